//! The release's state machine: [`plan`] decides, from the release, the
//! Machines and the Nodes, the next status, the marks to write, whether to
//! promote and the Events to publish. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::EventType;
use kube_on_kube_api::canary::{CanaryAction, CanaryMachine, CanaryMachineResult, CanaryPhase};
use kube_on_kube_api::{CanaryRelease, CanaryReleaseStatus, Machine};

use super::gates::{node_of, rolled_back};
use super::marks::release_marks;
use super::*;
use crate::rollout;

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

pub(super) fn percent(s: &str) -> Option<usize> {
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
pub(super) fn finish_conditions(
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
