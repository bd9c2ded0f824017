//! A change of the cluster default rolls every Machine that follows it, end
//! to end: the node-operator binary against a real API server and
//! controller-manager, four Machines on real SSH test hosts running the test
//! kubelet, and the ClusterPackageVersion's kubelet moved from one real
//! package to the next.
//!
//! Every change of Machines, Nodes and Pods is recorded by watches and
//! replayed in etcd order, so the test sees each moment of the rollout rather
//! than the samples a polling loop happens to take: at no moment are more
//! Machines unavailable (changing, or with a Node not Ready or cordoned for
//! the upgrade) than `maxUnavailable`; each Node is cordoned and its Pod
//! evicted before the new kubelet is switched in; only the operator's cordons
//! are undone; and a Machine's own override wins over the default.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod};
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};
use node_operator::rollout::node_ready;
use serde_json::json;
use support::*;

const OLD: &str = "kubelet-1.35.4";
const NEW: &str = "kubelet-1.35.5";
const CORDONED_BY: &str = "kubeonkube.io/cordoned-by";

fn busy(m: &Machine) -> bool {
    matches!(
        phase(m),
        Some(
            MachinePhase::Provisioning
                | MachinePhase::Upgrading
                | MachinePhase::Repairing
                | MachinePhase::Failed
        )
    )
}

fn unschedulable(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn cordoned_by_operator(n: &Node) -> bool {
    unschedulable(n) && n.annotations().contains_key(CORDONED_BY)
}

/// When `path` (a symlink) on the host was last replaced.
fn switched_at(host: &kok_testenv::hosts::TestHost, path: &str) -> SystemTime {
    let secs: f64 = on(host, &format!("stat -c %.9Y {path}")).parse().unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_change_rolls_within_the_budget() {
    let started = Instant::now();
    let h = Harness::start(HarnessOptions { hosts: 4 }).await;
    let new = kubelet_version(&h, "1.35.5");
    apply(&Api::<PackageVersion>::all(h.client.clone()), &new).await;
    let hosts = h.hosts.hosts();
    let machines = h.machines();
    let nodes: Api<Node> = Api::all(h.client.clone());
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");

    // Three Machines follow the default; the fourth pins the old kubelet.
    let pinned = hosts[3].name();
    for (i, host) in hosts.iter().enumerate() {
        let mut m = machine(host, host.host_public_key(), i);
        m.spec.packages.clear();
        if host.name() == pinned {
            m.spec.packages.insert("kubelet".into(), OLD.into());
        }
        apply(&machines, &m).await;
    }
    let _operator = h.operator();
    wait_all_at(&machines, hosts, "kubelet", OLD, Duration::from_secs(240)).await;
    eprintln!("4 Machines Ready at {OLD} after {:?}", started.elapsed());

    // A Pod on every Node, for the drains to evict; the second Node cordoned
    // by its administrator.
    for host in hosts {
        let pod = pod_on(host.name(), &format!("app-{}", host.name()));
        wait_for("the Pod created", Duration::from_secs(60), async || {
            pods.create(&PostParams::default(), &pod).await.ok()
        })
        .await;
    }
    let user_cordoned = hosts[1].name();
    nodes
        .patch(
            user_cordoned,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();

    let mut recorder = Recorder::new();
    recorder.watch(machines.clone(), "Machine").await;
    recorder.watch(nodes.clone(), "Node").await;
    recorder.watch(pods.clone(), "Pod").await;

    let changed = Instant::now();
    let changed_at = SystemTime::now();
    let cpvs: Api<ClusterPackageVersion> = Api::all(h.client.clone());
    set_default(&h.client, "kubelet", NEW).await;
    let followers: Vec<_> = hosts.iter().filter(|h| h.name() != pinned).collect();
    for host in &followers {
        wait_at(
            &machines,
            host.name(),
            "kubelet",
            NEW,
            Duration::from_secs(300),
        )
        .await;
    }
    let rolled = changed.elapsed();
    // Every Node the operator cordoned is schedulable again.
    wait_for(
        "the upgrade cordons undone",
        Duration::from_secs(60),
        async || {
            let list = nodes.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .all(|n| !n.annotations().contains_key(CORDONED_BY))
                .then_some(())
        },
    )
    .await;
    // The pinned Machine had every chance to move, and did not: its host
    // was visited again after every follower had moved.
    wait_checked_after(
        &machines,
        pinned,
        k8s_openapi::jiff::Timestamp::now(),
        RECHECK * 5,
    )
    .await;
    let changes = recorder.stop();
    eprintln!(
        "{} Machines rolled to {NEW} in {rolled:?}: {:.2} Machines per minute ({} changes recorded)",
        followers.len(),
        followers.len() as f64 / rolled.as_secs_f64() * 60.0,
        changes.len()
    );

    // Replay every change in etcd order and look at each moment.
    let mut replay = Replay::default();
    let mut peak = 0;
    let mut peak_set = BTreeSet::new();
    let mut upgrading = BTreeSet::new();
    let mut waited_for_budget = BTreeSet::new();
    // Node → when the test saw the operator's cordon / the Pod gone.
    let mut cordoned_seen: BTreeMap<String, SystemTime> = BTreeMap::new();
    let mut evicted_seen: BTreeMap<String, SystemTime> = BTreeMap::new();
    let mut ever_cordoned_by_operator = BTreeSet::new();
    for change in &changes {
        replay.apply(change);
        let ms: Vec<Machine> = replay.all("Machine");
        let ns: BTreeMap<String, Node> = replay
            .all::<Node>("Node")
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        let mut down = BTreeSet::new();
        for m in &ms {
            let name = m.name_any();
            if phase(m) == Some(MachinePhase::Upgrading) {
                upgrading.insert(name.clone());
            }
            if condition(m, "PackagesInstalled") == Some(("False", "WaitingForBudget")) {
                waited_for_budget.insert(name.clone());
            }
            let node = ns.get(&name);
            let node_down =
                node.is_some_and(|n| !node_ready(n) || (unschedulable(n) && name != user_cordoned));
            if busy(m) || node_down {
                down.insert(name);
            }
        }
        if down.len() > peak {
            peak = down.len();
            peak_set = down.clone();
        }
        assert!(
            down.len() <= 1,
            "{} Machines unavailable at once (rv {}): {down:?}",
            down.len(),
            change.rv
        );
        if change.kind == "Node"
            && let Some(n) = &change.object
        {
            let n: Node = serde_json::from_value(n.clone()).unwrap();
            if cordoned_by_operator(&n) {
                ever_cordoned_by_operator.insert(n.name_any());
                cordoned_seen.entry(n.name_any()).or_insert(change.seen);
            }
        }
        if change.kind == "Pod" && change.object.is_none() {
            let node = change.name.trim_start_matches("default/app-").to_string();
            evicted_seen.entry(node).or_insert(change.seen);
        }
    }
    eprintln!(
        "at most {peak} Machine unavailable at a time ({peak_set:?}); upgrading seen: {upgrading:?}; waited for the budget: {waited_for_budget:?}"
    );
    assert_eq!(peak, 1, "the rollout was seen taking Machines down");
    let want: BTreeSet<String> = followers.iter().map(|h| h.name().to_string()).collect();
    assert_eq!(upgrading, want, "each follower went through Upgrading");
    assert!(
        !waited_for_budget.is_empty(),
        "with three Machines to move and room for one, some waited for the budget"
    );

    for host in &followers {
        let name = host.name();
        let m = machines.get(name).await.unwrap();
        assert_eq!(installed(&m, "kubelet"), Some((NEW.to_string(), true)));
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/current"),
            "1.35.5"
        );
        assert_eq!(
            on(host, "readlink /opt/kube-on-kube/packages/kubelet/previous"),
            "1.35.4"
        );
        assert_eq!(
            on(host, "/usr/local/bin/kubelet --version"),
            "Kubernetes v1.35.5 (kok-test-kubelet)"
        );
        assert_eq!(on(host, "systemctl is-active kubelet.service"), "active");
        // Drained before the new kubelet went in: the Pod left first.
        let switched = switched_at(host, "/opt/kube-on-kube/packages/kubelet/current");
        assert!(
            switched > changed_at,
            "{name}: switched during this rollout"
        );
        let evicted = evicted_seen
            .get(name)
            .unwrap_or_else(|| panic!("{name}: its Pod was never evicted"));
        assert!(
            *evicted < switched,
            "{name}: the kubelet was switched ({switched:?}) before its Pod left ({evicted:?})"
        );
        if name == user_cordoned {
            assert!(
                !ever_cordoned_by_operator.contains(name),
                "the administrator's cordon is not taken over"
            );
        } else {
            let cordoned = cordoned_seen
                .get(name)
                .unwrap_or_else(|| panic!("{name}: never cordoned for the upgrade"));
            assert!(cordoned < evicted, "{name}: cordoned before it was drained");
        }
        assert!(has_event(&h.client, name, "Drained").await, "{name}");
        assert!(has_event(&h.client, name, "Upgraded").await, "{name}");
    }
    // Only what the operator cordoned was uncordoned.
    for host in hosts {
        let n = nodes.get(host.name()).await.unwrap();
        assert_eq!(
            unschedulable(&n),
            host.name() == user_cordoned,
            "{}: schedulable unless its administrator cordoned it",
            host.name()
        );
        assert!(node_ready(&n), "{}", host.name());
    }

    // The override won: the pinned Machine never moved.
    let m = machines.get(pinned).await.unwrap();
    assert_eq!(installed(&m, "kubelet"), Some((OLD.to_string(), true)));
    assert_eq!(phase(&m), Some(MachinePhase::Ready));
    assert!(!upgrading.contains(pinned));
    assert_eq!(
        on(
            &hosts[3],
            "readlink /opt/kube-on-kube/packages/kubelet/current"
        ),
        "1.35.4"
    );
    assert!(
        pods.get_opt(&format!("app-{pinned}"))
            .await
            .unwrap()
            .is_some(),
        "the pinned Machine's Pod stayed"
    );

    // The cluster default reports the rollout finished.
    let cpv = wait_for(
        "the default rolled out",
        Duration::from_secs(60),
        async || {
            let c = cpvs.get("default").await.ok()?;
            let s = c.status.clone()?;
            (s.up_to_date == 4
                && s.machines == 4
                && s.unavailable == 0
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "RolledOut" && c.status == "True"))
            .then_some(c)
        },
    )
    .await;
    eprintln!("RolledOut: {:?}", cpv.status.unwrap().conditions);
    eprintln!("whole test in {:?}", started.elapsed());
}
