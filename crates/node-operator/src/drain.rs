//! Cordon and drain a Node before its kubelet is disrupted, and uncordon it
//! afterwards — but only when the operator cordoned it: a Node an
//! administrator cordoned stays cordoned. Pods leave through the Eviction API,
//! so PodDisruptionBudgets are honoured, within a timeout.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::Error;

/// Annotation on a Node the operator cordoned; its value says why.
pub const CORDONED_BY: &str = "kubeonkube.io/cordoned-by";

const POLL: Duration = Duration::from_secs(2);

/// Whether the Node is cordoned.
pub fn is_cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// Whether the operator cordoned it (and so may uncordon it).
pub fn cordoned_by_us(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDONED_BY))
}

/// Pods a drain must move: not mirror Pods (the kubelet owns them), not
/// DaemonSet Pods (they would come straight back), not already finished or
/// leaving.
pub fn to_evict(pods: &[Pod]) -> Vec<&Pod> {
    pods.iter()
        .filter(|p| {
            let mirror = p
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
            let daemon = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
            let finished = matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            !mirror && !daemon && !finished
        })
        .collect()
}

/// Cordons `node` with `reason`, recording that the operator did. A Node
/// someone else cordoned is left as it is (and will not be uncordoned).
pub async fn cordon(client: &Client, node: &Node, reason: &str) -> Result<(), Error> {
    if is_cordoned(node) {
        return Ok(());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"annotations": {CORDONED_BY: reason}},
        "spec": {"unschedulable": true},
    });
    Api::<Node>::all(client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("cordon Node {name}")))?;
    Ok(())
}

/// Uncordons `node` if the operator cordoned it.
pub async fn uncordon(client: &Client, node: &Node) -> Result<bool, Error> {
    if !cordoned_by_us(node) {
        return Ok(false);
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"annotations": {CORDONED_BY: null}},
        "spec": {"unschedulable": null},
    });
    Api::<Node>::all(client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("uncordon Node {name}")))?;
    Ok(true)
}

/// Evicts the Node's Pods until none is left, or fails after `timeout`.
/// An eviction a PodDisruptionBudget refuses (429) is retried.
pub async fn drain(client: &Client, node: &str, timeout: Duration) -> Result<usize, Error> {
    let all: Api<Pod> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let mut evicted = 0;
    loop {
        let pods = all
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(Error::kube(format!("list Pods on Node {node}")))?
            .items;
        let left = to_evict(&pods);
        if left.is_empty() {
            return Ok(evicted);
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = left
                .iter()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default()
                    )
                })
                .collect();
            return Err(Error::DrainTimeout {
                node: node.to_string(),
                seconds: timeout.as_secs(),
                pods: names.join(", "),
            });
        }
        for pod in left {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            match api.evict(name, &EvictParams::default()).await {
                Ok(_) => evicted += 1,
                // Gone already, or a disruption budget says not now.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 429 => {}
                Err(e) => return Err(Error::kube(format!("evict Pod {ns}/{name}"))(e)),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn drain_skips_daemonset_mirror_and_finished_pods() {
        let mut daemon = pod("ds");
        daemon.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let mut mirror = pod("mirror");
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        let mut done = pod("done");
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let pods = vec![pod("web"), daemon, mirror, done];
        let names: Vec<_> = to_evict(&pods)
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, vec!["web"]);
    }

    #[test]
    fn only_our_cordon_is_undone() {
        let mut node = Node {
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(is_cordoned(&node));
        assert!(!cordoned_by_us(&node));
        node.metadata.annotations = Some([(CORDONED_BY.to_string(), "upgrade".to_string())].into());
        assert!(cordoned_by_us(&node));
    }
}
