//! hostPath etcd members rolled by the operator on real members, the
//! business API polled throughout to count what failed: a certificate roll
//! and a version roll restart each member in place, on its node and its
//! data.
//!
//! The other rolls are in `etcd_rolls`, members that fail in `etcd_recovery`.

use kok_test_support as common;
mod etcd_pods;

use std::time::Instant;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

use etcd_pods::*;

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
