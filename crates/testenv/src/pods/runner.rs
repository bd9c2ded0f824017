//! The Pod runner's loop: watch the Pods bound to its Nodes, start their
//! containers as real processes, probe them, restart them, report their status,
//! and stop them (SIGTERM, grace period, SIGKILL) when they are deleted.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::hosts::cgroups;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, PersistentVolume, PersistentVolumeClaim, Pod,
    PodCondition, PodIP, PodStatus, Secret, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};

use super::exec::{Mount, Spec};
use super::expand::{self, Lookup};
use super::hosts_file::{self, ForPod};
use super::images::ImageMap;
use super::net::PodNetwork;
use super::probe::{self, Check, ProbeState, Timing};
use super::volumes::{self, Fetched, Needs, Source};
use super::{node, storage};

/// Restart backoff: the kubelet's doubling, capped low so tests see recovery in
/// seconds rather than minutes.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Every container's cgroup is a child of this, in every hierarchy.
const CGROUP_PARENT: &str = "/kok-pods";

/// The container cgroups this process made and has not removed yet: what a
/// shutdown removes after its Pods are stopped (a container that did not
/// stop in time, or one that was starting as the shutdown began, would
/// otherwise leave its cgroup behind).
static LIVE_CGROUPS: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn live_cgroups() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<String>> {
    LIVE_CGROUPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// At exit: the containers' cgroups this process still has, with whatever
/// is left in them, and its Pod network. A runner held for the whole test
/// binary is never dropped, and what it made would otherwise stay until
/// the next runner's sweep.
pub(crate) fn install_exit_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function with no arguments.
        unsafe { libc::atexit(remove_own_at_exit) };
    });
}

extern "C" fn remove_own_at_exit() {
    // Never block at exit on a lock held by a thread that is gone.
    if let Ok(left) = LIVE_CGROUPS.try_lock() {
        for cgroup in left.iter() {
            let _ = cgroups::remove(cgroup, Duration::from_secs(2));
        }
    }
    cgroups::remove_if_empty(CGROUP_PARENT);
    super::net::remove_own();
}

/// Removes the empty cgroups of containers whose process is gone, left by
/// runners that were killed before they could.
pub(crate) fn sweep_stale_cgroups() {
    for pid in cgroups::children(CGROUP_PARENT) {
        let Ok(number) = pid.parse::<u32>() else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{number}")).exists() {
            cgroups::remove_if_empty(&format!("{CGROUP_PARENT}/{pid}"));
        }
    }
}
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// Everything the Pod tasks share.
pub(crate) struct Shared {
    pub client: Client,
    pub nodes: Vec<String>,
    pub node_labels: BTreeMap<String, String>,
    pub domain: String,
    pub state: PathBuf,
    pub logs: PathBuf,
    pub images: ImageMap,
    pub exec_program: PathBuf,
    pub net: PodNetwork,
    pub slices: reflector::Store<EndpointSlice>,
    /// Hosts files to refresh: Pod UID → (file, namespace, hostname, IP).
    pub hosts_files: Mutex<HashMap<String, (PathBuf, String, String, String)>>,
    /// Changes to EndpointSlices wake the hosts-file writer.
    pub slices_changed: Notify,
}

/// Run until `stop` turns true: register the Nodes, provision claims, keep
/// hosts files current and run the Pods bound to the Nodes.
pub(crate) async fn run(
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    writer: reflector::store::Writer<EndpointSlice>,
) {
    for name in &shared.nodes {
        if let Err(e) = node::register(
            &shared.client,
            name,
            &shared.net.gateway().to_string(),
            &shared.node_labels,
        )
        .await
        {
            tracing::error!(node = %name, error = %e, "cannot register node");
        }
    }
    if let Err(e) = storage::install_class(&shared.client).await {
        tracing::error!(error = %e, "cannot install the storage class");
    }
    let heartbeat = tokio::spawn(heartbeats(shared.clone()));
    let provisioner = tokio::spawn(provision(shared.clone()));
    let slices = tokio::spawn(watch_slices(shared.clone(), writer));
    let hosts = tokio::spawn(write_hosts_files(shared.clone()));

    let pods: Api<Pod> = Api::all(shared.client.clone());
    let mut events = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut running: HashMap<String, (watch::Sender<Option<Pod>>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.changed() => break,
            event = events.next() => event,
        };
        let Some(Ok(event)) = event else { continue };
        let (pods, deleted) = match event {
            Event::Apply(pod) | Event::InitApply(pod) => (vec![pod], false),
            Event::Delete(pod) => (vec![pod], true),
            Event::Init | Event::InitDone => continue,
        };
        for pod in pods {
            let ours = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| shared.nodes.contains(n));
            let Some(uid) = pod.uid() else { continue };
            if !ours {
                continue;
            }
            running.retain(|_, (_, task)| !task.is_finished());
            match running.get(&uid) {
                Some((tx, _)) => {
                    let _ = tx.send(if deleted { None } else { Some(pod) });
                }
                None if !deleted
                    && pod.metadata.deletion_timestamp.is_none()
                    && !finished(&pod) =>
                {
                    let (tx, rx) = watch::channel(Some(pod.clone()));
                    let task = tokio::spawn(run_pod(shared.clone(), pod, rx));
                    running.insert(uid, (tx, task));
                }
                None => {}
            }
        }
    }
    // Shutting down: stop every Pod's processes now, no grace, all at once.
    let mut tasks = Vec::new();
    for (_, (tx, task)) in running.drain() {
        let _ = tx.send(None);
        tasks.push((tx, task));
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        futures::future::join_all(tasks.iter_mut().map(|(_, task)| task)),
    )
    .await;
    for task in [heartbeat, provisioner, slices, hosts] {
        task.abort();
    }
    let left: Vec<String> = live_cgroups().iter().cloned().collect();
    for cgroup in left {
        if let Err(e) = cgroups::remove(&cgroup, Duration::from_secs(5)) {
            tracing::warn!(error = %e, "a container's cgroup outlived the runner");
        }
        live_cgroups().remove(&cgroup);
    }
    cgroups::remove_if_empty(CGROUP_PARENT);
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

async fn heartbeats(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs((node::LEASE_SECONDS / 4) as u64)).await;
        for name in &shared.nodes {
            if let Err(e) =
                node::heartbeat(&shared.client, name, &shared.net.gateway().to_string()).await
            {
                tracing::warn!(node = %name, error = %e, "heartbeat failed");
            }
        }
    }
}

async fn provision(shared: Arc<Shared>) {
    loop {
        if let Err(e) = storage::reconcile(&shared.client, &shared.state).await {
            tracing::warn!(error = %e, "volume provisioning pass failed");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn watch_slices(shared: Arc<Shared>, writer: reflector::store::Writer<EndpointSlice>) {
    let api: Api<EndpointSlice> = Api::all(shared.client.clone());
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = reflector::reflector(writer, stream).boxed();
    while stream.next().await.is_some() {
        shared.slices_changed.notify_one();
    }
}

async fn write_hosts_files(shared: Arc<Shared>) {
    loop {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), shared.slices_changed.notified()).await;
        // Let a burst of changes settle.
        tokio::time::sleep(Duration::from_millis(100)).await;
        refresh_hosts(&shared);
    }
}

fn refresh_hosts(shared: &Shared) {
    let slices: Vec<EndpointSlice> = shared
        .slices
        .state()
        .iter()
        .map(|s| (**s).clone())
        .collect();
    let extra = api_hosts(shared);
    let files = shared
        .hosts_files
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for (_, (path, namespace, hostname, ip)) in files {
        let text = hosts_file::render(
            &ForPod {
                namespace: &namespace,
                hostname: &hostname,
                ip: &ip,
            },
            &shared.domain,
            &slices,
            &extra,
        );
        // Rewritten in place: the file is bind-mounted, a rename would detach it.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            let _ = std::fs::write(&path, text);
        }
    }
}

/// The meta-cluster API, reachable from Pods through the runner's proxy on the
/// gateway, under the names in-cluster clients use.
fn api_hosts(shared: &Shared) -> Vec<(String, Vec<String>)> {
    let domain = &shared.domain;
    vec![(
        shared.net.gateway().to_string(),
        vec![
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            format!("kubernetes.default.svc.{domain}"),
        ],
    )]
}

/// Where one container stands.
#[derive(Clone, Debug, Default)]
struct ContainerRun {
    state: Option<ContainerState>,
    last_state: Option<ContainerState>,
    restarts: i32,
    ready: bool,
    started: bool,
}

/// Mutable status of one Pod, turned into `PodStatus` on every change.
#[derive(Default)]
struct PodState {
    ip: Option<String>,
    start_time: Option<Timestamp>,
    containers: BTreeMap<String, ContainerRun>,
    init_done: bool,
    message: Option<String>,
}

struct PodCtx {
    shared: Arc<Shared>,
    pod: Pod,
    name: String,
    namespace: String,
    uid: String,
    dir: PathBuf,
    state: Mutex<PodState>,
    changed: Notify,
}

impl PodCtx {
    fn update(&self, f: impl FnOnce(&mut PodState)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.changed.notify_one();
    }
}

async fn run_pod(shared: Arc<Shared>, pod: Pod, mut desired: watch::Receiver<Option<Pod>>) {
    let uid = pod.uid().unwrap_or_default();
    let name = pod.name_any();
    let namespace = pod.namespace().unwrap_or_default();
    let dir = shared.state.join("pods").join(&uid);
    let ctx = Arc::new(PodCtx {
        shared: shared.clone(),
        pod: pod.clone(),
        name: name.clone(),
        namespace: namespace.clone(),
        uid: uid.clone(),
        dir: dir.clone(),
        state: Mutex::new(PodState {
            start_time: Some(Timestamp::now()),
            ..Default::default()
        }),
        changed: Notify::new(),
    });
    let status_writer = tokio::spawn(write_status(ctx.clone()));

    let network = match shared.net.attach() {
        Ok(attached) => attached,
        Err(e) => {
            ctx.update(|s| s.message = Some(format!("cannot create the Pod network: {e}")));
            tracing::error!(pod = %name, error = %e, "cannot create the Pod network");
            wait_deleted(&mut desired).await;
            finish(&ctx, None).await;
            status_writer.abort();
            return;
        }
    };
    let ip = network.1.to_string();
    ctx.update(|s| s.ip = Some(ip.clone()));
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| name.clone());
    let hosts_path = dir.join("hosts");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(&hosts_path, "");
    let _ = std::fs::write(dir.join("resolv.conf"), hosts_file::RESOLV_CONF);
    shared
        .hosts_files
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            uid.clone(),
            (
                hosts_path.clone(),
                namespace.clone(),
                hostname.clone(),
                ip.clone(),
            ),
        );
    refresh_hosts(&shared);

    // Volumes: wait until every object they need exists.
    let mounts = loop {
        match prepare_volumes(&ctx).await {
            Ok(m) => break Some(m),
            Err(e) => {
                ctx.update(|s| s.message = Some(e.clone()));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    r = desired.changed() => if r.is_err() || desired.borrow().as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some()) { break None },
                }
            }
        }
    };
    // Carries the grace period once the Pod is deleted.
    let (stop_tx, stop_rx) = watch::channel(None::<i64>);
    let mut containers = Vec::new();
    if let Some(mounts) = mounts {
        ctx.update(|s| s.message = None);
        let netns = PathBuf::from(PodNetwork::netns_path(&network.0));
        let sandbox = Sandbox {
            netns,
            hostname,
            resolv_conf: dir.join("resolv.conf"),
            hosts: hosts_path,
            volumes: mounts,
            ip: ip.clone(),
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let restart_policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let sandbox = Arc::new(sandbox);
        // Init containers run one after another and must succeed.
        let mut init_ok = true;
        for container in spec.init_containers.iter().flatten() {
            let code = run_container(
                ctx.clone(),
                sandbox.clone(),
                container.clone(),
                "OnFailure".into(),
                stop_rx.clone(),
                true,
            )
            .await;
            if code != Some(0) {
                init_ok = false;
                break;
            }
        }
        ctx.update(|s| s.init_done = init_ok);
        if init_ok {
            for container in &spec.containers {
                containers.push(tokio::spawn(run_container(
                    ctx.clone(),
                    sandbox.clone(),
                    container.clone(),
                    restart_policy.clone(),
                    stop_rx.clone(),
                    false,
                )));
            }
        }
        wait_deleted(&mut desired).await;
    }
    // The grace period the deletion asked for (a second deletion may have
    // shortened it), as the kubelet does.
    // No Pod at all: the runner itself is stopping, and stops everything now.
    let deleted = desired.borrow().clone();
    let grace = match &deleted {
        None => 0,
        Some(deleted) => deleted
            .metadata
            .deletion_grace_period_seconds
            .or(pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30),
    };
    let _ = stop_tx.send(Some(grace));
    let deadline = Duration::from_secs(grace.max(0) as u64 + 5);
    let join = async {
        for task in containers {
            let _ = tokio::time::timeout(deadline, task).await;
        }
    };
    // A second deletion with a shorter grace period shortens the wait, as
    // the kubelet does.
    let shorten = async {
        while desired.changed().await.is_ok() {
            let asked = desired
                .borrow()
                .as_ref()
                .and_then(|p| p.metadata.deletion_grace_period_seconds);
            if let Some(g) = asked
                && stop_tx.borrow().is_some_and(|current| g < current)
            {
                let _ = stop_tx.send(Some(g));
            }
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = join => {}
        _ = shorten => {}
    }
    shared
        .hosts_files
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&uid);
    shared.net.detach(&network.0, network.1);
    let latest = desired.borrow().clone();
    finish(&ctx, latest).await;
    status_writer.abort();
}

/// Resolves when the Pod is deleted or marked for deletion.
async fn wait_deleted(desired: &mut watch::Receiver<Option<Pod>>) {
    loop {
        if desired
            .borrow()
            .as_ref()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
        {
            return;
        }
        if desired.changed().await.is_err() {
            return;
        }
    }
}

/// After the containers are gone: remove the Pod object (as the kubelet does
/// once a terminating Pod's containers have stopped) and its files.
async fn finish(ctx: &PodCtx, latest: Option<Pod>) {
    if latest.is_some() {
        let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(ctx.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let _ = api.delete(&ctx.name, &params).await;
    }
    let _ = std::fs::remove_dir_all(&ctx.dir);
}

/// What every container of a Pod shares.
struct Sandbox {
    netns: PathBuf,
    hostname: String,
    hosts: PathBuf,
    resolv_conf: PathBuf,
    /// Volume name → directory on the machine.
    volumes: BTreeMap<String, PathBuf>,
    ip: String,
}

struct ApiLookup {
    secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    config_maps: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

impl Lookup for ApiLookup {
    fn secret(&self, _: &str, name: &str, key: &str) -> Option<String> {
        self.secrets
            .get(name)?
            .get(key)
            .map(|v| String::from_utf8_lossy(v).to_string())
    }
    fn config_map(&self, _: &str, name: &str, key: &str) -> Option<String> {
        self.config_maps
            .get(name)?
            .get(key)
            .map(|v| String::from_utf8_lossy(v).to_string())
    }
}

async fn fetch(ctx: &PodCtx, needs: &[Needs]) -> Result<Fetched, String> {
    let client = &ctx.shared.client;
    let ns = &ctx.namespace;
    let mut fetched = Fetched {
        namespace: ns.clone(),
        ..Default::default()
    };
    for need in needs {
        match need {
            Needs::Secret { name, .. } => {
                if let Some(s) = Api::<Secret>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let data = s
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect();
                    fetched.secrets.insert(name.clone(), data);
                }
            }
            Needs::ConfigMap { name, .. } => {
                if let Some(c) = Api::<ConfigMap>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let mut data: BTreeMap<String, Vec<u8>> = c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    data.extend(
                        c.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    fetched.config_maps.insert(name.clone(), data);
                }
            }
            Needs::Claim(name) => {
                let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let volume = claim.and_then(|c| c.spec).and_then(|s| s.volume_name);
                if let Some(volume) = volume {
                    let pv = Api::<PersistentVolume>::all(client.clone())
                        .get(&volume)
                        .await
                        .map_err(|e| e.to_string())?;
                    if let Some(path) = pv
                        .spec
                        .and_then(|s| s.host_path)
                        .map(|h| PathBuf::from(h.path))
                    {
                        let _ = std::fs::create_dir_all(&path);
                        fetched.claims.insert(name.clone(), path);
                    }
                }
            }
            Needs::ServiceAccountToken {
                audience,
                expiration_seconds,
            } => {
                let account = ctx
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_else(|| "default".into());
                let request = TokenRequest {
                    spec: TokenRequestSpec {
                        audiences: audience.iter().cloned().collect(),
                        expiration_seconds: Some(expiration_seconds.unwrap_or(3600).max(600)),
                        bound_object_ref: Some(BoundObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Pod".into()),
                            name: Some(ctx.name.clone()),
                            uid: Some(ctx.uid.clone()),
                        }),
                    },
                    ..Default::default()
                };
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
                let token = api
                    .create_token_request(&account, &PostParams::default(), &request)
                    .await
                    .map_err(|e| format!("token for service account {account}: {e}"))?;
                fetched.token = token.status.map(|s| s.token);
            }
        }
    }
    Ok(fetched)
}

/// Materialize every volume; returns volume name → directory.
async fn prepare_volumes(ctx: &PodCtx) -> Result<BTreeMap<String, PathBuf>, String> {
    let spec = ctx.pod.spec.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        let fetched = fetch(ctx, &volumes::needs(volume)).await?;
        let dir = ctx.dir.join("volumes").join(&volume.name);
        match volumes::source(volume, &fetched).map_err(|e| e.to_string())? {
            Source::Files(files) => {
                volumes::write_files(&dir, &files)
                    .map_err(|e| format!("volume {}: {e}", volume.name))?;
                out.insert(volume.name.clone(), dir);
            }
            Source::EmptyDir => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("volume {}: {e}", volume.name))?;
                out.insert(volume.name.clone(), dir);
            }
            Source::HostPath(path) => {
                // As the kubelet does for `DirectoryOrCreate`.
                if volume
                    .host_path
                    .as_ref()
                    .is_some_and(|h| h.type_.as_deref() == Some("DirectoryOrCreate"))
                {
                    std::fs::create_dir_all(&path)
                        .map_err(|e| format!("volume {}: {e}", volume.name))?;
                }
                out.insert(volume.name.clone(), path);
            }
        }
    }
    Ok(out)
}

/// Run one container until stopped, restarting it as `restart_policy` says.
/// Returns the last exit code (init containers use it).
async fn run_container(
    ctx: Arc<PodCtx>,
    sandbox: Arc<Sandbox>,
    container: Container,
    restart_policy: String,
    mut stop: watch::Receiver<Option<i64>>,
    init: bool,
) -> Option<i32> {
    let name = container.name.clone();
    let mut backoff = BACKOFF_START;
    let log_path = ctx
        .shared
        .logs
        .join(format!(
            "{}_{}_{}",
            ctx.namespace,
            ctx.name,
            &ctx.uid[..8.min(ctx.uid.len())]
        ))
        .join(format!("{name}.log"));
    let _ = std::fs::create_dir_all(log_path.parent().unwrap_or(&ctx.shared.logs));
    let ports = container.ports.clone().unwrap_or_default();
    loop {
        if stop.borrow().is_some() {
            return None;
        }
        let spec = match container_spec(&ctx, &sandbox, &container).await {
            Ok(spec) => spec,
            Err(message) => {
                set_waiting(&ctx, &name, "CreateContainerConfigError", &message);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.changed() => return None,
                }
            }
        };
        let mut process = match Process::start(
            &ctx.shared.exec_program,
            &spec,
            &ctx.dir.join(format!("{name}.json")),
            &log_path,
        ) {
            Ok(p) => p,
            Err(message) => {
                set_waiting(&ctx, &name, "RunContainerError", &message);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => { backoff = (backoff * 2).min(BACKOFF_MAX); continue }
                    _ = stop.changed() => return None,
                }
            }
        };
        let started = Timestamp::now();
        let readiness = container.readiness_probe.clone();
        let liveness = container.liveness_probe.clone();
        ctx.update(|s| {
            let c = s.containers.entry(name.clone()).or_default();
            c.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(started)),
                }),
                ..Default::default()
            });
            c.started = true;
            c.ready = readiness.is_none() && !init;
        });
        let began = Instant::now();
        let mut ready_state = ProbeState::default();
        let mut live_state = ProbeState::default();
        let ready_timing = readiness.as_ref().map(Timing::of);
        let live_timing = liveness.as_ref().map(Timing::of);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut next_ready = ready_timing.map(|t| began + t.initial_delay);
        let mut next_live = live_timing.map(|t| began + t.initial_delay);
        let exit = loop {
            tokio::select! {
                code = process.wait() => break code,
                _ = stop.changed() => {
                    let code = process.stop_as_told(&mut stop).await;
                    record_exit(&ctx, &name, code, started, false);
                    return code;
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if let (Some(probe), Some(timing), Some(at)) = (&readiness, &ready_timing, next_ready)
                        && now >= at {
                            next_ready = Some(now + timing.period);
                            let ok = run_probe(probe, &sandbox, &ports, timing, process.pid(), &spec).await;
                            let ready = ready_state.record(ok, timing);
                            ctx.update(|s| if let Some(c) = s.containers.get_mut(&name) { c.ready = ready });
                        }
                    if let (Some(probe), Some(timing), Some(at)) = (&liveness, &live_timing, next_live)
                        && now >= at {
                            next_live = Some(now + timing.period);
                            let ok = run_probe(probe, &sandbox, &ports, timing, process.pid(), &spec).await;
                            live_state.record(ok, timing);
                            if live_state.failed() {
                                tracing::info!(pod = %ctx.name, container = %name, "liveness probe failed; restarting");
                                let code = process.stop(Duration::from_secs(ctx.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30).max(0) as u64)).await;
                                break code;
                            }
                        }
                }
            }
        };
        let restart = match restart_policy.as_str() {
            "Never" => false,
            "OnFailure" => exit != Some(0),
            _ => true,
        };
        record_exit(&ctx, &name, exit, started, restart);
        if !restart {
            return exit;
        }
        // A container that ran a while earns a fresh backoff, as in the kubelet.
        if began.elapsed() > Duration::from_secs(10) {
            backoff = BACKOFF_START;
        }
        set_waiting(
            &ctx,
            &name,
            "CrashLoopBackOff",
            &format!("back-off {backoff:?} restarting failed container"),
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return exit,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn run_probe(
    probe: &k8s_openapi::api::core::v1::Probe,
    sandbox: &Sandbox,
    ports: &[k8s_openapi::api::core::v1::ContainerPort],
    timing: &Timing,
    pid: u32,
    spec: &Spec,
) -> bool {
    match probe::check_for(probe, &sandbox.ip, ports) {
        Ok(Check::Exec { command }) => {
            super::exec::run_in(pid, spec, &command, timing.timeout).await
        }
        Ok(check) => probe::run_network(&check, timing.timeout).await,
        Err(_) => false,
    }
}

fn set_waiting(ctx: &PodCtx, name: &str, reason: &str, message: &str) {
    ctx.update(|s| {
        let c = s.containers.entry(name.to_string()).or_default();
        c.ready = false;
        c.state = Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..Default::default()
        });
    });
}

fn record_exit(ctx: &PodCtx, name: &str, code: Option<i32>, started: Timestamp, restarting: bool) {
    let terminated = ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code.unwrap_or(137),
            reason: Some(if code == Some(0) {
                "Completed".into()
            } else {
                "Error".into()
            }),
            started_at: Some(Time(started)),
            finished_at: Some(Time(Timestamp::now())),
            ..Default::default()
        }),
        ..Default::default()
    };
    ctx.update(|s| {
        let c = s.containers.entry(name.to_string()).or_default();
        c.ready = false;
        if restarting {
            c.restarts += 1;
            c.last_state = Some(terminated);
        } else {
            c.state = Some(terminated);
        }
    });
}

async fn container_spec(
    ctx: &PodCtx,
    sandbox: &Sandbox,
    container: &Container,
) -> Result<Spec, String> {
    let mut pod = ctx.pod.clone();
    let status = pod.status.get_or_insert_with(Default::default);
    status.pod_ip = Some(sandbox.ip.clone());
    status.host_ip = Some(ctx.shared.net.gateway().to_string());
    let mut needs = Vec::new();
    for env in container.env.iter().flatten() {
        if let Some(from) = &env.value_from {
            if let Some(s) = &from.secret_key_ref {
                needs.push(Needs::Secret {
                    name: s.name.clone(),
                    optional: s.optional == Some(true),
                });
            }
            if let Some(c) = &from.config_map_key_ref {
                needs.push(Needs::ConfigMap {
                    name: c.name.clone(),
                    optional: c.optional == Some(true),
                });
            }
        }
    }
    let fetched = fetch(ctx, &needs).await?;
    let lookup = ApiLookup {
        secrets: fetched.secrets,
        config_maps: fetched.config_maps,
    };
    let mut env = expand::environment(&pod, container, &lookup).map_err(|e| e.to_string())?;
    env.entry("KUBERNETES_SERVICE_HOST".into())
        .or_insert_with(|| "kubernetes.default.svc".into());
    env.entry("KUBERNETES_SERVICE_PORT".into())
        .or_insert_with(|| "443".into());
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.entry("HOSTNAME".into())
        .or_insert_with(|| sandbox.hostname.clone());
    let image = container.image.clone().unwrap_or_default();
    let entrypoint = match ctx.shared.images.program(&image) {
        Some(p) => p.display().to_string(),
        None if container.command.as_ref().is_some_and(|c| !c.is_empty()) => String::new(),
        None => {
            return Err(format!(
                "image {image:?} maps to no program (known: {})",
                ctx.shared.images.known().join(", ")
            ));
        }
    };
    let mut argv = expand::argv(container, &entrypoint, &env);
    ctx.shared.images.resolve_argv0_for(&image, &mut argv);
    let mut mounts = vec![
        Mount {
            source: sandbox.hosts.clone(),
            target: "/etc/hosts".into(),
            read_only: false,
        },
        Mount {
            source: sandbox.resolv_conf.clone(),
            target: "/etc/resolv.conf".into(),
            read_only: true,
        },
    ];
    // The program itself, where it is on the machine: the container's /tmp is
    // its own, and a checkout (with its build output) may live there.
    if let Some(program) = argv
        .first()
        .filter(|p| p.starts_with('/') && std::path::Path::new(p).is_file())
    {
        mounts.push(Mount {
            source: PathBuf::from(program),
            target: program.clone(),
            read_only: true,
        });
    }
    for m in container.volume_mounts.iter().flatten() {
        let source = sandbox
            .volumes
            .get(&m.name)
            .ok_or_else(|| format!("volume mount {} names no volume of the Pod", m.name))?;
        let source = match &m.sub_path {
            Some(sub) if !sub.is_empty() => source.join(sub),
            _ => source.clone(),
        };
        mounts.push(Mount {
            source,
            target: m.mount_path.clone(),
            read_only: m.read_only == Some(true),
        });
    }
    Ok(Spec {
        netns: sandbox.netns.clone(),
        hostname: sandbox.hostname.clone(),
        root: ctx.dir.join("rootfs").join(&container.name),
        upper: ctx.dir.join("upper").join(&container.name),
        mounts,
        working_dir: container.working_dir.clone(),
        argv,
        env,
    })
}

/// A running container process.
struct Process {
    pid: u32,
    exited: tokio::sync::oneshot::Receiver<Option<i32>>,
    code: Option<Option<i32>>,
}

impl Process {
    fn start(
        program: &std::path::Path,
        spec: &Spec,
        spec_path: &std::path::Path,
        log: &std::path::Path,
    ) -> Result<Process, String> {
        let json = serde_json::to_vec(spec).map_err(|e| e.to_string())?;
        // A fresh root for each start: the old one may still be mounted in a
        // namespace that is being torn down.
        let _ = std::fs::remove_dir_all(&spec.root);
        std::fs::write(spec_path, json)
            .map_err(|e| format!("writing {}: {e}", spec_path.display()))?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut command = std::process::Command::new(program);
        command
            .arg(spec_path)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        // Its own process group, so stopping it reaches what it forked.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = crate::process::spawn_tied_to_process(command)
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let pid = child.id();
        // A cgroup of its own, as a container has: what it starts that leaves
        // its process group (a daemon such as an SSH control master) still
        // goes with it. The process has not got far enough to fork yet.
        let cgroup = format!("{CGROUP_PARENT}/{pid}");
        let contained = match cgroups::move_into(&cgroup, pid) {
            Ok(()) => {
                live_cgroups().insert(cgroup.clone());
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "a container without a cgroup of its own");
                false
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let code = child.wait().ok().and_then(|s| {
                s.code().or_else(|| {
                    std::os::unix::process::ExitStatusExt::signal(&s).map(|sig| 128 + sig)
                })
            });
            // When a container's process ends, so does everything it started.
            if contained {
                if let Err(e) = cgroups::remove(&cgroup, Duration::from_secs(10)) {
                    tracing::warn!(error = %e, "a container's processes outlived it");
                }
                live_cgroups().remove(&cgroup);
                cgroups::remove_if_empty(CGROUP_PARENT);
            }
            let _ = tx.send(code);
        });
        Ok(Process {
            pid,
            exited: rx,
            code: None,
        })
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    async fn wait(&mut self) -> Option<i32> {
        if let Some(code) = self.code {
            return code;
        }
        let code = (&mut self.exited).await.ok().flatten();
        self.code = Some(code);
        code
    }

    /// SIGTERM the container's process group, SIGKILL once the grace period
    /// `stop` carries is over; a shorter one arriving meanwhile shortens it.
    async fn stop_as_told(&mut self, stop: &mut watch::Receiver<Option<i64>>) -> Option<i32> {
        if self.code.is_some() {
            return self.wait().await;
        }
        let began = Instant::now();
        let grace = |s: &watch::Receiver<Option<i64>>| {
            Duration::from_secs(s.borrow().unwrap_or(30).max(0) as u64)
        };
        let mut limit = grace(stop);
        let mut told = true;
        crate::sys::kill_group(self.pid, libc::SIGTERM);
        loop {
            tokio::select! {
                code = self.wait() => return code,
                _ = tokio::time::sleep(limit.saturating_sub(began.elapsed())) => {
                    crate::sys::kill_group(self.pid, libc::SIGKILL);
                    return self.wait().await;
                }
                changed = stop.changed(), if told => match changed {
                    Ok(()) => limit = limit.min(grace(stop)),
                    Err(_) => told = false,
                },
            }
        }
    }

    /// SIGTERM the container's process group, SIGKILL after `grace`.
    async fn stop(&mut self, grace: Duration) -> Option<i32> {
        if self.code.is_some() {
            return self.wait().await;
        }
        crate::sys::kill_group(self.pid, libc::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(code) => code,
            Err(_) => {
                crate::sys::kill_group(self.pid, libc::SIGKILL);
                self.wait().await
            }
        }
    }
}

/// Write the Pod's status whenever it changes.
async fn write_status(ctx: Arc<PodCtx>) {
    let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &ctx.namespace);
    let mut last = None;
    loop {
        let mut status = build_status(&ctx);
        stamp_transitions(&mut status, last.as_ref(), Timestamp::now());
        if last.as_ref() != Some(&status) {
            let patch = serde_json::json!({ "status": status });
            match api
                .patch_status(&ctx.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => last = Some(status),
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => tracing::debug!(pod = %ctx.name, error = %e, "status update failed"),
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), ctx.changed.notified()).await;
    }
}

/// Each condition's lastTransitionTime, as the kubelet keeps it: the time
/// of the last write that changed its status, carried over otherwise.
fn stamp_transitions(status: &mut PodStatus, last: Option<&PodStatus>, now: Timestamp) {
    let before = last
        .and_then(|l| l.conditions.as_deref())
        .unwrap_or_default();
    for c in status.conditions.iter_mut().flatten() {
        c.last_transition_time = before
            .iter()
            .find(|b| b.type_ == c.type_ && b.status == c.status)
            .and_then(|b| b.last_transition_time.clone())
            .or(Some(Time(now)));
    }
}

fn build_status(ctx: &PodCtx) -> PodStatus {
    let s = ctx.state.lock().unwrap_or_else(|p| p.into_inner());
    let spec = ctx.pod.spec.clone().unwrap_or_default();
    let statuses: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| {
            let run = s.containers.get(&c.name).cloned().unwrap_or_default();
            ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: String::new(),
                container_id: Some(format!("kok://{}-{}-{}", ctx.uid, c.name, run.restarts)),
                ready: run.ready,
                started: Some(run.started),
                restart_count: run.restarts,
                state: run.state.or_else(|| {
                    Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some("ContainerCreating".into()),
                            message: s.message.clone(),
                        }),
                        ..Default::default()
                    })
                }),
                last_state: run.last_state,
                ..Default::default()
            }
        })
        .collect();
    let all_ready = !statuses.is_empty() && statuses.iter().all(|c| c.ready);
    let all_terminated = statuses
        .iter()
        .all(|c| c.state.as_ref().is_some_and(|st| st.terminated.is_some()));
    let phase = if all_terminated && !statuses.is_empty() {
        if statuses.iter().all(|c| {
            c.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        }) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if statuses.iter().any(|c| {
        c.state
            .as_ref()
            .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            || c.restart_count > 0
    }) {
        "Running"
    } else {
        "Pending"
    };
    let condition = |type_: &str, ok: bool| PodCondition {
        type_: type_.into(),
        status: if ok { "True".into() } else { "False".into() },
        ..Default::default()
    };
    PodStatus {
        phase: Some(phase.into()),
        pod_ip: s.ip.clone(),
        pod_ips: s.ip.clone().map(|ip| vec![PodIP { ip }]),
        host_ip: Some(ctx.shared.net.gateway().to_string()),
        start_time: s.start_time.map(Time),
        conditions: Some(vec![
            condition("PodScheduled", true),
            condition("PodReadyToStartContainers", s.ip.is_some()),
            condition(
                "Initialized",
                s.init_done || spec.init_containers.as_ref().is_none_or(Vec::is_empty),
            ),
            condition("ContainersReady", all_ready),
            condition("Ready", all_ready),
        ]),
        container_statuses: Some(statuses),
        message: s.message.clone(),
        ..Default::default()
    }
}
