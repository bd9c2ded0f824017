//! Harness shared by the node-operator's end-to-end tests: a business API
//! server (real kube-apiserver and controller-manager) with the bootstrap
//! add-on applied, SSH test hosts that reach it through a TCP proxy, the
//! examples' PackageVersions and ClusterPackageVersion pointed at packages
//! served by the hosts' artifact server, and the `node-operator` binary as a
//! child process that a test can kill and restart.
//!
//! Every test binary uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Secret};
use kok_testenv::hosts::{HostsOptions, TestHost, TestHosts};
use kok_testenv::kube_env::{KubeEnv, Options};
use kok_testenv::proxy::TcpProxy;
use kok_testenv::wait::wait_for;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use kube::{Client, Discovery, ResourceExt};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{Cluster, ClusterPackageVersion, Machine, PackageVersion};
use kube_on_kube_operator::names::Names;
use kube_on_kube_operator::render::addons;
use serde::Deserialize as _;

/// Field manager of what the tests apply.
pub const MANAGER: &str = "node-operator-test";

/// Name (in kube-system) of the Secret holding the hosts' SSH client key, as
/// the example Machine names it.
pub const SSH_KEY_SECRET: &str = "node-ssh-key";

/// The repository's `examples/` directory.
pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Runs a local command, asserting it succeeds; its stdout.
pub fn run_local(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The sha256 of a local file, in hex.
pub fn sha256(path: &Path) -> String {
    run_local(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Runs `command` on the host over SSH; its trimmed stdout.
pub fn on(host: &TestHost, command: &str) -> String {
    let output = host.ssh(command);
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Packs `files` (path in the archive → content, mode 0755) into
/// `<artifacts>/<name>` and returns its sha256.
pub fn pack(hosts: &TestHosts, name: &str, files: &[(&str, Vec<u8>)]) -> String {
    let work = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let p = work.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        run_local(Command::new("chmod").arg("0755").arg(&p));
    }
    let archive = hosts.artifacts_dir().join(name);
    run_local(
        Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(work.path())
            .arg("."),
    );
    sha256(&archive)
}

/// A shell script's bytes.
pub fn script(text: &str) -> Vec<u8> {
    format!("#!/bin/sh\n{text}\n").into_bytes()
}

/// The test kubelet (`kok-test-kubelet`), stripped so the package stays small.
pub fn kubelet_binary() -> Vec<u8> {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("kok-test-kubelet");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        bin.display()
    );
    let stripped = tempfile::NamedTempFile::new().unwrap();
    run_local(
        Command::new("strip")
            .arg("-o")
            .arg(stripped.path())
            .arg(&bin),
    );
    std::fs::read(stripped.path()).unwrap()
}

/// Packs a kubelet package (the test kubelet reporting `version`) as
/// `<artifacts>/<file>`; its sha256.
pub fn pack_kubelet(hosts: &TestHosts, file: &str, version: &str) -> String {
    pack(
        hosts,
        file,
        &[
            ("bin/kubelet", kubelet_binary()),
            ("bin/VERSION", format!("{version}\n").into_bytes()),
        ],
    )
}

/// The stand-in packages' PackageVersions (`support/packageversions.yaml`:
/// containerd, CNI plugins, kubelet, shaped like the real ones), pointed at
/// the artifact server with the test packages' real checksums.
pub fn package_versions(hosts: &TestHosts) -> Vec<PackageVersion> {
    let containerd = pack(
        hosts,
        "containerd.tar.gz",
        &[
            ("bin/containerd", script("exec sleep 1000000")),
            ("bin/containerd-shim-runc-v2", script("exit 0")),
            ("bin/ctr", script("echo 'ctr test-containerd 2.1.4'")),
        ],
    );
    let cni = pack(
        hosts,
        "cni-plugins.tar.gz",
        &["bridge", "host-local", "loopback", "portmap"]
            .map(|p| (p, script("echo 'CNI plugin v1.8.0'"))),
    );
    let kubelet = pack_kubelet(hosts, "kubelet.tar.gz", "1.35.4");
    let text = include_str!("packageversions.yaml");
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(doc).unwrap();
        let mut pv: PackageVersion = serde_norway::from_value(value).unwrap();
        let (file, sha) = match pv.spec.package.as_str() {
            "containerd" => ("containerd.tar.gz", containerd.clone()),
            "cni-plugins" => ("cni-plugins.tar.gz", cni.clone()),
            "kubelet" => ("kubelet.tar.gz", kubelet.clone()),
            other => panic!("unexpected package {other}"),
        };
        pv.spec.artifacts[0].url = hosts.artifact_url(file);
        pv.spec.artifacts[0].sha256 = sha;
        out.push(pv);
    }
    out
}

/// A copy of the PackageVersion of `package` in `pvs`, named `name`, at
/// `version`, downloading `file` from the artifact server with `sha`.
pub fn package_version_like(
    pvs: &[PackageVersion],
    hosts: &TestHosts,
    package: &str,
    name: &str,
    version: &str,
    file: &str,
    sha: &str,
) -> PackageVersion {
    let mut pv = pvs
        .iter()
        .find(|p| p.spec.package == package)
        .unwrap_or_else(|| panic!("no PackageVersion of {package}"))
        .clone();
    pv.metadata = kube::api::ObjectMeta {
        name: Some(name.into()),
        labels: pv.metadata.labels.clone(),
        annotations: pv.metadata.annotations.clone(),
        ..Default::default()
    };
    pv.spec.version = version.into();
    pv.spec.artifacts[0].url = hosts.artifact_url(file);
    pv.spec.artifacts[0].sha256 = sha.into();
    pv
}

/// The `node-operator` binary, killed when dropped.
pub struct Operator {
    child: Child,
    log: PathBuf,
}

/// The flags [`Operator::start`] passes: short intervals and timeouts for
/// tests. Tests that wait for one of these thresholds, or show that
/// something does not happen within one, size their waits by the constants
/// below.
pub const OPERATOR_ARGS: &[&str] = &[
    "--recheck-interval=4s",
    "--node-wait=10s",
    "--retry-backoff=1s",
    "--ssh-concurrency=4",
    "--ssh-connect-timeout=3s",
    "--ssh-step-timeout=60s",
    "--ssh-keepalive-interval=2s",
    "--drain-timeout=30s",
    "--offboard-timeout=20s",
    "--cluster-dns=10.0.0.10",
    "--log-level=info,node_operator=debug",
    // Tests run side by side: no fixed port.
    "--http-address=127.0.0.1:0",
];

/// `--recheck-interval` of [`OPERATOR_ARGS`]: how often a Ready Machine's
/// host is visited.
pub const RECHECK: Duration = Duration::from_secs(4);

/// `--retry-backoff` of [`OPERATOR_ARGS`]: the first wait before a failed
/// Machine is tried again (it doubles with each failure in a row).
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// How long the test environment's controller-manager lets a Node go
/// without a heartbeat before it marks it NotReady. The test kubelet renews
/// every quarter of `nodeLeaseDurationSeconds` (8 s in
/// `packageversions.yaml`): six renewals fit in it.
pub const NODE_GRACE: Duration = Duration::from_secs(12);

impl Operator {
    /// Starts the operator against `env` with [`OPERATOR_ARGS`], appending its
    /// output to `log`.
    pub fn start(env: &KubeEnv, log: &Path) -> Operator {
        Self::start_with(env, log, &[])
    }

    /// Starts the operator with [`OPERATOR_ARGS`] and `extra`, whose flags
    /// replace the defaults of the same name (`--flag=value` form).
    pub fn start_with(env: &KubeEnv, log: &Path, extra: &[&str]) -> Operator {
        Self::start_as(env.kubeconfig_path(), log, extra)
    }

    /// Starts the operator with [`OPERATOR_ARGS`] and `extra`, with the
    /// identity and rights of `kubeconfig`.
    pub fn start_as(kubeconfig: &Path, log: &Path, extra: &[&str]) -> Operator {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_node-operator"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(OPERATOR_ARGS.iter().filter(|arg| {
                // A flag given in `extra` replaces the default one.
                let flag = arg.split('=').next().unwrap_or(arg);
                !extra.iter().any(|e| e.split('=').next() == Some(flag))
            }))
            .args(extra)
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Operator {
            child,
            log: log.to_path_buf(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it as a rollout does (SIGTERM): it finishes the reconciles in
    /// flight, releases the Lease (so the next one leads at once, without
    /// waiting for it to expire) and exits 0.
    pub async fn stop(mut self) {
        let pid = self.child.id().to_string();
        run_local(Command::new("kill").arg("-TERM").arg(&pid));
        let exit = wait_for(
            "the node-operator to exit after SIGTERM",
            Duration::from_secs(40),
            async || self.child.try_wait().ok().flatten(),
        )
        .await;
        assert!(exit.success(), "node-operator exit status {exit:?}");
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("node-operator log: {}", self.log.display());
        }
    }
}

/// Server-side apply of `obj` (forced, [`MANAGER`]).
pub async fn apply<K>(api: &Api<K>, obj: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut value = serde_json::to_value(obj).unwrap();
    if let Some(meta) = value["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap();
}

/// The kube-on-kube-operator's bootstrap add-on, rendered by its own template
/// functions for a cluster whose API server hosts reach at `server`, applied
/// to the business cluster. The test API server's certificate names
/// `localhost`, not the proxy's address, so `cluster-info` also names the TLS
/// server name to verify.
pub async fn bootstrap_addon(client: &Client, env: &KubeEnv, server: &str) {
    let objects = rendered_addon(env, server, addons::BOOTSTRAP);
    assert!(
        objects
            .iter()
            .any(|o| o.types.as_ref().is_some_and(|t| t.kind == "ConfigMap")
                && o.name_any() == "cluster-info"),
        "the bootstrap add-on renders cluster-info"
    );
    apply_objects(client, objects).await;
}

/// The RBAC objects of the node-operator add-on (the rights a per-cluster
/// node-operator has in its business cluster), applied.
pub async fn node_operator_rbac(client: &Client, env: &KubeEnv, server: &str) {
    let objects = rendered_addon(env, server, addons::NODE_OPERATOR)
        .into_iter()
        .filter(|o| {
            o.types
                .as_ref()
                .is_some_and(|t| t.api_version.starts_with("rbac.authorization.k8s.io/"))
        })
        .collect::<Vec<_>>();
    assert!(
        !objects.is_empty(),
        "the node-operator add-on grants rights"
    );
    apply_objects(client, objects).await;
}

/// The group the kube-on-kube-operator puts in the node-operator's client
/// certificate.
pub const NODE_OPERATORS_GROUP: &str = "kube-on-kube:node-operators";

/// A kubeconfig at `path` that acts as a member of [`NODE_OPERATORS_GROUP`]
/// only (the admin credentials impersonating it, so every request is
/// authorized with that identity's rights).
pub fn node_operator_kubeconfig(env: &KubeEnv, path: &Path) -> kube::config::Kubeconfig {
    let mut config = env.kubeconfig().clone();
    for named in &mut config.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some("kube-on-kube:node-operator".into());
            auth.impersonate_groups = Some(vec![NODE_OPERATORS_GROUP.into()]);
        }
    }
    std::fs::write(path, serde_json::to_string(&config).unwrap()).unwrap();
    config
}

/// The objects of the kube-on-kube-operator's add-on `name`, rendered by its
/// own template functions for a cluster whose API server hosts reach at
/// `server`.
fn rendered_addon(env: &KubeEnv, server: &str, name: &str) -> Vec<DynamicObject> {
    let cluster: Cluster = serde_norway::from_str(
        &std::fs::read_to_string(examples().join("cluster-minimal.yaml")).unwrap(),
    )
    .unwrap();
    let settings = addons::Settings {
        registry: "registry.k8s.io",
        operator_version: "0.1.0",
        node_operator_image: "node-operator:0.1.0",
    };
    let plans = addons::plan(&cluster, &settings, &[], &[]);
    let planned = plans
        .iter()
        .find_map(|p| match p {
            addons::Plan::Apply(p) if p.name == name => Some(p),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the {name} add-on is planned"));
    let ca_data = env.kubeconfig().clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    use base64::Engine as _;
    let ca_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .unwrap(),
    )
    .unwrap();
    let names = Names::new(&cluster, "cluster.local");
    let facts = addons::Facts {
        names: &names,
        endpoint: server,
        ca_pem: &ca_pem,
    };
    addons::render(planned, &cluster, &facts, &settings)
        .unwrap()
        .objects
}

/// Applies rendered add-on objects, `cluster-info` naming the TLS server
/// name the test API server's certificate has.
async fn apply_objects(client: &Client, objects: Vec<DynamicObject>) {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for mut object in objects {
        let types = object.types.clone().unwrap();
        if types.kind == "ConfigMap" && object.name_any() == "cluster-info" {
            let text = object.data["data"]["kubeconfig"].as_str().unwrap();
            let mut kubeconfig: serde_json::Value = serde_norway::from_str(text).unwrap();
            kubeconfig["clusters"][0]["cluster"]["tls-server-name"] = "localhost".into();
            object.data["data"]["kubeconfig"] = kubeconfig.to_string().into();
        }
        let gvk = kube::api::GroupVersionKind::try_from(&types).unwrap();
        let (resource, caps) = discovery.resolve_gvk(&gvk).unwrap();
        let api: Api<DynamicObject> = match (caps.scope, object.namespace()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        dynamic_apply(&api, &resource, &object).await;
    }
}

async fn dynamic_apply(api: &Api<DynamicObject>, resource: &ApiResource, object: &DynamicObject) {
    let mut value = serde_json::to_value(object).unwrap();
    value["apiVersion"] = resource.api_version.clone().into();
    value["kind"] = resource.kind.clone().into();
    api.patch(
        &object.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {} {}: {e}", resource.kind, object.name_any()));
}

/// The example Machine (`examples/machine.yaml`) for `host`, pinning
/// `host_key`, in zone `zone-<index % 2>`.
pub fn machine(host: &TestHost, host_key: &str, index: usize) -> Machine {
    let text = std::fs::read_to_string(examples().join("machine.yaml")).unwrap();
    let doc = serde_norway::Deserializer::from_str(&text)
        .find_map(|doc| {
            let value = serde_norway::Value::deserialize(doc).ok()?;
            (value.get("kind").and_then(|k| k.as_str()) == Some("Machine")).then_some(value)
        })
        .expect("examples/machine.yaml has a Machine");
    let mut m: Machine = serde_norway::from_value(doc).unwrap();
    m.metadata.name = Some(host.name().to_string());
    m.spec.hostname = None;
    m.spec.ip = host.ip().to_string();
    m.spec.zone = Some(format!("zone-{}", index % 2));
    m.spec.ssh.host_public_key = host_key.to_string();
    // Kernel parameters of the host's own network namespace: the example's
    // vm.max_map_count would change the machine running the tests.
    m.spec.sysctls = BTreeMap::from([
        ("net.ipv4.ip_forward".to_string(), "1".to_string()),
        ("net.ipv4.tcp_keepalive_time".to_string(), "600".to_string()),
    ]);
    m
}

/// The Machine, if it exists (and the API answers).
pub async fn machine_status(api: &Api<Machine>, name: &str) -> Option<Machine> {
    api.get_opt(name).await.ok().flatten()
}

/// Status and reason of a Machine condition.
pub fn condition<'a>(m: &'a Machine, type_: &str) -> Option<(&'a str, &'a str)> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Message of a Machine condition.
pub fn condition_message<'a>(m: &'a Machine, type_: &str) -> Option<&'a str> {
    m.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.as_str())
}

/// The Machine's phase.
pub fn phase(m: &Machine) -> Option<MachinePhase> {
    m.status.as_ref().and_then(|s| s.phase)
}

/// Waits until the Machine is Ready (phase and condition).
pub async fn wait_ready(api: &Api<Machine>, name: &str, timeout: Duration) -> Machine {
    wait_for(&format!("Machine {name} Ready"), timeout, async || {
        let m = machine_status(api, name).await?;
        (phase(&m) == Some(MachinePhase::Ready)
            && condition(&m, "Ready") == Some(("True", "Ready")))
        .then_some(m)
    })
    .await
}

/// Waits until the Machine's host was visited and found as declared (its
/// `lastCheckedAt`, whole seconds) after `since`: every reconcile queued
/// before then has run. With the periodic checks of [`OPERATOR_ARGS`] that
/// is within about [`RECHECK`].
pub async fn wait_checked_after(
    api: &Api<Machine>,
    name: &str,
    since: k8s_openapi::jiff::Timestamp,
    timeout: Duration,
) -> Machine {
    wait_for(
        &format!("Machine {name} checked after {since}"),
        timeout,
        async || {
            let m = machine_status(api, name).await?;
            let at = m.status.as_ref()?.last_checked_at.as_ref()?.0;
            (at > since).then_some(m)
        },
    )
    .await
}

/// Waits until the Machine's condition has `status` and `reason`.
pub async fn wait_condition(
    api: &Api<Machine>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
    timeout: Duration,
) -> Machine {
    wait_for(
        &format!("Machine {name} {type_}={status} ({reason})"),
        timeout,
        async || {
            let m = machine_status(api, name).await?;
            (condition(&m, type_) == Some((status, reason))).then_some(m)
        },
    )
    .await
}

/// Deletes the Machine `name`, waits until offboarding released it, and
/// asserts it got an Event with each of `reasons`.
pub async fn offboard(
    client: &Client,
    machines: &Api<Machine>,
    name: &str,
    timeout: Duration,
    reasons: &[&str],
) {
    machines.delete(name, &Default::default()).await.unwrap();
    wait_for("the Machine gone", timeout, async || {
        machine_status(machines, name).await.is_none().then_some(())
    })
    .await;
    for reason in reasons {
        assert!(
            has_event(client, name, reason).await,
            "{reason} Event on the deleted Machine"
        );
    }
}

/// Events whose involved object is named `name`.
pub async fn events_for(client: &Client, name: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Whether an Event with `reason` was published on `name`.
pub async fn has_event(client: &Client, name: &str, reason: &str) -> bool {
    events_for(client, name)
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some(reason))
}

/// Where each host records the SSH sessions (channels) sshd opened for it.
pub const SESSION_LOG: &str = "/root/ssh-sessions";

/// Makes sshd on `host` record every session it opens (a command, a shell,
/// a subsystem; each channel of a multiplexed connection counts), through
/// root's `~/.ssh/rc`, which sshd runs before each one. `/root` must be one of
/// the host's private directories.
pub fn count_ssh_sessions(host: &TestHost) {
    let rc = host.path_on_host("/root/.ssh/rc").unwrap();
    std::fs::create_dir_all(rc.parent().unwrap()).unwrap();
    // Whatever rc prints would reach the session's output: it prints nothing.
    std::fs::write(&rc, format!("echo session >> {SESSION_LOG} 2>/dev/null\n")).unwrap();
}

/// How many SSH sessions `host` has opened since [`count_ssh_sessions`],
/// read from the machine's side so reading it opens none.
pub fn ssh_sessions(host: &TestHost) -> usize {
    let log = host.path_on_host(SESSION_LOG).unwrap();
    std::fs::read_to_string(log)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// How many artifact requests asked for `file`.
pub fn count(requests: &[String], file: &str) -> usize {
    requests.iter().filter(|r| r.ends_with(file)).count()
}

/// Options of [`Harness::start`].
pub struct HarnessOptions {
    /// SSH test hosts.
    pub hosts: usize,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self { hosts: 3 }
    }
}

/// A business cluster ready for Machines: API server and controller-manager,
/// the bootstrap add-on, SSH test hosts reaching the API server through a
/// proxy, the examples' PackageVersions and ClusterPackageVersion, and the
/// SSH key Secret. No operator runs yet.
pub struct Harness {
    pub env: KubeEnv,
    pub client: Client,
    /// Declared (so dropped) before the hosts: the proxy listens on their
    /// bridge, and stopping it needs the bridge still there.
    pub proxy: TcpProxy,
    pub hosts: TestHosts,
    /// `https://<proxy>`: the API server as the hosts reach it.
    pub server: String,
    /// The PackageVersions applied.
    pub package_versions: Vec<PackageVersion>,
    /// The ClusterPackageVersion applied.
    pub cluster_package_version: ClusterPackageVersion,
}

impl Harness {
    pub async fn start(options: HarnessOptions) -> Harness {
        let env = KubeEnv::start(Options {
            controller_manager: true,
            scheduler: false,
            kwok_nodes: 0,
            install_crds: true,
            controller_manager_qps: None,
            node_monitor_grace: Some(NODE_GRACE),
            real_nodes: None,
        })
        .unwrap();
        let client = env.client().await;
        let hosts = TestHosts::start_with(HostsOptions {
            count: options.hosts,
            extra_private_dirs: vec![
                "/etc/sysctl.d".into(),
                "/etc/containerd".into(),
                "/root".into(),
            ],
        })
        .unwrap();
        for host in hosts.hosts() {
            count_ssh_sessions(host);
        }
        let api_port: u16 = env.api_url().rsplit(':').next().unwrap().parse().unwrap();
        let proxy = TcpProxy::start(hosts.gateway_ip(), ([127, 0, 0, 1], api_port).into()).unwrap();
        let server = format!("https://{}", proxy.addr());
        bootstrap_addon(&client, &env, &server).await;

        let package_versions = package_versions(&hosts);
        for pv in &package_versions {
            apply(&Api::<PackageVersion>::all(client.clone()), pv).await;
        }
        let cluster_package_version: ClusterPackageVersion =
            serde_norway::from_str(include_str!("clusterpackageversion.yaml")).unwrap();
        apply(
            &Api::<ClusterPackageVersion>::all(client.clone()),
            &cluster_package_version,
        )
        .await;
        let key = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(SSH_KEY_SECRET.into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/ssh-auth".into()),
            string_data: Some(BTreeMap::from([(
                "ssh-privatekey".to_string(),
                hosts.client_private_key_pem(),
            )])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), "kube-system")
            .create(&PostParams::default(), &key)
            .await
            .unwrap();
        Harness {
            env,
            client,
            hosts,
            proxy,
            server,
            package_versions,
            cluster_package_version,
        }
    }

    /// Machines of the business cluster.
    pub fn machines(&self) -> Api<Machine> {
        Api::all(self.client.clone())
    }

    /// Where [`Harness::operator`] logs.
    pub fn operator_log(&self) -> PathBuf {
        self.env.log_dir().join("node-operator.log")
    }

    /// Starts the operator with [`OPERATOR_ARGS`].
    pub fn operator(&self) -> Operator {
        Operator::start(&self.env, &self.operator_log())
    }

    /// Starts the operator with [`OPERATOR_ARGS`] and `extra`.
    pub fn operator_with(&self, extra: &[&str]) -> Operator {
        Operator::start_with(&self.env, &self.operator_log(), extra)
    }

    /// Creates (applies) the Machine of each host, `index` numbering zones.
    pub async fn create_machines(&self, hosts: &[TestHost]) {
        let api = self.machines();
        for (i, host) in hosts.iter().enumerate() {
            apply(&api, &machine(host, host.host_public_key(), i)).await;
        }
    }

    /// Waits until every one of `hosts` has a Ready Machine.
    pub async fn wait_all_ready(&self, hosts: &[TestHost], timeout: Duration) {
        let api = self.machines();
        for host in hosts {
            wait_ready(&api, host.name(), timeout).await;
        }
    }
}

/// One change of a watched object as a [`Recorder`] saw it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The object's resourceVersion: the etcd revision of the change, so
    /// changes of different kinds order by it.
    pub rv: u64,
    /// When the test received it.
    pub seen: std::time::SystemTime,
    /// `Machine`, `Node`, `Pod`, `CanaryRelease`…
    pub kind: &'static str,
    /// Object name (namespace/name for namespaced objects).
    pub name: String,
    /// The object after the change; None once deleted.
    pub object: Option<serde_json::Value>,
}

/// Records every change of the watched kinds from the moment it starts: a
/// list for the state then, then a watch from the list's resourceVersion, so
/// no short-lived state is missed as a polling loop would miss it.
pub struct Recorder {
    changes: std::sync::Arc<std::sync::Mutex<Vec<Change>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder watching nothing yet.
    pub fn new() -> Recorder {
        Recorder {
            changes: Default::default(),
            tasks: Vec::new(),
        }
    }

    /// Also records `kind` objects of `api`; returns once their state now is
    /// recorded.
    pub async fn watch<K>(&mut self, api: Api<K>, kind: &'static str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize,
        K: std::fmt::Debug + Send + Sync + 'static,
    {
        let changes = self.changes.clone();
        let rv = Self::list(&api, kind, &changes).await;
        self.tasks
            .push(tokio::spawn(Self::follow(api, kind, changes, rv)));
    }

    async fn list<K>(
        api: &Api<K>,
        kind: &'static str,
        changes: &std::sync::Mutex<Vec<Change>>,
    ) -> String
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize,
        K: std::fmt::Debug,
    {
        let list = api.list(&ListParams::default()).await.unwrap();
        let seen = std::time::SystemTime::now();
        let mut out = changes.lock().unwrap();
        for obj in &list.items {
            out.push(Self::change(kind, obj, seen, false));
        }
        list.metadata.resource_version.unwrap_or_default()
    }

    fn change<K>(kind: &'static str, obj: &K, seen: std::time::SystemTime, gone: bool) -> Change
    where
        K: kube::Resource + serde::Serialize,
    {
        let name = match obj.meta().namespace.as_deref() {
            Some(ns) => format!("{ns}/{}", obj.name_any()),
            None => obj.name_any(),
        };
        Change {
            rv: obj
                .meta()
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            seen,
            kind,
            name,
            object: (!gone).then(|| serde_json::to_value(obj).unwrap()),
        }
    }

    async fn follow<K>(
        api: Api<K>,
        kind: &'static str,
        changes: std::sync::Arc<std::sync::Mutex<Vec<Change>>>,
        mut rv: String,
    ) where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize,
        K: std::fmt::Debug + Send + 'static,
    {
        use futures::StreamExt as _;
        use kube::api::{WatchEvent, WatchParams};
        loop {
            let stream = match api.watch(&WatchParams::default().timeout(240), &rv).await {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            let mut relist = false;
            while let Some(event) = stream.next().await {
                let seen = std::time::SystemTime::now();
                let (obj, gone) = match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => (o, false),
                    Ok(WatchEvent::Deleted(o)) => (o, true),
                    Ok(WatchEvent::Bookmark(b)) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(_)) | Err(_) => {
                        relist = true;
                        break;
                    }
                };
                if let Some(v) = obj.meta().resource_version.clone() {
                    rv = v;
                }
                changes
                    .lock()
                    .unwrap()
                    .push(Self::change(kind, &obj, seen, gone));
            }
            if relist {
                // The watch expired: the state now, then on from there.
                rv = Self::list(&api, kind, &changes).await;
            }
        }
    }

    /// Every change so far, in etcd order.
    pub fn changes(&self) -> Vec<Change> {
        let mut out = self.changes.lock().unwrap().clone();
        out.sort_by_key(|c| c.rv);
        out
    }

    /// Stops watching; every change recorded, in etcd order.
    pub fn stop(self) -> Vec<Change> {
        for t in &self.tasks {
            t.abort();
        }
        self.changes()
    }
}

/// The objects as they stood after each recorded change, replayed in etcd
/// order.
#[derive(Debug, Default, Clone)]
pub struct Replay {
    /// Kind → name → object.
    pub objects: BTreeMap<&'static str, BTreeMap<String, serde_json::Value>>,
}

impl Replay {
    /// Applies one change.
    pub fn apply(&mut self, change: &Change) {
        let of_kind = self.objects.entry(change.kind).or_default();
        match &change.object {
            Some(o) => {
                of_kind.insert(change.name.clone(), o.clone());
            }
            None => {
                of_kind.remove(&change.name);
            }
        }
    }

    /// The `kind` object `name` now, typed.
    pub fn get<K: serde::de::DeserializeOwned>(&self, kind: &str, name: &str) -> Option<K> {
        self.objects
            .get(kind)?
            .get(name)
            .map(|v| serde_json::from_value(v.clone()).unwrap())
    }

    /// Every `kind` object now, typed.
    pub fn all<K: serde::de::DeserializeOwned>(&self, kind: &str) -> Vec<K> {
        self.objects
            .get(kind)
            .map(|m| {
                m.values()
                    .map(|v| serde_json::from_value(v.clone()).unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A PackageVersion of the test kubelet at `version`, packed as
/// `kubelet-<version>.tar.gz`, like the example kubelet otherwise.
pub fn kubelet_version(h: &Harness, version: &str) -> PackageVersion {
    let file = format!("kubelet-{version}.tar.gz");
    let sha = pack_kubelet(&h.hosts, &file, version);
    package_version_like(
        &h.package_versions,
        &h.hosts,
        "kubelet",
        &format!("kubelet-{version}"),
        version,
        &file,
        &sha,
    )
}

/// The PackageVersion (kind, name) the Machine has installed for `package`,
/// and whether it passed its health check.
pub fn installed(m: &Machine, package: &str) -> Option<(String, bool)> {
    let i = m.status.as_ref()?.installed.get(package)?;
    Some((i.package_version.clone(), i.healthy))
}

/// Waits until the Machine is Ready with `package` at PackageVersion `pv`,
/// healthy.
pub async fn wait_at(
    api: &Api<Machine>,
    name: &str,
    package: &str,
    pv: &str,
    timeout: Duration,
) -> Machine {
    wait_for(
        &format!("Machine {name} Ready at {pv}"),
        timeout,
        async || {
            let m = machine_status(api, name).await?;
            (phase(&m) == Some(MachinePhase::Ready)
                && installed(&m, package) == Some((pv.to_string(), true)))
            .then_some(m)
        },
    )
    .await
}

/// Waits until the Machine of every one of `hosts` is Ready with `package`
/// at PackageVersion `pv`, healthy.
pub async fn wait_all_at(
    api: &Api<Machine>,
    hosts: &[TestHost],
    package: &str,
    pv: &str,
    timeout: Duration,
) {
    for host in hosts {
        wait_at(api, host.name(), package, pv, timeout).await;
    }
}

/// Moves the ClusterPackageVersion's `package` to PackageVersion `pv`.
pub async fn set_default(client: &Client, package: &str, pv: &str) {
    Api::<ClusterPackageVersion>::all(client.clone())
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"packages": {package: pv}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("setting the default {package} to {pv}: {e}"));
}

/// A bare Pod bound to Node `node` (no scheduler needed), for drains to evict.
pub fn pod_on(node: &str, name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .unwrap()
}
