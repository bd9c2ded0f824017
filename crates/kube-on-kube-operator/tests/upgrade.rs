//! Upgrades and deletion carried out by the operator on
//! real processes: the operator runs as a Pod of the meta-cluster, every
//! control-plane Pod runs as a real process (kube-apiserver,
//! kube-controller-manager and kube-scheduler of two real releases), and the
//! business API is polled throughout to count what failed.
//!
//! - a patch upgrade v1.35.3 → v1.35.4 of a Production cluster rolls the
//!   components in order (checked on every observed snapshot of the Pods),
//!   survives the operator being restarted in the middle, and keeps the API
//!   answering; a version change that skips a minor version is refused and
//!   nothing running changes;
//! - deleting a Cluster removes everything it owns, timed.

use kok_test_support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

include!("common/upgrade_items.rs");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_upgrade_rolls_in_order_across_an_operator_restart() {
    let _one_at_a_time = HEAVY.lock().await;
    let name = "up";
    let (client, ns, clusters) = setup("upgrade", name, ClusterMode::Production, |c| {
        c.spec.version = FROM.into();
    })
    .await;
    wait_settled(&clusters, name, FROM, 3).await;
    let members_before = check_members(&client, &ns, name, 3).await;
    // The old release really runs: the program the Pod runner started.
    for (component, program) in ORDER {
        for p in ready_pods(&client, &ns, name, component).await {
            assert!(
                image_of(&p).ends_with(&format!("{program}:v{FROM}")),
                "{}",
                image_of(&p)
            );
        }
    }

    skipped_minor_is_refused(&client, &ns, &clusters, name).await;

    let etcd_before: BTreeMap<String, String> = ready_pods(&client, &ns, name, "etcd")
        .await
        .iter()
        .map(|p| (p.name_any(), uid(p)))
        .collect();
    assert_eq!(etcd_before.len(), 3);
    let business = business_client(&client, &ns, name).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "before-upgrade"}, "data": {"v": FROM}}),
            )
            .expect("configmap"),
        )
        .await
        .expect("write through the business API");
    let poller = ServicePoller::start(client.clone(), &ns, name, "before-upgrade");
    let observer = Observer::start(client.clone(), &ns, name, etcd_before);

    // v1.35.3 → v1.35.4.
    let t = Instant::now();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": TO}})),
        )
        .await
        .expect("upgrade");

    // Restart the operator while kube-apiserver rolls: the upgrade under way
    // is recorded in status, and the new operator carries it on.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "kube-apiserver to be rolling to the new release",
        UPGRADE,
        async || {
            let c = clusters.get(name).await.ok()?;
            let upgrading =
                progressing(&c).is_some_and(|(s, r, _)| s == "True" && r == "Upgrading");
            let rolling = ready_pods(&client, &ns, name, "apiserver")
                .await
                .iter()
                .any(|p| image_of(p).ends_with(&format!(":v{TO}")));
            (upgrading && rolling).then_some(())
        },
    )
    .await;
    let old_operator = uid(&pods.get("operator").await.expect("operator pod"));
    let mid = clusters.get(name).await.expect("cluster");
    stop_operator_pod(&client, &ns).await;
    println!(
        "operator stopped {:?} into the upgrade at {:?}",
        t.elapsed(),
        progressing(&mid).map(|p| p.2)
    );
    start_operator_pod(&client, &ns, &runner().nodes()[1]).await;
    let new_operator = uid(&pods.get("operator").await.expect("operator pod"));
    assert_ne!(old_operator, new_operator);

    wait_cluster(&clusters, name, "the upgrade to finish", UPGRADE, |c| {
        settled_at(c, TO, 3)
    })
    .await;
    wait_for("kube-proxy to be upgraded", UPGRADE, async || {
        observer.addon_upgraded().then_some(())
    })
    .await;
    let took = t.elapsed();
    let seen = observer.stop().await;
    let (polled, longest_outage) = poller.stop().await;
    println!("upgrade v{FROM} -> v{TO} took {took:?}");
    println!(
        "observed ({} snapshots): first Pod at v{TO} {:?}, no old Pod left {:?}, kube-proxy at v{TO} {:?}, fewest ready kube-apiservers {}",
        seen.snapshots, seen.first_new, seen.all_new, seen.addon_new, seen.fewest_ready_apiservers
    );

    // In order: each component started only once the one before it had no
    // Pod of the old release left, and the add-ons came last.
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    for (component, _) in ORDER {
        assert!(
            seen.all_new.contains_key(component),
            "{component} never fully rolled: {seen:?}"
        );
    }
    for pair in ORDER.windows(2) {
        let (before, after) = (pair[0].0, pair[1].0);
        assert!(
            seen.first_new[after] >= seen.all_new[before],
            "{after} before {before}: {seen:?}"
        );
    }
    let addon = seen.addon_new.expect("kube-proxy was never upgraded");
    assert!(addon >= seen.all_new["scheduler"], "{seen:?}");
    assert!(seen.fewest_ready_apiservers >= 3, "{seen:?}");
    // The business API stayed available.
    assert_available(&polled, longest_outage);

    // Converged: the new release runs everywhere, etcd untouched, no
    // duplicate member, the data still there.
    let c = clusters.get(name).await.expect("cluster");
    assert_eq!(
        running_versions(&c),
        [
            Some(TO.to_string()),
            Some(TO.to_string()),
            Some(TO.to_string())
        ]
    );
    for (component, program) in ORDER {
        let ready = ready_pods(&client, &ns, name, component).await;
        assert_eq!(ready.len(), 3, "{component}");
        for p in &ready {
            assert!(
                image_of(p).ends_with(&format!("{program}:v{TO}")),
                "{}",
                image_of(p)
            );
        }
    }
    let members_after = check_members(&client, &ns, name, 3).await;
    assert_eq!(members_after, members_before, "the membership changed");
    // Read back through a kube-apiserver of the new release.
    let (_, now) = BusinessApi::new(client.clone(), &ns, name)
        .next()
        .await
        .expect("a ready kube-apiserver");
    let cm = Api::<ConfigMap>::namespaced(now, "default")
        .get("before-upgrade")
        .await
        .expect("read back");
    assert_eq!(
        cm.data.unwrap_or_default().get("v").map(String::as_str),
        Some(FROM)
    );
    let started = event_notes(&client, &ns, name, "UpgradeStarted").await;
    assert_eq!(
        started.len(),
        1,
        "the restarted operator started the upgrade again: {started:?}"
    );
    let upgraded = event_notes(&client, &ns, name, "ComponentUpgraded").await;
    for (_, program) in ORDER {
        assert!(
            upgraded
                .iter()
                .any(|n| n.starts_with(program) && n.contains(TO)),
            "{upgraded:?}"
        );
    }
    let completed = event_notes(&client, &ns, name, "UpgradeCompleted").await;
    assert!(!completed.is_empty());
    let applied = event_notes(&client, &ns, name, "AddonApplied").await;
    assert!(
        applied
            .iter()
            .any(|n| n.contains(&format!("kube-proxy@{TO}"))),
        "{applied:?}"
    );

    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete cluster");
    stop_operator_pod(&client, &ns).await;
}

/// Names of what is left in `ns` besides the operator and what every
/// namespace has, by kind.
async fn leftovers(client: &Client, ns: &str) -> Vec<String> {
    async fn names<K>(client: &Client, ns: &str, kind: &str, keep: &[&str]) -> Vec<String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .into_iter()
            .map(|o| o.name_any())
            .filter(|n| !keep.contains(&n.as_str()))
            .map(|n| format!("{kind}/{n}"))
            .collect()
    }
    [
        names::<Pod>(client, ns, "Pod", &["operator"]).await,
        names::<PersistentVolumeClaim>(client, ns, "PersistentVolumeClaim", &[]).await,
        names::<Service>(client, ns, "Service", &[]).await,
        names::<Secret>(client, ns, "Secret", &[]).await,
        names::<Deployment>(client, ns, "Deployment", &[]).await,
        names::<ReplicaSet>(client, ns, "ReplicaSet", &[]).await,
        names::<ConfigMap>(client, ns, "ConfigMap", &["kube-root-ca.crt"]).await,
    ]
    .concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cluster_removes_everything_it_owns_within_seconds() {
    let name = "gone";
    let (client, ns, clusters) = setup("delete", name, ClusterMode::Minimal, |_| {}).await;
    wait_settled(&clusters, name, TO, 1).await;
    let owned = leftovers(&client, &ns).await;
    println!("{} objects before deletion: {owned:?}", owned.len());
    for kind in [
        "Pod/",
        "PersistentVolumeClaim/",
        "Service/",
        "Secret/",
        "Deployment/",
    ] {
        assert!(
            owned.iter().any(|o| o.starts_with(kind)),
            "no {kind} to delete: {owned:?}"
        );
    }

    let t = Instant::now();
    clusters
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete cluster");
    let mut last = Vec::new();
    let mut gone_at: BTreeMap<String, Duration> = BTreeMap::new();
    // When each Pod was first seen shutting down: the time between that and
    // its being gone is its process's shutdown.
    let mut stopping_at: BTreeMap<String, Duration> = BTreeMap::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "everything the Cluster owned to be gone",
        Duration::from_secs(120),
        async || {
            for p in pods.list(&ListParams::default()).await.ok()?.items {
                if p.metadata.deletion_timestamp.is_some() {
                    stopping_at
                        .entry(p.name_any())
                        .or_insert_with(|| t.elapsed());
                }
            }
            let left = leftovers(&client, &ns).await;
            for o in &owned {
                if !left.contains(o) {
                    gone_at.entry(o.clone()).or_insert_with(|| t.elapsed());
                }
            }
            last = left.clone();
            let cluster_gone = clusters.get_opt(name).await.ok()?.is_none();
            (cluster_gone && left.is_empty()).then_some(())
        },
    )
    .await;
    let took = t.elapsed();
    let slowest: Vec<_> = {
        let mut v: Vec<_> = gone_at.iter().collect();
        v.sort_by_key(|(_, d)| std::cmp::Reverse(**d));
        v.into_iter().take(5).collect()
    };
    println!(
        "deleted {} objects in {took:?}; the slowest to go: {slowest:?}",
        owned.len()
    );
    println!("Pods first seen shutting down at: {stopping_at:?}");
    assert!(last.is_empty());
    // The goal is 5 s; the bound leaves room for a loaded machine.
    assert!(took <= Duration::from_secs(10), "deletion took {took:?}");
    stop_operator_pod(&client, &ns).await;
}
