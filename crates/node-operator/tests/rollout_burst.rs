//! The cluster default changes the moment a fleet of new Machines turns
//! Ready, while the operator still works through the watch events of their
//! own provisioning: the rollout keeps to `maxUnavailable` all the same.
//!
//! Each Machine's last status writes queue reconciles that may start before
//! the watch has delivered those writes. A reconcile deciding from such a
//! stale copy saw a Machine that had just been upgraded as still at the old
//! version, or a Ready Machine as still in Upgrading, and wrote that back,
//! so more Machines showed as changing than the budget allows. Every change
//! of Machines and Nodes is recorded by watches and replayed in etcd order,
//! so the test sees each moment rather than what a polling loop samples.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};
use node_operator::rollout::node_ready;
use serde_json::json;
use support::*;

const HOSTS: usize = 10;
/// 30% of 10 Machines.
const BUDGET: usize = 3;
const OLD: &str = "kubelet-1.35.4";
const NEW: &str = "kubelet-1.35.5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_change_as_machines_turn_ready_stays_within_the_budget() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: HOSTS }).await;
    let new = kubelet_version(&h, "1.35.5");
    apply(&Api::<PackageVersion>::all(h.client.clone()), &new).await;
    let cpvs: Api<ClusterPackageVersion> = Api::all(h.client.clone());
    cpvs.patch(
        "default",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"rollout": {"maxUnavailable": "30%"}}})),
    )
    .await
    .unwrap();
    let hosts = h.hosts.hosts();
    let machines = h.machines();
    let nodes: Api<Node> = Api::all(h.client.clone());
    for (i, host) in hosts.iter().enumerate() {
        let mut m = machine(host, host.host_public_key(), i);
        m.spec.packages.clear();
        apply(&machines, &m).await;
    }
    let _operator = h.operator_with(&["--ssh-concurrency", "10"]);

    // The default moves as soon as the last Machine is Ready at the old
    // version: no pause for the operator to settle.
    wait_for(
        "every Machine Ready at the old kubelet",
        Duration::from_secs(300),
        async || {
            let list = machines.list(&Default::default()).await.ok()?.items;
            (list.len() == HOSTS
                && list.iter().all(|m| {
                    phase(m) == Some(MachinePhase::Ready)
                        && installed(m, "kubelet") == Some((OLD.to_string(), true))
                }))
            .then_some(())
        },
    )
    .await;
    let mut recorder = Recorder::new();
    recorder.watch(machines.clone(), "Machine").await;
    recorder.watch(nodes.clone(), "Node").await;
    set_default(&h.client, "kubelet", NEW).await;
    eprintln!(
        "{HOSTS} Machines Ready at {OLD} after {:?}; default moved to {NEW}",
        started.elapsed()
    );
    let changed = Instant::now();
    wait_all_at(&machines, hosts, "kubelet", NEW, Duration::from_secs(300)).await;
    let rolled = changed.elapsed();
    // Reconciles still queued by the last writes get their chance to
    // misbehave too: every host is visited once more.
    let rolled_at = k8s_openapi::jiff::Timestamp::now();
    for host in hosts {
        wait_checked_after(&machines, host.name(), rolled_at, RECHECK * 5).await;
    }
    let changes = recorder.stop();

    let mut replay = Replay::default();
    let mut peak = BTreeSet::new();
    let mut upgrading = BTreeSet::new();
    for change in &changes {
        replay.apply(change);
        let ns: Vec<Node> = replay.all("Node");
        let mut down = BTreeSet::new();
        for m in replay.all::<Machine>("Machine") {
            let name = m.name_any();
            if phase(&m) == Some(MachinePhase::Upgrading) {
                upgrading.insert(name.clone());
            }
            let node_down = ns.iter().any(|n| n.name_any() == name && !node_ready(n));
            if phase(&m) != Some(MachinePhase::Ready) || node_down {
                down.insert(format!("{name}={:?}", phase(&m)));
            }
        }
        assert!(
            down.len() <= BUDGET,
            "{} Machines unavailable at once (rv {}), more than maxUnavailable {BUDGET}: {down:?}",
            down.len(),
            change.rv
        );
        if down.len() > peak.len() {
            peak = down;
        }
    }
    eprintln!(
        "{HOSTS} Machines rolled to {NEW} in {rolled:?}, at most {} unavailable at once ({peak:?}); {} changes recorded",
        peak.len(),
        changes.len()
    );
    assert_eq!(
        upgrading.len(),
        HOSTS,
        "every Machine went through Upgrading"
    );
    for host in hosts {
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/current"),
            "1.35.5",
            "{}",
            host.name()
        );
        let m = machines.get(host.name()).await.unwrap();
        assert_eq!(phase(&m), Some(MachinePhase::Ready), "{}", host.name());
    }
    eprintln!("whole test in {:?}", started.elapsed());
}
