//! The Nodes the Pod runner stands behind: registered like a kubelet registers
//! its Node, and kept alive with Lease renewals so the node lifecycle controller
//! never marks them NotReady.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// Field manager of everything the runner writes.
pub const MANAGER: &str = "kok-testenv-pod-runner";

/// Lease duration the runner promises; it renews every third of it.
pub const LEASE_SECONDS: i32 = 40;

/// The Node object of a runner node.
pub fn node(name: &str, labels: &BTreeMap<String, String>) -> Node {
    let mut all = labels.clone();
    all.insert("kubernetes.io/hostname".into(), name.into());
    all.insert("kubernetes.io/os".into(), "linux".into());
    all.insert(
        "kubernetes.io/arch".into(),
        std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64"),
    );
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(all),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The Node's status: Ready, its address and generous capacity.
pub fn status(name: &str, ip: &str, now: Timestamp) -> NodeStatus {
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu", "32"),
        ("memory", "128Gi"),
        ("pods", "110"),
        ("ephemeral-storage", "200Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
    .collect();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    };
    NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
        ]),
        allocatable: Some(capacity.clone()),
        capacity: Some(capacity),
        conditions: Some(vec![
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "the test Pod runner is running Pods",
            ),
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "no pressure",
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "no pressure",
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "no pressure",
            ),
        ]),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".into(),
            operating_system: "linux".into(),
            kubelet_version: "v1.35.4".into(),
            kube_proxy_version: String::new(),
            container_runtime_version: "kok-testenv://1".into(),
            kernel_version: String::new(),
            os_image: "kube-on-kube test environment".into(),
            boot_id: String::new(),
            machine_id: String::new(),
            system_uuid: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Register (or refresh) the Node and its status.
pub async fn register(
    client: &Client,
    name: &str,
    ip: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let mut desired = node(name, labels);
    desired.metadata.managed_fields = None;
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": desired.metadata,
    });
    nodes.patch(name, &pp, &Patch::Apply(&body)).await?;
    heartbeat(client, name, ip).await
}

/// Renew the Node's Lease and refresh its Ready condition.
pub async fn heartbeat(client: &Client, name: &str, ip: &str) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "status": status(name, ip, now),
    });
    nodes.patch_status(name, &pp, &Patch::Apply(&body)).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    };
    let body = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": lease.metadata, "spec": lease.spec,
    });
    leases.patch(name, &pp, &Patch::Apply(&body)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_ready_with_its_address() {
        let s = status("runner-0", "10.214.3.1", Timestamp::UNIX_EPOCH);
        let ready = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(ready.status, "True");
        assert_eq!(s.addresses.expect("addresses")[0].address, "10.214.3.1");
        let n = node("runner-0", &[("pool".to_string(), "cp".to_string())].into());
        assert_eq!(
            n.metadata.labels.expect("labels")["kubernetes.io/hostname"],
            "runner-0"
        );
    }
}
