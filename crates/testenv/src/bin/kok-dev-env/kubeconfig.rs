//! The business clusters' admin kubeconfigs, written where the user finds
//! them and pointed at an address this machine reaches.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::{Client, ResourceExt as _};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ExposureType;

/// A business cluster as the user reaches it.
pub struct Reachable {
    /// `namespace/name` of the Cluster.
    pub key: String,
    /// The API server URL of the written kubeconfig.
    pub server: String,
    pub path: PathBuf,
    /// How the machine reaches it, when through the meta-cluster's load
    /// balancer; None for a Cluster exposed inside the meta-cluster only.
    pub through_load_balancer: Option<String>,
    /// `(address, name)` when the endpoint names a host the machine does not
    /// resolve and the load balancer answers for it at `address`: what the
    /// site's DNS would hold.
    pub dns_entry: Option<(String, String)>,
}

/// Writes a file readable by the owner only: kubeconfigs hold admin keys.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        // `mode` applies to new files only; one left by an earlier run is fixed too.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(contents)
    };
    write().with_context(|| format!("writing {}", path.display()))
}

/// Writes `<dir>/<name>.kubeconfig` from the Cluster's admin kubeconfig
/// Secret. A Cluster exposed by a LoadBalancer whose endpoint names a host
/// this machine does not resolve (the Production example's
/// `api.prod-east.example.com`) is reached at the load balancer's address
/// instead, the certificate still checked against the endpoint's name, as
/// `kubectl kok cluster kubeconfig --server` does.
pub async fn for_cluster(
    meta: &Client,
    cluster: &Cluster,
    dir: &Path,
) -> anyhow::Result<Reachable> {
    let namespace = cluster.namespace().unwrap_or_else(|| "default".into());
    let name = cluster.name_any();
    let key = format!("{namespace}/{name}");
    let status = cluster.status.as_ref().context("no status")?;
    let secret = status
        .admin_kubeconfig_secret
        .as_deref()
        .with_context(|| format!("Cluster {key} names no admin kubeconfig Secret"))?;
    let secret = Api::<Secret>::namespaced(meta.clone(), &namespace)
        .get(secret)
        .await
        .with_context(|| format!("reading the admin kubeconfig of {key}"))?;
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|v| v.0.clone())
        .with_context(|| format!("the admin kubeconfig Secret of {key} has no kubeconfig"))?;
    let mut config: serde_json::Value =
        serde_norway::from_slice(&text).with_context(|| format!("the kubeconfig of {key}"))?;
    let endpoint = status.endpoint.clone().unwrap_or_default();
    let mut through = None;
    let mut dns_entry = None;
    let mut server = endpoint.clone();
    if cluster.spec.api_server.external.type_ == ExposureType::LoadBalancer {
        let service = format!("{name}-apiserver-external");
        let ingress = Api::<Service>::namespaced(meta.clone(), &namespace)
            .get_opt(&service)
            .await?
            .and_then(|s| {
                s.status?
                    .load_balancer?
                    .ingress?
                    .into_iter()
                    .find_map(|i| i.ip)
            });
        if let Some(ip) = ingress {
            let port = cluster.spec.api_server.external.port;
            let at_ip = format!("https://{ip}:{port}");
            let host = endpoint_host(&endpoint);
            if at_ip == endpoint {
                through = Some(format!("at the load balancer's address {ip}"));
            } else {
                for c in config["clusters"].as_array_mut().into_iter().flatten() {
                    c["cluster"]["server"] = at_ip.clone().into();
                    if let Some(host) = &host {
                        c["cluster"]["tls-server-name"] = host.clone().into();
                    }
                }
                dns_entry = host
                    .clone()
                    .filter(|h| h.parse::<std::net::IpAddr>().is_err())
                    .map(|h| (ip.clone(), h));
                through = Some(format!(
                    "at the load balancer's address {ip}: its endpoint {endpoint} is not in this \
                     machine's DNS (the certificate is checked against {})",
                    host.as_deref().unwrap_or("the endpoint")
                ));
                server = at_ip;
            }
        }
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    write_private(&path, serde_norway::to_string(&config)?.as_bytes())?;
    Ok(Reachable {
        key,
        server,
        path,
        through_load_balancer: through,
        dns_entry,
    })
}

/// The host of an `https://host:port` URL.
fn endpoint_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let host = match authority.rsplit_once(':') {
        Some((host, _)) => host,
        None => authority,
    };
    Some(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
}

/// A client from a kubeconfig file.
pub async fn client(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Client::try_from(config).with_context(|| format!("a client for {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::endpoint_host;

    #[test]
    fn host_of_an_endpoint() {
        assert_eq!(
            endpoint_host("https://api.prod-east.example.com:6443").as_deref(),
            Some("api.prod-east.example.com")
        );
        assert_eq!(
            endpoint_host("https://[fd00::1]:6443").as_deref(),
            Some("fd00::1")
        );
        assert_eq!(endpoint_host("http://x:1"), None);
    }
}
