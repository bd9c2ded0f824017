use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions;
use kube::ResourceExt;
use kube_on_kube_api::canary::{CanaryAction, CanaryMachine, CanaryMachineResult, CanaryPhase};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::shared::OperationResult;
use kube_on_kube_api::{CanaryRelease, CanaryReleaseStatus, Machine};

use super::gates::*;
use super::marks::*;
use super::plan::*;
use super::*;
use crate::rollout::{self, CANARY_ANNOTATION};
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
