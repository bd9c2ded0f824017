//! The ClusterPackageVersion controller: checks that every default names an
//! existing PackageVersion of the right package, and summarises in status how
//! far the cluster has rolled to the defaults. The Machines themselves are
//! moved by the Machine controller, which finds the ones a new default affects
//! with [`machines_affected_by`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{
    ClusterPackageVersion, ClusterPackageVersionStatus, Machine, PackageVersion,
};

use crate::Error;
use crate::rollout;

/// Field manager of the ClusterPackageVersion status.
pub const MANAGER: &str = "node-operator-cpv";
/// The one ClusterPackageVersion of a cluster.
pub const NAME: &str = "default";
/// Condition: True when a default names a PackageVersion that does not exist or
/// belongs to another package; nothing is rolled while it is True.
pub const MISSING_PACKAGE_VERSION: &str = "MissingPackageVersion";
/// Condition: True when every Machine following the defaults runs them and is
/// Ready.
pub const ROLLED_OUT: &str = "RolledOut";

/// Problems with the defaults: one message per default that names a missing
/// PackageVersion or one of another package. Empty when all are usable.
pub fn invalid_defaults(
    cpv: &ClusterPackageVersion,
    pvs: &BTreeMap<String, PackageVersion>,
) -> Vec<String> {
    cpv.spec
        .packages
        .iter()
        .filter_map(|(pkg, name)| rollout::check_package_version(pkg, name, pvs.get(name)).err())
        .collect()
}

/// The Machines a change of the defaults to `cpv` must reconcile: those that
/// follow the default for a package and do not run the default yet. For the
/// Machine controller's `.watches()` mapper.
pub fn machines_affected_by<'a>(
    cpv: &ClusterPackageVersion,
    machines: impl IntoIterator<Item = &'a Machine>,
) -> Vec<ObjectRef<Machine>> {
    machines
        .into_iter()
        .filter(|m| !pending_defaults(m, cpv).is_empty())
        .map(ObjectRef::from_obj)
        .collect()
}

/// Packages of `machine` that follow the default of `cpv` but do not have it
/// installed.
fn pending_defaults(machine: &Machine, cpv: &ClusterPackageVersion) -> Vec<String> {
    let target = rollout::target(machine, Some(cpv));
    let installed = machine.status.as_ref().map(|s| &s.installed);
    target
        .follows_default()
        .filter(|pkg| {
            let want = target.package_version(pkg);
            installed
                .and_then(|i| i.get(*pkg))
                .map(|p| p.package_version.as_str())
                != want
        })
        .map(str::to_string)
        .collect()
}

/// How far the cluster has rolled to its defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Machines following the default for at least one package.
    pub machines: usize,
    /// Of those, Machines running every default they follow, Ready.
    pub up_to_date: usize,
    /// Of those, Machines changing or not Ready.
    pub unavailable: usize,
    /// Package → (Machines running its default, Machines following it).
    pub packages: BTreeMap<String, (usize, usize)>,
}

impl Summary {
    /// One line per package, for the RolledOut condition.
    pub fn describe(&self, cpv: &ClusterPackageVersion) -> String {
        self.packages
            .iter()
            .map(|(pkg, (at, of))| {
                let pv = cpv.spec.packages.get(pkg).map_or("", String::as_str);
                format!("{pkg}: {at}/{of} at {pv}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Summarise `machines` (with the cluster's `nodes`) against the defaults.
pub fn summarize<'a>(
    cpv: &ClusterPackageVersion,
    machines: impl IntoIterator<Item = &'a Machine> + Clone,
    nodes: &[Node],
) -> Summary {
    let unavailable = rollout::unavailable(machines.clone(), nodes);
    let mut summary = Summary::default();
    for pkg in cpv.spec.packages.keys() {
        summary.packages.insert(pkg.clone(), (0, 0));
    }
    for m in machines {
        let target = rollout::target(m, Some(cpv));
        let following: Vec<&str> = target.follows_default().collect();
        if following.is_empty() {
            continue;
        }
        summary.machines += 1;
        let pending = pending_defaults(m, cpv);
        for pkg in &following {
            let entry = summary.packages.entry(pkg.to_string()).or_default();
            entry.1 += 1;
            if !pending.iter().any(|p| p == pkg) {
                entry.0 += 1;
            }
        }
        let down = unavailable.contains(&m.name_any());
        let ready = m.status.as_ref().and_then(|s| s.phase) == Some(MachinePhase::Ready);
        if down {
            summary.unavailable += 1;
        } else if pending.is_empty() && ready {
            summary.up_to_date += 1;
        }
    }
    summary
}

/// The status to write: counts from `summary`, and the two conditions.
pub fn build_status(
    cpv: &ClusterPackageVersion,
    problems: &[String],
    summary: &Summary,
    now: Timestamp,
) -> ClusterPackageVersionStatus {
    let generation = cpv.metadata.generation;
    let mut conds: Vec<Condition> = cpv
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let (status, reason, message) = if problems.is_empty() {
        (
            Status::False,
            "AllFound",
            "every default names a PackageVersion of its package".to_string(),
        )
    } else {
        (Status::True, "MissingPackageVersion", problems.join("; "))
    };
    conditions::set(
        &mut conds,
        Desired {
            type_: MISSING_PACKAGE_VERSION,
            status,
            reason,
            message,
        },
        generation,
        now,
    );
    let rolled = problems.is_empty() && summary.up_to_date == summary.machines;
    let (reason, message) = if !problems.is_empty() {
        (
            "MissingPackageVersion",
            "nothing is rolled until every default names a usable PackageVersion".to_string(),
        )
    } else if rolled {
        ("RolledOut", summary.describe(cpv))
    } else {
        ("RollingOut", summary.describe(cpv))
    };
    conditions::set(
        &mut conds,
        Desired {
            type_: ROLLED_OUT,
            status: rolled.into(),
            reason,
            message,
        },
        generation,
        now,
    );
    ClusterPackageVersionStatus {
        observed_generation: generation,
        machines: count(summary.machines),
        up_to_date: count(summary.up_to_date),
        unavailable: count(summary.unavailable),
        conditions: conds,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// What the ClusterPackageVersion reconcile shares.
pub struct Context {
    /// Client of the business cluster.
    pub client: Client,
    /// Publishes Events on the ClusterPackageVersion.
    pub recorder: Recorder,
    /// The watched Machines (updated before a change of one wakes the summary).
    pub machines: Store<Machine>,
    /// When the last summary started (see [`SUMMARY_INTERVAL`]).
    pub last_pass: std::sync::Mutex<Option<std::time::Instant>>,
}

/// The shortest time between two summaries. Every Machine change wakes the
/// summary, and each pass reads every Machine and Node: during a rollout or
/// an operator start at thousands of Machines, a pass per change would keep
/// the API server busy listing them. Changes that arrive while a pass waits
/// are folded into it (the controller runs one pass of an object at a time),
/// and it reads everything afresh.
const SUMMARY_INTERVAL: Duration = Duration::from_secs(2);

/// Summarise and validate one ClusterPackageVersion.
pub async fn reconcile(
    cpv: Arc<ClusterPackageVersion>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let client = &ctx.client;
    let since = ctx
        .last_pass
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map(|at| at.elapsed());
    if let Some(wait) = since.and_then(|s| SUMMARY_INTERVAL.checked_sub(s)) {
        tokio::time::sleep(wait).await;
    }
    *ctx.last_pass.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    // The controller's cache can lag behind the status the last reconcile
    // wrote; comparing with that older status would repeat its Events.
    let Some(cpv) = Api::<ClusterPackageVersion>::all(client.clone())
        .get_opt(&cpv.name_any())
        .await
        .map_err(Error::kube(format!(
            "get ClusterPackageVersion {}",
            cpv.name_any()
        )))?
    else {
        return Ok(Action::await_change());
    };
    let pvs: BTreeMap<String, PackageVersion> = Api::<PackageVersion>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list PackageVersions"))?
        .items
        .into_iter()
        .map(|pv| (pv.name_any(), pv))
        .collect();
    if !kok_common::health::wait_until_ready(&ctx.machines).await {
        return Ok(Action::await_change());
    }
    let machines = ctx.machines.state();
    let nodes = rollout::list_nodes(client)
        .await
        .map_err(Error::kube("list Nodes"))?;

    let problems = invalid_defaults(&cpv, &pvs);
    let summary = summarize(&cpv, machines.iter().map(AsRef::as_ref), &nodes);
    let status = build_status(&cpv, &problems, &summary, Timestamp::now());

    let before = cpv.status.clone().unwrap_or_default();
    for (type_, became_true) in transitions(&before.conditions, &status.conditions) {
        let (type_ev, reason, note) = match (type_.as_str(), became_true) {
            (MISSING_PACKAGE_VERSION, true) => (
                EventType::Warning,
                "MissingPackageVersion",
                problems.join("; "),
            ),
            (MISSING_PACKAGE_VERSION, false) => (
                EventType::Normal,
                "PackageVersionsFound",
                "every default names a PackageVersion of its package".to_string(),
            ),
            (ROLLED_OUT, true) => (EventType::Normal, "RolledOut", summary.describe(&cpv)),
            _ => continue,
        };
        kok_common::events::publish(
            &ctx.recorder,
            &cpv.object_ref(&()),
            type_ev,
            reason,
            "Rollout",
            &note,
            None,
        )
        .await;
    }
    if before != status {
        let api = Api::<ClusterPackageVersion>::all(client.clone());
        kok_common::apply::apply_status(&api, MANAGER, &cpv.name_any(), &status).await?;
    }
    // Node readiness is not watched here; look again now and then.
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Condition types whose status changed between `before` and `after`, each with
/// whether it is now True. A condition new in `after` counts as changed only
/// when it is True, except MissingPackageVersion, whose first False is quiet.
fn transitions(before: &[Condition], after: &[Condition]) -> Vec<(String, bool)> {
    after
        .iter()
        .filter(|c| match before.iter().find(|b| b.type_ == c.type_) {
            Some(b) => b.status != c.status,
            None => c.status == Status::True,
        })
        .map(|c| (c.type_.clone(), c.status == Status::True))
        .collect()
}

/// Run the ClusterPackageVersion controller until shutdown. It reconciles the
/// one ClusterPackageVersion on any change of it, a Machine or a
/// PackageVersion.
pub async fn run(
    client: Client,
    machines: Store<Machine>,
    changes: impl Stream<Item = Arc<Machine>> + Send + 'static,
) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), Reporter::from("node-operator")),
        machines,
        last_pass: Default::default(),
    });
    let controller = Controller::new(
        Api::<ClusterPackageVersion>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_shared_stream(changes, |_: Arc<Machine>| {
        Some(ObjectRef::<ClusterPackageVersion>::new(NAME))
    })
    .watches(
        Api::<PackageVersion>::all(client.clone()),
        watcher::Config::default(),
        |_: PackageVersion| Some(ObjectRef::<ClusterPackageVersion>::new(NAME)),
    );
    kok_common::controller::run(
        "clusterpackageversion",
        controller,
        reconcile,
        error_policy,
        ctx,
        Error::category,
    )
    .await;
}

fn error_policy(cpv: Arc<ClusterPackageVersion>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %cpv.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube_on_kube_api::machine::InstalledPackage;
    use kube_on_kube_api::package::RolloutSpec;
    use kube_on_kube_api::{ClusterPackageVersionSpec, MachineStatus};

    fn cpv(packages: &[(&str, &str)]) -> ClusterPackageVersion {
        let mut c = ClusterPackageVersion::new(
            NAME,
            ClusterPackageVersionSpec {
                packages: packages
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                rollout: RolloutSpec {
                    max_unavailable: IntOrString::Int(1),
                },
            },
        );
        c.metadata.generation = Some(3);
        c
    }

    fn pv(name: &str, package: &str) -> (String, PackageVersion) {
        let pv: PackageVersion = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "PackageVersion",
            "metadata": {"name": name},
            "spec": {
                "package": package,
                "version": "1.0.0",
                "artifacts": [{"arch": "amd64", "url": "http://x/p.tgz", "sha256": "0".repeat(64)}]
            }
        }))
        .expect("valid PackageVersion");
        (name.to_string(), pv)
    }

    fn machine(
        name: &str,
        overrides: &[(&str, &str)],
        installed: &[(&str, &str)],
        phase: MachinePhase,
        node: &str,
    ) -> Machine {
        let mut m: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name},
            "spec": {
                "ip": "10.0.0.1",
                "ssh": {
                    "privateKeySecretRef": {"name": "k", "namespace": "kube-system"},
                    "hostPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"
                },
                "packages": overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            }
        }))
        .expect("valid Machine");
        m.status = Some(MachineStatus {
            phase: Some(phase),
            node_name: Some(node.into()),
            installed: installed
                .iter()
                .map(|(pkg, pv)| {
                    (
                        pkg.to_string(),
                        InstalledPackage {
                            version: "1.0.0".into(),
                            package_version: pv.to_string(),
                            previous: None,
                            healthy: true,
                        },
                    )
                })
                .collect(),
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
    fn defaults_must_name_existing_versions_of_their_package() {
        let c = cpv(&[
            ("kubelet", "kubelet-2"),
            ("containerd", "kubelet-1"),
            ("cni", "cni-9"),
        ]);
        let pvs: BTreeMap<_, _> = [pv("kubelet-1", "kubelet"), pv("kubelet-2", "kubelet")].into();
        let problems = invalid_defaults(&c, &pvs);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("cni-9 does not exist"));
        assert!(problems[1].contains("kubelet-1 is a version of kubelet, not containerd"));
        let ok = cpv(&[("kubelet", "kubelet-2")]);
        assert!(invalid_defaults(&ok, &pvs).is_empty());
    }

    #[test]
    fn affected_machines_follow_the_default_and_lack_it() {
        let c = cpv(&[("kubelet", "kubelet-2"), ("containerd", "c-1")]);
        let ms = vec![
            machine(
                "at-default",
                &[],
                &[("kubelet", "kubelet-2"), ("containerd", "c-1")],
                MachinePhase::Ready,
                "n1",
            ),
            machine(
                "behind",
                &[],
                &[("kubelet", "kubelet-1"), ("containerd", "c-1")],
                MachinePhase::Ready,
                "n2",
            ),
            machine(
                "pinned",
                &[("kubelet", "kubelet-1")],
                &[("kubelet", "kubelet-1"), ("containerd", "c-1")],
                MachinePhase::Ready,
                "n3",
            ),
            machine(
                "pinned-behind",
                &[("kubelet", "kubelet-1")],
                &[("kubelet", "kubelet-1")],
                MachinePhase::Ready,
                "n4",
            ),
        ];
        let got: Vec<String> = machines_affected_by(&c, &ms)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(got, vec!["behind", "pinned-behind"]);
    }

    #[test]
    fn summary_counts_defaults_up_to_date_and_unavailable() {
        let c = cpv(&[("kubelet", "kubelet-2")]);
        let ms = vec![
            machine(
                "a",
                &[],
                &[("kubelet", "kubelet-2")],
                MachinePhase::Ready,
                "n1",
            ),
            machine(
                "b",
                &[],
                &[("kubelet", "kubelet-1")],
                MachinePhase::Upgrading,
                "n2",
            ),
            machine(
                "c",
                &[],
                &[("kubelet", "kubelet-1")],
                MachinePhase::Ready,
                "n3",
            ),
            machine(
                "d",
                &[],
                &[("kubelet", "kubelet-2")],
                MachinePhase::Ready,
                "n4",
            ),
            machine(
                "pinned",
                &[("kubelet", "kubelet-1")],
                &[("kubelet", "kubelet-1")],
                MachinePhase::Ready,
                "n5",
            ),
        ];
        let nodes = vec![
            node("n1", true),
            node("n2", true),
            node("n3", true),
            node("n4", false),
            node("n5", true),
        ];
        let s = summarize(&c, &ms, &nodes);
        assert_eq!(s.machines, 4);
        assert_eq!(s.up_to_date, 1, "only a is at the default and Ready");
        assert_eq!(s.unavailable, 2, "b upgrading, d's Node not Ready");
        assert_eq!(s.packages["kubelet"], (2, 4));
        assert_eq!(s.describe(&c), "kubelet: 2/4 at kubelet-2");

        let status = build_status(&c, &[], &s, Timestamp::UNIX_EPOCH);
        assert_eq!(
            (status.machines, status.up_to_date, status.unavailable),
            (4, 1, 2)
        );
        assert_eq!(status.observed_generation, Some(3));
        let rolled = status
            .conditions
            .iter()
            .find(|c| c.type_ == ROLLED_OUT)
            .expect("RolledOut");
        assert_eq!(
            (rolled.status.as_str(), rolled.reason.as_str()),
            ("False", "RollingOut")
        );
        assert!(!conditions::is_true(
            &status.conditions,
            MISSING_PACKAGE_VERSION
        ));
    }

    #[test]
    fn rolled_out_when_every_follower_is_at_the_default() {
        let c = cpv(&[("kubelet", "kubelet-2")]);
        let ms = vec![
            machine(
                "a",
                &[],
                &[("kubelet", "kubelet-2")],
                MachinePhase::Ready,
                "n1",
            ),
            machine(
                "b",
                &[],
                &[("kubelet", "kubelet-2")],
                MachinePhase::Ready,
                "n2",
            ),
        ];
        let nodes = vec![node("n1", true), node("n2", true)];
        let status = build_status(&c, &[], &summarize(&c, &ms, &nodes), Timestamp::UNIX_EPOCH);
        assert!(conditions::is_true(&status.conditions, ROLLED_OUT));
        let problems = vec!["kubelet: PackageVersion kubelet-2 does not exist".to_string()];
        let bad = build_status(
            &c,
            &problems,
            &summarize(&c, &ms, &nodes),
            Timestamp::UNIX_EPOCH,
        );
        assert!(conditions::is_true(
            &bad.conditions,
            MISSING_PACKAGE_VERSION
        ));
        assert!(!conditions::is_true(&bad.conditions, ROLLED_OUT));
    }

    #[test]
    fn only_changed_conditions_make_events() {
        let c = cpv(&[("kubelet", "kubelet-2")]);
        let first = build_status(&c, &[], &Summary::default(), Timestamp::UNIX_EPOCH);
        // A fresh status: RolledOut (0 of 0) became True; MissingPackageVersion False is quiet.
        assert_eq!(
            transitions(&[], &first.conditions),
            vec![(ROLLED_OUT.to_string(), true)]
        );
        assert!(transitions(&first.conditions, &first.conditions).is_empty());
        let problems = vec!["x".to_string()];
        let second = build_status(&c, &problems, &Summary::default(), Timestamp::UNIX_EPOCH);
        let mut changed = transitions(&first.conditions, &second.conditions);
        changed.sort();
        assert_eq!(
            changed,
            vec![
                (MISSING_PACKAGE_VERSION.to_string(), true),
                (ROLLED_OUT.to_string(), false)
            ]
        );
    }
}
