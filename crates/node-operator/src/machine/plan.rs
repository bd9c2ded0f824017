//! The pure middle of the Machine reconcile: from the Machine, its resolved
//! PackageVersions, its Node and what the host reported, decide what to do
//! next — in which order packages go, whether the host needs a visit at all,
//! what the Node should carry, and what the templates see.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::InstalledPackage;
use kube_on_kube_api::package::PackageVersionSpec;

use crate::bootstrap::MACHINE_LABEL;
use crate::install::Values;
use crate::rollout::node_ready;

/// Node label for the Machine's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Node label for the Machine's IDC.
pub const IDC_LABEL: &str = "kubeonkube.io/idc";

/// One package the Machine should run.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    /// Package name.
    pub package: String,
    /// PackageVersion name.
    pub package_version: String,
    /// Its spec.
    pub spec: PackageVersionSpec,
}

/// Orders packages so that each comes after the packages it depends on
/// (runtime and CNI before kubelet); ties keep name order.
pub fn order(mut wanted: Vec<Wanted>) -> Result<Vec<Wanted>, String> {
    wanted.sort_by(|a, b| a.package.cmp(&b.package));
    let names: BTreeSet<String> = wanted.iter().map(|w| w.package.clone()).collect();
    for w in &wanted {
        if let Some(missing) = w.spec.depends_on.iter().find(|d| !names.contains(*d)) {
            return Err(format!(
                "{} ({}) depends on package {missing}, which neither the Machine nor the ClusterPackageVersion names",
                w.package, w.package_version
            ));
        }
    }
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::with_capacity(wanted.len());
    while !wanted.is_empty() {
        let Some(i) = wanted
            .iter()
            .position(|w| w.spec.depends_on.iter().all(|d| done.contains(d)))
        else {
            let cycle: Vec<&str> = wanted.iter().map(|w| w.package.as_str()).collect();
            return Err(format!(
                "packages depend on each other in a cycle: {}",
                cycle.join(", ")
            ));
        };
        let w = wanted.remove(i);
        done.insert(w.package.clone());
        out.push(w);
    }
    Ok(out)
}

/// The Node name a Machine registers as.
pub fn node_name(machine: &Machine) -> String {
    machine
        .spec
        .hostname
        .clone()
        .unwrap_or_else(|| machine.name_any())
}

/// Labels the Node should carry: the kubelet labels, zone and IDC, and the
/// Machine's name (how Node events find their Machine).
pub fn node_labels(machine: &Machine) -> BTreeMap<String, String> {
    let mut labels = machine.spec.kubelet.node_labels.clone();
    if let Some(zone) = &machine.spec.zone {
        labels.insert(ZONE_LABEL.into(), zone.clone());
    }
    if let Some(idc) = &machine.spec.idc {
        labels.insert(IDC_LABEL.into(), idc.clone());
    }
    labels.insert(MACHINE_LABEL.into(), machine.name_any());
    labels
}

/// Labels of `desired` the Node lacks or has with another value.
pub fn missing_labels(node: &Node, desired: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let have = node.metadata.labels.clone().unwrap_or_default();
    desired
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The Node's taints with the Machine's added where a taint of the same key
/// and effect is missing; `None` when nothing is missing. Taints others put
/// there (cordon, node lifecycle) are kept.
pub fn taints_with(node: &Node, wanted: &[Taint]) -> Option<Vec<Taint>> {
    let have = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let missing: Vec<Taint> = wanted
        .iter()
        .filter(|w| {
            !have
                .iter()
                .any(|h| h.key == w.key && h.effect == w.effect && h.value == w.value)
        })
        .cloned()
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut all: Vec<Taint> = have
        .into_iter()
        .filter(|h| {
            !missing
                .iter()
                .any(|m| m.key == h.key && m.effect == h.effect)
        })
        .collect();
    all.extend(missing);
    Some(all)
}

/// Cluster-wide values for templates, from operator flags and `cluster-info`.
#[derive(Clone, Debug, Default)]
pub struct ClusterValues {
    pub cluster_dns: String,
    pub cluster_domain: String,
    pub api_server: String,
}

/// What the templates of config files and units see for `machine`: strings,
/// except the kubelet settings `registerTaints`, `kubeReserved`,
/// `systemReserved` and `evictionHard`, which are lists and maps for
/// `| yaml`, and `kubeletExtraArgs`, a map of flag name to value.
/// `nodeLabels` is the kubelet's `k=v,k=v` form.
pub fn template_values(machine: &Machine, cluster: &ClusterValues) -> Values {
    let k = &machine.spec.kubelet;
    let labels = node_labels(machine)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let quantities =
        |m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            serde_json::json!(
                m.iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect::<BTreeMap<_, _>>()
            )
        };
    let node = node_name(machine);
    Values::from([
        ("nodeName".to_string(), node.clone().into()),
        ("hostname".to_string(), node.into()),
        ("nodeIP".to_string(), machine.spec.ip.clone().into()),
        ("clusterDNS".to_string(), cluster.cluster_dns.clone().into()),
        (
            "clusterDomain".to_string(),
            cluster.cluster_domain.clone().into(),
        ),
        ("apiServer".to_string(), cluster.api_server.clone().into()),
        ("nodeLabels".to_string(), labels.into()),
        ("registerTaints".to_string(), serde_json::json!(k.taints)),
        ("kubeReserved".to_string(), quantities(&k.kube_reserved)),
        ("systemReserved".to_string(), quantities(&k.system_reserved)),
        (
            "evictionHard".to_string(),
            serde_json::json!(k.eviction_hard),
        ),
        (
            "kubeletExtraArgs".to_string(),
            serde_json::json!(k.extra_args),
        ),
    ])
}

/// Why the host needs a visit over SSH, or how long until it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Nothing to do on the host; look again after this long.
    NotNow(Duration),
    /// Go, for this reason.
    Go(&'static str),
}

/// What decides whether to open an SSH session.
#[derive(Clone, Debug)]
pub struct VisitInput<'a> {
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    pub wanted: &'a [Wanted],
    pub installed: &'a BTreeMap<String, InstalledPackage>,
    /// The Node exists and is Ready.
    pub node_ready: bool,
    /// Time since the host was last checked by this process, if it was.
    pub since_check: Option<Duration>,
    /// How often a Ready Machine's host is re-checked.
    pub recheck: Duration,
    /// How long to wait for a Node after installing before looking again.
    pub node_wait: Duration,
    /// Whether a Node-condition remediation is due.
    pub remediation_due: bool,
    /// Whether the last operation failed.
    pub failed: bool,
}

/// No SSH session when the Machine is Ready and nothing changed since the
/// last check, except the periodic re-check.
pub fn visit(input: &VisitInput<'_>) -> Visit {
    let Some(since) = input.since_check else {
        return Visit::Go("first check since the operator started");
    };
    if input.failed {
        return Visit::Go("retry after a failure");
    }
    if input.observed_generation != input.generation {
        return Visit::Go("the Machine changed");
    }
    let current = input.wanted.iter().all(|w| {
        input
            .installed
            .get(&w.package)
            .is_some_and(|i| i.package_version == w.package_version && i.healthy)
    });
    if !current {
        return Visit::Go("a package is not at its wanted version");
    }
    if input.remediation_due {
        return Visit::Go("a Node problem has a remediation");
    }
    if !input.node_ready {
        return if since >= input.node_wait {
            Visit::Go("the Node is not Ready")
        } else {
            Visit::NotNow((input.node_wait - since).min(Duration::from_secs(5)))
        };
    }
    if since >= input.recheck {
        return Visit::Go("periodic check");
    }
    Visit::NotNow(input.recheck - since)
}

/// A stable point within `interval` for `machine`, so that periodic checks
/// of many Machines do not all fall at the same moment.
pub fn spread(machine: &str, interval: Duration) -> Duration {
    // FNV-1a: stable across processes and releases, unlike the std hasher.
    let hash = machine.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(hash % millis.max(1))
}

/// Whether the Node is Ready (a missing Node is not).
pub fn ready(node: Option<&Node>) -> bool {
    node.is_some_and(node_ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_stable_and_within_the_interval() {
        let interval = Duration::from_secs(300);
        let a = spread("worker-a1", interval);
        assert_eq!(a, spread("worker-a1", interval));
        assert!(a < interval);
        let distinct: BTreeSet<Duration> = (0..20)
            .map(|i| spread(&format!("worker-{i}"), interval))
            .collect();
        assert!(distinct.len() > 10, "{distinct:?}");
        assert_eq!(spread("x", Duration::ZERO), Duration::ZERO);
    }
    use kube_on_kube_api::machine::{KubeletSpec, MachineSpec, SshSpec};
    use kube_on_kube_api::shared::SecretKeyRef;

    fn spec(package: &str, deps: &[&str]) -> Wanted {
        Wanted {
            package: package.into(),
            package_version: format!("{package}-1.0.0"),
            spec: PackageVersionSpec {
                package: package.into(),
                version: "1.0.0".into(),
                artifacts: vec![],
                install: Default::default(),
                health_check: None,
                depends_on: deps.iter().map(|d| d.to_string()).collect(),
            },
        }
    }

    fn machine() -> Machine {
        let mut m = Machine::new(
            "m1",
            MachineSpec {
                hostname: None,
                ip: "10.0.0.5".into(),
                zone: Some("zone-a".into()),
                idc: Some("idc-1".into()),
                ssh: SshSpec {
                    user: "root".into(),
                    port: 22,
                    private_key_secret_ref: serde_json::from_value(
                        serde_json::json!({"name": "k", "namespace": "kube-system"}),
                    )
                    .unwrap(),
                    host_public_key: "ssh-ed25519 AAAA".into(),
                },
                packages: BTreeMap::new(),
                kubelet: KubeletSpec {
                    node_labels: [("pool".to_string(), "general".to_string())].into(),
                    taints: vec![Taint {
                        key: "dedicated".into(),
                        value: Some("batch".into()),
                        effect: "PreferNoSchedule".into(),
                        time_added: None,
                    }],
                    ..Default::default()
                },
                sysctls: BTreeMap::new(),
            },
        );
        m.metadata.generation = Some(1);
        let _: Option<SecretKeyRef> = None;
        m
    }

    #[test]
    fn dependencies_come_first() {
        let ordered = order(vec![
            spec("kubelet", &["containerd", "cni-plugins"]),
            spec("containerd", &[]),
            spec("cni-plugins", &[]),
        ])
        .unwrap();
        let names: Vec<_> = ordered.iter().map(|w| w.package.as_str()).collect();
        assert_eq!(names, vec!["cni-plugins", "containerd", "kubelet"]);
        assert!(
            order(vec![spec("kubelet", &["containerd"])])
                .unwrap_err()
                .contains("containerd")
        );
        assert!(
            order(vec![spec("a", &["b"]), spec("b", &["a"])])
                .unwrap_err()
                .contains("cycle")
        );
    }

    #[test]
    fn node_carries_zone_idc_labels_and_taints() {
        let m = machine();
        let labels = node_labels(&m);
        assert_eq!(labels[ZONE_LABEL], "zone-a");
        assert_eq!(labels[IDC_LABEL], "idc-1");
        assert_eq!(labels[MACHINE_LABEL], "m1");
        let mut node = Node::default();
        assert_eq!(missing_labels(&node, &labels).len(), 4);
        node.metadata.labels = Some(labels.clone());
        assert!(missing_labels(&node, &labels).is_empty());
        let with = taints_with(&node, &m.spec.kubelet.taints).unwrap();
        assert_eq!(with.len(), 1);
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![
                Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                },
                with[0].clone(),
            ]),
            ..Default::default()
        });
        assert_eq!(taints_with(&node, &m.spec.kubelet.taints), None);
    }

    #[test]
    fn templates_see_kubelet_flags_and_flow_maps() {
        let values = template_values(
            &machine(),
            &ClusterValues {
                cluster_dns: "10.0.0.10".into(),
                cluster_domain: "cluster.local".into(),
                api_server: "https://a:6443".into(),
            },
        );
        assert_eq!(values["nodeName"], "m1");
        assert_eq!(values["nodeIP"], "10.0.0.5");
        let labels = values["nodeLabels"].as_str().unwrap();
        assert!(labels.contains("topology.kubernetes.io/zone=zone-a"));
        assert!(labels.contains("pool=general"));
        assert_eq!(
            values["registerTaints"],
            serde_json::json!([{"effect":"PreferNoSchedule","key":"dedicated","value":"batch"}])
        );
        assert_eq!(values["kubeReserved"], serde_json::json!({}));
    }

    #[test]
    fn a_ready_unchanged_machine_is_left_alone_until_the_recheck() {
        let wanted = vec![spec("kubelet", &[])];
        let installed = BTreeMap::from([(
            "kubelet".to_string(),
            InstalledPackage {
                version: "1.0.0".into(),
                package_version: "kubelet-1.0.0".into(),
                previous: None,
                healthy: true,
            },
        )]);
        let mut input = VisitInput {
            generation: Some(2),
            observed_generation: Some(2),
            wanted: &wanted,
            installed: &installed,
            node_ready: true,
            since_check: Some(Duration::from_secs(10)),
            recheck: Duration::from_secs(300),
            node_wait: Duration::from_secs(60),
            remediation_due: false,
            failed: false,
        };
        assert_eq!(visit(&input), Visit::NotNow(Duration::from_secs(290)));
        input.since_check = Some(Duration::from_secs(300));
        assert_eq!(visit(&input), Visit::Go("periodic check"));
        input.since_check = Some(Duration::from_secs(10));
        input.observed_generation = Some(1);
        assert!(matches!(visit(&input), Visit::Go(_)));
        input.observed_generation = Some(2);
        input.node_ready = false;
        assert!(matches!(visit(&input), Visit::NotNow(_)));
        input.since_check = Some(Duration::from_secs(61));
        assert_eq!(visit(&input), Visit::Go("the Node is not Ready"));
        input.since_check = None;
        assert!(matches!(visit(&input), Visit::Go(_)));
        let other = vec![Wanted {
            package_version: "kubelet-2.0.0".into(),
            ..spec("kubelet", &[])
        }];
        input.wanted = &other;
        input.since_check = Some(Duration::from_secs(1));
        input.node_ready = true;
        assert_eq!(
            visit(&input),
            Visit::Go("a package is not at its wanted version")
        );
    }
}
