//! What the operator's test binaries share (each names it `common`): the
//! Pod runner, the operator run as a Pod of the meta-cluster, a test
//! Cluster on the runner's nodes, a client of the business API, a poller
//! that counts failed business API calls, and etcdctl against the members;
//! and [`meta`], a real meta-cluster whose workers are Machines.

pub mod meta;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, Placement};
use kube_on_kube_operator::config::Config;
use kube_on_kube_operator::context::Context;
use serde_json::json;

/// The node-operator binary, for the image of its Deployment:
/// `KOK_NODE_OPERATOR`, else beside the running test in the same profile
/// directory (`target/debug/node-operator` for `target/debug/deps/x`).
pub fn node_operator_binary() -> PathBuf {
    workspace_binary("node-operator", "KOK_NODE_OPERATOR")
}

/// The kube-on-kube-operator binary the test runs: `KOK_OPERATOR`, else
/// beside the running test (cargo builds it for the operator's tests).
pub fn operator_binary() -> PathBuf {
    workspace_binary("kube-on-kube-operator", "KOK_OPERATOR")
}

/// A binary of this workspace: the path in `var`, else `name` beside the
/// running test in the same profile directory.
fn workspace_binary(name: &str, var: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no {name} binary next to {}: run `cargo build --workspace --bins` first (or set {var})",
                exe.display()
            )
        })
}

/// Start a Pod runner with three control-plane nodes, the operator's binary
/// and `programs` (image name, optionally with a tag → program).
pub fn start_runner(programs: Vec<(String, PathBuf)>) -> PodRunner {
    let operator = operator_binary();
    let mut all: std::collections::BTreeMap<String, PathBuf> =
        [("kube-on-kube-operator".to_string(), operator)].into();
    all.extend(programs);
    PodRunner::start(
        KubeEnv::shared(),
        Options {
            nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
            programs: all,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"))
}

/// A ServiceAccount `operator` in `ns` allowed to manage everything (the
/// chart's least-privilege rules are tested with the chart).
pub async fn grant_operator(client: &Client, ns: &str) {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "operator"}})).expect("account");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("service account");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("operator-{ns}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
}

/// Run the operator's binary as Pod `operator` watching `ns`.
pub async fn start_operator_pod(client: &Client, ns: &str, node: &str) {
    start_operator_pod_with(client, ns, node, &[]).await;
}

/// Run the operator's binary as Pod `operator` watching `ns`, with `extra`
/// flags.
pub async fn start_operator_pod_with(client: &Client, ns: &str, node: &str, extra: &[String]) {
    let mut args = vec![format!("--namespace={ns}")];
    args.extend_from_slice(extra);
    start_operator_pod_args(client, ns, node, &args).await;
}

/// Run the operator's binary as Pod `operator` in `ns` with `args` (no
/// `--namespace` among them: it watches every namespace).
pub async fn start_operator_pod_args(client: &Client, ns: &str, node: &str, args: &[String]) {
    // The operator's own decisions at debug: its log is what explains a
    // failed test.
    let mut args = args.to_vec();
    args.push("--log-level=info,kube_on_kube_operator=debug".to_string());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "operator",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "operator", "image": "kube-on-kube-operator", "args": args}]
        }
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("operator pod");
}

/// Stop the operator Pod and wait until it is gone.
pub async fn stop_operator_pod(client: &Client, ns: &str) {
    delete_operator_pod(client, ns, &DeleteParams::default()).await;
}

/// Kill the operator's Pod at once (no grace: whatever it was doing is cut
/// short) and wait until it is gone.
pub async fn kill_operator_pod(client: &Client, ns: &str) {
    delete_operator_pod(client, ns, &DeleteParams::default().grace_period(0)).await;
}

async fn delete_operator_pod(client: &Client, ns: &str, params: &DeleteParams) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete("operator", params)
        .await
        .expect("stop the operator");
    wait_for(
        "the operator pod to be gone",
        Duration::from_secs(60),
        async || pods.get_opt("operator").await.ok()?.is_none().then_some(()),
    )
    .await;
}

/// `examples/cluster-minimal.yaml` as it is.
pub fn minimal_example() -> Cluster {
    serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
        .expect("the Minimal example")
}

/// `examples/cluster-production.yaml` as it is.
pub fn production_example() -> Cluster {
    serde_norway::from_str(include_str!("../../../examples/cluster-production.yaml"))
        .expect("the Production example")
}

/// A Cluster named `name` in `ns` on the runner's nodes, etcd on claims.
pub fn test_cluster(ns: &str, name: &str, mode: ClusterMode) -> Cluster {
    let mut cluster: Cluster = minimal_example();
    cluster.metadata.namespace = Some(ns.into());
    cluster.metadata.name = Some(name.into());
    cluster.spec.mode = mode;
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster.spec.etcd.storage = serde_json::from_value(json!({"claimTemplate": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}
    }}))
    .expect("storage");
    cluster
}

/// The production example as Cluster `name` in `ns` for kwok nodes: they
/// carry no control-plane label, and no provisioner serves claims.
pub fn kwok_cluster(mode: ClusterMode, ns: &str, name: &str) -> Cluster {
    let mut c: Cluster = production_example();
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.spec.mode = mode;
    c.spec.placement = None;
    c.spec.etcd.storage =
        serde_json::from_value(json!({"volumeSource": {"emptyDir": {}}})).expect("storage");
    c
}

/// The controller's context, as the operator builds it, for tests that call
/// the reconcile themselves.
pub fn context(client: &Client, config: Config) -> Arc<Context> {
    Arc::new(Context::new(
        client.clone(),
        Recorder::new(
            client.clone(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        ),
        config,
    ))
}

pub fn condition(c: &Cluster, type_: &str) -> Option<String> {
    Some(c.status.as_ref()?.condition(type_)?.status.clone())
}

/// Every condition a working Cluster has True.
pub const ALL_READY: [&str; 7] = [
    "EtcdReady",
    "APIServerReady",
    "ControllerManagerReady",
    "SchedulerReady",
    "CertificatesReady",
    "AddonsReady",
    "Ready",
];

/// Whether every condition of [`ALL_READY`] is True.
pub fn all_ready(c: &Cluster) -> bool {
    ALL_READY
        .iter()
        .all(|t| condition(c, t).as_deref() == Some("True"))
}

/// Wait until `check` holds for the Cluster.
pub async fn wait_cluster(
    clusters: &Api<Cluster>,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Cluster) -> bool,
) -> Cluster {
    let deadline = std::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Ok(c) = clusters.get(name).await {
            if check(&c) {
                return c;
            }
            last = Some(c);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; the Cluster's last status: {}",
            last.as_ref()
                .and_then(|c| c.status.as_ref())
                .map(|s| serde_json::to_string_pretty(s).unwrap_or_default())
                .unwrap_or_else(|| "none".into())
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The admin kubeconfig Secret's content.
pub async fn secret_value(client: &Client, ns: &str, secret: &str, key: &str) -> Vec<u8> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(secret)
        .await
        .unwrap_or_else(|e| panic!("secret {secret}: {e}"));
    s.data
        .and_then(|d| d.get(key).map(|v| v.0.clone()))
        .unwrap_or_else(|| panic!("secret {secret} has no {key}"))
}

/// Ready Pods of one component of cluster `name`.
pub async fn ready_pods(client: &Client, ns: &str, name: &str, component: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!(
        "kubeonkube.io/cluster={name},kubeonkube.io/component={component}"
    )))
    .await
    .expect("pods")
    .items
    .into_iter()
    .filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
    .collect()
}

/// Wait until cluster `name`'s kube-apiserver Deployment has rolled out
/// completely: `replicas` Pods, all of the current template and ready, none
/// of an older one left to be replaced. The component status counts ready
/// replicas of every template, so it reads `3/3` in the middle of a rollout
/// too, while an old Pod a test might pick is still about to go.
pub async fn wait_apiserver_rolled_out(client: &Client, ns: &str, name: &str, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deployment = format!("{name}-apiserver");
    wait_for(
        "the kube-apiserver rollout to complete",
        Duration::from_secs(300),
        async || {
            let d = deployments.get(&deployment).await.ok()?;
            let s = d.status?;
            (s.observed_generation >= d.metadata.generation
                && s.replicas == Some(replicas)
                && s.updated_replicas == Some(replicas)
                && s.ready_replicas == Some(replicas))
            .then_some(())
        },
    )
    .await;
}

/// A client of the business API of cluster `name` as its admin, through one
/// ready kube-apiserver Pod's address (checked against the name in its
/// certificate).
pub async fn business_client(client: &Client, ns: &str, name: &str) -> Client {
    let apiserver = ready_pods(client, ns, name, "apiserver")
        .await
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("a ready apiserver pod");
    let mut config = admin_config(client, ns, name).await;
    config.cluster_url = format!("https://{apiserver}:6443").parse().expect("url");
    Client::try_from(config).expect("business client")
}

/// The admin kubeconfig of cluster `name` as a client configuration, the
/// name checked in the serving certificate `kubernetes` (point its URL at
/// an apiserver Pod's address).
pub async fn admin_config(client: &Client, ns: &str, name: &str) -> kube::Config {
    let text = secret_value(
        client,
        ns,
        &format!("{name}-admin-kubeconfig"),
        "kubeconfig",
    )
    .await;
    let kubeconfig: kube::config::Kubeconfig =
        serde_norway::from_slice(&text).expect("admin kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    config.tls_server_name = Some("kubernetes".into());
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    config
}

/// Polls a ConfigMap through the business API every 200 ms (a quorum read
/// in etcd) and counts what failed.
pub struct Poller {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<(Vec<String>, Duration)>,
}

/// What a poller saw.
#[derive(Debug)]
pub struct Polled {
    pub ok: u64,
    pub failed: u64,
    /// The first few failures, with the time since polling started.
    pub failures: Vec<String>,
    /// The longest any call took, answered or not.
    pub slowest: Duration,
}

impl Poller {
    pub fn start(business: Client, ns: &str, name: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let api: Api<ConfigMap> = Api::namespaced(business, ns);
        let name = name.to_string();
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut failures = Vec::new();
            let mut slowest = Duration::ZERO;
            while !s.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let answer = tokio::time::timeout(Duration::from_secs(5), api.get(&name)).await;
                slowest = slowest.max(asked.elapsed());
                match answer {
                    Ok(Ok(_)) => {
                        o.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        f.fetch_add(1, Ordering::Relaxed);
                        if failures.len() < 20 {
                            failures.push(format!("{:?}: {other:?}", started.elapsed()));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (failures, slowest)
        });
        Self {
            stop,
            ok,
            failed,
            task,
        }
    }

    /// Calls so far: (answered, failed).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    pub async fn stop(self) -> Polled {
        self.stop.store(true, Ordering::Relaxed);
        let (failures, slowest) = self.task.await.expect("poller");
        Polled {
            ok: self.ok.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            failures,
            slowest,
        }
    }
}

/// etcdctl on this machine against the members' Pod addresses, as the
/// operator's etcd client. The members' certificates name their Services,
/// not their Pod addresses, so the server name is not checked here; the
/// client certificate still is, by etcd.
pub struct Etcdctl {
    dir: tempfile::TempDir,
}

/// One member as etcdctl lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ListedMember {
    #[serde(rename = "ID")]
    pub id: u64,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl Etcdctl {
    pub async fn new(client: &Client, ns: &str, cluster: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = format!("{cluster}-operator-etcd-client");
        for key in ["ca.crt", "tls.crt", "tls.key"] {
            let value = secret_value(client, ns, &secret, key).await;
            std::fs::write(dir.path().join(key), value).expect("write pki");
        }
        Self { dir }
    }

    fn file(&self, key: &str) -> String {
        self.dir.path().join(key).display().to_string()
    }

    /// Run etcdctl with `args` against `endpoints`; stdout on success.
    pub fn run(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new(kok_testenv::bins::bin("etcdctl").expect("etcdctl"))
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg(format!("--cacert={}", self.file("ca.crt")))
            .arg(format!("--cert={}", self.file("tls.crt")))
            .arg(format!("--key={}", self.file("tls.key")))
            .arg("--insecure-skip-tls-verify")
            .arg("--command-timeout=5s")
            .arg("--dial-timeout=3s")
            .args(args)
            .output()
            .expect("run etcdctl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The member list, asked of any of `endpoints`.
    pub fn member_list(&self, endpoints: &[String]) -> Result<Vec<ListedMember>, String> {
        #[derive(serde::Deserialize)]
        struct Answer {
            #[serde(default)]
            members: Vec<ListedMember>,
        }
        let text = self.run(endpoints, &["member", "list", "-w", "json"])?;
        serde_json::from_str::<Answer>(&text)
            .map(|a| a.members)
            .map_err(|e| format!("{e}: {text}"))
    }

    /// The version `endpoint` runs, from its own status.
    pub fn version(&self, endpoint: &str) -> Result<String, String> {
        let text = self.run(
            &[endpoint.to_string()],
            &["endpoint", "status", "-w", "json"],
        )?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        v[0]["Status"]["version"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no version in {text}"))
    }
}

/// Client URLs (by Pod address) of the member Pods of cluster `name` that
/// are ready.
pub async fn member_endpoints(client: &Client, ns: &str, name: &str) -> Vec<String> {
    ready_pods(client, ns, name, "etcd")
        .await
        .into_iter()
        .filter_map(|p| p.status.and_then(|s| s.pod_ip))
        .map(|ip| format!("https://{ip}:2379"))
        .collect()
}

/// A kubeconfig file for `secret` under `dir`.
pub async fn kubeconfig_file(client: &Client, ns: &str, secret: &str, dir: &Path) -> PathBuf {
    let text = secret_value(client, ns, secret, "kubeconfig").await;
    let path = dir.join(secret);
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// The PIDs of the processes of a container whose command line carries
/// every one of `marks`: the test kills a member's etcd process with them.
pub fn pids_with(marks: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if marks.iter().all(|m| args.iter().any(|a| a == m)) {
            out.push(pid);
        }
    }
    out
}

/// Names of the Events on cluster `name` with reason `reason`.
pub async fn event_notes(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The Cluster's reported etcd members: (name, id, learner, healthy).
pub fn reported_members(c: &Cluster) -> Vec<(String, Option<String>, bool, bool)> {
    c.status
        .as_ref()
        .map(|s| {
            s.etcd_members
                .iter()
                .map(|m| (m.name.clone(), m.id.clone(), m.learner, m.healthy))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether cluster `c` reports `n` healthy voters with IDs, EtcdReady True,
/// and no change under way.
pub fn etcd_converged(c: &Cluster, n: usize) -> bool {
    let members = reported_members(c);
    members.len() == n
        && members
            .iter()
            .all(|(_, id, learner, healthy)| id.is_some() && !learner && *healthy)
        && condition(c, "EtcdReady").as_deref() == Some("True")
        && c.status.as_ref().is_some_and(|s| s.etcd_change.is_none())
}

/// Name of the Pod's UID, for telling a recreated Pod from the old one.
pub fn uid(p: &Pod) -> String {
    p.uid().unwrap_or_default()
}

/// The ready node-operator Pod of cluster `name`, on one of the runner's
/// nodes, has connected to the business API: the line of its log saying so
/// (with the business API's version).
pub async fn node_operator_connected(
    runner: &PodRunner,
    client: &Client,
    ns: &str,
    name: &str,
) -> String {
    let pod = ready_pods(client, ns, name, "node-operator")
        .await
        .into_iter()
        .next()
        .expect("a ready node-operator Pod");
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    assert!(
        node.as_ref().is_some_and(|n| runner.nodes().contains(n)),
        "the node-operator runs on {node:?}, not on the runner's nodes"
    );
    let log = runner.container_log(ns, &pod.name_any(), &uid(&pod), "node-operator");
    wait_for(
        "the node-operator to log its connection",
        Duration::from_secs(60),
        async || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .find(|l| l.contains("connected to the business cluster"))
                .map(str::to_string)
        },
    )
    .await
}

/// The operator's binary run as a process of this test against the shared
/// meta-cluster (with kwok nodes: its Pods become Ready without running),
/// with `flags`; killed when dropped.
pub struct OperatorProcess {
    child: std::process::Child,
    log: PathBuf,
}

impl OperatorProcess {
    /// Start it with `--kubeconfig`, no leader election, a free HTTP port,
    /// and `flags` (say `--namespace=…` and the flags under test).
    pub fn start(name: &str, flags: &[String]) -> OperatorProcess {
        let env = KubeEnv::shared();
        let log = env.log_dir().join(format!("operator-{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = std::process::Command::new(operator_binary())
            .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
            .arg("--leader-elect=false")
            .arg("--http-address=127.0.0.1:0")
            .arg("--log-level=info,kube_on_kube_operator=debug")
            .args(flags)
            .env("POD_NAME", name)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the operator");
        OperatorProcess { child, log }
    }

    /// The process id, to read its memory from `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the log's place when the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the operator exited ({status}); log {}", self.log.display());
        }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("operator log: {}", self.log.display());
        }
    }
}

/// A Minimal Cluster `name` in `ns` for kwok nodes: no placement, etcd on
/// `emptyDir`.
pub fn kwok_minimal_cluster(ns: &str, name: &str) -> Cluster {
    let mut c: Cluster = minimal_example();
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.spec.placement = None;
    c.spec.etcd.storage =
        serde_json::from_value(json!({"volumeSource": {"emptyDir": {}}})).expect("storage");
    c
}

/// The condition `type_` of the Cluster: (status, reason, message).
pub fn condition_of(c: &Cluster, type_: &str) -> Option<(String, String, String)> {
    let c = c.status.as_ref()?.condition(type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The server of the first cluster of a kubeconfig text (the add-ons embed
/// kubeconfigs with quoted values, so they are compared parsed).
pub fn kubeconfig_server(text: &str) -> Option<String> {
    kube::config::Kubeconfig::from_yaml(text)
        .ok()?
        .clusters
        .first()?
        .cluster
        .as_ref()?
        .server
        .clone()
}

/// Every condition of Cluster `name` True, with `endpoint` when given.
pub async fn ready_cluster(clusters: &Api<Cluster>, name: &str, endpoint: Option<&str>) -> Cluster {
    wait_for(
        &format!("{name} to be Ready at {endpoint:?}"),
        Duration::from_secs(300),
        async || {
            let c = clusters.get(name).await.ok()?;
            let at = c.status.as_ref()?.endpoint.as_deref();
            (endpoint.is_none_or(|e| at == Some(e)) && all_ready(&c)).then_some(c)
        },
    )
    .await
}

/// Deletes Cluster `name`, waits until it is gone, and stops the operator.
pub async fn delete_and_stop_operator(client: &Client, ns: &str, name: &str) {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete");
    wait_for("the Cluster to go", Duration::from_secs(120), async || {
        clusters.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete("operator", &DeleteParams::default())
        .await
        .expect("stop the operator");
}

/// The Minimal example on the runner's nodes. The example has no
/// placement: without one the Pods could land on the meta-cluster's
/// simulated nodes, where nothing runs.
pub fn minimal_on_runner() -> Cluster {
    let mut cluster: Cluster = minimal_example();
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster
}

/// The Minimal example in namespace `ns`, on the runner's nodes, reachable
/// inside the meta-cluster only (ClusterIP).
pub fn minimal_inside(ns: &str) -> Cluster {
    let mut cluster = minimal_on_runner();
    cluster.metadata.namespace = Some(ns.to_string());
    cluster.spec.api_server.external.type_ = kube_on_kube_api::cluster::ExposureType::ClusterIP;
    cluster
}

/// kubectl (the environment's upstream build) with `kubeconfig`.
pub struct Kubectl {
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// Runs it with `stdin`; its stdout, or what it said on failure.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child =
            std::process::Command::new(kok_testenv::bins::bin("kubectl").expect("kubectl"))
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg("--request-timeout=30s")
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run kubectl");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write kubectl's stdin");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("kubectl output");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs it; its stdout, the test failing if it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        self.run(args, None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `kubectl apply` of `yaml` (one or more documents, YAML or JSON).
    pub fn apply(&self, yaml: &str) {
        self.run(&["apply", "-f", "-"], Some(yaml))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `args` with `-o json`, parsed; None if it failed.
    pub fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        let out = self.run(&all, None).ok()?;
        serde_json::from_str(&out).ok()
    }
}

/// Whether a Pod or Node, as kubectl prints it in JSON, has the condition
/// Ready True.
pub fn is_ready(object: &serde_json::Value) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
