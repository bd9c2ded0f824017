//! The fences around a Cluster's control plane in the shared meta-cluster:
//! NetworkPolicies that let only that Cluster's own Pods (its kube-apiserver,
//! the other members) and the operator reach its etcd members and the
//! controller-manager's and scheduler's ports, so a Pod of another namespace
//! cannot even open a connection to them (TLS client authentication stays
//! the second wall). Its API and the konnectivity agents' port stay open to
//! every client: they are what the Cluster serves.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::CLUSTER_LABEL;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

use super::addons::KONNECTIVITY_AGENT_PORT;
use super::control_plane::{
    API_PORT, CONTROLLER_MANAGER_PORT, KONNECTIVITY_HEALTH_PORT, SCHEDULER_PORT,
};
use super::etcd::{CLIENT_PORT, PEER_PORT};
use crate::names::{Component, Names};

/// The label every namespace carries with its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn port(p: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(p)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn selector(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    }
}

/// The Cluster's own Pods, in its namespace.
fn own_pods(names: &Names) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(selector(
            [(CLUSTER_LABEL.to_string(), names.cluster.clone())].into(),
        )),
        ..Default::default()
    }
}

/// Every Pod of the operator's namespace.
fn operator(operator_namespace: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(selector(
            [(
                NAMESPACE_NAME_LABEL.to_string(),
                operator_namespace.to_string(),
            )]
            .into(),
        )),
        ..Default::default()
    }
}

fn policy(
    cluster: &Cluster,
    names: &Names,
    name: String,
    component: Component,
    pod_selector: LabelSelector,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(names.namespace.clone()),
            labels: Some(super::component_labels(names, component)),
            owner_references: Some(vec![super::owner(cluster)]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pod_selector),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    }
}

/// The NetworkPolicy of `cluster`'s etcd members: clients (2379) and peers
/// (2380) from the Cluster's own Pods, clients from the operator's
/// namespace (membership, health, snapshots); nothing else reaches them.
pub fn etcd(cluster: &Cluster, names: &Names, operator_namespace: &str) -> NetworkPolicy {
    policy(
        cluster,
        names,
        names.etcd_network_policy(),
        Component::Etcd,
        selector(super::component_labels(names, Component::Etcd)),
        vec![
            NetworkPolicyIngressRule {
                from: Some(vec![own_pods(names)]),
                ports: Some(vec![port(CLIENT_PORT), port(PEER_PORT)]),
            },
            NetworkPolicyIngressRule {
                from: Some(vec![operator(operator_namespace)]),
                ports: Some(vec![port(CLIENT_PORT)]),
            },
        ],
    )
}

/// The NetworkPolicy of `cluster`'s kube-apiserver, controller-manager and
/// scheduler Pods: the business API (6443) and the konnectivity agents'
/// port (8132) from anywhere (its clients and workers, through the load
/// balancer); the controller-manager's and scheduler's ports (10257, 10259)
/// and konnectivity's health port only from the Cluster's own Pods and the
/// operator's namespace. Each node's kubelet probes its Pods from the node
/// itself, which the meta-cluster's network lets through.
pub fn control_plane(cluster: &Cluster, names: &Names, operator_namespace: &str) -> NetworkPolicy {
    let components = [
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
    ];
    let pod_selector = LabelSelector {
        match_labels: Some([(CLUSTER_LABEL.to_string(), names.cluster.clone())].into()),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: kube_on_kube_api::shared::COMPONENT_LABEL.to_string(),
            operator: "In".into(),
            values: Some(components.iter().map(|c| c.as_str().to_string()).collect()),
        }]),
    };
    policy(
        cluster,
        names,
        names.control_plane_network_policy(),
        Component::ApiServer,
        pod_selector,
        vec![
            NetworkPolicyIngressRule {
                from: None,
                ports: Some(vec![port(API_PORT), port(KONNECTIVITY_AGENT_PORT)]),
            },
            NetworkPolicyIngressRule {
                from: Some(vec![own_pods(names), operator(operator_namespace)]),
                ports: Some(vec![
                    port(CONTROLLER_MANAGER_PORT),
                    port(SCHEDULER_PORT),
                    port(KONNECTIVITY_HEALTH_PORT),
                ]),
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> (Cluster, Names) {
        let cluster: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let names = Names::new(&cluster, "cluster.local");
        (cluster, names)
    }

    /// The ports a rule admits.
    fn ports(rule: &NetworkPolicyIngressRule) -> Vec<i32> {
        rule.ports
            .iter()
            .flatten()
            .filter_map(|p| match p.port {
                Some(IntOrString::Int(n)) => Some(n),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn only_the_clusters_pods_and_the_operator_reach_its_members() {
        let (cluster, names) = example();
        let policy = etcd(&cluster, &names, "kok-system");
        let spec = policy.spec.expect("spec");
        let selected = spec
            .pod_selector
            .and_then(|s| s.match_labels)
            .expect("selector");
        assert_eq!(selected.get(CLUSTER_LABEL), Some(&names.cluster));
        assert_eq!(
            selected
                .get(kube_on_kube_api::shared::COMPONENT_LABEL)
                .map(String::as_str),
            Some("etcd")
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let rules = spec.ingress.expect("ingress");
        let peers: Vec<String> = rules
            .iter()
            .map(|r| serde_json::to_string(&r.from).expect("json"))
            .collect();
        assert_eq!(
            peers,
            [
                format!(r#"[{{"podSelector":{{"matchLabels":{{"{CLUSTER_LABEL}":"{}"}}}}}}]"#, names.cluster),
                r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kok-system"}}}]"#.to_string(),
            ]
        );
        assert_eq!(ports(&rules[0]), [CLIENT_PORT, PEER_PORT]);
        assert_eq!(
            ports(&rules[1]),
            [CLIENT_PORT],
            "the operator is a client, never a peer"
        );
    }

    #[test]
    fn the_api_is_open_and_the_other_control_plane_ports_are_fenced() {
        let (cluster, names) = example();
        let policy = control_plane(&cluster, &names, "kok-system");
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some(format!("{}-control-plane", names.cluster).as_str())
        );
        let spec = policy.spec.expect("spec");
        let selected = serde_json::to_value(&spec.pod_selector).expect("json");
        assert_eq!(
            selected["matchExpressions"][0]["values"],
            serde_json::json!(["apiserver", "controller-manager", "scheduler"])
        );
        assert_eq!(selected["matchLabels"][CLUSTER_LABEL], names.cluster);
        let rules = spec.ingress.expect("ingress");
        // Every client reaches the API and the agents' port.
        assert_eq!(rules[0].from, None);
        assert_eq!(ports(&rules[0]), [6443, 8132]);
        // The rest only from the Cluster's own Pods and the operator.
        assert_eq!(ports(&rules[1]), [10257, 10259, 8134]);
        assert_eq!(
            serde_json::to_string(&rules[1].from).expect("json"),
            format!(
                r#"[{{"podSelector":{{"matchLabels":{{"{CLUSTER_LABEL}":"{}"}}}}}},{{"namespaceSelector":{{"matchLabels":{{"kubernetes.io/metadata.name":"kok-system"}}}}}}]"#,
                names.cluster
            )
        );
    }
}
