//! What version each Machine should run and whether it may start changing now:
//! precedence of canary marks, Machine overrides and the cluster default, and
//! the cluster-wide disruption budget (`maxUnavailable`) every reconcile shares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kok_common::conditions::Status;
use kube::ResourceExt;
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};

/// Annotation on a Machine naming the CanaryRelease that claims it. Two
/// releases never claim the same Machine.
pub const CANARY_ANNOTATION: &str = "kubeonkube.io/canary";
/// Annotation on a claimed Machine with a JSON object package → PackageVersion
/// name. Set when the Machine's batch is released; on rollback it names the
/// Machine's previous PackageVersions.
pub const CANARY_PACKAGES_ANNOTATION: &str = "kubeonkube.io/canary-packages";

/// What a Machine should run, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// Package name → PackageVersion name.
    pub packages: BTreeMap<String, String>,
    /// Package name → where its PackageVersion came from.
    pub source: BTreeMap<String, Source>,
}

impl Target {
    /// The PackageVersion name `package` should be at, if any.
    pub fn package_version(&self, package: &str) -> Option<&str> {
        self.packages.get(package).map(String::as_str)
    }

    /// Packages whose PackageVersion comes from the cluster default.
    pub fn follows_default(&self) -> impl Iterator<Item = &str> {
        self.source
            .iter()
            .filter(|(_, s)| **s == Source::ClusterDefault)
            .map(|(p, _)| p.as_str())
    }
}

/// Why a Machine runs a given PackageVersion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The Machine's own `spec.packages` entry.
    Override,
    /// The CanaryRelease of that name released it to this Machine.
    Canary(String),
    /// The ClusterPackageVersion default.
    ClusterDefault,
}

/// The CanaryRelease claiming `machine`, if any.
pub fn canary_claim(machine: &Machine) -> Option<&str> {
    machine
        .annotations()
        .get(CANARY_ANNOTATION)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// The PackageVersions a claiming CanaryRelease released to `machine`. A
/// malformed annotation is treated as absent (the Machine keeps its other
/// versions) rather than failing every reconcile of the Machine.
pub fn canary_packages(machine: &Machine) -> Option<BTreeMap<String, String>> {
    canary_claim(machine)?;
    let raw = machine.annotations().get(CANARY_PACKAGES_ANNOTATION)?;
    serde_json::from_str(raw).ok()
}

/// Resolve what `machine` should run. Precedence: canary marks, then the
/// Machine's `spec.packages` override, then the ClusterPackageVersion default.
pub fn target(machine: &Machine, cpv: Option<&ClusterPackageVersion>) -> Target {
    let mut t = Target::default();
    if let Some(cpv) = cpv {
        for (pkg, pv) in &cpv.spec.packages {
            t.packages.insert(pkg.clone(), pv.clone());
            t.source.insert(pkg.clone(), Source::ClusterDefault);
        }
    }
    for (pkg, pv) in &machine.spec.packages {
        t.packages.insert(pkg.clone(), pv.clone());
        t.source.insert(pkg.clone(), Source::Override);
    }
    if let (Some(claim), Some(packages)) = (canary_claim(machine), canary_packages(machine)) {
        for (pkg, pv) in packages {
            t.packages.insert(pkg.clone(), pv);
            t.source.insert(pkg, Source::Canary(claim.to_string()));
        }
    }
    t
}

/// Whether `pv` (looked up by `name`) can serve as `package`'s version: it
/// exists and is a version of that package. The message says what is wrong.
pub fn check_package_version(
    package: &str,
    name: &str,
    pv: Option<&PackageVersion>,
) -> Result<(), String> {
    match pv {
        None => Err(format!("{package}: PackageVersion {name} does not exist")),
        Some(pv) if pv.spec.package != package => Err(format!(
            "{package}: PackageVersion {name} is a version of {}, not {package}",
            pv.spec.package
        )),
        Some(_) => Ok(()),
    }
}

/// Whether the Node named by a Machine is Ready.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Ready" && c.status == Status::True)
        })
}

/// Every Machine, without managed fields (read in pages).
pub async fn list_machines(client: &kube::Client) -> Result<Vec<Machine>, kube::Error> {
    let api = kube::Api::<Machine>::all(client.clone());
    kok_common::client::list_paged(&api, &Default::default(), |mut m: Machine| {
        m.metadata.managed_fields = None;
        m
    })
    .await
}

/// Every Node as far as availability and canary gates look at it: its name,
/// labels and conditions (type, status, reason), read in pages. A whole Node
/// also carries images, addresses, capacity and managed fields, which at
/// thousands of Nodes is most of the memory a list takes.
pub async fn list_nodes(client: &kube::Client) -> Result<Vec<Node>, kube::Error> {
    let api = kube::Api::<Node>::all(client.clone());
    kok_common::client::list_paged(&api, &Default::default(), slim_node).await
}

fn slim_node(node: Node) -> Node {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let conditions = node.status.and_then(|s| s.conditions).map(|cs| {
        cs.into_iter()
            .map(|c| NodeCondition {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                ..Default::default()
            })
            .collect()
    });
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name,
            labels: node.metadata.labels,
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions,
            ..Default::default()
        }),
    }
}

/// Whether `machine` counts against the disruption budget: it is changing or
/// broken (Provisioning, Upgrading, Repairing, Failed), or it has a Node that is
/// not Ready or gone. `node` is the Machine's Node if it exists.
pub fn is_unavailable(machine: &Machine, node: Option<&Node>) -> bool {
    let status = machine.status.as_ref();
    let busy = matches!(
        status.and_then(|s| s.phase),
        Some(
            MachinePhase::Provisioning
                | MachinePhase::Upgrading
                | MachinePhase::Repairing
                | MachinePhase::Failed
        )
    );
    let has_node = status.and_then(|s| s.node_name.as_ref()).is_some();
    busy || (has_node && !node.is_some_and(node_ready))
}

/// Names of the Machines that are unavailable now, given every Machine and every
/// Node of the cluster.
pub fn unavailable<'a>(
    machines: impl IntoIterator<Item = &'a Machine>,
    nodes: &[Node],
) -> BTreeSet<String> {
    let by_name: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect();
    machines
        .into_iter()
        .filter(|m| {
            let node = m
                .status
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .and_then(|n| by_name.get(n).copied());
            is_unavailable(m, node)
        })
        .map(|m| m.name_any())
        .collect()
}

/// How many Machines may be unavailable at once: a count, or a percentage of
/// `machines` rounded down. At least one, so a rollout always moves.
pub fn max_unavailable(value: &IntOrString, machines: usize) -> usize {
    let n = match value {
        IntOrString::Int(i) => usize::try_from(*i).unwrap_or(0),
        IntOrString::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<usize>().ok()) {
            Some(percent) => machines.saturating_mul(percent.min(100)) / 100,
            None => s.parse::<usize>().unwrap_or(1),
        },
    };
    n.max(1)
}

/// The cluster's budget: from the ClusterPackageVersion's `rollout`, or one
/// Machine at a time when there is none.
pub fn budget(cpv: Option<&ClusterPackageVersion>, machines: usize) -> usize {
    match cpv {
        Some(cpv) => max_unavailable(&cpv.spec.rollout.max_unavailable, machines),
        None => 1,
    }
}

/// In-memory admission of Machines into disruption (an upgrade or repair that
/// stops a package), shared by every reconcile through the Context. A Machine
/// is admitted when the Machines unavailable now plus those already admitted,
/// other than itself, leave room under the budget.
#[derive(Debug, Default, Clone)]
pub struct Gate {
    admitted: Arc<Mutex<BTreeMap<String, usize>>>,
}

/// A Machine's admission into disruption. Dropping it releases the slot.
#[derive(Debug)]
pub struct Permit {
    gate: Gate,
    machine: String,
}

impl Permit {
    /// The Machine admitted.
    pub fn machine(&self) -> &str {
        &self.machine
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut admitted = self.gate.lock();
        if let Some(count) = admitted.get_mut(&self.machine) {
            *count -= 1;
            if *count == 0 {
                admitted.remove(&self.machine);
            }
        }
    }
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, usize>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every update is one insert or remove), so a poisoned lock is usable.
        self.admitted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admit `machine` into disruption if the budget allows. `unavailable_now`
    /// are the Machines unavailable by their status and Nodes. A Machine that
    /// already holds a Permit is admitted again (the slot is shared until every
    /// Permit of it is dropped).
    pub fn try_admit(
        &self,
        machine: &str,
        unavailable_now: &BTreeSet<String>,
        max_unavailable: usize,
    ) -> Option<Permit> {
        let mut admitted = self.lock();
        if let Some(count) = admitted.get_mut(machine) {
            *count += 1;
        } else {
            let occupied = unavailable_now
                .iter()
                .map(String::as_str)
                .chain(admitted.keys().map(String::as_str))
                .filter(|m| *m != machine)
                .collect::<BTreeSet<_>>()
                .len();
            if occupied >= max_unavailable {
                return None;
            }
            admitted.insert(machine.to_string(), 1);
        }
        Some(Permit {
            gate: self.clone(),
            machine: machine.to_string(),
        })
    }

    /// Machines holding a Permit now.
    pub fn admitted(&self) -> BTreeSet<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use kube_on_kube_api::package::RolloutSpec;
    use kube_on_kube_api::{ClusterPackageVersionSpec, MachineSpec, MachineStatus};

    fn machine(name: &str, overrides: &[(&str, &str)], annotations: &[(&str, &str)]) -> Machine {
        let spec: MachineSpec = serde_json::from_value(serde_json::json!({
            "ip": "10.0.0.1",
            "ssh": {
                "privateKeySecretRef": {"name": "k", "namespace": "kube-system"},
                "hostPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"
            },
            "packages": overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        }))
        .expect("valid machine spec");
        let mut m = Machine::new(name, spec);
        m.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        m
    }

    fn cpv(packages: &[(&str, &str)], max: IntOrString) -> ClusterPackageVersion {
        ClusterPackageVersion::new(
            "default",
            ClusterPackageVersionSpec {
                packages: packages
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                rollout: RolloutSpec {
                    max_unavailable: max,
                },
            },
        )
    }

    #[test]
    fn default_override_and_canary_precedence() {
        let c = cpv(
            &[
                ("containerd", "containerd-2.0.0"),
                ("kubelet", "kubelet-1.35.0"),
                ("cni", "cni-1.6.0"),
            ],
            IntOrString::Int(1),
        );
        let m = machine(
            "a",
            &[("kubelet", "kubelet-1.35.1"), ("cni", "cni-1.7.0")],
            &[
                (CANARY_ANNOTATION, "rel"),
                (CANARY_PACKAGES_ANNOTATION, r#"{"cni":"cni-1.8.0"}"#),
            ],
        );
        let t = target(&m, Some(&c));
        assert_eq!(t.package_version("containerd"), Some("containerd-2.0.0"));
        assert_eq!(t.source["containerd"], Source::ClusterDefault);
        assert_eq!(t.package_version("kubelet"), Some("kubelet-1.35.1"));
        assert_eq!(t.source["kubelet"], Source::Override);
        assert_eq!(t.package_version("cni"), Some("cni-1.8.0"));
        assert_eq!(t.source["cni"], Source::Canary("rel".into()));
        assert_eq!(t.follows_default().collect::<Vec<_>>(), vec!["containerd"]);
    }

    #[test]
    fn canary_packages_need_the_claim_and_valid_json() {
        let c = cpv(&[("kubelet", "kubelet-1.35.0")], IntOrString::Int(1));
        let unclaimed = machine(
            "a",
            &[],
            &[(CANARY_PACKAGES_ANNOTATION, r#"{"kubelet":"kubelet-9.9.9"}"#)],
        );
        assert_eq!(
            target(&unclaimed, Some(&c)).package_version("kubelet"),
            Some("kubelet-1.35.0")
        );
        let claimed_not_released = machine("a", &[], &[(CANARY_ANNOTATION, "rel")]);
        assert_eq!(
            target(&claimed_not_released, Some(&c)).source["kubelet"],
            Source::ClusterDefault
        );
        let malformed = machine(
            "a",
            &[],
            &[
                (CANARY_ANNOTATION, "rel"),
                (CANARY_PACKAGES_ANNOTATION, "kubelet=kubelet-9"),
            ],
        );
        assert_eq!(
            target(&malformed, Some(&c)).package_version("kubelet"),
            Some("kubelet-1.35.0")
        );
    }

    #[test]
    fn no_default_means_only_overrides() {
        let m = machine("a", &[("kubelet", "kubelet-1.35.1")], &[]);
        let t = target(&m, None);
        assert_eq!(t.packages.len(), 1);
        assert_eq!(t.source["kubelet"], Source::Override);
    }

    #[test]
    fn max_unavailable_counts_and_percentages() {
        assert_eq!(max_unavailable(&IntOrString::Int(1), 3), 1);
        assert_eq!(max_unavailable(&IntOrString::Int(5), 3), 5);
        assert_eq!(max_unavailable(&IntOrString::Int(0), 3), 1);
        assert_eq!(max_unavailable(&IntOrString::String("10%".into()), 100), 10);
        assert_eq!(max_unavailable(&IntOrString::String("10%".into()), 19), 1);
        assert_eq!(max_unavailable(&IntOrString::String("10%".into()), 3), 1);
        assert_eq!(max_unavailable(&IntOrString::String("50%".into()), 5), 2);
        assert_eq!(max_unavailable(&IntOrString::String("100%".into()), 7), 7);
        assert_eq!(budget(None, 10), 1);
        assert_eq!(
            budget(Some(&cpv(&[], IntOrString::String("25%".into()))), 8),
            2
        );
    }

    fn with_status(mut m: Machine, phase: MachinePhase, node: Option<&str>) -> Machine {
        m.status = Some(MachineStatus {
            phase: Some(phase),
            node_name: node.map(str::to_string),
            ..Default::default()
        });
        m
    }

    fn node(name: &str, ready: bool) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn unavailable_from_phase_and_node() {
        let ms = vec![
            with_status(machine("ready", &[], &[]), MachinePhase::Ready, Some("n1")),
            with_status(
                machine("upg", &[], &[]),
                MachinePhase::Upgrading,
                Some("n2"),
            ),
            with_status(
                machine("notready", &[], &[]),
                MachinePhase::Ready,
                Some("n3"),
            ),
            with_status(machine("gone", &[], &[]), MachinePhase::Ready, Some("n4")),
            with_status(machine("failed", &[], &[]), MachinePhase::Failed, None),
            with_status(machine("pending", &[], &[]), MachinePhase::Pending, None),
            machine("new", &[], &[]),
        ];
        let nodes = vec![node("n1", true), node("n2", true), node("n3", false)];
        let got = unavailable(&ms, &nodes);
        let want: BTreeSet<String> = ["upg", "notready", "gone", "failed"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn package_version_must_exist_and_match_the_package() {
        let pv: PackageVersion = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "PackageVersion",
            "metadata": {"name": "kubelet-1.35.0"},
            "spec": {
                "package": "kubelet",
                "version": "1.35.0",
                "artifacts": [{"arch": "amd64", "url": "http://x/k.tgz", "sha256": "0".repeat(64)}]
            }
        }))
        .expect("valid PackageVersion");
        assert_eq!(
            check_package_version("kubelet", "kubelet-1.35.0", Some(&pv)),
            Ok(())
        );
        let wrong = check_package_version("containerd", "kubelet-1.35.0", Some(&pv));
        assert!(wrong.is_err_and(|e| e.contains("is a version of kubelet, not containerd")));
        let missing = check_package_version("kubelet", "kubelet-9.9.9", None);
        assert!(missing.is_err_and(|e| e.contains("kubelet-9.9.9 does not exist")));
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn gate_counts_unavailable_and_admitted() {
        let gate = Gate::default();
        let a = gate.try_admit("a", &set(&[]), 1).expect("room for a");
        assert!(
            gate.try_admit("b", &set(&[]), 1).is_none(),
            "a holds the slot"
        );
        assert_eq!(gate.admitted(), set(&["a"]));
        drop(a);
        assert!(gate.admitted().is_empty());
        // An unavailable Machine other than the asker occupies a slot...
        assert!(gate.try_admit("b", &set(&["c"]), 1).is_none());
        // ...but the asker's own unavailability does not.
        let b = gate.try_admit("b", &set(&["b"]), 1).expect("b itself down");
        // A Machine both admitted and unavailable is counted once.
        let c = gate
            .try_admit("c", &set(&["b"]), 2)
            .expect("b counted once");
        assert!(gate.try_admit("d", &set(&["b"]), 2).is_none());
        drop((b, c));
        assert!(gate.admitted().is_empty());
    }

    #[test]
    fn readmission_shares_the_slot_until_every_permit_drops() {
        let gate = Gate::default();
        let first = gate.try_admit("a", &set(&[]), 1).expect("room");
        let second = gate.try_admit("a", &set(&[]), 1).expect("same machine");
        drop(first);
        assert!(
            gate.try_admit("b", &set(&[]), 1).is_none(),
            "a still holds it"
        );
        drop(second);
        assert!(gate.try_admit("b", &set(&[]), 1).is_some());
    }

    /// Many threads race to admit Machines under random budgets and hold times;
    /// at no moment do more Machines hold Permits than the budget allows.
    #[test]
    fn concurrent_admissions_never_exceed_the_budget() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        for (seed, budget) in [(1u64, 1usize), (7, 2), (42, 3), (99, 5)] {
            let gate = Gate::default();
            let holding = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let admissions = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..12u64)
                .map(|t| {
                    let (gate, holding, peak, admissions) = (
                        gate.clone(),
                        holding.clone(),
                        peak.clone(),
                        admissions.clone(),
                    );
                    std::thread::spawn(move || {
                        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(t + 1);
                        let mut next = move || {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x
                        };
                        let name = format!("m{t}");
                        for _ in 0..300 {
                            if let Some(permit) = gate.try_admit(&name, &BTreeSet::new(), budget) {
                                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                admissions.fetch_add(1, Ordering::SeqCst);
                                if next() % 3 == 0 {
                                    std::thread::yield_now();
                                }
                                holding.fetch_sub(1, Ordering::SeqCst);
                                drop(permit);
                            } else if next() % 2 == 0 {
                                std::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("thread finished");
            }
            let peak = peak.load(Ordering::SeqCst);
            assert!(peak <= budget, "peak {peak} over budget {budget}");
            assert!(admissions.load(Ordering::SeqCst) > 0);
            assert!(gate.admitted().is_empty());
        }
    }
}
