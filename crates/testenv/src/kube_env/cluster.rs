//! Objects the environment puts into a fresh API server before tests see it: our
//! CRDs, kwok's fake nodes, per-test namespaces.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};

use super::Error;
use super::components::{KWOK_NODE_ANNOTATION, poll_until};

const FIELD_MANAGER: &str = "kok-testenv";

/// Applies every CRD of `kube_on_kube_api` (server-side apply) and waits until
/// each one is Established, so tests can create custom objects right away.
pub async fn install_crds(client: &Client) -> Result<(), Error> {
    install_crds_within(client, Duration::from_secs(60)).await
}

pub(crate) async fn install_crds_within(client: &Client, timeout: Duration) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for (file, crd) in kube_on_kube_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(Error::kube(format!("applying the CRD from {file}")))?;
        names.push(name);
    }
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        match tokio::time::timeout(timeout, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => {
                return Err(Error::Wait {
                    what: format!("waiting for CRD {name}"),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("CRD {name} Established"),
                    after: timeout,
                });
            }
        }
    }
    Ok(())
}

/// Creates `count` nodes for kwok and waits until kwok reports them Ready.
pub(crate) async fn create_fake_nodes(
    client: &Client,
    count: usize,
    timeout: Duration,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let names: Vec<String> = (0..count).map(|i| format!("kwok-node-{i}")).collect();
    for name in &names {
        api.patch(name, &params, &Patch::Apply(fake_node(name)))
            .await
            .map_err(Error::kube(format!("creating fake node {name}")))?;
    }
    let all_ready = async {
        for name in &names {
            await_condition(api.clone(), name, node_ready).await?;
        }
        Ok::<_, kube::runtime::wait::Error>(())
    };
    match tokio::time::timeout(timeout, all_ready).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(Error::Wait {
            what: "waiting for the fake nodes".into(),
            source,
        }),
        Err(_) => Err(Error::Timeout {
            what: format!("{count} kwok nodes Ready"),
            after: timeout,
        }),
    }
}

fn node_ready(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A node as kwok's own examples describe one. kwok fills in the status,
/// including a capacity large enough that scheduling never depends on requests.
/// No taint: nothing real runs here, so test pods need no toleration.
pub fn fake_node(name: &str) -> serde_json::Value {
    let (key, value) = KWOK_NODE_ANNOTATION;
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": { key: value, "node.alpha.kubernetes.io/ttl": "0" },
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "type": "kwok",
            },
        },
    })
}

/// Creates namespace `name`; with a controller manager running, also waits for
/// its `default` service account, without which pods are refused.
pub(crate) async fn create_namespace(
    client: &Client,
    name: &str,
    wait_for_service_account: bool,
    timeout: Duration,
) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some([("kok-testenv".to_owned(), "true".to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    if wait_for_service_account {
        wait_service_account(client, name, timeout).await?;
    }
    Ok(())
}

/// Waits for the `default` service account of `namespace`, which the controller
/// manager creates.
pub(crate) async fn wait_service_account(
    client: &Client,
    namespace: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let what = format!("service account {namespace}/default");
    poll_until(&what, timeout, None, || async {
        let found = accounts
            .get_opt("default")
            .await
            .map_err(Error::kube(format!("reading {namespace}/default")))?;
        Ok(found.is_some())
    })
    .await
}

/// A DNS label from a caller-chosen prefix and a sequence number.
pub(crate) fn namespace_name(prefix: &str, seq: u64) -> String {
    let mut base: String = prefix
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    let suffix = format!("-{seq}");
    base.truncate(63 - suffix.len());
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    format!("{base}{suffix}")
}

/// The `kubernetes` Service's endpoint at `endpoint`: its Endpoints, and the
/// EndpointSlice kube-proxy reads (the mirroring controller leaves this
/// Service alone, so the slice is written too, as kube-apiserver does).
pub(crate) async fn publish_api_endpoint(
    client: &Client,
    endpoint: std::net::SocketAddr,
) -> Result<(), Error> {
    let ip = endpoint.ip().to_string();
    let port = endpoint.port();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let endpoints = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), "default")
        .patch("kubernetes", &params, &Patch::Apply(&endpoints))
        .await
        .map_err(Error::kube("setting the kubernetes Endpoints"))?;
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if endpoint.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), "default")
        .patch("kubernetes", &params, &Patch::Apply(&slice))
        .await
        .map_err(Error::kube("setting the kubernetes EndpointSlice"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::namespace_name;

    #[test]
    fn namespace_names_are_dns_labels() {
        assert_eq!(namespace_name("csr", 3), "csr-3");
        assert_eq!(namespace_name("My_Test::case", 12), "my-test--case-12");
        assert_eq!(namespace_name("--", 1), "test-1");
        let long = namespace_name(&"x".repeat(100), 123456);
        assert!(long.len() <= 63, "{long}");
        assert!(long.ends_with("-123456"));
    }
}
