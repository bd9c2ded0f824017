//! etcd membership carried out by the operator on real members: the operator
//! runs as a Pod of the meta-cluster, every control-plane Pod runs as a real
//! process, and the business API is polled throughout to count what failed.
//!
//! - a member's process killed, its Pod deleted, its claim and Pod deleted:
//!   recovered or replaced, the quorum kept, the data still there;
//! - the operator restarted in the middle of a replacement: no duplicate or
//!   orphaned member;
//! - Minimal → Production: one member at a time; then an etcd upgrade from
//!   one real release to the next, one member at a time.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::json;

/// The release an upgrade starts from, and its image tag.
const OLD_ETCD: &str = "3.6.15";
const NEW_ETCD: &str = "3.6.16";
/// A release that cannot start.
const BROKEN_ETCD: &str = "3.6.99";

fn runner() -> &'static PodRunner {
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

const READY: Duration = Duration::from_secs(300);
const CONVERGE: Duration = Duration::from_secs(240);

/// The operator's `--etcd-failed-after` here: how long a member Pod that has
/// restarted 5 times may stay not ready before it counts as failed (5
/// minutes in production). The Pod runner's restart backoff (0.5 s doubling
/// to 10 s) gets a crash-looping member to 5 restarts in about 16 s, so this
/// is the wait that decides.
const FAILED_AFTER: Duration = Duration::from_secs(30);

/// The flags every operator of these tests runs with.
fn operator_flags() -> Vec<String> {
    vec![
        format!("--etcd-host-path-prefixes={}", host_path_root().display()),
        format!("--etcd-failed-after={}s", FAILED_AFTER.as_secs()),
    ]
}

/// Start the operator in a fresh namespace and create `cluster` there.
async fn setup(
    prefix: &str,
    name: &str,
    mode: ClusterMode,
    etcd: &str,
) -> (Client, String, Api<Cluster>) {
    setup_with(prefix, name, mode, etcd, |_| {}).await
}

/// The etcd hostPath prefix the tests' operators allow; a Cluster's
/// directories go under `<root>/<namespace>`, as the operator requires.
fn host_path_root() -> std::path::PathBuf {
    std::env::temp_dir().join("kok-etcd-host-paths")
}

/// [`setup`], with the Cluster changed by `edit` before it is created.
async fn setup_with(
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

async fn wait_serving(clusters: &Api<Cluster>, name: &str, members: usize) -> Cluster {
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
async fn check_member_list(client: &Client, ns: &str, name: &str, n: usize) -> Vec<ListedMember> {
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

fn id_of(list: &[ListedMember], member: &str) -> u64 {
    list.iter()
        .find(|m| m.name == member)
        .map(|m| m.id)
        .unwrap_or_else(|| panic!("{member} is not listed: {list:?}"))
}

async fn pod_of(client: &Client, ns: &str, member: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(member)
        .await
        .unwrap_or_else(|e| panic!("pod {member}: {e}"))
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| c.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

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

/// Ask for etcd `version`.
async fn ask_etcd(clusters: &Api<Cluster>, name: &str, version: &str) {
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
async fn roll_to_new_release(
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
async fn never_down(poller: Poller, during: &str) {
    let polled = poller.stop().await;
    println!(
        "business API during {during}: {} answered, {} failed {:?}, slowest {:?}",
        polled.ok, polled.failed, polled.failures, polled.slowest
    );
    assert!(polled.ok > 0);
    assert_eq!(polled.failed, 0, "{:?}", polled.failures);
}

/// Delete the Cluster and stop its operator.
async fn tear_down(client: &Client, ns: &str, clusters: &Api<Cluster>, name: &str) {
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete cluster");
    stop_operator_pod(client, ns).await;
}

/// The member Pods that exist, by name.
async fn member_pods(client: &Client, ns: &str, name: &str) -> Vec<Pod> {
    let selector = format!("kubeonkube.io/cluster={name},kubeonkube.io/etcd-member");
    let mut pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .expect("member pods")
        .items;
    pods.sort_by_key(|p| p.name_any());
    pods
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
