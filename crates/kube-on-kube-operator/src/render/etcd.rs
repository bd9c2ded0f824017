//! etcd members as the operator runs them: one Pod, one headless Service (the
//! member's stable peer identity) and, with a claim template, one
//! PersistentVolumeClaim per member; plus the client Service in front of all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm,
    PodAntiAffinity, PodSpec, Probe, ProjectedVolumeSource, SecretProjection, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeProjection, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_on_kube_api::cluster::Cluster;
use serde::{Deserialize, Serialize};

use super::{component_labels, owner};
use crate::names::{Component, Names};

/// A member name and its peer URL, as in etcd's `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peer {
    pub name: String,
    pub peer_url: String,
}

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClusterState {
    New,
    Existing,
}

impl ClusterState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        }
    }
}

/// The value of etcd's `--initial-cluster` flag.
pub fn initial_cluster_flag(peers: &[Peer]) -> String {
    peers
        .iter()
        .map(|p| format!("{}={}", p.name, p.peer_url))
        .collect::<Vec<_>>()
        .join(",")
}

/// Label naming the etcd member a Pod or Service belongs to.
pub const MEMBER_LABEL: &str = "kubeonkube.io/etcd-member";

/// Port numbers.
pub const CLIENT_PORT: i32 = 2379;
pub const PEER_PORT: i32 = 2380;
pub const METRICS_PORT: i32 = 2381;

/// Where the member's certificates are mounted.
pub const PKI_DIR: &str = "/etc/etcd/pki";
/// Where the member's data lives.
pub const DATA_DIR: &str = "/var/lib/etcd";

/// Annotation with the etcd version a member's Pod was created to run.
pub const VERSION_ANNOTATION: &str = "kubeonkube.io/etcd-version";

/// One member's Pod.
pub struct MemberPod<'a> {
    pub index: usize,
    /// Every member the new member must know about, as the membership plan
    /// gives them: all members at bootstrap, the live member list (with the
    /// new member) when it joins a running cluster.
    pub initial_cluster: &'a [Peer],
    /// How the member joins: with the others at bootstrap (`new`), or into a
    /// running cluster after it was added through the etcd API (`existing`).
    pub state: ClusterState,
    /// The etcd version `image` runs.
    pub version: &'a str,
    /// Image to run.
    pub image: &'a str,
    /// Hash of the mounted certificates; a change rolls the Pod.
    pub config_hash: &'a str,
}

fn member_labels(names: &Names, member: &str) -> BTreeMap<String, String> {
    let mut labels = component_labels(names, Component::Etcd);
    labels.insert(MEMBER_LABEL.into(), member.into());
    labels
}

/// Whether the members keep their data in a directory of their node
/// (`volumeSource.hostPath`, no claim): it outlives the Pod, and is root's.
pub fn on_host_path(cluster: &Cluster) -> bool {
    let storage = &cluster.spec.etcd.storage;
    storage.claim_template.is_none()
        && storage
            .volume_source
            .as_ref()
            .is_some_and(|v| v.host_path.is_some())
}

/// The Pod of etcd member `m.index`.
pub fn member_pod(cluster: &Cluster, names: &Names, m: &MemberPod<'_>) -> Pod {
    let member = names.etcd_member(m.index);
    let spec = &cluster.spec;
    let peer_url = names.etcd_peer_url(&member);
    let client_url = names.etcd_client_url(&member);
    let mut args: BTreeMap<String, String> = [
        ("name", member.clone()),
        ("data-dir", format!("{DATA_DIR}/{FIRST_DATA_DIR}")),
        (
            "listen-client-urls",
            format!("https://0.0.0.0:{CLIENT_PORT}"),
        ),
        ("advertise-client-urls", client_url),
        ("listen-peer-urls", format!("https://0.0.0.0:{PEER_PORT}")),
        ("initial-advertise-peer-urls", peer_url),
        (
            "listen-metrics-urls",
            format!("http://0.0.0.0:{METRICS_PORT}"),
        ),
        ("initial-cluster", initial_cluster_flag(m.initial_cluster)),
        ("initial-cluster-state", m.state.as_str().into()),
        (
            "initial-cluster-token",
            format!("{}-{}", names.namespace, names.cluster),
        ),
        ("cert-file", format!("{PKI_DIR}/server.crt")),
        ("key-file", format!("{PKI_DIR}/server.key")),
        ("trusted-ca-file", format!("{PKI_DIR}/ca.crt")),
        ("client-cert-auth", "true".into()),
        ("peer-cert-file", format!("{PKI_DIR}/peer.crt")),
        ("peer-key-file", format!("{PKI_DIR}/peer.key")),
        ("peer-trusted-ca-file", format!("{PKI_DIR}/ca.crt")),
        ("peer-client-cert-auth", "true".into()),
        ("snapshot-count", "10000".into()),
        ("auto-compaction-mode", "periodic".into()),
        ("auto-compaction-retention", "1h".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // User flags win over ours.
    args.extend(spec.etcd.component.extra_args.clone());
    let args: Vec<String> = args
        .into_iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect();

    let secret_items = |secret: String, prefix: &str, with_ca: bool| {
        let mut items = vec![
            KeyToPath {
                key: "tls.crt".into(),
                path: format!("{prefix}.crt"),
                mode: None,
            },
            KeyToPath {
                key: "tls.key".into(),
                path: format!("{prefix}.key"),
                mode: None,
            },
        ];
        if with_ca {
            items.push(KeyToPath {
                key: "ca.crt".into(),
                path: "ca.crt".into(),
                mode: None,
            });
        }
        VolumeProjection {
            secret: Some(SecretProjection {
                name: secret,
                items: Some(items),
                optional: None,
            }),
            ..Default::default()
        }
    };
    let suffix = format!("etcd-{}", m.index);
    let pki = Volume {
        name: "pki".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                secret_items(
                    names.cert_secret(&format!("{suffix}-server")),
                    "server",
                    true,
                ),
                secret_items(names.cert_secret(&format!("{suffix}-peer")), "peer", false),
            ]),
            default_mode: Some(0o400),
        }),
        ..Default::default()
    };
    // A node's directory is root's: no Pod group is given it (the kubelet
    // changes the group of claims and emptyDirs only), so etcd stays root
    // there.
    let on_host_path = on_host_path(cluster);
    let data = match (
        &spec.etcd.storage.claim_template,
        &spec.etcd.storage.volume_source,
    ) {
        (Some(_), _) => Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: member.clone(),
                read_only: None,
            }),
            ..Default::default()
        },
        (None, Some(source)) => Volume {
            name: "data".into(),
            empty_dir: source.empty_dir.clone(),
            host_path: source.host_path.clone().map(|mut h| {
                h.path = format!("{}/{member}", h.path.trim_end_matches('/'));
                h.type_ = Some("DirectoryOrCreate".into());
                h
            }),
            ..Default::default()
        },
        (None, None) => Volume {
            name: "data".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        },
    };
    // Readiness is probed every second: a new Cluster's kube-apiserver is
    // created once a member is Ready (see `rollout::apiserver_waits`).
    let probe = |path: &str, failure_threshold: i32, initial: i32, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(METRICS_PORT),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    };
    let port = |name: &str, port: i32| ContainerPort {
        name: Some(name.into()),
        container_port: port,
        ..Default::default()
    };
    let mut annotations = BTreeMap::new();
    annotations.insert(
        super::CONFIG_HASH_ANNOTATION.to_string(),
        m.config_hash.to_string(),
    );
    annotations.insert(VERSION_ANNOTATION.to_string(), m.version.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(member.clone()),
            namespace: Some(names.namespace.clone()),
            labels: Some(member_labels(names, &member)),
            annotations: Some(annotations),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(member.clone()),
            subdomain: Some(member.clone()),
            node_selector: spec
                .placement
                .as_ref()
                .map(|p| p.node_selector.clone())
                .filter(|s| !s.is_empty()),
            tolerations: spec
                .placement
                .as_ref()
                .map(|p| p.tolerations.clone())
                .filter(|t| !t.is_empty()),
            // A crashed etcd recovers from its own data; replacing a member is
            // the operator's decision, made from member health.
            restart_policy: Some("Always".into()),
            termination_grace_period_seconds: Some(30),
            enable_service_links: Some(false),
            automount_service_account_token: Some(false),
            security_context: Some(if on_host_path {
                super::restricted_pod()
            } else {
                super::restricted_pod_non_root()
            }),
            containers: vec![Container {
                name: "etcd".into(),
                image: Some(m.image.into()),
                security_context: Some(if on_host_path {
                    super::restricted()
                } else {
                    super::restricted_non_root()
                }),
                command: Some(vec!["etcd".into()]),
                args: Some(args),
                env: Some(vec![EnvVar {
                    name: "POD_IP".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "status.podIP".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }),
                    value: None,
                }]),
                ports: Some(vec![
                    port("client", CLIENT_PORT),
                    port("peer", PEER_PORT),
                    port("metrics", METRICS_PORT),
                ]),
                // A learner is healthy without a vote: /readyz alone would keep a
                // learner not ready, and the operator promotes ready learners.
                readiness_probe: Some(probe("/readyz?exclude=non_learner", 3, 0, 1)),
                liveness_probe: Some(probe("/livez", 8, 10, 2)),
                resources: spec.etcd.component.resources.clone(),
                volume_mounts: Some(vec![
                    VolumeMount {
                        name: "pki".into(),
                        mount_path: PKI_DIR.into(),
                        read_only: Some(true),
                        ..Default::default()
                    },
                    VolumeMount {
                        name: "data".into(),
                        mount_path: DATA_DIR.into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            volumes: Some(vec![pki, data]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Annotations on a hostPath member's Service that pin it to its data: the
/// node its Pod ran on and the data directory it used there. A member's
/// Service lives as long as its slot, so they outlive the Pod.
pub const NODE_ANNOTATION: &str = "kubeonkube.io/etcd-node";
pub const DATA_DIR_ANNOTATION: &str = "kubeonkube.io/etcd-data-dir";

/// The data directory (under [`DATA_DIR`]) of members created with the
/// cluster, and of every member not on hostPath.
pub const FIRST_DATA_DIR: &str = "data";

/// Where a hostPath member's data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The node whose directory holds the data; `None` until the Pod that
    /// writes it is scheduled.
    pub node: Option<String>,
    /// The data directory's name under [`DATA_DIR`].
    pub data_dir: String,
}

/// The data directory of a member added to a running cluster with `id`: a
/// name no earlier member of the slot used, so a member added back onto a
/// node that still holds a removed member's directory starts empty (etcd
/// refuses a re-added member that brings its removed self's data), and no
/// directory is ever wiped.
pub fn added_data_dir(id: u64) -> String {
    format!("member-{id:x}")
}

/// `pod` keeping its data at `pin`: etcd's `--data-dir` is the pinned
/// directory, and with a node the Pod may only run there (the data is on
/// that node's disk). The directory is also recorded on the Pod, from where
/// the member's Service takes it once the Pod is scheduled.
pub fn on_data(mut pod: Pod, pin: &Pin) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DATA_DIR_ANNOTATION.into(), pin.data_dir.clone());
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    for c in &mut spec.containers {
        for arg in c.args.iter_mut().flatten() {
            if arg.starts_with("--data-dir=") {
                *arg = format!("--data-dir={DATA_DIR}/{}", pin.data_dir);
            }
        }
    }
    if let Some(node) = &pin.node {
        spec.affinity
            .get_or_insert_with(Default::default)
            .node_affinity = Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.clone()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        });
    }
    pod
}

/// The pin a hostPath member's Pod shows: its node once scheduled, and the
/// data directory it was created with.
pub fn pod_pin(pod: &Pod) -> Option<Pin> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let data_dir = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DATA_DIR_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| FIRST_DATA_DIR.into());
    Some(Pin {
        node: Some(node),
        data_dir,
    })
}

/// The pin recorded on a member's Service.
pub fn service_pin(service: &Service) -> Option<Pin> {
    let a = service.metadata.annotations.as_ref()?;
    Some(Pin {
        node: Some(a.get(NODE_ANNOTATION)?.clone()),
        data_dir: a.get(DATA_DIR_ANNOTATION)?.clone(),
    })
}

/// `service` recording `pin`.
pub fn pinned(mut service: Service, pin: &Pin) -> Service {
    let annotations = service
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    if let Some(node) = &pin.node {
        annotations.insert(NODE_ANNOTATION.into(), node.clone());
    }
    annotations.insert(DATA_DIR_ANNOTATION.into(), pin.data_dir.clone());
    service
}

/// Label key of the topology etcd members are spread over: one member per
/// node.
pub const SPREAD_TOPOLOGY: &str = "kubernetes.io/hostname";

/// How a Production Cluster's members are kept off each other's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// One member per node, or the member is not scheduled: enough nodes
    /// match the Cluster's placement.
    Required,
    /// Apart where the scheduler can: too few nodes match, and members
    /// sharing a node beats members not running.
    Preferred,
}

/// `pod` kept apart from its Cluster's other members, as `spread` says.
pub fn spread(mut pod: Pod, names: &Names, spread: Spread) -> Pod {
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(component_labels(names, Component::Etcd)),
            ..Default::default()
        }),
        topology_key: SPREAD_TOPOLOGY.into(),
        ..Default::default()
    };
    let anti = match spread {
        Spread::Required => PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term]),
            ..Default::default()
        },
        Spread::Preferred => PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: term,
                },
            ]),
            ..Default::default()
        },
    };
    if let Some(spec) = pod.spec.as_mut() {
        spec.affinity
            .get_or_insert_with(Default::default)
            .pod_anti_affinity = Some(anti);
    }
    pod
}

/// The spread a member Pod was created with, if any.
pub fn pod_spread(pod: &Pod) -> Option<Spread> {
    let anti = pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .pod_anti_affinity
        .as_ref()?;
    if anti
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        Some(Spread::Required)
    } else {
        Some(Spread::Preferred)
    }
}

/// The PodDisruptionBudget of the Cluster's etcd members: an eviction (a
/// node drain) takes at most one member at a time, so a quorum stays. Said
/// as `minAvailable` (all members but one): the members' controller is the
/// Cluster, which has no scale subresource, and the disruption controller
/// cannot count the Pods a `maxUnavailable` is relative to without one (it
/// would then allow no eviction at all).
pub fn disruption_budget(cluster: &Cluster, names: &Names) -> PodDisruptionBudget {
    let members = cluster.spec.mode.replicas();
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(names.etcd_disruption_budget()),
            namespace: Some(names.namespace.clone()),
            labels: Some(component_labels(names, Component::Etcd)),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(members - 1)),
            selector: Some(LabelSelector {
                match_labels: Some(component_labels(names, Component::Etcd)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The headless Service that gives member `index` its stable DNS name; it
/// publishes the address before the member is ready, because peers must find
/// each other to become ready at all.
pub fn member_service(cluster: &Cluster, names: &Names, index: usize) -> Service {
    let member = names.etcd_member(index);
    service(cluster, names, &member, member_labels(names, &member), true)
}

/// The Service clients (kube-apiserver) use to reach any member.
pub fn client_service(cluster: &Cluster, names: &Names) -> Service {
    service(
        cluster,
        names,
        &names.etcd_client_service(),
        component_labels(names, Component::Etcd),
        false,
    )
}

fn service(
    cluster: &Cluster,
    names: &Names,
    name: &str,
    selector: BTreeMap<String, String>,
    headless: bool,
) -> Service {
    let port = |name: &str, port: i32| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let mut ports = vec![port("client", CLIENT_PORT)];
    if headless {
        ports.push(port("peer", PEER_PORT));
    }
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(names.namespace.clone()),
            labels: Some(component_labels(names, Component::Etcd)),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: headless.then(|| "None".into()),
            publish_not_ready_addresses: headless.then_some(true),
            selector: Some(selector),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    }
}

/// The claim of member `index`, when the Cluster uses a claim template.
pub fn member_claim(
    cluster: &Cluster,
    names: &Names,
    index: usize,
) -> Option<PersistentVolumeClaim> {
    let template = cluster.spec.etcd.storage.claim_template.clone()?;
    let member = names.etcd_member(index);
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(member.clone()),
            namespace: Some(names.namespace.clone()),
            labels: Some(member_labels(names, &member)),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(template),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::cluster::ClusterMode;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        c.metadata.uid = Some("uid-1".into());
        c.spec.mode = ClusterMode::Production;
        c
    }

    #[test]
    fn member_pod_uses_its_service_name_as_identity() {
        let c = cluster();
        let n = Names::new(&c, "cluster.local");
        let initial: Vec<Peer> = (0..3)
            .map(|i| {
                let name = n.etcd_member(i);
                Peer {
                    peer_url: n.etcd_peer_url(&name),
                    name,
                }
            })
            .collect();
        let pod = member_pod(
            &c,
            &n,
            &MemberPod {
                index: 1,
                initial_cluster: &initial,
                state: ClusterState::New,
                version: "3.6.16",
                image: "registry.k8s.io/etcd:3.6.16-0",
                config_hash: "abc",
            },
        );
        assert_eq!(
            pod.metadata.annotations.as_ref().expect("annotations")[VERSION_ANNOTATION],
            "3.6.16"
        );
        let spec = pod.spec.expect("spec");
        let args = spec.containers[0].args.clone().expect("args");
        assert!(args.contains(&"--name=prod-east-etcd-1".to_string()));
        assert!(args.contains(&"--initial-advertise-peer-urls=https://prod-east-etcd-1.clusters.svc.cluster.local:2380".to_string()));
        assert!(args.iter().any(|a| a.starts_with("--initial-cluster=prod-east-etcd-0=https://prod-east-etcd-0.clusters.svc.cluster.local:2380,prod-east-etcd-1=")));
        assert!(args.contains(&"--initial-cluster-state=new".to_string()));
        // The user's flag is applied, after ours.
        assert!(args.contains(&"--quota-backend-bytes=8589934592".to_string()));
        assert_eq!(spec.subdomain.as_deref(), Some("prod-east-etcd-1"));
        let claim = spec
            .volumes
            .expect("volumes")
            .iter()
            .find(|v| v.name == "data")
            .and_then(|v| v.persistent_volume_claim.clone())
            .expect("claim");
        assert_eq!(claim.claim_name, "prod-east-etcd-1");
        assert_eq!(
            spec.node_selector.expect("selector")["node-role.kubeonkube.io/control-plane"],
            ""
        );
    }

    #[test]
    fn member_service_is_headless_and_publishes_not_ready() {
        let c = cluster();
        let n = Names::new(&c, "cluster.local");
        let svc = member_service(&c, &n, 2).spec.expect("spec");
        assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
        assert_eq!(svc.publish_not_ready_addresses, Some(true));
        assert_eq!(
            svc.selector.expect("selector")[MEMBER_LABEL],
            "prod-east-etcd-2"
        );
        let client = client_service(&c, &n).spec.expect("spec");
        assert_eq!(client.cluster_ip, None);
        assert!(
            !client
                .selector
                .expect("selector")
                .contains_key(MEMBER_LABEL)
        );
        assert!(member_claim(&c, &n, 0).is_some());
    }
}

#[cfg(test)]
mod users {
    use super::*;

    fn member(storage: serde_json::Value) -> Pod {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        c.spec.etcd.storage = serde_json::from_value(storage).expect("storage");
        let n = Names::new(&c, "cluster.local");
        member_pod(
            &c,
            &n,
            &MemberPod {
                index: 0,
                initial_cluster: &[],
                state: ClusterState::New,
                version: "3.6.16",
                image: "registry.k8s.io/etcd:3.6.16-0",
                config_hash: "abc",
            },
        )
    }

    fn users(pod: &Pod) -> (Option<i64>, Option<i64>, Option<bool>) {
        let spec = pod.spec.as_ref().expect("spec");
        let pod_sc = spec.security_context.clone().expect("pod securityContext");
        let sc = spec.containers[0]
            .security_context
            .clone()
            .expect("securityContext");
        (sc.run_as_user, pod_sc.fs_group, sc.run_as_non_root)
    }

    #[test]
    fn etcd_runs_as_a_user_that_is_not_root_unless_its_data_is_a_node_directory() {
        let claim = serde_json::json!({"claimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}});
        let empty = serde_json::json!({"volumeSource": {"emptyDir": {}}});
        let node = serde_json::json!({"volumeSource": {"hostPath": {"path": "/var/lib/kok"}}});
        let non_root = (
            Some(crate::render::NON_ROOT),
            Some(crate::render::NON_ROOT),
            Some(true),
        );
        assert_eq!(users(&member(claim)), non_root);
        assert_eq!(users(&member(empty)), non_root);
        assert_eq!(users(&member(node)), (None, None, None));
    }
}

#[cfg(test)]
mod placement {
    use super::*;

    fn pod() -> (Cluster, Names, Pod) {
        let c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let n = Names::new(&c, "cluster.local");
        let pod = member_pod(
            &c,
            &n,
            &MemberPod {
                index: 0,
                initial_cluster: &[],
                state: ClusterState::Existing,
                version: "3.6.16",
                image: "registry.k8s.io/etcd:3.6.16-0",
                config_hash: "abc",
            },
        );
        (c, n, pod)
    }

    #[test]
    fn a_pinned_member_runs_on_its_node_in_its_directory() {
        let (_, _, pod) = pod();
        let pin = Pin {
            node: Some("node-b".into()),
            data_dir: added_data_dir(0xabc),
        };
        let pod = on_data(pod, &pin);
        let spec = pod.spec.clone().expect("spec");
        let args = spec.containers[0].args.clone().expect("args");
        assert!(args.contains(&"--data-dir=/var/lib/etcd/member-abc".to_string()));
        assert_eq!(
            args.iter().filter(|a| a.starts_with("--data-dir=")).count(),
            1
        );
        let terms = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|a| a.required_during_scheduling_ignored_during_execution)
            .expect("required node affinity")
            .node_selector_terms;
        let field = &terms[0].match_fields.as_ref().expect("fields")[0];
        assert_eq!(
            (field.key.as_str(), field.values.clone()),
            ("metadata.name", Some(vec!["node-b".to_string()]))
        );
        // Read back as the Pod's pin once scheduled there.
        let mut scheduled = pod;
        if let Some(s) = scheduled.spec.as_mut() {
            s.node_name = Some("node-b".into());
        }
        assert_eq!(pod_pin(&scheduled), Some(pin.clone()));
        // Recorded on, and read back from, the member's Service.
        let (c, n, _) = self::pod();
        let svc = pinned(member_service(&c, &n, 0), &pin);
        assert_eq!(service_pin(&svc), Some(pin));
        assert_eq!(service_pin(&member_service(&c, &n, 0)), None);
    }

    #[test]
    fn members_are_spread_required_or_preferred_and_budgeted() {
        let (c, n, pod) = pod();
        let required = spread(pod.clone(), &n, Spread::Required);
        let anti = required
            .spec
            .as_ref()
            .and_then(|s| s.affinity.clone())
            .and_then(|a| a.pod_anti_affinity)
            .expect("anti-affinity");
        let term = &anti
            .required_during_scheduling_ignored_during_execution
            .expect("required")[0];
        assert_eq!(term.topology_key, SPREAD_TOPOLOGY);
        let selector = term
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("labels");
        // Every member of this Cluster, and only of this Cluster.
        assert_eq!(selector, component_labels(&n, Component::Etcd));
        assert_eq!(pod_spread(&required), Some(Spread::Required));
        let preferred = spread(pod.clone(), &n, Spread::Preferred);
        assert_eq!(pod_spread(&preferred), Some(Spread::Preferred));
        assert_eq!(pod_spread(&pod), None);

        let pdb = disruption_budget(&c, &n);
        let spec = pdb.spec.expect("spec");
        // Production: two of three stay, one may go.
        assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
        assert_eq!(spec.max_unavailable, None);
        assert_eq!(
            spec.selector.and_then(|s| s.match_labels),
            Some(component_labels(&n, Component::Etcd))
        );
        assert_eq!(
            pdb.metadata.owner_references.expect("owner")[0].controller,
            Some(true)
        );
    }
}

#[cfg(test)]
mod joining {
    use super::*;

    #[test]
    fn a_member_joining_a_running_cluster_gets_the_live_list_and_existing() {
        let c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let n = Names::new(&c, "cluster.local");
        // The live list: member 0 and the learner just added for slot 2.
        let live = [
            Peer {
                name: n.etcd_member(0),
                peer_url: n.etcd_peer_url(&n.etcd_member(0)),
            },
            Peer {
                name: n.etcd_member(2),
                peer_url: n.etcd_peer_url(&n.etcd_member(2)),
            },
        ];
        let pod = member_pod(
            &c,
            &n,
            &MemberPod {
                index: 2,
                initial_cluster: &live,
                state: ClusterState::Existing,
                version: "3.6.16",
                image: "registry.k8s.io/etcd:3.6.16-0",
                config_hash: "abc",
            },
        );
        let args = pod.spec.expect("spec").containers[0]
            .args
            .clone()
            .expect("args");
        assert!(args.contains(&"--initial-cluster-state=existing".to_string()));
        let flag = format!("--initial-cluster={}", initial_cluster_flag(&live));
        assert!(args.contains(&flag), "{args:?}");
        assert!(
            !args.iter().any(|a| a.contains("prod-east-etcd-1=")),
            "{args:?}"
        );
    }
}
