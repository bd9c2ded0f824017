//! One way to build a `kube::Client` from the `--kubeconfig`/`--context` flags
//! every binary accepts, falling back to `KUBECONFIG` and the in-cluster account.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::Error;

/// Connection flags shared by every binary.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientArgs {
    /// Path to a kubeconfig file. Without it: $KUBECONFIG, then ~/.kube/config,
    /// then the Pod's service account.
    #[arg(long, env = "KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig to use instead of its current context.
    #[arg(long, env = "KOK_CONTEXT", global = true)]
    pub context: Option<String>,
}

impl ClientArgs {
    /// The client configuration these flags select.
    pub async fn config(&self) -> Result<Config, Error> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(Error::Kubeconfig)
            }
            None if self.context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(Error::Kubeconfig),
            None => Config::infer().await.map_err(Error::Infer),
        }
    }

    /// A client for the cluster these flags select.
    pub async fn client(&self) -> Result<Client, Error> {
        Client::try_from(self.config().await?).map_err(Error::Client)
    }
}

impl ClientArgs {
    /// A client for the selected cluster, checked by asking the API server for
    /// its version, which is logged as `connected to <what>`.
    pub async fn connect(&self, what: &str) -> Result<Client, Error> {
        let client = self.client().await?;
        let version = client.apiserver_version().await.map_err(Error::Api)?;
        tracing::info!(server = %version.git_version, "connected to {what}");
        Ok(client)
    }
}

/// Objects per page of [`list_paged`].
pub const PAGE: u32 = 500;

/// Every object `params` selects, read in pages of [`PAGE`], each passed
/// through `keep` as its page arrives: a collection of thousands is never
/// held whole as the API server sends it (managed fields and all), only as
/// far as the caller needs it.
pub async fn list_paged<K, T>(
    api: &kube::Api<K>,
    params: &kube::api::ListParams,
    mut keep: impl FnMut(K) -> T,
) -> Result<Vec<T>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone().limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items.into_iter().map(&mut keep));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}
