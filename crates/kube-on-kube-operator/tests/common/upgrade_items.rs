// Items shared by the upgrade and certificate-rotation tests, included
// into each (`include!`), so that both keep them private.
/// The release the upgrade starts from, and the one it goes to.
const FROM: &str = "1.35.3";
const TO: &str = "1.35.4";

/// The stateless components in the order they must be upgraded: component
/// label and program name.
const ORDER: [(&str, &str); 3] = [
    ("apiserver", "kube-apiserver"),
    ("controller-manager", "kube-controller-manager"),
    ("scheduler", "kube-scheduler"),
];

const READY: Duration = Duration::from_secs(420);
const UPGRADE: Duration = Duration::from_secs(600);

/// The two Production clusters are not run at the same time: each is a dozen
/// real processes, and the machines this runs on are small.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let mut programs: Vec<(String, PathBuf)> = ORDER
            .iter()
            .map(|(_, program)| {
                let old = kok_testenv::bins::bin(&format!("{program}-v{FROM}"))
                    .unwrap_or_else(|e| panic!("the previous {program} release: {e}"));
                (format!("{program}:v{FROM}"), old)
            })
            .collect();
        programs.push(("node-operator".into(), node_operator_binary()));
        start_runner(programs)
    })
}

/// Start the operator in a fresh namespace and create a Cluster there.
async fn setup(
    prefix: &str,
    name: &str,
    mode: ClusterMode,
    edit: impl FnOnce(&mut Cluster),
) -> (Client, String, Api<Cluster>) {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(prefix).await;
    grant_operator(&client, &ns).await;
    start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
    let mut cluster = test_cluster(&ns, name, mode);
    edit(&mut cluster);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    (client, ns, clusters)
}

/// The versions the status reports for the stateless components.
fn running_versions(c: &Cluster) -> [Option<String>; 3] {
    let components = c.status.as_ref().and_then(|s| s.components.as_ref());
    [
        components.and_then(|x| x.api_server.version.clone()),
        components.and_then(|x| x.controller_manager.version.clone()),
        components.and_then(|x| x.scheduler.version.clone()),
    ]
}

fn current(c: &Cluster) -> bool {
    c.status.as_ref().and_then(|s| s.observed_generation) == c.metadata.generation
}

fn progressing(c: &Cluster) -> Option<(String, String, String)> {
    let p = c.status.as_ref()?.condition("Progressing")?;
    Some((p.status.clone(), p.reason.clone(), p.message.clone()))
}

/// Ready, every stateless component at `version` on every replica, no
/// upgrade under way, `members` etcd members settled, for the latest spec.
fn settled_at(c: &Cluster, version: &str, members: usize) -> bool {
    current(c)
        && condition(c, "Ready").as_deref() == Some("True")
        && running_versions(c)
            .iter()
            .all(|v| v.as_deref() == Some(version))
        && progressing(c).is_some_and(|(s, r, _)| s == "False" && r == "UpToDate")
        && etcd_converged(c, members)
}

async fn wait_settled(clusters: &Api<Cluster>, name: &str, version: &str, members: usize) {
    let t = Instant::now();
    wait_cluster(
        clusters,
        name,
        &format!("the cluster to be ready at v{version}"),
        READY,
        |c| settled_at(c, version, members),
    )
    .await;
    println!("{name}: ready at v{version} after {:?}", t.elapsed());
}

/// The cluster's control-plane Pods by name: (UID, image).
async fn control_plane_pods(
    client: &Client,
    ns: &str,
    name: &str,
) -> BTreeMap<String, (String, String)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubeonkube.io/cluster={name}")))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| {
            p.labels()
                .get("kubeonkube.io/component")
                .is_some_and(|c| c != "node-operator")
        })
        .map(|p| {
            let image = image_of(&p);
            (p.name_any(), (uid(&p), image))
        })
        .collect()
}

fn image_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// The stateless Deployments' (generation, image).
async fn deployment_images(
    client: &Client,
    ns: &str,
    name: &str,
) -> BTreeMap<String, (i64, String)> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for (component, _) in ORDER {
        let d = api
            .get(&format!("{name}-{component}"))
            .await
            .expect("deployment");
        let image = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        out.insert(
            component.to_string(),
            (d.metadata.generation.unwrap_or(0), image),
        );
    }
    out
}

/// The member list etcd itself reports: `n` voters with unique IDs and peer
/// URLs.
async fn check_members(client: &Client, ns: &str, name: &str, n: usize) -> Vec<ListedMember> {
    let etcdctl = Etcdctl::new(client, ns, name).await;
    let endpoints = member_endpoints(client, ns, name).await;
    let mut list = etcdctl
        .member_list(&endpoints)
        .unwrap_or_else(|e| panic!("member list: {e}"));
    list.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(list.len(), n, "{list:?}");
    let ids: BTreeSet<u64> = list.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), n, "duplicate IDs: {list:?}");
    let peers: BTreeSet<&String> = list.iter().flat_map(|m| &m.peer_urls).collect();
    assert_eq!(peers.len(), n, "duplicate peer URLs: {list:?}");
    assert!(list.iter().all(|m| !m.is_learner), "{list:?}");
    let names: Vec<String> = list.iter().map(|m| m.name.clone()).collect();
    let wanted: Vec<String> = (0..n).map(|i| format!("{name}-etcd-{i}")).collect();
    assert_eq!(names, wanted);
    list
}

/// A client of the business API as its admin through the kube-apiserver Pod
/// at `address` (checked against the name in its certificate).
async fn admin_client_at(client: &Client, ns: &str, name: &str, address: &str) -> Client {
    let mut config = admin_config(client, ns, name).await;
    config.cluster_url = format!("https://{address}:6443").parse().expect("url");
    Client::try_from(config).expect("business client")
}

/// The business API the way a client behind the kube-apiserver Service
/// reaches it: each call goes to one of the Service's ready endpoints (from
/// its EndpointSlices, as kube-proxy would route it), in turn.
struct BusinessApi {
    client: Client,
    ns: String,
    name: String,
    slices: Api<EndpointSlice>,
    clients: BTreeMap<String, Client>,
    turn: usize,
}

impl BusinessApi {
    fn new(client: Client, ns: &str, name: &str) -> Self {
        Self {
            slices: Api::namespaced(client.clone(), ns),
            client,
            ns: ns.into(),
            name: name.into(),
            clients: BTreeMap::new(),
            turn: 0,
        }
    }

    /// The next ready endpoint and a client of it; None when there is none
    /// (or the meta-cluster did not answer).
    async fn next(&mut self) -> Option<(String, Client)> {
        let selector = format!("kubernetes.io/service-name={}-apiserver", self.name);
        let ready: Vec<String> = self
            .slices
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .flat_map(|e| e.addresses.iter().cloned())
            .collect();
        self.turn += 1;
        let address = ready.get(self.turn % ready.len().max(1))?.clone();
        if !self.clients.contains_key(&address) {
            let c = admin_client_at(&self.client, &self.ns, &self.name, &address).await;
            self.clients.insert(address.clone(), c);
        }
        Some((address.clone(), self.clients[&address].clone()))
    }
}

/// Polls a ConfigMap through the business API every 200 ms the way a client
/// behind the kube-apiserver Service reaches it: each call goes to one of
/// the Service's ready endpoints (from its EndpointSlices, as kube-proxy
/// would route it), in turn. A call that fails, or finds no ready endpoint,
/// counts as failed.
struct ServicePoller {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(Polled, u32)>,
}

impl ServicePoller {
    fn start(client: Client, ns: &str, name: &str, config_map: &str) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, name, config_map) = (ns.to_string(), name.to_string(), config_map.to_string());
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let mut business = BusinessApi::new(client, &ns, &name);
            let started = Instant::now();
            let (mut ok, mut failed, mut failures) = (0, 0, Vec::new());
            let (mut run, mut longest, mut slowest) = (0, 0, Duration::ZERO);
            while !s.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let answer = match business.next().await {
                    None => Err("no ready kube-apiserver endpoint".to_string()),
                    Some((address, c)) => {
                        let api: Api<ConfigMap> = Api::namespaced(c, "default");
                        match tokio::time::timeout(Duration::from_secs(5), api.get(&config_map))
                            .await
                        {
                            Ok(Ok(_)) => Ok(()),
                            other => Err(format!("{address}: {other:?}")),
                        }
                    }
                };
                slowest = slowest.max(asked.elapsed());
                match answer {
                    Ok(()) => {
                        ok += 1;
                        run = 0;
                    }
                    Err(e) => {
                        failed += 1;
                        run += 1;
                        longest = longest.max(run);
                        if failures.len() < 20 {
                            failures.push(format!("{:?}: {e}", started.elapsed()));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (
                Polled {
                    ok,
                    failed,
                    failures,
                    slowest,
                },
                longest,
            )
        });
        Self { stop, task }
    }

    /// What was polled, and the longest run of calls in a row that failed.
    async fn stop(self) -> (Polled, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("poller")
    }
}

/// The business API stayed available: it answered, no two calls in a row
/// (200 ms apart, 5 s allowed each) failed, and at most one call in a
/// hundred did. A single slow answer while a component restarts is counted
/// and printed, not a failure of the test.
fn assert_available(polled: &Polled, longest_outage: u32) {
    println!(
        "business API: {} answered, {} failed, at most {longest_outage} in a row {:?}, slowest {:?}",
        polled.ok, polled.failed, polled.failures, polled.slowest
    );
    assert!(polled.ok > 0);
    assert!(longest_outage < 2, "{:?}", polled.failures);
    assert!(
        polled.failed * 100 <= polled.ok + polled.failed,
        "{:?}",
        polled.failures
    );
}

/// What the observer saw during an upgrade, with times since it started.
#[derive(Debug, Default)]
struct Seen {
    snapshots: u32,
    /// Per component: when a Pod of the new release first existed, and when
    /// no Pod of the old release was left (not even one shutting down).
    first_new: BTreeMap<&'static str, Duration>,
    all_new: BTreeMap<&'static str, Duration>,
    /// When the kube-proxy add-on in the business cluster first named the
    /// new release.
    addon_new: Option<Duration>,
    /// Snapshots that broke the order, or etcd Pods that changed.
    violations: Vec<String>,
    /// The fewest ready kube-apiserver Pods in any snapshot.
    fewest_ready_apiservers: usize,
}

/// Watches the cluster's Pods and the business cluster's kube-proxy during an
/// upgrade and checks on every snapshot that no component runs the new
/// release while one before it still runs the old one.
struct Observer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Record one snapshot: the add-on's state (read before the Pods) and the
/// cluster's Pods, `at` since observing started.
fn record(
    seen: &mut Seen,
    at: Duration,
    addon_new: bool,
    pods: &[Pod],
    etcd: &BTreeMap<String, String>,
) {
    let new_tag = format!(":v{TO}");
    seen.snapshots += 1;
    if addon_new && seen.addon_new.is_none() {
        seen.addon_new = Some(at);
    }
    let mut old = BTreeMap::new();
    let mut new = BTreeMap::new();
    let mut ready_apiservers = 0;
    for p in pods {
        let component = p
            .labels()
            .get("kubeonkube.io/component")
            .cloned()
            .unwrap_or_default();
        if component == "etcd" {
            if etcd.get(&p.name_any()) != Some(&uid(p)) {
                seen.violations
                    .push(format!("{at:?}: etcd Pod {} was replaced", p.name_any()));
            }
            continue;
        }
        if component == "apiserver" && is_ready(p) && p.metadata.deletion_timestamp.is_none() {
            ready_apiservers += 1;
        }
        let bucket = if image_of(p).ends_with(&new_tag) {
            &mut new
        } else {
            &mut old
        };
        *bucket.entry(component).or_insert(0) += 1;
    }
    let etcd_now = pods
        .iter()
        .filter(|p| {
            p.labels()
                .get("kubeonkube.io/component")
                .map(String::as_str)
                == Some("etcd")
        })
        .count();
    if etcd_now != etcd.len() {
        seen.violations
            .push(format!("{at:?}: {etcd_now} etcd Pods, not {}", etcd.len()));
    }
    seen.fewest_ready_apiservers = seen.fewest_ready_apiservers.min(ready_apiservers);
    for (i, (component, _)) in ORDER.iter().enumerate() {
        let has_new = new.get(*component).copied().unwrap_or(0) > 0;
        let has_old = old.get(*component).copied().unwrap_or(0) > 0;
        if has_new && !seen.first_new.contains_key(component) {
            seen.first_new.insert(*component, at);
        }
        if has_new && !has_old && !seen.all_new.contains_key(component) {
            seen.all_new.insert(*component, at);
        }
        if i > 0 && has_new {
            let before = ORDER[i - 1].0;
            if old.get(before).copied().unwrap_or(0) > 0 {
                seen.violations.push(format!(
                    "{at:?}: {component} has a Pod at v{TO} while {before} still has {} at the old release",
                    old[before]
                ));
            }
        }
    }
    if addon_new && old.get("scheduler").copied().unwrap_or(0) > 0 {
        seen.violations.push(format!(
            "{at:?}: kube-proxy names v{TO} while the scheduler still runs the old release"
        ));
    }
}

impl Observer {
    fn start(client: Client, ns: &str, name: &str, etcd: BTreeMap<String, String>) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen {
            fewest_ready_apiservers: usize::MAX,
            ..Default::default()
        }));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let selector = format!("kubeonkube.io/cluster={name}");
        let (ns, name) = (ns.to_string(), name.to_string());
        let (s, out) = (stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let new_tag = format!(":v{TO}");
            let mut business = BusinessApi::new(client, &ns, &name);
            while !s.load(Ordering::Relaxed) {
                // The add-on first, then the Pods: once kube-proxy names the
                // new release the scheduler must already have settled, so a
                // later snapshot of the Pods must show no old scheduler.
                let daemonsets: Option<Api<DaemonSet>> = business
                    .next()
                    .await
                    .map(|(_, c)| Api::namespaced(c, "kube-system"));
                let addon_new = match daemonsets {
                    None => false,
                    Some(daemonsets) => matches!(
                    tokio::time::timeout(Duration::from_secs(3), daemonsets.get_opt("kube-proxy")).await,
                    Ok(Ok(Some(ds))) if ds.spec.as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|s| s.containers.first())
                        .and_then(|c| c.image.as_deref())
                        .is_some_and(|i| i.ends_with(&new_tag))
                    ),
                };
                let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                };
                let at = started.elapsed();
                record(
                    &mut out.lock().expect("observer state"),
                    at,
                    addon_new,
                    &list.items,
                    &etcd,
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Self { stop, seen, task }
    }

    /// Whether kube-proxy was seen at the new release yet.
    fn addon_upgraded(&self) -> bool {
        self.seen
            .lock()
            .expect("observer state")
            .addon_new
            .is_some()
    }

    async fn stop(self) -> Seen {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("observer");
        std::mem::take(&mut *self.seen.lock().expect("observer state"))
    }
}

/// A version change that skips a minor version is refused, by the API server
/// for the cluster's version and by the operator for one component's, and
/// nothing running changes.
async fn skipped_minor_is_refused(client: &Client, ns: &str, clusters: &Api<Cluster>, name: &str) {
    let pods_before = control_plane_pods(client, ns, name).await;
    let deployments_before = deployment_images(client, ns, name).await;

    let skip = format!(
        "1.{}.0",
        TO.split('.')
            .nth(1)
            .and_then(|m| m.parse::<u32>().ok())
            .expect("minor")
            + 2
    );
    let refused = clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": skip}})),
        )
        .await
        .expect_err("the API server must refuse a skipped minor version");
    let text = refused.to_string();
    println!("spec.version {FROM} -> {skip}: {text}");
    assert!(text.contains("may not skip a minor version"), "{text}");
    assert_eq!(
        clusters.get(name).await.expect("cluster").spec.version,
        FROM
    );

    // One component's version is not checked by the API server against what
    // runs: the operator refuses it.
    let t = Instant::now();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controllerManager": {"version": skip}}})),
        )
        .await
        .expect("a component version is accepted by the API server");
    let c = wait_cluster(
        clusters,
        name,
        "the operator to refuse the version",
        READY,
        |c| {
            current(c)
                && progressing(c)
                    .is_some_and(|(s, r, _)| s == "False" && r == "VersionChangeRefused")
        },
    )
    .await;
    let (_, _, message) = progressing(&c).expect("Progressing");
    println!(
        "controllerManager.version {skip}: refused after {:?}: {message}",
        t.elapsed()
    );
    assert!(message.contains("skips a minor version"), "{message}");
    assert!(message.contains("kube-controller-manager"), "{message}");
    let refusals = event_notes(client, ns, name, "UpgradeRefused").await;
    assert!(
        refusals.iter().any(|n| n.contains("skips a minor version")),
        "{refusals:?}"
    );
    // Give a wrong operator the time to do something, then check it did not.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        deployment_images(client, ns, name).await,
        deployments_before,
        "a refused change touched a Deployment"
    );
    assert_eq!(
        control_plane_pods(client, ns, name).await,
        pods_before,
        "a refused change touched a Pod"
    );

    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controllerManager": {"version": null}}})),
        )
        .await
        .expect("take the component version back");
    wait_settled(clusters, name, FROM, 3).await;
    assert_eq!(
        deployment_images(client, ns, name).await,
        deployments_before
    );
    assert_eq!(control_plane_pods(client, ns, name).await, pods_before);
}
