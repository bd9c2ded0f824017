//! etcd membership changes and rolls carried out by the operator on real
//! members, the business API polled throughout to count what failed:
//!
//! - Minimal → Production: one member at a time; then an etcd upgrade from
//!   one real release to the next, one member at a time, and back to
//!   Minimal.
//!
//! hostPath members' rolls are in `etcd_host_path`, members that fail in
//! `etcd_recovery`: each is a binary of its own, so that no binary holds
//! two Production control planes one after the other.

use kok_test_support as common;
mod etcd_pods;

use std::time::Instant;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kok_testenv::wait::wait_for;
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
