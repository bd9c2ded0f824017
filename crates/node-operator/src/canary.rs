//! The CanaryRelease controller: claims the Machines a release selects, hands
//! them their target PackageVersions batch by batch through annotations the
//! Machine controller reads (see [`crate::rollout`]), judges each batch by its
//! health gates, halts when the failure budget is spent, rolls back, and
//! promotes the targets to the cluster default.
//!
//! Every decision is made by [`plan`], a pure function of the release, the
//! Machines and the Nodes; the reconcile only fetches, applies what the plan
//! says and publishes its Events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::canary::{
    CanaryAction, CanaryMachine, CanaryMachineResult, CanaryPhase, HealthGates,
};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::shared::OperationResult;
use kube_on_kube_api::{CanaryRelease, CanaryReleaseStatus, ClusterPackageVersion, Machine};

use crate::Error;
use crate::rollout::{self, CANARY_ANNOTATION, CANARY_PACKAGES_ANNOTATION};
use kok_common::finalizer;

/// Field manager of the release status and of promotions into the
/// ClusterPackageVersion.
pub const MANAGER: &str = "node-operator-canary";
/// Finalizer that releases a deleted release's claims.
pub const FINALIZER: &str = "kubeonkube.io/canary-claims";
/// Annotation on a released Machine: when its batch was released (RFC 3339);
/// the health-gate timeout runs from here.
pub const RELEASED_AT_ANNOTATION: &str = "kubeonkube.io/canary-released-at";
/// Annotation on a released Machine: JSON object package → the PackageVersion
/// it ran before the release, what a rollback returns it to.
pub const PREVIOUS_ANNOTATION: &str = "kubeonkube.io/canary-previous";
/// Annotation on a released Machine: JSON list of the watched Node condition
/// types that were already True when its batch was released.
pub const BASELINE_ANNOTATION: &str = "kubeonkube.io/canary-baseline";

/// Condition types of a CanaryRelease.
pub mod condition {
    pub const PROGRESSING: &str = "Progressing";
    pub const HALTED: &str = "Halted";
    pub const ROLLED_BACK: &str = "RolledBack";
    pub const PROMOTED: &str = "Promoted";
    /// Machines the selector picked that another release had claimed.
    pub const CLAIM_CONFLICT: &str = "ClaimConflict";
}

/// Field manager of one release's marks on Machines. One manager per release
/// makes the API server refuse a second release's claim on a Machine (a
/// server-side apply conflict), even when two releases race.
pub fn claim_manager(release: &str) -> String {
    let mut m = format!("node-operator-canary-{release}");
    m.truncate(128);
    m
}

/// Sizes of the batches of `selected` Machines: each entry a count or a
/// percentage of `selected` (rounded up, at least one), capped by what is left;
/// Machines left after the last entry form one final batch.
pub fn batch_sizes(selected: usize, batches: &[IntOrString]) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut left = selected;
    for b in batches {
        if left == 0 {
            break;
        }
        let size = match b {
            IntOrString::Int(n) => usize::try_from(*n).unwrap_or(0),
            IntOrString::String(s) => match percent(s) {
                Some(p) => (selected * p).div_ceil(100),
                None => s.parse().unwrap_or(1),
            },
        };
        let size = size.clamp(1, left);
        sizes.push(size);
        left -= size;
    }
    if left > 0 {
        sizes.push(left);
    }
    sizes
}

fn percent(s: &str) -> Option<usize> {
    s.strip_suffix('%')?
        .parse::<usize>()
        .ok()
        .map(|p| p.min(100))
}

/// Failed Machines tolerated: a count, or a percentage of `selected` rounded
/// down. The release halts when more than this many failed.
pub fn failure_budget(value: &IntOrString, selected: usize) -> usize {
    match value {
        IntOrString::Int(n) => usize::try_from(*n).unwrap_or(0),
        IntOrString::String(s) => match percent(s) {
            Some(p) => selected * p / 100,
            None => s.parse().unwrap_or(0),
        },
    }
}

/// What this controller keeps on one Machine, besides the claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// Package → PackageVersion the Machine must run (the targets, or the
    /// previous versions when rolling back). None until its batch is released.
    pub packages: Option<BTreeMap<String, String>>,
    /// Package → PackageVersion it ran before the release.
    pub previous: Option<BTreeMap<String, String>>,
    /// Watched Node conditions already True when the batch was released.
    pub baseline: Option<BTreeSet<String>>,
    /// When the batch was released.
    pub released_at: Option<Timestamp>,
}

impl Marks {
    /// The marks as found on `machine`.
    pub fn read(machine: &Machine) -> Marks {
        let a = machine.annotations();
        Marks {
            packages: from_json(a.get(CANARY_PACKAGES_ANNOTATION)),
            previous: from_json(a.get(PREVIOUS_ANNOTATION)),
            baseline: from_json(a.get(BASELINE_ANNOTATION)),
            released_at: a.get(RELEASED_AT_ANNOTATION).and_then(|v| v.parse().ok()),
        }
    }

    /// The annotations that carry the claim of `release` and these marks.
    pub fn annotations(&self, release: &str) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(CANARY_ANNOTATION.to_string(), release.to_string())]);
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                a.insert(key.to_string(), v);
            }
        };
        put(
            CANARY_PACKAGES_ANNOTATION,
            self.packages.as_ref().map(to_json),
        );
        put(PREVIOUS_ANNOTATION, self.previous.as_ref().map(to_json));
        put(BASELINE_ANNOTATION, self.baseline.as_ref().map(to_json));
        put(
            RELEASED_AT_ANNOTATION,
            self.released_at.map(|t| t.to_string()),
        );
        a
    }
}

/// A mark that does not parse is treated as absent.
fn from_json<T: serde::de::DeserializeOwned>(value: Option<&String>) -> Option<T> {
    value.and_then(|v| serde_json::from_str(v).ok())
}

/// Mark values are maps and sets of strings, which always serialise.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A change of one Machine's marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkChange {
    /// Claim the Machine with these marks.
    Set(Marks),
    /// Remove the claim and every mark.
    Release,
}

/// What one reconcile of a release must do.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The status to write.
    pub status: CanaryReleaseStatus,
    /// Machine → change of its marks, applied in name order.
    pub marks: BTreeMap<String, MarkChange>,
    /// Targets to write into the ClusterPackageVersion defaults (before any
    /// claim is released).
    pub promote: Option<BTreeMap<String, String>>,
    /// Events to publish: type, reason, note.
    pub events: Vec<(EventType, &'static str, String)>,
    /// When to look again.
    pub requeue: Duration,
}

/// What the health gates say about one released Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Upgrading, Succeeded or Failed.
    pub result: CanaryMachineResult,
    /// What failed, or what it is waiting for.
    pub message: Option<String>,
}

/// Judge a released Machine by the gates. `node` is its Node if it has one.
pub fn evaluate(
    machine: Option<&Machine>,
    node: Option<&Node>,
    targets: &BTreeMap<String, String>,
    gates: &HealthGates,
    timeout: Duration,
    now: Timestamp,
) -> Verdict {
    let failed = |m: String| Verdict {
        result: CanaryMachineResult::Failed,
        message: Some(m),
    };
    let Some(machine) = machine else {
        return failed("the Machine was deleted".into());
    };
    let marks = Marks::read(machine);
    let released_at = marks.released_at.unwrap_or(now);
    let status = machine.status.clone().unwrap_or_default();

    if status.phase == Some(MachinePhase::Failed)
        && status.last_operation.as_ref().is_none_or(|op| {
            op.result == OperationResult::Failed
                && op.started_at.0.as_second() >= released_at.as_second()
        })
    {
        let why = status
            .last_operation
            .and_then(|op| op.message.map(|m| format!("{}: {m}", op.step)))
            .unwrap_or_else(|| "the Machine failed".into());
        return failed(format!("upgrade failed: {why}"));
    }
    if let Some(node) = node {
        let baseline = marks.baseline.unwrap_or_default();
        let now_true = true_conditions(node);
        if let Some(new) = gates
            .no_new_conditions
            .iter()
            .find(|c| now_true.contains(*c) && !baseline.contains(*c))
        {
            return failed(format!("Node condition {new} became True"));
        }
    }

    let mut waiting = Vec::new();
    for (pkg, pv) in targets {
        match status.installed.get(pkg) {
            Some(i) if i.package_version == *pv => {
                if gates.package_health && !i.healthy {
                    waiting.push(format!("{pkg} {pv} to pass its health check"));
                }
            }
            _ => waiting.push(format!("{pkg} to be at {pv}")),
        }
    }
    if gates.node_ready && !node.is_some_and(rollout::node_ready) {
        waiting.push("its Node to be Ready".into());
    }
    if waiting.is_empty() {
        return Verdict {
            result: CanaryMachineResult::Succeeded,
            message: None,
        };
    }
    let waited = Duration::from_millis(
        u64::try_from(now.as_millisecond() - released_at.as_millisecond()).unwrap_or(0),
    );
    if waited > timeout {
        return failed(format!(
            "did not pass the health gates within {}s: waiting for {}",
            timeout.as_secs(),
            waiting.join(", ")
        ));
    }
    Verdict {
        result: CanaryMachineResult::Upgrading,
        message: Some(format!("waiting for {}", waiting.join(", "))),
    }
}

fn true_conditions(node: &Node) -> BTreeSet<String> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter(|c| c.status == Status::True)
                .map(|c| c.type_.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `machine` runs `previous` again after a rollback: each package at
/// its previous PackageVersion and healthy, and the Machine Ready. A
/// failed upgrade leaves the old PackageVersion recorded (it never became
/// current in status) but unhealthy while the host still runs the new one, so
/// the record alone does not prove the host went back.
fn rolled_back(machine: &Machine, previous: &BTreeMap<String, String>) -> bool {
    let Some(status) = machine.status.as_ref() else {
        return false;
    };
    status.phase == Some(MachinePhase::Ready)
        && previous.iter().all(|(pkg, pv)| {
            status
                .installed
                .get(pkg)
                .is_some_and(|i| i.package_version == *pv && i.healthy)
        })
}

/// Per-Machine results added up into the status counters.
pub fn aggregate(status: &mut CanaryReleaseStatus) {
    let count = |r: &[CanaryMachineResult]| {
        let n = status
            .machines
            .iter()
            .filter(|m| r.contains(&m.result))
            .count();
        i32::try_from(n).unwrap_or(i32::MAX)
    };
    use CanaryMachineResult as R;
    status.selected = count(&[
        R::Pending,
        R::Upgrading,
        R::Succeeded,
        R::Failed,
        R::RolledBack,
    ]);
    status.succeeded = count(&[R::Succeeded]);
    status.failed = count(&[R::Failed]);
    status.pending = count(&[R::Pending, R::Upgrading]);
}

fn node_of<'a>(machine: Option<&Machine>, nodes: &'a BTreeMap<&str, &Node>) -> Option<&'a Node> {
    let name = machine?.status.as_ref()?.node_name.as_deref()?;
    nodes.get(name).copied()
}

/// The marks of a Machine whose batch is released now: the targets, what it
/// ran before, and the watched Node conditions already True.
fn release_marks(
    machine: &Machine,
    node: Option<&Node>,
    targets: &BTreeMap<String, String>,
    gates: &HealthGates,
    now: Timestamp,
) -> Marks {
    let installed = machine.status.as_ref().map(|s| &s.installed);
    let previous = targets
        .keys()
        .filter_map(|pkg| {
            installed
                .and_then(|i| i.get(pkg))
                .map(|i| (pkg.clone(), i.package_version.clone()))
        })
        .collect();
    let baseline = node.map(true_conditions).unwrap_or_default();
    Marks {
        packages: Some(targets.clone()),
        previous: Some(previous),
        baseline: Some(
            gates
                .no_new_conditions
                .iter()
                .filter(|c| baseline.contains(*c))
                .cloned()
                .collect(),
        ),
        released_at: Some(now),
    }
}

/// Decide the next step of `release` from the cluster's `machines` and
/// `nodes` at time `now`.
pub fn plan(release: &CanaryRelease, machines: &[Machine], nodes: &[Node], now: Timestamp) -> Plan {
    use CanaryMachineResult as R;
    let name = release.name_any();
    let spec = &release.spec;
    let generation = release.metadata.generation;
    let old = release.status.clone().unwrap_or_default();
    let spec_changed = old.observed_generation != generation;
    let pause = kok_common::duration::parse(&spec.pause_between_batches).unwrap_or(Duration::ZERO);
    let timeout =
        kok_common::duration::parse(&spec.health_gates.timeout).unwrap_or(Duration::from_secs(600));
    let by_name: BTreeMap<&str, &Machine> = machines
        .iter()
        .filter_map(|m| m.metadata.name.as_deref().map(|n| (n, m)))
        .collect();
    let nodes: BTreeMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|k| (k, n)))
        .collect();
    let ours = |m: &Machine| rollout::canary_claim(m) == Some(name.as_str());

    let mut status = old.clone();
    status.observed_generation = generation;
    let mut marks = BTreeMap::new();
    let mut events = Vec::new();
    let mut requeue = Duration::from_secs(5);
    let mut conds = std::mem::take(&mut status.conditions);
    let set_cond = |conds: &mut Vec<Condition>, type_, ok: bool, reason, message: String| {
        conditions::set(
            conds,
            Desired {
                type_,
                status: ok.into(),
                reason,
                message,
            },
            generation,
            now,
        )
    };

    // A promoted release only lets go of what it still holds.
    if old.phase == Some(CanaryPhase::Promoted) {
        for m in machines.iter().filter(|m| ours(m)) {
            marks.insert(m.name_any(), MarkChange::Release);
        }
        status.conditions = conds;
        return Plan {
            status,
            marks,
            promote: None,
            events,
            requeue: Duration::from_secs(300),
        };
    }

    // Selection, once: the Machines the selector picks that nobody else claims.
    if status.machines.is_empty() {
        let selector = match Selector::try_from(spec.selector.clone()) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("the selector cannot be used: {e}");
                set_cond(
                    &mut conds,
                    condition::PROGRESSING,
                    false,
                    "InvalidSelector",
                    msg.clone(),
                );
                status.phase = Some(CanaryPhase::Pending);
                status.conditions = conds;
                return Plan {
                    status,
                    marks,
                    promote: None,
                    events: vec![(EventType::Warning, "InvalidSelector", msg)],
                    requeue: Duration::from_secs(300),
                };
            }
        };
        let (taken, free): (Vec<&Machine>, Vec<&Machine>) = by_name
            .values()
            .copied()
            .filter(|m| selector.matches(m.labels()))
            .partition(|m| rollout::canary_claim(m).is_some_and(|c| c != name));
        let refused: Vec<String> = taken
            .iter()
            .map(|m| {
                format!(
                    "{} (claimed by {})",
                    m.name_any(),
                    rollout::canary_claim(m).unwrap_or_default()
                )
            })
            .collect();
        if refused.is_empty() {
            set_cond(
                &mut conds,
                condition::CLAIM_CONFLICT,
                false,
                "NoConflict",
                "no selected Machine is claimed by another release".into(),
            );
        } else {
            let msg = format!(
                "left out, claimed by another release: {}",
                refused.join(", ")
            );
            set_cond(
                &mut conds,
                condition::CLAIM_CONFLICT,
                true,
                "ClaimedByAnotherRelease",
                msg.clone(),
            );
            events.push((EventType::Warning, "ClaimConflict", msg));
        }
        let sizes = batch_sizes(free.len(), &spec.batches);
        let mut names = free.iter().map(|m| m.name_any());
        for (batch, size) in sizes.iter().enumerate() {
            for machine in names.by_ref().take(*size) {
                status.machines.push(CanaryMachine {
                    name: machine,
                    batch: i32::try_from(batch).unwrap_or(i32::MAX),
                    result: R::Pending,
                    message: None,
                });
            }
        }
        if status.machines.is_empty() {
            set_cond(
                &mut conds,
                condition::PROGRESSING,
                false,
                "NoMachines",
                "the selector picks no Machine that is free to claim".into(),
            );
            status.phase = Some(CanaryPhase::Pending);
            status.batch_progress = Some("0/0".into());
            aggregate(&mut status);
            status.conditions = conds;
            return Plan {
                status,
                marks,
                promote: None,
                events,
                requeue: Duration::from_secs(30),
            };
        }
        events.push((
            EventType::Normal,
            "Selected",
            format!(
                "{} Machines in {} batches of {:?}",
                status.machines.len(),
                sizes.len(),
                sizes
            ),
        ));
        status.current_batch = Some(0);
        status.phase = Some(CanaryPhase::Progressing);
        // Claim them all now, so no other release takes them mid-way. A
        // Machine this release already marked keeps its marks: selecting
        // again must not take back a batch already released.
        for entry in &status.machines {
            let kept = by_name
                .get(entry.name.as_str())
                .filter(|m| ours(m))
                .map(|m| Marks::read(m))
                .unwrap_or_default();
            marks.insert(entry.name.clone(), MarkChange::Set(kept));
        }
    }
    let total = status
        .machines
        .iter()
        .map(|m| m.batch + 1)
        .max()
        .unwrap_or(0);

    // Judge the released Machines.
    for entry in status.machines.iter_mut() {
        let machine = by_name.get(entry.name.as_str()).copied();
        if matches!(entry.result, R::Succeeded | R::Failed | R::RolledBack) {
            continue;
        }
        let released = machine
            .map(Marks::read)
            .is_some_and(|m| m.packages.as_ref() == Some(&spec.packages));
        if !released && machine.is_some() {
            continue;
        }
        let v = evaluate(
            machine,
            node_of(machine, &nodes),
            &spec.packages,
            &spec.health_gates,
            timeout,
            now,
        );
        if v.result != entry.result {
            match v.result {
                R::Succeeded => events.push((
                    EventType::Normal,
                    "MachineSucceeded",
                    format!("{} passed the health gates", entry.name),
                )),
                R::Failed => events.push((
                    EventType::Warning,
                    "MachineFailed",
                    format!("{}: {}", entry.name, v.message.clone().unwrap_or_default()),
                )),
                _ => {}
            }
        }
        entry.result = v.result;
        entry.message = v.message;
    }

    // Resume (once per spec change) gives a halted release's failed Machines
    // another try from now.
    let selected = status.machines.len();
    let budget = failure_budget(&spec.failure_budget, selected);
    if spec.action == Some(CanaryAction::Resume)
        && spec_changed
        && old.phase == Some(CanaryPhase::Halted)
    {
        for entry in status.machines.iter_mut().filter(|m| m.result == R::Failed) {
            if let Some(m) = by_name.get(entry.name.as_str()) {
                let mut mk = Marks::read(m);
                mk.released_at = Some(now);
                marks.insert(entry.name.clone(), MarkChange::Set(mk));
                entry.result = R::Upgrading;
                entry.message = Some("resumed; judged again".into());
            }
        }
        events.push((
            EventType::Normal,
            "Resumed",
            "failed Machines are judged again".into(),
        ));
    }
    let failed = status
        .machines
        .iter()
        .filter(|m| m.result == R::Failed)
        .count();
    let over = failed > budget;

    let rolling_back = spec.action == Some(CanaryAction::Rollback)
        || matches!(
            old.phase,
            Some(CanaryPhase::RollingBack | CanaryPhase::RolledBack)
        )
        || (over && spec.auto_rollback);
    // A rollback turns failed Machines into rolled-back ones, which no longer
    // count against the budget; the release stays halted all the same.
    let halted = over || (rolling_back && conditions::is_true(&old.conditions, condition::HALTED));

    if rolling_back {
        if !matches!(
            old.phase,
            Some(CanaryPhase::RollingBack | CanaryPhase::RolledBack)
        ) {
            let why = if over {
                format!("{failed} failed, budget {budget}")
            } else {
                "asked for".into()
            };
            events.push((
                EventType::Warning,
                "RollingBack",
                format!("returning every upgraded Machine to its previous versions ({why})"),
            ));
        }
        let mut done = true;
        for entry in status.machines.iter_mut() {
            let Some(m) = by_name.get(entry.name.as_str()).copied() else {
                continue;
            };
            let mk = Marks::read(m);
            let Some(packages) = &mk.packages else {
                continue;
            };
            if entry.result == R::RolledBack {
                continue;
            }
            let previous = mk.previous.clone().unwrap_or_default();
            if *packages != previous {
                let mut back = mk.clone();
                back.packages = Some(previous);
                marks.insert(entry.name.clone(), MarkChange::Set(back));
                done = false;
                continue;
            }
            let back = rolled_back(m, &previous);
            // A failed Machine keeps its failure as the message: why it
            // was rolled back.
            let failed = entry.result == R::Failed;
            if back {
                entry.result = R::RolledBack;
                if !failed {
                    entry.message = None;
                }
            } else {
                if !failed {
                    entry.message = Some("rolling back to its previous versions".into());
                }
                done = false;
            }
        }
        if done {
            if old.phase != Some(CanaryPhase::RolledBack) {
                events.push((
                    EventType::Normal,
                    "RolledBack",
                    "every upgraded Machine runs its previous versions again".into(),
                ));
            }
            status.phase = Some(CanaryPhase::RolledBack);
            requeue = Duration::from_secs(300);
        } else {
            status.phase = Some(CanaryPhase::RollingBack);
        }
    } else if spec.action == Some(CanaryAction::Promote) && !over {
        for m in machines.iter().filter(|m| ours(m)) {
            marks.insert(m.name_any(), MarkChange::Release);
        }
        // Machines claimed in this very reconcile are not on the server yet.
        for entry in &status.machines {
            marks.insert(entry.name.clone(), MarkChange::Release);
        }
        events.push((
            EventType::Normal,
            "Promoted",
            format!(
                "the targets {:?} are the cluster default now",
                spec.packages
            ),
        ));
        status.phase = Some(CanaryPhase::Promoted);
        requeue = Duration::from_secs(300);
        status.batch_passed_at = None;
        aggregate(&mut status);
        finish_conditions(&mut conds, &status, failed, budget, halted, generation, now);
        status.conditions = conds;
        return Plan {
            status,
            marks,
            promote: Some(spec.packages.clone()),
            events,
            requeue,
        };
    } else if over {
        if old.phase != Some(CanaryPhase::Halted) {
            events.push((EventType::Warning, "Halted", format!("{failed} Machines failed, more than the failure budget of {budget}; no new batch starts")));
        }
        status.phase = Some(CanaryPhase::Halted);
    } else {
        // Progress through the batches.
        let current = status.current_batch.unwrap_or(0);
        let in_batch = |b: i32| status.machines.iter().filter(move |m| m.batch == b);
        let unreleased: Vec<String> = in_batch(current)
            .filter(|e| e.result == R::Pending)
            .map(|e| e.name.clone())
            .collect();
        let paused = spec.action == Some(CanaryAction::Pause);
        let start = |batch: i32,
                     names: &[String],
                     marks: &mut BTreeMap<String, MarkChange>,
                     entries: &mut Vec<CanaryMachine>,
                     events: &mut Vec<(EventType, &'static str, String)>| {
            for n in names {
                if let Some(m) = by_name.get(n.as_str()) {
                    let mk = release_marks(
                        m,
                        node_of(Some(m), &nodes),
                        &spec.packages,
                        &spec.health_gates,
                        now,
                    );
                    marks.insert(n.clone(), MarkChange::Set(mk));
                    if let Some(e) = entries.iter_mut().find(|e| e.name == *n) {
                        e.result = R::Upgrading;
                        e.message = None;
                    }
                }
            }
            events.push((
                EventType::Normal,
                "BatchStarted",
                format!("batch {}/{total}: {}", batch + 1, names.join(", ")),
            ));
        };
        if !unreleased.is_empty() {
            if paused {
                status.phase = Some(CanaryPhase::Paused);
            } else {
                start(
                    current,
                    &unreleased,
                    &mut marks,
                    &mut status.machines,
                    &mut events,
                );
                status.phase = Some(CanaryPhase::Progressing);
            }
        } else if in_batch(current).all(|e| matches!(e.result, R::Succeeded | R::Failed)) {
            let passed_at = match &status.batch_passed_at {
                Some(t) => t.0,
                None => {
                    let ok = in_batch(current)
                        .filter(|e| e.result == R::Succeeded)
                        .count();
                    let bad = in_batch(current).filter(|e| e.result == R::Failed).count();
                    events.push((
                        EventType::Normal,
                        "BatchPassed",
                        format!(
                            "batch {}/{total}: {ok} succeeded, {bad} failed",
                            current + 1
                        ),
                    ));
                    status.batch_passed_at = Some(Time(now));
                    now
                }
            };
            let waited = Duration::from_millis(
                u64::try_from(now.as_millisecond() - passed_at.as_millisecond()).unwrap_or(0),
            );
            if current + 1 >= total {
                if old.phase != Some(CanaryPhase::Succeeded) {
                    events.push((
                        EventType::Normal,
                        "Succeeded",
                        format!(
                            "every batch passed: {} succeeded, {failed} failed",
                            status
                                .machines
                                .iter()
                                .filter(|m| m.result == R::Succeeded)
                                .count()
                        ),
                    ));
                }
                status.phase = Some(CanaryPhase::Succeeded);
                requeue = Duration::from_secs(300);
            } else if paused {
                status.phase = Some(CanaryPhase::Paused);
            } else if waited >= pause {
                let next = current + 1;
                let names: Vec<String> = in_batch(next).map(|e| e.name.clone()).collect();
                status.current_batch = Some(next);
                status.batch_passed_at = None;
                start(next, &names, &mut marks, &mut status.machines, &mut events);
                status.phase = Some(CanaryPhase::Progressing);
            } else {
                requeue = requeue.min(pause - waited);
                status.phase = Some(CanaryPhase::Progressing);
            }
        } else {
            status.phase = Some(if paused {
                CanaryPhase::Paused
            } else {
                CanaryPhase::Progressing
            });
        }
    }
    if status.phase == Some(CanaryPhase::Paused) && old.phase != Some(CanaryPhase::Paused) {
        events.push((
            EventType::Normal,
            "Paused",
            "no new batch starts until the action is Resume or removed".into(),
        ));
    }
    let current = status.current_batch.unwrap_or(0);
    status.batch_progress = Some(format!("{}/{total}", (current + 1).min(total)));
    aggregate(&mut status);
    finish_conditions(&mut conds, &status, failed, budget, halted, generation, now);
    status.conditions = conds;
    Plan {
        status,
        marks,
        promote: None,
        events,
        requeue,
    }
}

/// Progressing, Halted, RolledBack and Promoted from the phase and the budget.
fn finish_conditions(
    conds: &mut Vec<Condition>,
    status: &CanaryReleaseStatus,
    failed: usize,
    budget: usize,
    halted: bool,
    generation: Option<i64>,
    now: Timestamp,
) {
    let phase = status.phase.unwrap_or(CanaryPhase::Pending);
    let mut set = |type_, ok: bool, reason: &str, message: String| {
        conditions::set(
            conds,
            Desired {
                type_,
                status: ok.into(),
                reason,
                message,
            },
            generation,
            now,
        )
    };
    let batch = status.batch_progress.clone().unwrap_or_default();
    let phase_name = format!("{phase:?}");
    match phase {
        CanaryPhase::Progressing => set(
            condition::PROGRESSING,
            true,
            "BatchInProgress",
            format!("batch {batch}"),
        ),
        _ => set(
            condition::PROGRESSING,
            false,
            &phase_name,
            format!("{phase_name} at batch {batch}"),
        ),
    }
    if halted {
        let message = if failed > budget {
            format!("{failed} Machines failed; the failure budget is {budget}")
        } else {
            format!(
                "the failure budget of {budget} was spent; the failed Machines were rolled back"
            )
        };
        set(condition::HALTED, true, "FailureBudgetSpent", message);
    } else {
        set(
            condition::HALTED,
            false,
            "WithinBudget",
            format!("{failed} Machines failed; the failure budget is {budget}"),
        );
    }
    match phase {
        CanaryPhase::RolledBack => set(
            condition::ROLLED_BACK,
            true,
            "RolledBack",
            "every upgraded Machine runs its previous versions".into(),
        ),
        CanaryPhase::RollingBack => set(
            condition::ROLLED_BACK,
            false,
            "RollingBack",
            "returning upgraded Machines to their previous versions".into(),
        ),
        _ => set(
            condition::ROLLED_BACK,
            false,
            "NotRolledBack",
            "no rollback was needed or asked for".into(),
        ),
    }
    if phase == CanaryPhase::Promoted {
        set(
            condition::PROMOTED,
            true,
            "Promoted",
            "the targets are the cluster default".into(),
        );
    } else {
        set(
            condition::PROMOTED,
            false,
            "NotPromoted",
            "the targets are not the cluster default".into(),
        );
    }
}

/// What the CanaryRelease reconcile shares.
pub struct Context {
    /// Client of the business cluster.
    pub client: Client,
    /// Publishes Events on CanaryReleases.
    pub recorder: Recorder,
}

/// Converge one CanaryRelease.
pub async fn reconcile(release: Arc<CanaryRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = release.name_any();
    let releases = Api::<CanaryRelease>::all(client.clone());
    // The controller's cache can lag behind the status the last reconcile
    // wrote; planning on that older status would redo steps already taken.
    let Some(release) = releases.get_opt(&name).await.map_err(Error::Kube)? else {
        return Ok(Action::await_change());
    };
    let machines_api = Api::<Machine>::all(client.clone());
    let machines = rollout::list_machines(client).await.map_err(Error::Kube)?;
    let has_finalizer = finalizer::has(&release, FINALIZER);

    if release.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            let claimed: Vec<String> = machines
                .iter()
                .filter(|m| rollout::canary_claim(m) == Some(name.as_str()))
                .map(|m| m.name_any())
                .collect();
            for m in &claimed {
                apply_marks(&machines_api, &name, m, &MarkChange::Release).await?;
            }
            publish(
                &ctx,
                &release,
                EventType::Normal,
                "ClaimsReleased",
                format!(
                    "released {} Machines: {}",
                    claimed.len(),
                    claimed.join(", ")
                ),
            )
            .await;
            finalizer::remove(&releases, &release, FINALIZER)
                .await
                .map_err(Error::Kube)?;
        }
        return Ok(Action::await_change());
    }

    let nodes = rollout::list_nodes(client).await.map_err(Error::Kube)?;
    let mut plan = plan(&release, &machines, &nodes, Timestamp::now());

    let claims = plan.marks.values().any(|c| matches!(c, MarkChange::Set(_)));
    if claims && !has_finalizer {
        finalizer::add(&releases, &release, FINALIZER)
            .await
            .map_err(Error::Kube)?;
    }
    if let Some(packages) = &plan.promote {
        promote(client, packages).await?;
    }
    let mut conflicts = Vec::new();
    for (machine, change) in &plan.marks {
        match apply_marks(&machines_api, &name, machine, change).await {
            Ok(()) => {}
            Err(Error::Kube(kube::Error::Api(s))) if s.is_conflict() => {
                conflicts.push(machine.clone())
            }
            Err(Error::Kube(kube::Error::Api(s))) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    // A refused mark on a Machine this release already claimed changes
    // nothing it holds; a refused claim means the Machine is not ours, even
    // when this plan released it in the same step.
    conflicts.retain(|c| {
        !machines
            .iter()
            .any(|m| m.name_any() == *c && rollout::canary_claim(m) == Some(name.as_str()))
    });
    if !conflicts.is_empty() {
        drop_conflicts(
            &mut plan.status,
            &conflicts,
            release.metadata.generation,
            Timestamp::now(),
        );
        plan.events.push((
            EventType::Warning,
            "ClaimConflict",
            format!("another release claimed {} first", conflicts.join(", ")),
        ));
    }
    for (type_, reason, note) in &plan.events {
        publish(&ctx, &release, *type_, reason, note.clone()).await;
    }
    if release.status.as_ref() != Some(&plan.status) {
        kok_common::apply::apply_status(&releases, MANAGER, &name, &plan.status).await?;
    }
    Ok(Action::requeue(plan.requeue))
}

/// Forget Machines whose claim lost a race to another release: they carry no
/// mark of this release, so whatever the plan said about them (even that
/// their batch started) never reached them, and waiting for them would stall
/// the release.
pub fn drop_conflicts(
    status: &mut CanaryReleaseStatus,
    conflicts: &[String],
    generation: Option<i64>,
    now: Timestamp,
) {
    status.machines.retain(|m| !conflicts.contains(&m.name));
    aggregate(status);
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: condition::CLAIM_CONFLICT,
            status: Status::True,
            reason: "ClaimedByAnotherRelease",
            message: format!(
                "left out, claimed by another release: {}",
                conflicts.join(", ")
            ),
        },
        generation,
        now,
    );
}

/// The server-side apply configuration of `release`'s marks on `machine`.
/// Releasing applies no annotations at all rather than an empty map: a
/// manager that applied `annotations: {}` would keep owning the map and make
/// every later release's claim on the Machine a conflict.
pub fn marks_patch(machine: &str, change: &MarkChange, release: &str) -> serde_json::Value {
    let mut patch = serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": machine},
    });
    if let MarkChange::Set(marks) = change {
        patch["metadata"]["annotations"] = serde_json::json!(marks.annotations(release));
    }
    patch
}

async fn apply_marks(
    api: &Api<Machine>,
    release: &str,
    machine: &str,
    change: &MarkChange,
) -> Result<(), Error> {
    let patch = marks_patch(machine, change, release);
    // Not forced: a claim another release holds is a conflict, not a takeover.
    let params = PatchParams::apply(&claim_manager(release));
    api.patch(machine, &params, &Patch::Apply(&patch))
        .await
        .map_err(Error::Kube)?;
    Ok(())
}

async fn promote(client: &Client, targets: &BTreeMap<String, String>) -> Result<(), Error> {
    let api = Api::<ClusterPackageVersion>::all(client.clone());
    // Apply every default, not only the targets: this manager's earlier
    // promotions must not be dropped from the map.
    let mut packages = api
        .get_opt(crate::cpv::NAME)
        .await
        .map_err(Error::Kube)?
        .map(|c| c.spec.packages)
        .unwrap_or_default();
    packages.extend(targets.clone());
    let patch = serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "ClusterPackageVersion",
        "metadata": {"name": crate::cpv::NAME},
        "spec": {"packages": packages},
    });
    api.patch(
        crate::cpv::NAME,
        &kok_common::apply::params(MANAGER),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::Kube)?;
    Ok(())
}

async fn publish(
    ctx: &Context,
    release: &CanaryRelease,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // Failures of upgrades carry what the host printed.
    kok_common::events::publish(
        &ctx.recorder,
        &release.object_ref(&()),
        type_,
        reason,
        "Canary",
        &crate::redact::text(&note),
        None,
    )
    .await;
}

fn error_policy(release: Arc<CanaryRelease>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(name = %release.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Run the CanaryRelease controller until shutdown. A change of a Machine a
/// release claims reconciles that release.
pub async fn run(client: Client, changes: impl Stream<Item = Arc<Machine>> + Send + 'static) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), Reporter::from("node-operator")),
    });
    let controller = Controller::new(
        Api::<CanaryRelease>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_shared_stream(changes, |m: Arc<Machine>| {
        rollout::canary_claim(&m).map(ObjectRef::<CanaryRelease>::new)
    });
    kok_common::controller::run(
        "canaryrelease",
        controller,
        reconcile,
        error_policy,
        ctx,
        Error::category,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use kube_on_kube_api::machine::{InstalledPackage, LastOperation};
    use kube_on_kube_api::{CanaryReleaseSpec, MachineStatus};

    const OLD: &str = "kubelet-1";
    const NEW: &str = "kubelet-2";

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid timestamp")
    }

    fn int(n: i32) -> IntOrString {
        IntOrString::Int(n)
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    fn release(batches: Vec<IntOrString>, pause: &str, budget: IntOrString) -> CanaryRelease {
        let spec: CanaryReleaseSpec = serde_json::from_value(serde_json::json!({
            "selector": {"matchLabels": {"pool": "canary"}},
            "packages": {"kubelet": NEW},
            "batches": batches,
            "pauseBetweenBatches": pause,
            "healthGates": {"noNewConditions": ["KernelDeadlock"], "timeout": "60s"},
            "failureBudget": budget,
        }))
        .expect("valid spec");
        let mut r = CanaryRelease::new("rel", spec);
        r.metadata.generation = Some(1);
        r
    }

    fn machine(name: &str, pool: &str) -> Machine {
        let mut m: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "labels": {"pool": pool}},
            "spec": {
                "ip": "10.0.0.1",
                "ssh": {
                    "privateKeySecretRef": {"name": "k", "namespace": "kube-system"},
                    "hostPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"
                }
            }
        }))
        .expect("valid Machine");
        m.status = Some(MachineStatus {
            phase: Some(MachinePhase::Ready),
            node_name: Some(name.into()),
            ..Default::default()
        });
        installed(&mut m, OLD, true);
        m
    }

    fn installed(m: &mut Machine, pv: &str, healthy: bool) {
        let s = m.status.get_or_insert_with(Default::default);
        s.installed.insert(
            "kubelet".into(),
            InstalledPackage {
                version: pv.trim_start_matches("kubelet-").into(),
                package_version: pv.into(),
                previous: None,
                healthy,
            },
        );
    }

    fn node(name: &str, ready: bool, extra: &[&str]) -> Node {
        let mut conditions = vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }];
        for c in extra {
            conditions.push(NodeCondition {
                type_: c.to_string(),
                status: "True".into(),
                ..Default::default()
            });
        }
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Apply what a plan decided, as the API server and the Machine controller
    /// would: marks land on the Machines, the status on the release.
    fn apply(plan: &Plan, r: &mut CanaryRelease, machines: &mut [Machine]) {
        for m in machines.iter_mut() {
            let Some(change) = plan.marks.get(&m.name_any()) else {
                continue;
            };
            let a = m.metadata.annotations.get_or_insert_with(Default::default);
            a.retain(|k, _| !k.starts_with("kubeonkube.io/canary"));
            if let MarkChange::Set(marks) = change {
                a.extend(marks.annotations("rel"));
            }
        }
        r.status = Some(plan.status.clone());
    }

    fn results(r: &CanaryRelease) -> Vec<(String, i32, CanaryMachineResult)> {
        r.status
            .as_ref()
            .map(|s| {
                s.machines
                    .iter()
                    .map(|m| (m.name.clone(), m.batch, m.result))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn reasons(plan: &Plan) -> Vec<&'static str> {
        plan.events.iter().map(|e| e.1).collect()
    }

    #[test]
    fn batches_by_count_and_percentage_with_leftover_last() {
        assert_eq!(batch_sizes(2, &[int(1)]), vec![1, 1]);
        assert_eq!(batch_sizes(10, &[int(1), pct("20%")]), vec![1, 2, 7]);
        assert_eq!(batch_sizes(3, &[pct("50%")]), vec![2, 1]);
        assert_eq!(batch_sizes(3, &[pct("1%"), int(5), int(5)]), vec![1, 2]);
        assert_eq!(batch_sizes(4, &[pct("100%")]), vec![4]);
        assert_eq!(batch_sizes(0, &[int(1)]), Vec::<usize>::new());
        assert_eq!(batch_sizes(5, &[]), vec![5]);
    }

    #[test]
    fn failure_budget_counts_and_percentages() {
        assert_eq!(failure_budget(&int(0), 10), 0);
        assert_eq!(failure_budget(&int(2), 10), 2);
        assert_eq!(failure_budget(&pct("10%"), 10), 1);
        assert_eq!(failure_budget(&pct("10%"), 9), 0);
        assert_eq!(failure_budget(&pct("0%"), 9), 0);
        assert_eq!(failure_budget(&pct("100%"), 3), 3);
    }

    fn released(mut m: Machine, at: Timestamp, baseline: &[&str]) -> Machine {
        let marks = Marks {
            packages: Some(BTreeMap::from([("kubelet".into(), NEW.into())])),
            previous: Some(BTreeMap::from([("kubelet".into(), OLD.into())])),
            baseline: Some(baseline.iter().map(|s| s.to_string()).collect()),
            released_at: Some(at),
        };
        m.metadata.annotations = Some(marks.annotations("rel"));
        m
    }

    #[test]
    fn gates_wait_pass_and_fail() {
        let r = release(vec![int(1)], "0s", int(0));
        let gates = &r.spec.health_gates;
        let timeout = Duration::from_secs(60);
        let eval = |m: &Machine, n: &Node, now| {
            evaluate(Some(m), Some(n), &r.spec.packages, gates, timeout, now)
        };
        let mut m = released(machine("a", "canary"), ts(0), &[]);
        let ready = node("a", true, &[]);

        let v = eval(&m, &ready, ts(10));
        assert_eq!(v.result, CanaryMachineResult::Upgrading);
        assert!(v.message.unwrap().contains("kubelet to be at kubelet-2"));

        installed(&mut m, NEW, false);
        let v = eval(&m, &ready, ts(10));
        assert_eq!(v.result, CanaryMachineResult::Upgrading);
        assert!(v.message.unwrap().contains("health check"));

        installed(&mut m, NEW, true);
        assert_eq!(
            eval(&m, &ready, ts(10)).result,
            CanaryMachineResult::Succeeded
        );
        let v = eval(&m, &node("a", false, &[]), ts(10));
        assert_eq!(v.result, CanaryMachineResult::Upgrading);
        let v = eval(&m, &node("a", false, &[]), ts(61));
        assert_eq!(v.result, CanaryMachineResult::Failed);
        assert!(
            v.message
                .unwrap()
                .contains("within 60s: waiting for its Node to be Ready")
        );

        // A watched condition that was already True before the batch is no news...
        let old_problem = released(m.clone(), ts(0), &["KernelDeadlock"]);
        let sick = node("a", true, &["KernelDeadlock", "DiskPressure"]);
        assert_eq!(
            eval(&old_problem, &sick, ts(10)).result,
            CanaryMachineResult::Succeeded
        );
        // ...but one that became True since fails the Machine at once.
        let v = eval(&m, &sick, ts(10));
        assert_eq!(v.result, CanaryMachineResult::Failed);
        assert_eq!(
            v.message.as_deref(),
            Some("Node condition KernelDeadlock became True")
        );

        // A failed operation after the release fails the Machine; one before does not.
        let mut failed = released(machine("a", "canary"), ts(0), &[]);
        let s = failed.status.as_mut().unwrap();
        s.phase = Some(MachinePhase::Failed);
        s.last_operation = Some(LastOperation {
            step: "install kubelet 2".into(),
            started_at: Time(ts(5)),
            finished_at: None,
            result: OperationResult::Failed,
            message: Some("health check failed".into()),
            output_tail: None,
        });
        let v = eval(&failed, &ready, ts(10));
        assert_eq!(v.result, CanaryMachineResult::Failed);
        assert!(v.message.unwrap().contains("health check failed"));
        let stale = released(failed.clone(), ts(20), &[]);
        assert_eq!(
            eval(&stale, &ready, ts(21)).result,
            CanaryMachineResult::Upgrading
        );

        let v = evaluate(None, None, &r.spec.packages, gates, timeout, ts(1));
        assert_eq!(v.message.as_deref(), Some("the Machine was deleted"));
    }

    #[test]
    fn aggregates_results() {
        use CanaryMachineResult as R;
        let mut s = CanaryReleaseStatus::default();
        for (i, r) in [
            R::Pending,
            R::Upgrading,
            R::Succeeded,
            R::Succeeded,
            R::Failed,
            R::RolledBack,
        ]
        .into_iter()
        .enumerate()
        {
            s.machines.push(CanaryMachine {
                name: format!("m{i}"),
                batch: 0,
                result: r,
                message: None,
            });
        }
        aggregate(&mut s);
        assert_eq!((s.selected, s.succeeded, s.failed, s.pending), (6, 2, 1, 2));
    }

    #[test]
    fn batches_pause_then_succeed_then_promote() {
        use CanaryMachineResult as R;
        let mut r = release(vec![int(1)], "30s", int(0));
        let mut ms = vec![
            machine("a", "canary"),
            machine("b", "canary"),
            machine("c", "other"),
        ];
        let nodes = vec![
            node("a", true, &[]),
            node("b", true, &[]),
            node("c", true, &[]),
        ];

        // Selection claims a and b and releases batch 1 (a).
        let p = plan(&r, &ms, &nodes, ts(0));
        assert_eq!(reasons(&p), vec!["Selected", "BatchStarted"]);
        assert!(matches!(&p.marks["a"], MarkChange::Set(m) if m.packages.is_some()));
        assert!(matches!(&p.marks["b"], MarkChange::Set(m) if m.packages.is_none()));
        assert!(!p.marks.contains_key("c"));
        apply(&p, &mut r, &mut ms);
        assert_eq!(
            results(&r),
            vec![("a".into(), 0, R::Upgrading), ("b".into(), 1, R::Pending)]
        );
        let st = r.status.clone().unwrap();
        assert_eq!(st.phase, Some(CanaryPhase::Progressing));
        assert_eq!(st.batch_progress.as_deref(), Some("1/2"));
        assert_eq!(
            rollout::target(&ms[0], None).package_version("kubelet"),
            Some(NEW)
        );
        assert_eq!(rollout::canary_claim(&ms[1]), Some("rel"));

        // Nothing changes while a is upgrading; no repeated events.
        let p = plan(&r, &ms, &nodes, ts(5));
        assert!(p.marks.is_empty() && p.events.is_empty(), "{p:?}");

        // a reaches the target: the batch passes, the pause starts.
        installed(&mut ms[0], NEW, true);
        let p = plan(&r, &ms, &nodes, ts(10));
        assert_eq!(reasons(&p), vec!["MachineSucceeded", "BatchPassed"]);
        assert!(p.marks.is_empty());
        assert_eq!(p.requeue, Duration::from_secs(5));
        apply(&p, &mut r, &mut ms);
        assert_eq!(r.status.as_ref().unwrap().succeeded, 1);

        // Still pausing at 35s (25s in); at 41s batch 2 starts.
        let p = plan(&r, &ms, &nodes, ts(35));
        assert!(p.marks.is_empty());
        assert_eq!(p.requeue, Duration::from_secs(5));
        let p = plan(&r, &ms, &nodes, ts(41));
        assert_eq!(reasons(&p), vec!["BatchStarted"]);
        assert!(matches!(&p.marks["b"], MarkChange::Set(m) if m.packages.is_some()));
        apply(&p, &mut r, &mut ms);
        assert_eq!(
            r.status.as_ref().unwrap().batch_progress.as_deref(),
            Some("2/2")
        );

        installed(&mut ms[1], NEW, true);
        let p = plan(&r, &ms, &nodes, ts(50));
        apply(&p, &mut r, &mut ms);
        let st = r.status.clone().unwrap();
        assert_eq!(st.phase, Some(CanaryPhase::Succeeded));
        assert_eq!(
            (st.selected, st.succeeded, st.failed, st.pending),
            (2, 2, 0, 0)
        );
        assert!(!conditions::is_true(&st.conditions, condition::PROGRESSING));

        // Promote: targets into the default, every claim released.
        r.spec.action = Some(CanaryAction::Promote);
        r.metadata.generation = Some(2);
        let p = plan(&r, &ms, &nodes, ts(60));
        assert_eq!(p.promote, Some(r.spec.packages.clone()));
        assert_eq!(p.marks.get("a"), Some(&MarkChange::Release));
        assert_eq!(p.marks.get("b"), Some(&MarkChange::Release));
        apply(&p, &mut r, &mut ms);
        let st = r.status.clone().unwrap();
        assert_eq!(st.phase, Some(CanaryPhase::Promoted));
        assert!(conditions::is_true(&st.conditions, condition::PROMOTED));
        assert_eq!(rollout::canary_claim(&ms[0]), None);
        // Once promoted, nothing more happens.
        let p = plan(&r, &ms, &nodes, ts(70));
        assert!(p.promote.is_none() && p.marks.is_empty() && p.events.is_empty());
    }

    #[test]
    fn machines_claimed_elsewhere_are_left_out() {
        let r = release(vec![int(1)], "0s", int(0));
        let mut taken = machine("a", "canary");
        taken.metadata.annotations = Some(BTreeMap::from([(
            CANARY_ANNOTATION.to_string(),
            "other".to_string(),
        )]));
        let ms = vec![taken, machine("b", "canary")];
        let p = plan(&r, &ms, &[], ts(0));
        assert!(!p.marks.contains_key("a"));
        assert!(p.marks.contains_key("b"));
        assert!(reasons(&p).contains(&"ClaimConflict"));
        assert!(conditions::is_true(
            &p.status.conditions,
            condition::CLAIM_CONFLICT
        ));
        assert_eq!(p.status.selected, 1);

        // b's claim is refused: the plan released its batch in the same
        // step, but no mark reached it, so it is forgotten, not waited for.
        assert_eq!(p.status.machines[0].result, CanaryMachineResult::Upgrading);
        let mut lost = p.status.clone();
        drop_conflicts(&mut lost, &["b".into()], Some(1), ts(0));
        assert_eq!(lost.selected, 0);
        assert!(lost.machines.is_empty());
    }

    #[test]
    fn selecting_again_keeps_released_marks() {
        let mut r = release(vec![int(1)], "0s", int(0));
        let stale = r.clone();
        let mut ms = vec![machine("a", "canary"), machine("b", "canary")];
        let nodes = vec![node("a", true, &[]), node("b", true, &[])];
        let p = plan(&r, &ms, &nodes, ts(0));
        apply(&p, &mut r, &mut ms);
        // Planned again from a release whose status is not there yet: a's
        // batch stays released.
        let p = plan(&stale, &ms, &nodes, ts(1));
        let MarkChange::Set(a) = &p.marks["a"] else {
            panic!("a stays claimed: {p:?}");
        };
        assert_eq!(a.packages.as_ref(), Some(&stale.spec.packages));
        assert_eq!(a.released_at, Some(ts(0)));
    }

    #[test]
    fn releasing_applies_no_annotation_map() {
        let released = marks_patch("a", &MarkChange::Release, "rel");
        assert_eq!(
            released,
            serde_json::json!({
                "apiVersion": "kubeonkube.io/v1alpha1",
                "kind": "Machine",
                "metadata": {"name": "a"},
            })
        );
        let claimed = marks_patch("a", &MarkChange::Set(Marks::default()), "rel");
        assert_eq!(
            claimed["metadata"]["annotations"],
            serde_json::json!({CANARY_ANNOTATION: "rel"})
        );
    }

    #[test]
    fn failure_over_budget_halts_and_rolls_back() {
        use CanaryMachineResult as R;
        let mut r = release(vec![int(1)], "0s", int(0));
        r.spec.auto_rollback = true;
        let mut ms = vec![machine("a", "canary"), machine("b", "canary")];
        let nodes = vec![node("a", true, &[]), node("b", true, &[])];
        let p = plan(&r, &ms, &nodes, ts(0));
        apply(&p, &mut r, &mut ms);

        // a's upgrade fails: over the budget of 0, so roll back at once.
        installed(&mut ms[0], NEW, false);
        let s = ms[0].status.as_mut().unwrap();
        s.phase = Some(MachinePhase::Failed);
        let p = plan(&r, &ms, &nodes, ts(5));
        assert_eq!(reasons(&p), vec!["MachineFailed", "RollingBack"]);
        let MarkChange::Set(back) = &p.marks["a"] else {
            panic!("a must be rolled back: {p:?}");
        };
        assert_eq!(
            back.packages,
            Some(BTreeMap::from([("kubelet".into(), OLD.into())]))
        );
        assert!(!p.marks.contains_key("b"), "b was never released");
        apply(&p, &mut r, &mut ms);
        let st = r.status.clone().unwrap();
        assert_eq!(st.phase, Some(CanaryPhase::RollingBack));
        assert!(conditions::is_true(&st.conditions, condition::HALTED));
        assert_eq!(
            rollout::target(&ms[0], None).package_version("kubelet"),
            Some(OLD)
        );

        // Still on the new version: rolling back.
        let p = plan(&r, &ms, &nodes, ts(6));
        assert!(p.marks.is_empty());
        assert_eq!(p.status.phase, Some(CanaryPhase::RollingBack));

        // A failed health check leaves the old PackageVersion recorded but
        // unhealthy and the Machine Failed: the host still runs the new one.
        installed(&mut ms[0], OLD, false);
        let p = plan(&r, &ms, &nodes, ts(6));
        assert_eq!(p.status.phase, Some(CanaryPhase::RollingBack), "{p:?}");
        assert_eq!(p.status.machines[0].result, R::Failed);

        // The Machine controller put the old version back.
        installed(&mut ms[0], OLD, true);
        ms[0].status.as_mut().unwrap().phase = Some(MachinePhase::Ready);
        let p = plan(&r, &ms, &nodes, ts(7));
        assert_eq!(reasons(&p), vec!["RolledBack"]);
        apply(&p, &mut r, &mut ms);
        let st = r.status.clone().unwrap();
        assert_eq!(st.phase, Some(CanaryPhase::RolledBack));
        assert!(conditions::is_true(&st.conditions, condition::ROLLED_BACK));
        assert_eq!(
            results(&r),
            vec![("a".into(), 0, R::RolledBack), ("b".into(), 1, R::Pending)]
        );
        // Still halted, and a says why it was rolled back.
        assert!(conditions::is_true(&st.conditions, condition::HALTED));
        let a = &st.machines[0];
        assert!(
            a.message
                .as_deref()
                .is_some_and(|m| m.contains("upgrade failed")),
            "{a:?}"
        );
    }

    #[test]
    fn halt_without_auto_rollback_waits_and_resume_retries() {
        let mut r = release(vec![int(1)], "0s", int(0));
        let mut ms = vec![machine("a", "canary"), machine("b", "canary")];
        let nodes = vec![node("a", true, &[]), node("b", true, &[])];
        let p = plan(&r, &ms, &nodes, ts(0));
        apply(&p, &mut r, &mut ms);
        // a never gets there: the 60s timeout fails it and the release halts.
        let p = plan(&r, &ms, &nodes, ts(61));
        assert_eq!(reasons(&p), vec!["MachineFailed", "Halted"]);
        apply(&p, &mut r, &mut ms);
        assert_eq!(r.status.as_ref().unwrap().phase, Some(CanaryPhase::Halted));
        let p = plan(&r, &ms, &nodes, ts(70));
        assert!(
            p.marks.is_empty() && p.events.is_empty(),
            "halted is quiet: {p:?}"
        );

        // Resume: a is judged again from now, and once it passes batch 2 starts.
        r.spec.action = Some(CanaryAction::Resume);
        r.metadata.generation = Some(2);
        let p = plan(&r, &ms, &nodes, ts(80));
        assert!(reasons(&p).contains(&"Resumed"));
        assert!(matches!(&p.marks["a"], MarkChange::Set(m) if m.released_at == Some(ts(80))));
        apply(&p, &mut r, &mut ms);
        assert_eq!(
            r.status.as_ref().unwrap().phase,
            Some(CanaryPhase::Progressing)
        );
        installed(&mut ms[0], NEW, true);
        // No pause between batches: b is released in the same step.
        let p = plan(&r, &ms, &nodes, ts(85));
        assert_eq!(
            reasons(&p),
            vec!["MachineSucceeded", "BatchPassed", "BatchStarted"]
        );
        assert!(matches!(&p.marks["b"], MarkChange::Set(m) if m.packages.is_some()));
    }

    #[test]
    fn pause_starts_no_new_batch_and_rollback_action_rolls_back() {
        let mut r = release(vec![int(1)], "0s", int(0));
        let mut ms = vec![machine("a", "canary"), machine("b", "canary")];
        let nodes = vec![node("a", true, &[]), node("b", true, &[])];
        let p = plan(&r, &ms, &nodes, ts(0));
        apply(&p, &mut r, &mut ms);
        r.spec.action = Some(CanaryAction::Pause);
        r.metadata.generation = Some(2);
        installed(&mut ms[0], NEW, true);
        let p = plan(&r, &ms, &nodes, ts(5));
        apply(&p, &mut r, &mut ms);
        let p = plan(&r, &ms, &nodes, ts(100));
        assert!(p.marks.is_empty(), "paused: {p:?}");
        assert_eq!(p.status.phase, Some(CanaryPhase::Paused));

        r.spec.action = Some(CanaryAction::Rollback);
        r.metadata.generation = Some(3);
        let p = plan(&r, &ms, &nodes, ts(110));
        let MarkChange::Set(back) = &p.marks["a"] else {
            panic!("a must be rolled back: {p:?}");
        };
        assert_eq!(
            back.packages,
            Some(BTreeMap::from([("kubelet".into(), OLD.into())]))
        );
        assert_eq!(p.status.phase, Some(CanaryPhase::RollingBack));
    }
}
