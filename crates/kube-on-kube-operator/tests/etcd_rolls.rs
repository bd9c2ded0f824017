//! etcd membership changes and rolls carried out by the operator on real
//! members, the business API polled throughout to count what failed:
//!
//! - Minimal → Production: one member at a time; then an etcd upgrade from
//!   one real release to the next, one member at a time, and back to
//!   Minimal;
//! - hostPath members: a certificate roll and a version roll restart each
//!   member in place, on its node and its data.
//!
//! Members that fail are in `etcd_recovery`.

mod common;
mod etcd_pods;

use std::time::Instant;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

use etcd_pods::*;

/// Minimal → Production adds one member at a time (never two learners), an
/// etcd upgrade between two real releases restarts one member at a time on
/// its data with two of three serving and the business API answering, and
/// Production → Minimal removes members one at a time, with their Pods and
/// claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_then_upgrade_etcd_one_member_at_a_time() {
    let name = "grow";
    let (client, ns, clusters) = setup("etcd-grow", name, ClusterMode::Minimal, OLD_ETCD).await;
    wait_serving(&clusters, name, 1).await;
    let etcdctl = Etcdctl::new(&client, &ns, name).await;
    let endpoints = member_endpoints(&client, &ns, name).await;
    assert_eq!(
        etcdctl.version(&endpoints[0]).expect("version"),
        OLD_ETCD,
        "the old release runs first"
    );

    // Minimal → Production: members 1 → 3, one at a time.
    let t = Instant::now();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Production"}})),
        )
        .await
        .expect("scale out");
    let mut seen = Vec::new();
    let grown = wait_for("three members", READY, async || {
        let c = clusters.get(name).await.ok()?;
        let members = reported_members(&c);
        let learners = members.iter().filter(|m| m.2).count();
        assert!(learners <= 1, "two learners at once: {members:?}");
        let count = members.len();
        if seen.last() != Some(&count) {
            seen.push(count);
        }
        (etcd_converged(&c, 3) && condition(&c, "APIServerReady").as_deref() == Some("True"))
            .then_some(c)
    })
    .await;
    println!(
        "scaled 1 -> 3 in {:?}; member counts seen {seen:?}",
        t.elapsed()
    );
    assert!(
        seen.windows(2).all(|w| w[1] <= w[0] + 1),
        "more than one member added at once: {seen:?}"
    );
    check_member_list(&client, &ns, name, 3).await;
    assert_eq!(
        grown
            .status
            .as_ref()
            .and_then(|s| s.components.as_ref())
            .and_then(|c| c.etcd.version.clone())
            .as_deref(),
        Some(OLD_ETCD)
    );

    // Let the API server roll onto the three members before polling it, so
    // the Pod polled is not one the rollout is about to replace.
    wait_apiserver_rolled_out(&client, &ns, name, 3).await;
    let business = business_client(&client, &ns, name).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "before-upgrade"}, "data": {"v": OLD_ETCD}}),
            )
            .expect("configmap"),
        )
        .await
        .expect("write through the business API");
    let poller = Poller::start(business.clone(), "default", "before-upgrade");

    // etcd 3.6.15 → 3.6.16: members roll one at a time.
    let t = Instant::now();
    roll_to_new_release(&client, &ns, &clusters, name, t).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let polled = poller.stop().await;
    println!(
        "business API during the upgrade: {} answered, {} failed {:?}, slowest {:?}",
        polled.ok, polled.failed, polled.failures, polled.slowest
    );
    // Each member's own /version.
    let endpoints = member_endpoints(&client, &ns, name).await;
    assert_eq!(endpoints.len(), 3);
    for e in &endpoints {
        assert_eq!(etcdctl.version(e).expect("version"), NEW_ETCD, "{e}");
    }
    let after = check_member_list(&client, &ns, name, 3).await;
    // The same members, restarted on their data.
    assert_eq!(after.len(), 3);
    for i in 0..3 {
        let p = pods.get(&format!("{name}-etcd-{i}")).await.expect("pod");
        let image = p.spec.expect("spec").containers[0]
            .image
            .clone()
            .unwrap_or_default();
        assert!(image.ends_with(&format!("etcd:{NEW_ETCD}-0")), "{image}");
    }
    let rolled = event_notes(&client, &ns, name, "MemberRestarting").await;
    assert_eq!(rolled.len(), 3, "{rolled:?}");
    let upgraded = event_notes(&client, &ns, name, "EtcdUpgraded").await;
    assert!(!upgraded.is_empty());
    let cm = config_maps.get("before-upgrade").await.expect("read back");
    assert_eq!(
        cm.data.unwrap_or_default().get("v").map(String::as_str),
        Some(OLD_ETCD)
    );
    assert!(polled.ok > 0);
    assert_eq!(polled.failed, 0, "{:?}", polled.failures);

    // Production → Minimal: back to one member, one removal at a time.
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mode": "Minimal"}})),
        )
        .await
        .expect("scale in");
    let t = Instant::now();
    wait_cluster(&clusters, name, "one member", READY, |c| {
        etcd_converged(c, 1)
    })
    .await;
    println!("scaled 3 -> 1 in {:?}", t.elapsed());
    check_member_list(&client, &ns, name, 1).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for i in 1..3 {
        let member = format!("{name}-etcd-{i}");
        wait_for(
            "the removed member's pod and claim to go",
            CONVERGE,
            async || {
                (pods.get_opt(&member).await.ok()?.is_none()
                    && claims.get_opt(&member).await.ok()?.is_none())
                .then_some(())
            },
        )
        .await;
    }
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete cluster");
    stop_operator_pod(&client, &ns).await;
}

/// hostPath members are pinned to their node: a certificate roll and an etcd
/// version roll restart each member on its own data, on its node, as the same
/// member, with every key kept and the business API answering throughout. No
/// member is removed or added (before, a rolled hostPath member was removed,
/// added back onto its old directory, refused by its peers and crash-looped,
/// leaving two of three members).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_path_members_roll_in_place_keeping_their_data() {
    let name = "hostpath";
    // Under the allowed prefix and the test's namespace (known once the
    // Cluster is built), removed with the test.
    let dir = std::cell::RefCell::new(None::<tempfile::TempDir>);
    let (client, ns, clusters) = setup_with(
        "etcd-hostpath",
        name,
        ClusterMode::Production,
        OLD_ETCD,
        |c| {
            let parent = host_path_root().join(c.namespace().expect("namespace"));
            std::fs::create_dir_all(&parent).expect("hostPath parent");
            let made = tempfile::tempdir_in(&parent).expect("tempdir");
            let path = made.path().display().to_string();
            *dir.borrow_mut() = Some(made);
            c.spec.etcd.storage =
                serde_json::from_value(json!({"volumeSource": {"hostPath": {"path": path}}}))
                    .expect("storage");
        },
    )
    .await;
    let dir = dir.into_inner().expect("hostPath directory");
    wait_serving(&clusters, name, 3).await;
    let before = check_member_list(&client, &ns, name, 3).await;
    // Each member's Service records the node its data is on.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pinned = async || {
        let mut nodes = Vec::new();
        for p in member_pods(&client, &ns, name).await {
            let svc = services.get(&p.name_any()).await.ok()?;
            let node = svc.annotations().get("kubeonkube.io/etcd-node")?.clone();
            (Some(&node) == p.spec.as_ref()?.node_name.as_ref()).then_some(())?;
            nodes.push(node);
        }
        (nodes.len() == 3).then_some(nodes)
    };
    let nodes = wait_for("every member pinned to its node", CONVERGE, pinned).await;
    println!("members pinned to {nodes:?}");

    wait_apiserver_rolled_out(&client, &ns, name, 3).await;
    let business = business_client(&client, &ns, name).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    for i in 0..20 {
        config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": format!("key-{i}")}, "data": {"i": i.to_string()}}),
                )
                .expect("configmap"),
            )
            .await
            .expect("write through the business API");
    }
    let check_data = async || {
        for i in 0..20 {
            let cm = config_maps
                .get(&format!("key-{i}"))
                .await
                .unwrap_or_else(|e| panic!("key-{i} lost: {e}"));
            assert_eq!(
                cm.data.unwrap_or_default().get("i").cloned(),
                Some(i.to_string())
            );
        }
    };
    let poller = Poller::start(business.clone(), "default", "key-0");

    // Certificate roll: every member's certificates are issued again (their
    // Secrets deleted), so every member restarts, one at a time.
    let t = Instant::now();
    let pods_before: Vec<String> = member_pods(&client, &ns, name)
        .await
        .iter()
        .map(uid)
        .collect();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        for cert in ["server", "peer"] {
            secrets
                .delete(&format!("{name}-etcd-{i}-{cert}"), &DeleteParams::default())
                .await
                .expect("delete member certificate");
        }
    }
    let mut fewest_ready = 3;
    wait_for(
        "every member restarted with new certificates",
        READY,
        async || {
            fewest_ready = fewest_ready.min(ready_pods(&client, &ns, name, "etcd").await.len());
            let now: Vec<String> = Api::<Pod>::namespaced(client.clone(), &ns)
                .list(&Default::default())
                .await
                .ok()?
                .items
                .iter()
                .filter(|p| p.name_any().starts_with(&format!("{name}-etcd-")))
                .map(uid)
                .collect();
            let c = clusters.get(name).await.ok()?;
            (now.len() == 3
                && now.iter().all(|u| !pods_before.contains(u))
                && etcd_converged(&c, 3))
            .then_some(())
        },
    )
    .await;
    println!(
        "certificate roll in {:?}; fewest ready members seen: {fewest_ready}",
        t.elapsed()
    );
    assert!(fewest_ready >= 2, "quorum lost: {fewest_ready} ready");
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_eq!(after, before, "a certificate roll changed the membership");
    check_data().await;

    // Version roll: 3.6.15 → 3.6.16, each member restarted on its data.
    let t = Instant::now();
    roll_to_new_release(&client, &ns, &clusters, name, t).await;
    let etcdctl = Etcdctl::new(&client, &ns, name).await;
    for e in member_endpoints(&client, &ns, name).await {
        assert_eq!(etcdctl.version(&e).expect("version"), NEW_ETCD, "{e}");
    }
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_eq!(after, before, "a version roll changed the membership");
    check_data().await;

    // The same members on the same nodes and directories: nothing removed,
    // added, or started beside its first data directory.
    let pods = member_pods(&client, &ns, name).await;
    let on: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(on, nodes, "a member moved to another node");
    for reason in ["MemberRemoved", "MemberReplaced", "MemberAdded"] {
        let notes = event_notes(&client, &ns, name, reason).await;
        assert!(notes.is_empty(), "{reason}: {notes:?}");
    }
    let restarted = event_notes(&client, &ns, name, "MemberRestarting").await;
    for i in 0..3 {
        let member = format!("{name}-etcd-{i}");
        assert!(
            restarted.iter().any(|n| n.contains(&member)),
            "{restarted:?}"
        );
    }
    for i in 0..3 {
        let member_dir = dir.path().join(format!("{name}-etcd-{i}"));
        let entries: Vec<String> = std::fs::read_dir(&member_dir)
            .unwrap_or_else(|e| panic!("{}: {e}", member_dir.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, ["data"], "{}", member_dir.display());
    }
    never_down(poller, "the rolls").await;
    tear_down(&client, &ns, &clusters, name).await;
}
