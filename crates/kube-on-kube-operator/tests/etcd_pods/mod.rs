//! A Cluster's etcd members as Pods of a meta-cluster whose Pods run as real
//! processes, the operator as one of them: what the tests of membership
//! changes (`etcd_recovery`, `etcd_rolls`, `etcd_host_path`) share.

#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

/// The release an upgrade starts from, and its image tag.
pub const OLD_ETCD: &str = "3.6.15";
pub const NEW_ETCD: &str = "3.6.16";
/// A release that cannot start.
pub const BROKEN_ETCD: &str = "3.6.99";

pub fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let old = kok_testenv::bins::bin(&format!("etcd-v{OLD_ETCD}"))
            .unwrap_or_else(|e| panic!("the previous etcd release: {e}"));
        // A "release" whose members exit at once, for a roll that fails.
        start_runner(vec![
            (format!("etcd:{OLD_ETCD}-0"), old),
            (format!("etcd:{BROKEN_ETCD}-0"), "/bin/false".into()),
        ])
    })
}

pub const READY: Duration = Duration::from_secs(300);
pub const CONVERGE: Duration = Duration::from_secs(240);

/// The operator's `--etcd-failed-after` here: how long a member Pod that has
/// restarted 5 times may stay not ready before it counts as failed (5
/// minutes in production). The Pod runner's restart backoff (0.5 s doubling
/// to 10 s) gets a crash-looping member to 5 restarts in about 16 s, so this
/// is the wait that decides.
pub const FAILED_AFTER: Duration = Duration::from_secs(30);

/// The flags every operator of these tests runs with.
pub fn operator_flags() -> Vec<String> {
    vec![
        format!("--etcd-host-path-prefixes={}", host_path_root().display()),
        format!("--etcd-failed-after={}s", FAILED_AFTER.as_secs()),
    ]
}

/// Start the operator in a fresh namespace and create `cluster` there.
pub async fn setup(
    prefix: &str,
    name: &str,
    mode: ClusterMode,
    etcd: &str,
) -> (Client, String, Api<Cluster>) {
    setup_with(prefix, name, mode, etcd, |_| {}).await
}

/// The etcd hostPath prefix the tests' operators allow; a Cluster's
/// directories go under `<root>/<namespace>`, as the operator requires.
pub fn host_path_root() -> std::path::PathBuf {
    std::env::temp_dir().join("kok-etcd-host-paths")
}

/// [`setup`], with the Cluster changed by `edit` before it is created.
pub async fn setup_with(
    prefix: &str,
    name: &str,
    mode: ClusterMode,
    etcd: &str,
    edit: impl FnOnce(&mut Cluster),
) -> (Client, String, Api<Cluster>) {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(prefix).await;
    grant_operator(&client, &ns).await;
    start_operator_pod_with(&client, &ns, &runner.nodes()[0], &operator_flags()).await;
    let mut cluster = test_cluster(&ns, name, mode);
    cluster.spec.etcd.component.version = Some(etcd.into());
    edit(&mut cluster);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    (client, ns, clusters)
}

pub async fn wait_serving(clusters: &Api<Cluster>, name: &str, members: usize) -> Cluster {
    let started = Instant::now();
    let c = wait_cluster(
        clusters,
        name,
        &format!("{members} etcd members and the API server to be ready"),
        READY,
        |c| etcd_converged(c, members) && condition(c, "APIServerReady").as_deref() == Some("True"),
    )
    .await;
    println!(
        "{name}: {members} members and the API ready after {:?}",
        started.elapsed()
    );
    c
}

/// The member list etcd itself reports: exactly `n` started voters with
/// unique IDs, names and peer URLs, one per wanted slot.
pub async fn check_member_list(
    client: &Client,
    ns: &str,
    name: &str,
    n: usize,
) -> Vec<ListedMember> {
    let etcdctl = Etcdctl::new(client, ns, name).await;
    let endpoints = member_endpoints(client, ns, name).await;
    let list = etcdctl
        .member_list(&endpoints)
        .unwrap_or_else(|e| panic!("member list: {e}"));
    assert_eq!(list.len(), n, "{list:?}");
    let mut names: Vec<_> = list.iter().map(|m| m.name.clone()).collect();
    names.sort();
    let wanted: Vec<_> = (0..n).map(|i| format!("{name}-etcd-{i}")).collect();
    assert_eq!(names, wanted, "{list:?}");
    let mut ids: Vec<_> = list.iter().map(|m| m.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "duplicate IDs: {list:?}");
    let mut peers: Vec<_> = list.iter().flat_map(|m| m.peer_urls.clone()).collect();
    peers.sort();
    peers.dedup();
    assert_eq!(peers.len(), n, "duplicate peer URLs: {list:?}");
    assert!(list.iter().all(|m| !m.is_learner), "{list:?}");
    for m in &list {
        assert_eq!(
            m.peer_urls,
            [format!("https://{}.{ns}.svc.cluster.local:2380", m.name)],
            "{m:?}"
        );
    }
    list
}

pub fn id_of(list: &[ListedMember], member: &str) -> u64 {
    list.iter()
        .find(|m| m.name == member)
        .map(|m| m.id)
        .unwrap_or_else(|| panic!("{member} is not listed: {list:?}"))
}

pub async fn pod_of(client: &Client, ns: &str, member: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(member)
        .await
        .unwrap_or_else(|e| panic!("pod {member}: {e}"))
}

pub fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| c.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

/// Ask for etcd `version`.
pub async fn ask_etcd(clusters: &Api<Cluster>, name: &str, version: &str) {
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"etcd": {"version": version}}})),
        )
        .await
        .expect("set the etcd version");
}

/// Ask for [`NEW_ETCD`] and wait until every member runs it, two of three
/// serving throughout.
pub async fn roll_to_new_release(
    client: &Client,
    ns: &str,
    clusters: &Api<Cluster>,
    name: &str,
    started: Instant,
) {
    ask_etcd(clusters, name, NEW_ETCD).await;
    let mut fewest_ready = 3;
    wait_for("every member on the new release", READY, async || {
        fewest_ready = fewest_ready.min(ready_pods(client, ns, name, "etcd").await.len());
        let c = clusters.get(name).await.ok()?;
        let version = c
            .status
            .as_ref()
            .and_then(|s| s.components.as_ref())
            .and_then(|x| x.etcd.version.clone());
        (etcd_converged(&c, 3) && version.as_deref() == Some(NEW_ETCD)).then_some(())
    })
    .await;
    println!(
        "etcd {OLD_ETCD} -> {NEW_ETCD} in {:?}; fewest ready members seen: {fewest_ready}",
        started.elapsed()
    );
    assert!(fewest_ready >= 2, "quorum lost: {fewest_ready} ready");
}

/// Stop `poller`: the business API answered every call while it ran.
pub async fn never_down(poller: Poller, during: &str) {
    let polled = poller.stop().await;
    println!(
        "business API during {during}: {} answered, {} failed {:?}, slowest {:?}",
        polled.ok, polled.failed, polled.failures, polled.slowest
    );
    assert!(polled.ok > 0);
    assert_eq!(polled.failed, 0, "{:?}", polled.failures);
}

/// Delete the Cluster and stop its operator.
pub async fn tear_down(client: &Client, ns: &str, clusters: &Api<Cluster>, name: &str) {
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete cluster");
    stop_operator_pod(client, ns).await;
}

/// The member Pods that exist, by name.
pub async fn member_pods(client: &Client, ns: &str, name: &str) -> Vec<Pod> {
    let selector = format!("kubeonkube.io/cluster={name},kubeonkube.io/etcd-member");
    let mut pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .expect("member pods")
        .items;
    pods.sort_by_key(|p| p.name_any());
    pods
}
