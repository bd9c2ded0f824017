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

/// What one plan reads: the release and the Machines and Nodes around it,
/// as one reconcile saw them.
struct Pass<'a> {
    name: String,
    spec: &'a kube_on_kube_api::CanaryReleaseSpec,
    /// The status the release had when it was read.
    old: &'a CanaryReleaseStatus,
    generation: Option<i64>,
    /// The spec changed since the status was written.
    spec_changed: bool,
    pause: Duration,
    timeout: Duration,
    machines: &'a [Machine],
    by_name: BTreeMap<&'a str, &'a Machine>,
    nodes: BTreeMap<&'a str, &'a Node>,
    now: Timestamp,
}

impl Pass<'_> {
    /// Whether this release holds `machine`.
    fn ours(&self, machine: &Machine) -> bool {
        rollout::canary_claim(machine) == Some(self.name.as_str())
    }

    fn machine(&self, name: &str) -> Option<&Machine> {
        self.by_name.get(name).copied()
    }
}

/// What one plan writes as it goes; [`Draft::done`] makes it the [`Plan`].
struct Draft {
    status: CanaryReleaseStatus,
    conditions: Vec<Condition>,
    marks: BTreeMap<String, MarkChange>,
    events: Vec<(EventType, &'static str, String)>,
    requeue: Duration,
}

impl Draft {
    fn set_condition(
        &mut self,
        pass: &Pass<'_>,
        type_: &'static str,
        ok: bool,
        reason: &'static str,
        message: String,
    ) {
        conditions::set(
            &mut self.conditions,
            Desired {
                type_,
                status: ok.into(),
                reason,
                message,
            },
            pass.generation,
            pass.now,
        );
    }

    fn event(&mut self, type_: EventType, reason: &'static str, note: String) {
        self.events.push((type_, reason, note));
    }

    /// The Machines named let go of this release's marks.
    fn release_all(&mut self, names: impl IntoIterator<Item = String>) {
        for name in names {
            self.marks.insert(name, MarkChange::Release);
        }
    }

    /// The plan of a release that got past selection: its conditions
    /// (Progressing, Halted, RolledBack, Promoted) settled from the phase
    /// and the budget.
    fn concluded(
        mut self,
        pass: &Pass<'_>,
        failed: usize,
        budget: usize,
        halted: bool,
        promote: Option<BTreeMap<String, String>>,
    ) -> Plan {
        finish_conditions(
            &mut self.conditions,
            &self.status,
            failed,
            budget,
            halted,
            pass.generation,
            pass.now,
        );
        self.done(promote)
    }

    fn done(mut self, promote: Option<BTreeMap<String, String>>) -> Plan {
        self.status.conditions = self.conditions;
        Plan {
            status: self.status,
            marks: self.marks,
            promote,
            events: self.events,
            requeue: self.requeue,
        }
    }
}

/// What a release does next, once its Machines are judged.
enum Step {
    RollBack,
    Promote,
    Halt,
    Progress,
}

/// The entries of batch `batch`.
fn in_batch(machines: &[CanaryMachine], batch: i32) -> impl Iterator<Item = &CanaryMachine> {
    machines.iter().filter(move |m| m.batch == batch)
}

/// Decide the next step of `release` from the cluster's `machines` and
/// `nodes` at time `now`.
pub fn plan(release: &CanaryRelease, machines: &[Machine], nodes: &[Node], now: Timestamp) -> Plan {
    use CanaryMachineResult as R;
    let spec = &release.spec;
    let generation = release.metadata.generation;
    let old = release.status.clone().unwrap_or_default();
    let pass = Pass {
        name: release.name_any(),
        spec,
        old: &old,
        generation,
        spec_changed: old.observed_generation != generation,
        pause: kok_common::duration::parse(&spec.pause_between_batches).unwrap_or(Duration::ZERO),
        timeout: kok_common::duration::parse(&spec.health_gates.timeout)
            .unwrap_or(Duration::from_secs(600)),
        machines,
        by_name: machines
            .iter()
            .filter_map(|m| m.metadata.name.as_deref().map(|n| (n, m)))
            .collect(),
        nodes: nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref().map(|k| (k, n)))
            .collect(),
        now,
    };
    let mut status = old.clone();
    status.observed_generation = generation;
    let mut d = Draft {
        conditions: std::mem::take(&mut status.conditions),
        status,
        marks: BTreeMap::new(),
        events: Vec::new(),
        requeue: Duration::from_secs(5),
    };

    // A promoted release only lets go of what it still holds.
    if old.phase == Some(CanaryPhase::Promoted) {
        d.release_all(
            machines
                .iter()
                .filter(|m| pass.ours(m))
                .map(|m| m.name_any()),
        );
        d.requeue = Duration::from_secs(300);
        return d.done(None);
    }
    // Selection, once.
    if d.status.machines.is_empty() && !select(&pass, &mut d) {
        return d.done(None);
    }
    let total = d
        .status
        .machines
        .iter()
        .map(|m| m.batch + 1)
        .max()
        .unwrap_or(0);
    judge(&pass, &mut d);
    resume(&pass, &mut d);

    let budget = failure_budget(&spec.failure_budget, d.status.machines.len());
    let failed = d
        .status
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
    let step = if rolling_back {
        Step::RollBack
    } else if spec.action == Some(CanaryAction::Promote) && !over {
        Step::Promote
    } else if over {
        Step::Halt
    } else {
        Step::Progress
    };
    match step {
        Step::RollBack => roll_back(&pass, &mut d, over, failed, budget),
        Step::Promote => {
            promote(&pass, &mut d);
            return d.concluded(&pass, failed, budget, halted, Some(spec.packages.clone()));
        }
        Step::Halt => {
            if old.phase != Some(CanaryPhase::Halted) {
                d.event(
                    EventType::Warning,
                    "Halted",
                    format!("{failed} Machines failed, more than the failure budget of {budget}; no new batch starts"),
                );
            }
            d.status.phase = Some(CanaryPhase::Halted);
        }
        Step::Progress => progress(&pass, &mut d, total, failed),
    }
    if d.status.phase == Some(CanaryPhase::Paused) && old.phase != Some(CanaryPhase::Paused) {
        d.event(
            EventType::Normal,
            "Paused",
            "no new batch starts until the action is Resume or removed".into(),
        );
    }
    let current = d.status.current_batch.unwrap_or(0);
    d.status.batch_progress = Some(format!("{}/{total}", (current + 1).min(total)));
    aggregate(&mut d.status);
    d.concluded(&pass, failed, budget, halted, None)
}

/// Select the Machines the selector picks that nobody else claims, in
/// batches, and claim them all. False when there is nothing to go on with
/// (an unusable selector, no free Machine): the draft is then the plan.
fn select(pass: &Pass<'_>, d: &mut Draft) -> bool {
    use CanaryMachineResult as R;
    let selector = match Selector::try_from(pass.spec.selector.clone()) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("the selector cannot be used: {e}");
            d.set_condition(
                pass,
                condition::PROGRESSING,
                false,
                "InvalidSelector",
                msg.clone(),
            );
            d.status.phase = Some(CanaryPhase::Pending);
            d.event(EventType::Warning, "InvalidSelector", msg);
            d.requeue = Duration::from_secs(300);
            return false;
        }
    };
    let (taken, free): (Vec<&Machine>, Vec<&Machine>) = pass
        .by_name
        .values()
        .copied()
        .filter(|m| selector.matches(m.labels()))
        .partition(|m| rollout::canary_claim(m).is_some_and(|c| c != pass.name));
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
        d.set_condition(
            pass,
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
        d.set_condition(
            pass,
            condition::CLAIM_CONFLICT,
            true,
            "ClaimedByAnotherRelease",
            msg.clone(),
        );
        d.event(EventType::Warning, "ClaimConflict", msg);
    }
    let sizes = batch_sizes(free.len(), &pass.spec.batches);
    let mut names = free.iter().map(|m| m.name_any());
    for (batch, size) in sizes.iter().enumerate() {
        for machine in names.by_ref().take(*size) {
            d.status.machines.push(CanaryMachine {
                name: machine,
                batch: i32::try_from(batch).unwrap_or(i32::MAX),
                result: R::Pending,
                message: None,
            });
        }
    }
    if d.status.machines.is_empty() {
        d.set_condition(
            pass,
            condition::PROGRESSING,
            false,
            "NoMachines",
            "the selector picks no Machine that is free to claim".into(),
        );
        d.status.phase = Some(CanaryPhase::Pending);
        d.status.batch_progress = Some("0/0".into());
        aggregate(&mut d.status);
        d.requeue = Duration::from_secs(30);
        return false;
    }
    let note = format!(
        "{} Machines in {} batches of {:?}",
        d.status.machines.len(),
        sizes.len(),
        sizes
    );
    d.event(EventType::Normal, "Selected", note);
    d.status.current_batch = Some(0);
    d.status.phase = Some(CanaryPhase::Progressing);
    // Claim them all now, so no other release takes them mid-way. A
    // Machine this release already marked keeps its marks: selecting
    // again must not take back a batch already released.
    for entry in &d.status.machines {
        let kept = pass
            .machine(&entry.name)
            .filter(|m| pass.ours(m))
            .map(Marks::read)
            .unwrap_or_default();
        d.marks.insert(entry.name.clone(), MarkChange::Set(kept));
    }
    true
}

/// Judge the released Machines by the health gates.
fn judge(pass: &Pass<'_>, d: &mut Draft) {
    use CanaryMachineResult as R;
    for entry in d.status.machines.iter_mut() {
        let machine = pass.machine(&entry.name);
        if matches!(entry.result, R::Succeeded | R::Failed | R::RolledBack) {
            continue;
        }
        let released = machine
            .map(Marks::read)
            .is_some_and(|m| m.packages.as_ref() == Some(&pass.spec.packages));
        if !released && machine.is_some() {
            continue;
        }
        let v = evaluate(
            machine,
            node_of(machine, &pass.nodes),
            &pass.spec.packages,
            &pass.spec.health_gates,
            pass.timeout,
            pass.now,
        );
        if v.result != entry.result {
            match v.result {
                R::Succeeded => d.events.push((
                    EventType::Normal,
                    "MachineSucceeded",
                    format!("{} passed the health gates", entry.name),
                )),
                R::Failed => d.events.push((
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
}

/// Resume (once per spec change) gives a halted release's failed Machines
/// another try from now.
fn resume(pass: &Pass<'_>, d: &mut Draft) {
    use CanaryMachineResult as R;
    if pass.spec.action != Some(CanaryAction::Resume)
        || !pass.spec_changed
        || pass.old.phase != Some(CanaryPhase::Halted)
    {
        return;
    }
    for entry in d
        .status
        .machines
        .iter_mut()
        .filter(|m| m.result == R::Failed)
    {
        if let Some(m) = pass.machine(&entry.name) {
            let mut mk = Marks::read(m);
            mk.released_at = Some(pass.now);
            d.marks.insert(entry.name.clone(), MarkChange::Set(mk));
            entry.result = R::Upgrading;
            entry.message = Some("resumed; judged again".into());
        }
    }
    d.event(
        EventType::Normal,
        "Resumed",
        "failed Machines are judged again".into(),
    );
}

/// Return every upgraded Machine to the versions it ran before, and say
/// when all of them do.
fn roll_back(pass: &Pass<'_>, d: &mut Draft, over: bool, failed: usize, budget: usize) {
    use CanaryMachineResult as R;
    let old = pass.old;
    if !matches!(
        old.phase,
        Some(CanaryPhase::RollingBack | CanaryPhase::RolledBack)
    ) {
        let why = if over {
            format!("{failed} failed, budget {budget}")
        } else {
            "asked for".into()
        };
        d.event(
            EventType::Warning,
            "RollingBack",
            format!("returning every upgraded Machine to its previous versions ({why})"),
        );
    }
    let mut done = true;
    for entry in d.status.machines.iter_mut() {
        let Some(m) = pass.machine(&entry.name) else {
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
            d.marks.insert(entry.name.clone(), MarkChange::Set(back));
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
            d.event(
                EventType::Normal,
                "RolledBack",
                "every upgraded Machine runs its previous versions again".into(),
            );
        }
        d.status.phase = Some(CanaryPhase::RolledBack);
        d.requeue = Duration::from_secs(300);
    } else {
        d.status.phase = Some(CanaryPhase::RollingBack);
    }
}

/// Make the targets the cluster default and let go of every Machine.
fn promote(pass: &Pass<'_>, d: &mut Draft) {
    d.release_all(
        pass.machines
            .iter()
            .filter(|m| pass.ours(m))
            .map(|m| m.name_any()),
    );
    // Machines claimed in this very reconcile are not on the server yet.
    let claimed: Vec<String> = d.status.machines.iter().map(|e| e.name.clone()).collect();
    d.release_all(claimed);
    d.event(
        EventType::Normal,
        "Promoted",
        format!(
            "the targets {:?} are the cluster default now",
            pass.spec.packages
        ),
    );
    d.status.phase = Some(CanaryPhase::Promoted);
    d.requeue = Duration::from_secs(300);
    d.status.batch_passed_at = None;
    aggregate(&mut d.status);
}

/// Release the Machines of `batch` named `names` to the targets.
fn start_batch(pass: &Pass<'_>, d: &mut Draft, batch: i32, names: &[String], total: i32) {
    use CanaryMachineResult as R;
    for n in names {
        if let Some(m) = pass.machine(n) {
            let mk = release_marks(
                m,
                node_of(Some(m), &pass.nodes),
                &pass.spec.packages,
                &pass.spec.health_gates,
                pass.now,
            );
            d.marks.insert(n.clone(), MarkChange::Set(mk));
            if let Some(e) = d.status.machines.iter_mut().find(|e| e.name == *n) {
                e.result = R::Upgrading;
                e.message = None;
            }
        }
    }
    d.event(
        EventType::Normal,
        "BatchStarted",
        format!("batch {}/{total}: {}", batch + 1, names.join(", ")),
    );
}

/// Progress through the batches: release the current one, wait for its
/// verdicts and the pause, then the next; succeed after the last.
fn progress(pass: &Pass<'_>, d: &mut Draft, total: i32, failed: usize) {
    use CanaryMachineResult as R;
    let spec = pass.spec;
    let current = d.status.current_batch.unwrap_or(0);
    let unreleased: Vec<String> = in_batch(&d.status.machines, current)
        .filter(|e| e.result == R::Pending)
        .map(|e| e.name.clone())
        .collect();
    let paused = spec.action == Some(CanaryAction::Pause);
    if !unreleased.is_empty() {
        if paused {
            d.status.phase = Some(CanaryPhase::Paused);
        } else {
            start_batch(pass, d, current, &unreleased, total);
            d.status.phase = Some(CanaryPhase::Progressing);
        }
        return;
    }
    if !in_batch(&d.status.machines, current).all(|e| matches!(e.result, R::Succeeded | R::Failed))
    {
        d.status.phase = Some(if paused {
            CanaryPhase::Paused
        } else {
            CanaryPhase::Progressing
        });
        return;
    }
    let passed_at = match &d.status.batch_passed_at {
        Some(t) => t.0,
        None => {
            let ok = in_batch(&d.status.machines, current)
                .filter(|e| e.result == R::Succeeded)
                .count();
            let bad = in_batch(&d.status.machines, current)
                .filter(|e| e.result == R::Failed)
                .count();
            d.event(
                EventType::Normal,
                "BatchPassed",
                format!(
                    "batch {}/{total}: {ok} succeeded, {bad} failed",
                    current + 1
                ),
            );
            d.status.batch_passed_at = Some(Time(pass.now));
            pass.now
        }
    };
    let waited = Duration::from_millis(
        u64::try_from(pass.now.as_millisecond() - passed_at.as_millisecond()).unwrap_or(0),
    );
    if current + 1 >= total {
        if pass.old.phase != Some(CanaryPhase::Succeeded) {
            let succeeded = d
                .status
                .machines
                .iter()
                .filter(|m| m.result == R::Succeeded)
                .count();
            d.event(
                EventType::Normal,
                "Succeeded",
                format!("every batch passed: {succeeded} succeeded, {failed} failed"),
            );
        }
        d.status.phase = Some(CanaryPhase::Succeeded);
        d.requeue = Duration::from_secs(300);
    } else if paused {
        d.status.phase = Some(CanaryPhase::Paused);
    } else if waited >= pass.pause {
        let next = current + 1;
        let names: Vec<String> = in_batch(&d.status.machines, next)
            .map(|e| e.name.clone())
            .collect();
        d.status.current_batch = Some(next);
        d.status.batch_passed_at = None;
        start_batch(pass, d, next, &names, total);
        d.status.phase = Some(CanaryPhase::Progressing);
    } else {
        d.requeue = d.requeue.min(pass.pause - waited);
        d.status.phase = Some(CanaryPhase::Progressing);
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
