//! The fence around a Cluster's etcd in the shared meta-cluster: a
//! NetworkPolicy that lets only that Cluster's own Pods (its kube-apiserver,
//! the other members) and the operator reach its members, so a Pod of
//! another namespace cannot even open a connection to them (TLS client
//! authentication stays the second wall).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::CLUSTER_LABEL;

use super::etcd::{CLIENT_PORT, PEER_PORT};
use crate::names::{Component, Names};

/// The label every namespace carries with its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The NetworkPolicy of `cluster`'s etcd members: clients (2379) and peers
/// (2380) from the Cluster's own Pods, clients from the operator's
/// namespace (membership, health, snapshots); nothing else reaches them.
pub fn etcd(cluster: &Cluster, names: &Names, operator_namespace: &str) -> NetworkPolicy {
    let port = |p: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(p)),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let selector = |labels: BTreeMap<String, String>| LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    };
    let own_pods = NetworkPolicyPeer {
        pod_selector: Some(selector(
            [(CLUSTER_LABEL.to_string(), names.cluster.clone())].into(),
        )),
        ..Default::default()
    };
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(selector(
            [(
                NAMESPACE_NAME_LABEL.to_string(),
                operator_namespace.to_string(),
            )]
            .into(),
        )),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(names.etcd_network_policy()),
            namespace: Some(names.namespace.clone()),
            labels: Some(super::component_labels(names, Component::Etcd)),
            owner_references: Some(vec![super::owner(cluster)]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(super::component_labels(names, Component::Etcd))),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![own_pods]),
                    ports: Some(vec![port(CLIENT_PORT), port(PEER_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![operator]),
                    ports: Some(vec![port(CLIENT_PORT)]),
                },
            ]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clusters_pods_and_the_operator_reach_its_members() {
        let cluster: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let names = Names::new(&cluster, "cluster.local");
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
        let ports = |i: usize| -> Vec<i32> {
            rules[i]
                .ports
                .iter()
                .flatten()
                .filter_map(|p| match p.port {
                    Some(IntOrString::Int(n)) => Some(n),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(ports(0), [CLIENT_PORT, PEER_PORT]);
        assert_eq!(
            ports(1),
            [CLIENT_PORT],
            "the operator is a client, never a peer"
        );
    }
}
