//! One way to build a `kube::Client` from the `--kubeconfig`/`--context` flags
//! every binary accepts, falling back to `KUBECONFIG` and the in-cluster account.

use std::path::PathBuf;

use hyper::Request;

use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::util::MapRequestLayer;

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

    /// A client for the cluster these flags select. Each request it sends
    /// is counted in `kok_api_requests_total`.
    pub async fn client(&self) -> Result<Client, Error> {
        let builder = ClientBuilder::try_from(self.config().await?).map_err(Error::Client)?;
        Ok(builder.with_layer(&MapRequestLayer::new(counted)).build())
    }
}

/// Count a request by its HTTP method, watches apart (`WATCH`).
fn counted(request: Request<Body>) -> Request<Body> {
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let method = if watch {
        "WATCH"
    } else {
        request.method().as_str()
    };
    crate::metrics::global().api_request(method);
    request
}

impl ClientArgs {
    /// A client for the selected cluster, checked by asking the API server for
    /// its version, which is logged as `connected to <what>`.
    pub async fn connect(&self, what: &str) -> Result<Client, Error> {
        let client = self.client().await?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|source| Error::Api {
                call: "reading the API server's version".into(),
                source,
            })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn count(metrics: &str, method: &str) -> f64 {
        let series = format!("kok_api_requests_total{{method=\"{method}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0.0, |v| v.parse().unwrap())
    }

    #[test]
    fn requests_are_counted_by_method_and_watches_apart() {
        let request = |method: &str, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap()
        };
        let before = crate::metrics::global().encode();
        counted(request("GET", "/api/v1/namespaces/a/pods?labelSelector=x"));
        counted(request("GET", "/api/v1/pods?watch=true&resourceVersion=1"));
        counted(request("PATCH", "/api/v1/namespaces/a/pods/p"));
        let after = crate::metrics::global().encode();
        for method in ["GET", "WATCH", "PATCH"] {
            assert_eq!(
                count(&after, method) - count(&before, method),
                1.0,
                "{method}: {after}"
            );
        }
    }
}
