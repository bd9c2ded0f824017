//! CanaryRelease end to end: the node-operator binary against a real API
//! server and controller-manager, three Machines on real SSH test hosts
//! running the test kubelet, and real kubelet packages: one that works and one
//! whose health check fails.
//!
//! One operator works on the whole cluster, so the scenarios run in sequence
//! in one test: a release goes batch by batch (paused and resumed between
//! two batches), a second release selecting the same Machines is refused
//! them, the first is promoted to the cluster default, a broken version
//! spends the failure budget and halts its release, and the rollback action
//! returns the Machine to the version it ran before. Machines and releases
//! are recorded by watches, so batch boundaries are checked at every moment,
//! not at samples.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::jiff::Timestamp;
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::canary::{CanaryMachineResult, CanaryPhase};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::package::HealthCheck;
use kube_on_kube_api::{CanaryRelease, ClusterPackageVersion, Machine, PackageVersion};
use serde_json::json;
use support::*;

const OLD: &str = "kubelet-1.35.4";
const GOOD: &str = "kubelet-1.35.5";
const BROKEN: &str = "kubelet-1.35.6";
const CLAIM: &str = "kubeonkube.io/canary";
const RELEASED_PACKAGES: &str = "kubeonkube.io/canary-packages";
const RELEASED_AT: &str = "kubeonkube.io/canary-released-at";
/// `pauseBetweenBatches` of the first release: long enough for the test to
/// pause the release after its first batch, before the second would start.
const PAUSE: Duration = Duration::from_secs(8);

fn release(name: &str, target: &str, batches: serde_json::Value, pause: &str) -> CanaryRelease {
    serde_json::from_value(json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "CanaryRelease",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"pool": "canary"}},
            "packages": {"kubelet": target},
            "batches": batches,
            "pauseBetweenBatches": pause,
            "healthGates": {"nodeReady": true, "packageHealth": true, "timeout": "4m"},
            "failureBudget": 0,
            "autoRollback": false,
        },
    }))
    .unwrap()
}

async fn set_action(api: &Api<CanaryRelease>, name: &str, action: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"action": action}})),
    )
    .await
    .unwrap();
}

fn canary_phase(r: &CanaryRelease) -> Option<CanaryPhase> {
    r.status.as_ref().and_then(|s| s.phase)
}

fn canary_condition(r: &CanaryRelease, type_: &str) -> Option<(String, String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_phase(
    api: &Api<CanaryRelease>,
    name: &str,
    want: CanaryPhase,
    timeout: Duration,
) -> CanaryRelease {
    wait_for(
        &format!("CanaryRelease {name} {want:?}"),
        timeout,
        async || {
            let r = api.get_opt(name).await.ok()??;
            (canary_phase(&r) == Some(want)).then_some(r)
        },
    )
    .await
}

/// The PackageVersions released to the Machine by the release claiming it.
fn released_packages(m: &Machine) -> Option<String> {
    m.annotations().get(RELEASED_PACKAGES).cloned()
}

fn released_at(m: &Machine) -> Option<SystemTime> {
    let t: Timestamp = m.annotations().get(RELEASED_AT)?.parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(t.as_nanosecond()).ok()?))
}

async fn canary_events(h: &Harness, name: &str) -> Vec<String> {
    events_for(&h.client, name)
        .await
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("CanaryRelease"))
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_batches_pause_conflict_promote_halt_and_roll_back() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: 3 }).await;
    let pvs: Api<PackageVersion> = Api::all(h.client.clone());
    apply(&pvs, &kubelet_version(&h, "1.35.5")).await;
    // A kubelet that installs and runs but never passes its health check.
    let mut broken = kubelet_version(&h, "1.35.6");
    broken.spec.health_check = Some(HealthCheck {
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo 'kubelet 1.35.6 is broken' >&2; exit 1".into(),
        ]),
        http_get: None,
        timeout_seconds: 5,
    });
    apply(&pvs, &broken).await;

    let hosts = h.hosts.hosts();
    let machines = h.machines();
    let releases: Api<CanaryRelease> = Api::all(h.client.clone());
    let cpvs: Api<ClusterPackageVersion> = Api::all(h.client.clone());
    for (i, host) in hosts.iter().enumerate() {
        let mut m = machine(host, host.host_public_key(), i);
        m.spec.packages.clear();
        m.metadata.labels = Some(BTreeMap::from([("pool".into(), "canary".into())]));
        apply(&machines, &m).await;
    }
    let _operator = h.operator();
    wait_all_at(&machines, hosts, "kubelet", OLD, Duration::from_secs(240)).await;
    eprintln!("3 Machines Ready at {OLD} after {:?}", started.elapsed());

    let mut recorder = Recorder::new();
    recorder.watch(machines.clone(), "Machine").await;
    recorder.watch(releases.clone(), "CanaryRelease").await;

    // 1. Batch by batch, one Machine each, PAUSE apart; paused after the first.
    let good = "kubelet-1.35.5";
    let t = Instant::now();
    releases
        .create(
            &PostParams::default(),
            &release(good, GOOD, json!([1, 1]), &format!("{}s", PAUSE.as_secs())),
        )
        .await
        .unwrap();
    wait_for(
        "the first batch passed",
        Duration::from_secs(180),
        async || {
            let r = releases.get(good).await.ok()?;
            r.status.as_ref()?.batch_passed_at.as_ref().map(|_| ())
        },
    )
    .await;
    set_action(&releases, good, "Pause").await;
    let paused_at = SystemTime::now();
    eprintln!("first batch passed after {:?}; paused", t.elapsed());

    // 2. Meanwhile a second release selects the same Machines: refused.
    let rival = "rival";
    releases
        .create(
            &PostParams::default(),
            &release(rival, GOOD, json!([1]), "0s"),
        )
        .await
        .unwrap();
    let r = wait_for("the rival refused", Duration::from_secs(60), async || {
        let r = releases.get(rival).await.ok()?;
        let c = canary_condition(&r, "ClaimConflict")?;
        (c.0 == "True").then_some(r)
    })
    .await;
    let (_, reason, message) = canary_condition(&r, "ClaimConflict").unwrap();
    assert_eq!(reason, "ClaimedByAnotherRelease");
    for host in hosts {
        assert!(
            message.contains(&format!("{} (claimed by {good})", host.name())),
            "{message}"
        );
    }
    let st = r.status.clone().unwrap();
    assert_eq!((st.selected, st.machines.len()), (0, 0), "{st:?}");
    assert!(
        canary_events(&h, rival)
            .await
            .contains(&"ClaimConflict".to_string())
    );
    for host in hosts {
        let m = machines.get(host.name()).await.unwrap();
        assert_eq!(m.annotations().get(CLAIM).map(String::as_str), Some(good));
    }
    releases
        .delete(rival, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the rival gone", Duration::from_secs(30), async || {
        releases.get_opt(rival).await.ok()?.is_none().then_some(())
    })
    .await;

    // Paused past the pause between batches: no new batch. (A release that
    // is not paused looks again the moment its pause ends.)
    let held = PAUSE + Duration::from_secs(3);
    tokio::time::sleep(held.saturating_sub(paused_at.elapsed().unwrap())).await;
    let r = releases.get(good).await.unwrap();
    assert_eq!(
        canary_phase(&r),
        Some(CanaryPhase::Paused),
        "{:?}",
        r.status
    );
    let released: Vec<String> = machines
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|m| released_packages(m).is_some())
        .map(|m| m.name_any())
        .collect();
    assert_eq!(
        released.len(),
        1,
        "only the first batch released while paused: {released:?}"
    );
    let resumed_at = SystemTime::now();
    set_action(&releases, good, "Resume").await;
    let r = wait_phase(
        &releases,
        good,
        CanaryPhase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    eprintln!("release succeeded {:?} after it started", t.elapsed());
    let st = r.status.clone().unwrap();
    assert_eq!(
        (st.selected, st.succeeded, st.failed, st.pending),
        (3, 3, 0, 0),
        "{st:?}"
    );
    assert_eq!(st.batch_progress.as_deref(), Some("3/3"));
    let batch_of: BTreeMap<String, i32> = st
        .machines
        .iter()
        .map(|m| (m.name.clone(), m.batch))
        .collect();
    assert_eq!(
        batch_of.values().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([0, 1, 2]),
        "{st:?}"
    );
    assert!(
        st.machines
            .iter()
            .all(|m| m.result == CanaryMachineResult::Succeeded)
    );
    for host in hosts {
        let m = machines.get(host.name()).await.unwrap();
        assert_eq!(installed(&m, "kubelet"), Some((GOOD.to_string(), true)));
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/current"),
            "1.35.5"
        );
    }

    // Batches never overlapped and waited the pause: replayed change by change.
    let changes = recorder.changes();
    let mut replay = Replay::default();
    let mut done: BTreeMap<String, SystemTime> = BTreeMap::new();
    let mut released: BTreeMap<String, SystemTime> = BTreeMap::new();
    for change in &changes {
        replay.apply(change);
        if change.kind != "Machine" {
            continue;
        }
        for m in replay.all::<Machine>("Machine") {
            let name = m.name_any();
            if released_packages(&m).is_some_and(|p| p.contains(GOOD)) {
                released
                    .entry(name.clone())
                    .or_insert_with(|| released_at(&m).unwrap());
                let batch = batch_of[&name];
                // Every Machine of the batch before is done by now.
                for (other, b) in &batch_of {
                    if *b == batch - 1 {
                        assert!(
                            done.contains_key(other),
                            "{name} (batch {batch}) released at rv {} before {other} (batch {b}) passed",
                            change.rv
                        );
                    }
                }
            }
            if phase(&m) == Some(MachinePhase::Ready)
                && installed(&m, "kubelet") == Some((GOOD.to_string(), true))
            {
                done.entry(name).or_insert(change.seen);
            }
        }
    }
    // When the release itself saw each batch pass (its clock, as the
    // released-at marks): the pause runs from there.
    let mut passed: BTreeMap<i32, SystemTime> = BTreeMap::new();
    for c in changes
        .iter()
        .filter(|c| c.kind == "CanaryRelease" && c.name == good)
    {
        let Some(r) = c.object.clone() else { continue };
        let r: CanaryRelease = serde_json::from_value(r).unwrap();
        let Some(st) = r.status else { continue };
        if let (Some(b), Some(t)) = (st.current_batch, st.batch_passed_at) {
            passed.entry(b).or_insert(
                SystemTime::UNIX_EPOCH + Duration::from_nanos(t.0.as_nanosecond() as u64),
            );
        }
    }
    let in_batch = |b: i32| batch_of.iter().find(|(_, x)| **x == b).unwrap().0.clone();
    for b in 1..3 {
        let (prev, this) = (in_batch(b - 1), in_batch(b));
        let after_done = released[&this]
            .duration_since(done[&prev])
            .unwrap_or_default();
        let after_pass = released[&this]
            .duration_since(passed[&(b - 1)])
            .unwrap_or_default();
        eprintln!(
            "batch {b} released {after_pass:?} after batch {} passed its gates ({after_done:?} after the test saw it done)",
            b - 1
        );
        assert!(
            after_pass >= PAUSE,
            "batch {b} started {after_pass:?} after the one before passed; the pause is {PAUSE:?}"
        );
    }
    assert!(
        released[&in_batch(1)] >= resumed_at,
        "the second batch waited for Resume"
    );
    let events = canary_events(&h, good).await;
    for reason in [
        "Selected",
        "BatchStarted",
        "BatchPassed",
        "Paused",
        "Succeeded",
    ] {
        assert!(events.iter().any(|e| e == reason), "{reason}: {events:?}");
    }

    // 3. Promote: the targets become the cluster default, the claims go.
    set_action(&releases, good, "Promote").await;
    let r = wait_phase(
        &releases,
        good,
        CanaryPhase::Promoted,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(canary_condition(&r, "Promoted").unwrap().0, "True");
    let cpv = cpvs.get("default").await.unwrap();
    assert_eq!(cpv.spec.packages["kubelet"], GOOD);
    assert_eq!(
        cpv.spec.packages["containerd"], "containerd-2.1.4",
        "other defaults kept"
    );
    wait_for("the claims released", Duration::from_secs(60), async || {
        let list = machines.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .all(|m| !m.annotations().contains_key(CLAIM) && released_packages(m).is_none())
            .then_some(())
    })
    .await;
    // Each Machine, looked at since its release (its status no longer names
    // one), stays as it is: Ready at the promoted version.
    for host in hosts {
        let m = wait_for(
            "the Machine's status without its release",
            Duration::from_secs(60),
            async || {
                let m = machines.get(host.name()).await.ok()?;
                m.status.as_ref()?.canary.is_none().then_some(m)
            },
        )
        .await;
        assert_eq!(phase(&m), Some(MachinePhase::Ready), "{}", host.name());
        assert_eq!(installed(&m, "kubelet"), Some((GOOD.to_string(), true)));
    }

    // 4. A broken version: the first Machine fails its health check, the
    // budget of 0 is spent, the release halts and starts no other batch.
    let bad = "kubelet-1.35.6";
    let t = Instant::now();
    releases
        .create(
            &PostParams::default(),
            &release(bad, BROKEN, json!([1]), "0s"),
        )
        .await
        .unwrap();
    let r = wait_phase(
        &releases,
        bad,
        CanaryPhase::Halted,
        Duration::from_secs(180),
    )
    .await;
    eprintln!("broken release halted {:?} after it started", t.elapsed());
    let st = r.status.clone().unwrap();
    assert_eq!((st.selected, st.failed, st.succeeded), (3, 1, 0), "{st:?}");
    let victim = st
        .machines
        .iter()
        .find(|m| m.result == CanaryMachineResult::Failed)
        .unwrap()
        .clone();
    assert_eq!(victim.batch, 0);
    assert!(
        victim
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("upgrade failed"),
        "{victim:?}"
    );
    let (status, reason, _) = canary_condition(&r, "Halted").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "FailureBudgetSpent")
    );
    let m = machines.get(&victim.name).await.unwrap();
    assert_eq!(phase(&m), Some(MachinePhase::Failed));
    assert_eq!(
        condition(&m, "PackagesInstalled"),
        Some(("False", "HealthCheckFailed"))
    );
    let victim_host = hosts.iter().find(|h| h.name() == victim.name).unwrap();
    assert_eq!(
        on(
            victim_host,
            "readlink /opt/kube-on-kube/packages/kubelet/current"
        ),
        "1.35.6"
    );
    // Halted: no other Machine gets the broken version. (A release with
    // Machines in flight looks again every 5 s at the latest; with a pause of
    // 0s its next batch would start then.)
    tokio::time::sleep(Duration::from_secs(7)).await;
    let r = releases.get(bad).await.unwrap();
    assert_eq!(canary_phase(&r), Some(CanaryPhase::Halted));
    for host in hosts.iter().filter(|h| h.name() != victim.name) {
        let m = machines.get(host.name()).await.unwrap();
        assert_eq!(released_packages(&m), None, "{} was released", host.name());
        assert_eq!(installed(&m, "kubelet"), Some((GOOD.to_string(), true)));
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/current"),
            "1.35.5"
        );
    }
    // From the first failure the Machine reported to the release halting.
    let changes = recorder.changes();
    let failed_seen = changes
        .iter()
        .filter(|c| c.kind == "Machine" && c.name == victim.name)
        .find_map(|c| {
            let m: Machine = serde_json::from_value(c.object.clone()?).ok()?;
            (phase(&m) == Some(MachinePhase::Failed)
                && released_packages(&m).is_some_and(|p| p.contains(BROKEN)))
            .then_some(c.seen)
        })
        .unwrap();
    let halted_seen = changes
        .iter()
        .filter(|c| c.kind == "CanaryRelease" && c.name == bad)
        .find_map(|c| {
            let r: CanaryRelease = serde_json::from_value(c.object.clone()?).ok()?;
            (canary_phase(&r) == Some(CanaryPhase::Halted)).then_some(c.seen)
        })
        .unwrap();
    eprintln!(
        "first failure to halt: {:?}",
        halted_seen.duration_since(failed_seen).unwrap_or_default()
    );
    assert!(halted_seen >= failed_seen);

    // 5. Rollback: the Machine returns to the version it ran before.
    let t = Instant::now();
    set_action(&releases, bad, "Rollback").await;
    let r = wait_phase(
        &releases,
        bad,
        CanaryPhase::RolledBack,
        Duration::from_secs(180),
    )
    .await;
    eprintln!("rolled back in {:?}", t.elapsed());
    assert_eq!(canary_condition(&r, "RolledBack").unwrap().0, "True");
    let st = r.status.clone().unwrap();
    let entry = st.machines.iter().find(|m| m.name == victim.name).unwrap();
    assert_eq!(entry.result, CanaryMachineResult::RolledBack);
    let m = wait_at(
        &machines,
        &victim.name,
        "kubelet",
        GOOD,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(condition(&m, "NodeReady").map(|c| c.0), Some("True"));
    assert_eq!(
        on(
            victim_host,
            "readlink /opt/kube-on-kube/packages/kubelet/current"
        ),
        "1.35.5"
    );
    assert_eq!(
        on(victim_host, "/usr/local/bin/kubelet --version"),
        "Kubernetes v1.35.5 (kok-test-kubelet)"
    );
    assert_eq!(
        on(victim_host, "systemctl is-active kubelet.service"),
        "active"
    );
    let events = canary_events(&h, bad).await;
    for reason in ["MachineFailed", "Halted", "RollingBack", "RolledBack"] {
        assert!(events.iter().any(|e| e == reason), "{reason}: {events:?}");
    }

    // Deleting the release lets go of its Machines; they follow the default.
    releases
        .delete(bad, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the broken release gone",
        Duration::from_secs(60),
        async || releases.get_opt(bad).await.ok()?.is_none().then_some(()),
    )
    .await;
    for host in hosts {
        let m = machines.get(host.name()).await.unwrap();
        assert!(!m.annotations().contains_key(CLAIM), "{}", host.name());
        wait_at(
            &machines,
            host.name(),
            "kubelet",
            GOOD,
            Duration::from_secs(60),
        )
        .await;
    }

    // 6. The same broken version with automatic rollback, in batches of a
    // third: the first failure spends the budget and the release rolls the
    // Machine back by itself.
    let auto = "kubelet-1.35.6-auto";
    let mut r = release(auto, BROKEN, json!(["33%"]), "0s");
    r.spec.auto_rollback = true;
    let t = Instant::now();
    releases.create(&PostParams::default(), &r).await.unwrap();
    let r = wait_phase(
        &releases,
        auto,
        CanaryPhase::RolledBack,
        Duration::from_secs(180),
    )
    .await;
    eprintln!(
        "broken release rolled back automatically {:?} after it started",
        t.elapsed()
    );
    let st = r.status.clone().unwrap();
    assert_eq!(st.batch_progress.as_deref(), Some("1/2"), "{st:?}");
    let first: Vec<_> = st.machines.iter().filter(|m| m.batch == 0).collect();
    assert_eq!(
        first.len(),
        1,
        "33% of 3 Machines, rounded up, is one: {st:?}"
    );
    assert_eq!(first[0].result, CanaryMachineResult::RolledBack);
    assert!(
        first[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("upgrade failed")),
        "the rolled-back Machine says why: {st:?}"
    );
    assert!(
        st.machines
            .iter()
            .filter(|m| m.batch == 1)
            .all(|m| m.result == CanaryMachineResult::Pending),
        "{st:?}"
    );
    assert_eq!(canary_condition(&r, "Halted").unwrap().0, "True");
    let events = canary_events(&h, auto).await;
    for reason in ["MachineFailed", "RollingBack", "RolledBack"] {
        assert!(events.iter().any(|e| e == reason), "{reason}: {events:?}");
    }
    assert!(
        !events.iter().any(|e| e == "Halted"),
        "rolled back, not left halted: {events:?}"
    );
    let back = hosts.iter().find(|h| h.name() == first[0].name).unwrap();
    wait_at(
        &machines,
        back.name(),
        "kubelet",
        GOOD,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        on(back, "readlink /opt/kube-on-kube/packages/kubelet/current"),
        "1.35.5"
    );
    for host in hosts {
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/current"),
            "1.35.5",
            "{}",
            host.name()
        );
    }
    recorder.stop();
    eprintln!("whole test in {:?}", started.elapsed());
}
