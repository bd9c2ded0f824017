//! etcd members that fail, carried through by the operator on real members:
//! the operator runs as a Pod of the meta-cluster, every control-plane Pod
//! runs as a real process, and the business API is polled throughout to
//! count what failed.
//!
//! - a member's process killed, its Pod deleted, its claim and Pod deleted:
//!   recovered or replaced, the quorum kept, the data still there;
//! - the operator restarted in the middle of a replacement: no duplicate or
//!   orphaned member;
//! - a member failing on the release a roll gave it: left on its data, the
//!   roll stopped, and restarted on its data when asked for the old release.
//!
//! Membership changes and rolls that go right are in `etcd_rolls`.

use kok_test_support as common;
mod etcd_pods;

use std::time::Instant;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

use etcd_pods::*;

/// Delete a member's claim, then its Pod: its data is gone for good.
async fn lose_member_data(client: &Client, ns: &str, member: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let old = claims
        .get(member)
        .await
        .expect("claim")
        .uid()
        .unwrap_or_default();
    claims
        .delete(member, &DeleteParams::default())
        .await
        .expect("delete claim");
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(member, &DeleteParams::default())
        .await
        .expect("delete pod");
    old
}

/// The claim `member` has now, once it is a new one.
async fn wait_new_claim(client: &Client, ns: &str, member: &str, old_uid: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_for("a fresh claim", CONVERGE, async || {
        let c = claims.get_opt(member).await.ok()??;
        (c.uid().as_deref() != Some(old_uid) && c.metadata.deletion_timestamp.is_none())
            .then_some(())
    })
    .await;
}

/// A Production member's process killed or Pod deleted comes back on its data
/// as the same member; one whose claim and Pod are deleted is removed by ID
/// and added back as a new member on a fresh claim, also when the operator
/// restarts in the middle of it (added once, no orphan). The other members
/// keep their IDs, the data written before stays, and the business API
/// answers every call throughout. The failure threshold is short here, so
/// this also shows a member back from a fault is not mistaken for a failed
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_members_recover_or_are_replaced_keeping_quorum() {
    let name = "faults";
    let (client, ns, clusters) =
        setup("etcd-faults", name, ClusterMode::Production, NEW_ETCD).await;
    wait_serving(&clusters, name, 3).await;
    let before = check_member_list(&client, &ns, name, 3).await;

    // Data written before any fault, read back after each.
    let business = business_client(&client, &ns, name).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    let data = json!({"metadata": {"name": "before-faults"}, "data": {"written": "before"}});
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(data).expect("configmap"),
        )
        .await
        .expect("write through the business API");
    let poller = Poller::start(business.clone(), "default", "before-faults");
    let check_data = async || {
        let cm = config_maps.get("before-faults").await.expect("read back");
        assert_eq!(
            cm.data
                .unwrap_or_default()
                .get("written")
                .map(String::as_str),
            Some("before")
        );
    };

    // (a) A member's process is killed: the Pod runner starts it again, on
    // its data, as the same member; the operator changes nothing.
    let member = format!("{name}-etcd-1");
    let pod = pod_of(&client, &ns, &member).await;
    let token = format!("--initial-cluster-token={ns}-{name}");
    let pids = pids_with(&[&format!("--name={member}"), &token]);
    assert!(!pids.is_empty(), "no etcd process of {member}");
    let t = Instant::now();
    for pid in &pids {
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
    wait_for("the killed member to run again", CONVERGE, async || {
        let p = pod_of(&client, &ns, &member).await;
        (restarts(&p) > restarts(&pod) && ready_pods(&client, &ns, name, "etcd").await.len() == 3)
            .then_some(())
    })
    .await;
    let c = wait_cluster(&clusters, name, "etcd to settle", CONVERGE, |c| {
        etcd_converged(c, 3)
    })
    .await;
    println!("(a) killed process: back after {:?}", t.elapsed());
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_eq!(after, before, "killing a process changed the membership");
    assert_eq!(uid(&pod_of(&client, &ns, &member).await), uid(&pod));
    assert_eq!(reported_members(&c).len(), 3);
    check_data().await;

    // (b) A member's Pod is deleted: recreated on the same claim, as the
    // same member (same ID).
    let member = format!("{name}-etcd-2");
    let pod = pod_of(&client, &ns, &member).await;
    let t = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&member, &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(
        "the member pod to be recreated and ready",
        CONVERGE,
        async || {
            let p = Api::<Pod>::namespaced(client.clone(), &ns)
                .get_opt(&member)
                .await
                .ok()??;
            (uid(&p) != uid(&pod) && ready_pods(&client, &ns, name, "etcd").await.len() == 3)
                .then_some(())
        },
    )
    .await;
    wait_cluster(&clusters, name, "etcd to settle", CONVERGE, |c| {
        etcd_converged(c, 3)
    })
    .await;
    println!("(b) deleted pod: back after {:?}", t.elapsed());
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_eq!(
        id_of(&after, &member),
        id_of(&before, &member),
        "a recreated Pod must rejoin as the same member"
    );
    assert_eq!(after, before);
    let args = pod_of(&client, &ns, &member)
        .await
        .spec
        .expect("spec")
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(
        args.contains(&"--initial-cluster-state=existing".to_string()),
        "{args:?}"
    );
    check_data().await;

    // (c) A member's claim and Pod are deleted: its data is lost, so it is
    // removed by ID and added back as a new member on a fresh claim.
    let member = format!("{name}-etcd-0");
    let t = Instant::now();
    let old_claim = lose_member_data(&client, &ns, &member).await;
    wait_new_claim(&client, &ns, &member, &old_claim).await;
    wait_cluster(
        &clusters,
        name,
        "the member to be replaced",
        CONVERGE,
        |c| etcd_converged(c, 3),
    )
    .await;
    println!(
        "(c) deleted claim and pod: replaced after {:?}",
        t.elapsed()
    );
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_ne!(
        id_of(&after, &member),
        id_of(&before, &member),
        "a member that lost its data must come back as a new member"
    );
    for other in [format!("{name}-etcd-1"), format!("{name}-etcd-2")] {
        assert_eq!(id_of(&after, &other), id_of(&before, &other));
    }
    check_data().await;
    let replaced = event_notes(&client, &ns, name, "MemberReplaced").await;
    assert!(replaced.iter().any(|n| n.contains(&member)), "{replaced:?}");
    let promoted = event_notes(&client, &ns, name, "MemberPromoted").await;
    assert!(promoted.iter().any(|n| n.contains(&member)), "{promoted:?}");

    // (d) The same again, with the operator stopped in the middle of the
    // replacement and started again.
    let before = after;
    let member = format!("{name}-etcd-1");
    let t = Instant::now();
    let old_claim = lose_member_data(&client, &ns, &member).await;
    let mid = wait_cluster(
        &clusters,
        name,
        "the replacement to be under way",
        CONVERGE,
        |c| {
            c.status
                .as_ref()
                .and_then(|s| s.etcd_change.as_ref())
                .and_then(|s| s["step"].as_str())
                .is_some_and(|s| ["addLearner", "startMember", "promote"].contains(&s))
        },
    )
    .await;
    let step = mid.status.as_ref().and_then(|s| s.etcd_change.clone());
    stop_operator_pod(&client, &ns).await;
    println!("(d) operator stopped at {step:?}");
    start_operator_pod_with(&client, &ns, &runner().nodes()[1], &operator_flags()).await;
    wait_new_claim(&client, &ns, &member, &old_claim).await;
    wait_cluster(
        &clusters,
        name,
        "the replacement to finish",
        CONVERGE,
        |c| etcd_converged(c, 3),
    )
    .await;
    println!(
        "(d) replaced across an operator restart after {:?}",
        t.elapsed()
    );
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_ne!(id_of(&after, &member), id_of(&before, &member));
    let added = event_notes(&client, &ns, name, "MemberAdded").await;
    let added_here = added.iter().filter(|n| n.contains(&member)).count();
    assert_eq!(added_here, 1, "added more than once: {added:?}");
    check_data().await;

    never_down(poller, "the faults").await;
    tear_down(&client, &ns, &clusters, name).await;
}

/// A member that fails on the version a roll gave it is left on its data
/// while the others serve: not removed, not replaced, and the roll stops
/// with EtcdReady saying which member and why, no sooner than the
/// operator's failure threshold (its `--etcd-failed-after`, short here).
/// Asking for the previous version again restarts it on its data, as the
/// same member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_failing_after_a_version_roll_is_left_on_its_data() {
    let name = "badroll";
    let (client, ns, clusters) =
        setup("etcd-badroll", name, ClusterMode::Production, NEW_ETCD).await;
    wait_serving(&clusters, name, 3).await;
    let before = check_member_list(&client, &ns, name, 3).await;
    wait_apiserver_rolled_out(&client, &ns, name, 3).await;
    let business = business_client(&client, &ns, name).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"v": "1"}}))
                .expect("configmap"),
        )
        .await
        .expect("write through the business API");

    let t = Instant::now();
    ask_etcd(&clusters, name, BROKEN_ETCD).await;
    let version_of = |p: &Pod| {
        p.annotations()
            .get("kubeonkube.io/etcd-version")
            .cloned()
            .unwrap_or_default()
    };
    // Until the member is judged failed (5 restarts, then not ready for
    // FAILED_AFTER), and after: one member on the broken release, the others
    // untouched, nobody removed. The wait is too short for the production
    // threshold, so an operator that ignored its flag fails here.
    let stopped = wait_for(
        "the roll to stop on the failed member",
        FAILED_AFTER + CONVERGE,
        async || {
            let pods = member_pods(&client, &ns, name).await;
            let broken = pods.iter().filter(|p| version_of(p) == BROKEN_ETCD).count();
            assert!(broken <= 1, "the roll went on past a failed member");
            let removed = event_notes(&client, &ns, name, "MemberReplaced").await;
            assert!(
                removed.is_empty(),
                "a failed member was replaced: {removed:?}"
            );
            let c = clusters.get(name).await.ok()?;
            let etcd = c.status.as_ref()?.condition("EtcdReady")?.clone();
            (etcd.reason == "RollFailed").then_some(etcd)
        },
    )
    .await;
    println!("roll stopped after {:?}: {}", t.elapsed(), stopped.message);
    assert!(
        t.elapsed() >= FAILED_AFTER,
        "judged failed before the threshold"
    );
    let failed = member_pods(&client, &ns, name)
        .await
        .into_iter()
        .find(|p| version_of(p) == BROKEN_ETCD)
        .expect("the failed member's pod");
    assert!(
        stopped.message.contains(&failed.name_any()),
        "{}",
        stopped.message
    );
    let notes = event_notes(&client, &ns, name, "EtcdRollFailed").await;
    assert!(
        notes.iter().any(|n| n.contains(&failed.name_any())),
        "{notes:?}"
    );
    // Still a member, with its ID: its data was not thrown away.
    let etcdctl = Etcdctl::new(&client, &ns, name).await;
    let endpoints = member_endpoints(&client, &ns, name).await;
    let listed = etcdctl.member_list(&endpoints).expect("member list");
    assert_eq!(listed, before, "the failed member was removed");
    assert_eq!(
        config_maps
            .get("kept")
            .await
            .expect("read back")
            .data
            .unwrap_or_default()
            .get("v")
            .cloned(),
        Some("1".to_string())
    );

    // Back to the release that works: the failed member restarts on its data.
    let t = Instant::now();
    ask_etcd(&clusters, name, NEW_ETCD).await;
    wait_cluster(&clusters, name, "etcd to settle", READY, |c| {
        etcd_converged(c, 3)
    })
    .await;
    println!("recovered after {:?}", t.elapsed());
    let after = check_member_list(&client, &ns, name, 3).await;
    assert_eq!(after, before, "recovering changed the membership");
    let removed = event_notes(&client, &ns, name, "MemberReplaced").await;
    assert!(removed.is_empty(), "{removed:?}");
    tear_down(&client, &ns, &clusters, name).await;
}
