//! Removing a meta worker is deleting its Machine (`kok_test_support::meta` makes
//! the real meta-cluster): the node-operator drains it, the etcd member
//! whose data it held is replaced on another meta worker while the others
//! keep a quorum, and the business cluster never notices: its API answers
//! every call, and the workload on its real worker keeps running.

use kok_test_support as common;
use kok_test_support::meta;

use meta::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kok_testenv::wait::wait_for;
use serde_json::{Value, json};

/// About 225 s alone, 366 s beside the rest of the suite. (Two runs that
/// failed here were a full disk: see `fill_in_machine`'s eviction
/// thresholds.)
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_meta_workers_machine_moves_its_etcd_member_without_an_outage() {
    // Four meta workers: a Production Cluster's three etcd members require
    // a node each, so the member of a removed worker needs a fourth. A
    // fifth host becomes the business cluster's worker.
    let meta = Meta::up(4, 1).await;
    let client = meta.env.client().await;
    let ns = "tenant-a";
    let created = Instant::now();
    let (clusters, name) = meta.create_production(ns, TO_VERSION).await;
    common::ready_cluster(&clusters, &name, None).await;
    println!(
        "Cluster {name} Ready {:?} after it was created",
        created.elapsed()
    );
    let dir = tempfile::tempdir().expect("a directory");
    let business = meta.business_kubectl(ns, &name, dir.path()).await;

    // A business worker: the Cluster's own node-operator, from its image
    // in the tenant's namespace, makes the remaining host a Node over SSH;
    // a workload runs on it.
    let worker = &meta.business_hosts()[0];
    business.apply(&meta.packages);
    business.apply(&business_machine(&meta.hosts, worker));
    business.apply(BUSINESS_WORKLOAD);
    let joined = Instant::now();
    wait_for(
        "the business worker Ready",
        Duration::from_secs(300),
        async || {
            let node = business.json(&["get", "node", worker.name()])?;
            common::is_ready(&node).then_some(())
        },
    )
    .await;
    println!(
        "business worker {} Ready {:?} after its Machine was applied",
        worker.name(),
        joined.elapsed()
    );
    let workload = wait_for(
        "the workload running on the business worker",
        Duration::from_secs(180),
        async || {
            let pods = business.json(&["-n", "default", "get", "pods", "-l", "app=web"])?;
            let pod = pods["items"].as_array()?.first()?.clone();
            common::is_ready(&pod).then_some(pod)
        },
    )
    .await;
    println!(
        "the workload runs {:?} after the Machine was applied",
        joined.elapsed()
    );

    // Removing a meta worker is deleting its Machine. One that holds an
    // etcd member (each does) and does not answer for the load balancer's
    // address (MetalLB moves that on its own): it is drained, its member
    // is replaced on another meta worker while the others keep a quorum,
    // and the business API and workload never notice.
    let announcer = meta.load_balancer_announcer(ns).await;
    let members = meta.etcd_nodes(ns);
    let removed = members
        .iter()
        .map(|(_, node)| node.clone())
        .find(|node| *node != announcer)
        .expect("an etcd member off the announcing node");
    let ids_before: BTreeSet<String> =
        common::reported_members(&clusters.get(&name).await.expect("the Cluster"))
            .into_iter()
            .filter_map(|(_, id, _, _)| id)
            .collect();
    business.apply(
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "probe", "namespace": "default"}})
        .to_string(),
    );
    let business_client =
        kube::Client::try_from(common::admin_config(&client, ns, &name).await).expect("a client");
    let poller = common::Poller::start(business_client, "default", "probe");
    let deleting = Instant::now();
    meta.kubectl
        .ok(&["delete", "machine", &removed, "--wait=false"]);
    wait_for(
        &format!("the Machine {removed} and its Node gone"),
        Duration::from_secs(300),
        async || {
            let machines = meta.kubectl.json(&["get", "machines"])?;
            let nodes = meta.kubectl.json(&["get", "nodes"])?;
            let named = |list: &Value| {
                list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|o| o["metadata"]["name"] == removed.as_str())
            };
            (!named(&machines) && !named(&nodes)).then_some(())
        },
    )
    .await;
    println!(
        "meta worker {removed} offboarded in {:?}",
        deleting.elapsed()
    );
    let after = common::wait_cluster(
        &clusters,
        &name,
        "three healthy etcd voters, one of them new",
        Duration::from_secs(300),
        |c| {
            let ids: BTreeSet<String> = common::reported_members(c)
                .into_iter()
                .filter_map(|(_, id, _, _)| id)
                .collect();
            common::etcd_converged(c, 3) && ids.intersection(&ids_before).count() == 2
        },
    )
    .await;
    let polled = poller.stop().await;
    println!(
        "etcd member on {removed} replaced {:?} after its Machine was deleted: {:?}; business API: {} answered, {} failed, slowest {:?}",
        deleting.elapsed(),
        common::reported_members(&after),
        polled.ok,
        polled.failed,
        polled.slowest
    );
    let moved = meta.etcd_nodes(ns);
    assert!(
        moved.iter().all(|(_, node)| *node != removed),
        "an etcd member still on {removed}: {moved:?}"
    );
    assert_eq!(
        polled.failed, 0,
        "business API calls failed: {:?}",
        polled.failures
    );
    assert!(polled.ok > 10, "{polled:?}");
    let pods = business
        .json(&["-n", "default", "get", "pods", "-l", "app=web"])
        .expect("the workload's Pods");
    let still = &pods["items"][0];
    assert_eq!(
        still["metadata"]["uid"], workload["metadata"]["uid"],
        "the workload's Pod was replaced: {still}"
    );
    assert!(common::is_ready(still), "{still}");
    assert_eq!(
        still["status"]["containerStatuses"][0]["restartCount"], 0,
        "{still}"
    );
}
