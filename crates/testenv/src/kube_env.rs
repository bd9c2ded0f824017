//! A real Kubernetes control plane per test binary (etcd, kube-apiserver and,
//! on request, kube-controller-manager, kube-scheduler and kwok), so operator
//! tests exercise the same API machinery - validation, RBAC, garbage collection,
//! CSR signing - that production clusters run.
//!
//! ```no_run
//! # async fn demo() {
//! use kok_testenv::kube_env::KubeEnv;
//! let env = KubeEnv::shared();
//! let client = env.client().await;
//! let ns = env.namespace("my-test").await;
//! # let _ = (client, ns);
//! # }
//! ```

mod cluster;
mod components;
mod error;
pub(crate) mod pki;
pub(crate) mod supervisor;
pub(crate) mod workdir;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use cluster::{fake_node, install_crds};
pub use error::Error;

use crate::bins;
use pki::Pki;
use supervisor::Supervised;
use workdir::Workdir;

/// Components to run besides etcd and kube-apiserver.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// kube-controller-manager: garbage collection, service accounts, CSR signing
    /// with the environment's CA, bootstrap tokens, workload controllers.
    pub controller_manager: bool,
    /// kube-scheduler, so pods get a node.
    pub scheduler: bool,
    /// Fake nodes run by kwok (0: no kwok). Pods scheduled there turn Running and
    /// Ready without any container runtime.
    pub kwok_nodes: usize,
    /// Apply the CRDs of `kube_on_kube_api` and wait until they are Established.
    pub install_crds: bool,
    /// kube-controller-manager's `--kube-api-qps` (None: its default, 20 a
    /// second per controller). Its Deployment and ReplicaSet controllers
    /// create and update every Pod of the control planes in a fleet; at 20
    /// requests a second they, not the operator, set how fast hundreds of
    /// Clusters come up.
    pub controller_manager_qps: Option<u32>,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a
    /// Node may go without a heartbeat (a Lease renewal or a status update)
    /// before it is marked NotReady. None: five minutes with kwok nodes
    /// (see [`PATIENT_NODE_GRACE`]), else the controller-manager's default
    /// (50 s). A test that stops a kubelet and waits for its Node to turn
    /// NotReady waits this long; its kubelets must renew well within it.
    pub node_monitor_grace: Option<Duration>,
    /// Real kubelets join (see [`RealNodes`]). None: Nodes are kwok's or
    /// the Pod runner's only.
    pub real_nodes: Option<RealNodes>,
}

/// What an environment needs for real kubelets and their Pods (SSH test
/// hosts made nodes by the node-operator): the API server's certificate
/// also names `address`, where the hosts reach it through a
/// [`crate::proxy::TcpProxy`] on [`KubeEnv::api_port`]; the controller-manager
/// gives each Node a /24 of [`crate::meta_network::POD_CIDR`], which the CNI
/// routes (and [`crate::meta_network::PodRoutes`] routes here). The
/// `kubernetes` Service's endpoint is not set: the proxy's address is known
/// only once it listens ([`KubeEnv::publish_api_endpoint`]).
#[derive(Clone, Copy, Debug)]
pub struct RealNodes {
    pub address: std::net::IpAddr,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_manager: true,
            scheduler: false,
            kwok_nodes: 0,
            install_crds: true,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: None,
        }
    }
}

/// The options of [`KubeEnv::shared`]: everything, so most tests can share it.
const SHARED_OPTIONS: Options = Options {
    controller_manager: true,
    scheduler: true,
    kwok_nodes: 3,
    install_crds: true,
    controller_manager_qps: None,
    node_monitor_grace: None,
    real_nodes: None,
};

/// The NotReady grace of environments with simulated nodes. They test
/// control planes, not node failure: simulated nodes and Pod-runner nodes
/// renew their Leases through the same loaded API server as everything
/// else, and a late renewal would mark every Pod on them not ready, which
/// kwok never sets back.
pub const PATIENT_NODE_GRACE: Duration = Duration::from_secs(300);

/// Upper bounds for each start step; generous because test binaries often start
/// while other crates are still compiling on the same cores.
const ETCD_READY: Duration = Duration::from_secs(30);
const APISERVER_READY: Duration = Duration::from_secs(90);
const SETUP_READY: Duration = Duration::from_secs(90);
const NAMESPACE_READY: Duration = Duration::from_secs(60);

/// Bind races with other processes picking ports at the same time are retried
/// this many times.
const PORT_ATTEMPTS: usize = 3;

/// A running control plane. Dropping it kills its processes and deletes its
/// data; the component logs stay under `target/testenv-logs/`.
pub struct KubeEnv {
    api_url: String,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    log_dir: PathBuf,
    controller_manager: bool,
    // Declared before `workdir` so the processes are gone before their files.
    processes: Vec<Supervised>,
    workdir: Workdir,
}

impl KubeEnv {
    /// Starts an independent environment and blocks until it is ready (safe to
    /// call from async tests). Use it for a second cluster next to the shared
    /// one, or when a test needs options the shared one lacks.
    pub fn start(opts: Options) -> Result<KubeEnv, Error> {
        static SEQ: AtomicUsize = AtomicUsize::new(1);
        let name = format!("env-{}", SEQ.fetch_add(1, Ordering::Relaxed));
        Self::start_named(&name, opts)
    }

    /// The environment of this test binary, started on first use with every
    /// component and three kwok nodes. Tests isolate themselves with
    /// [`KubeEnv::namespace`].
    ///
    /// # Panics
    /// When the environment cannot start; every later caller gets the same
    /// message rather than a second attempt.
    pub fn shared() -> &'static KubeEnv {
        static SHARED: OnceLock<Result<KubeEnv, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| match Self::start_named("shared", SHARED_OPTIONS) {
            Ok(mut env) => {
                env.workdir.remove_at_exit();
                Ok(env)
            }
            Err(e) => Err(e.report()),
        });
        match shared {
            Ok(env) => env,
            Err(message) => {
                panic!("the shared Kubernetes test environment did not start: {message}")
            }
        }
    }

    /// A new admin client on the caller's runtime. Clients are not cached: each
    /// `#[tokio::test]` has its own runtime, and a client outlives none of them.
    ///
    /// # Panics
    /// When the kubeconfig cannot be turned into a client.
    pub async fn client(&self) -> Client {
        match client_for(&self.kubeconfig).await {
            Ok(client) => client,
            Err(e) => panic!("building a client for {}: {}", self.api_url, e.report()),
        }
    }

    /// The admin kubeconfig (CN=admin, O=system:masters), for `kubectl` and other
    /// programs started by tests.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig itself, credentials inline.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The port of [`KubeEnv::api_url`].
    pub fn api_port(&self) -> u16 {
        self.api_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// Makes the `kubernetes` Service lead to `endpoint` (where Pods on real
    /// nodes reach the API server), as kube-apiserver's endpoint reconciler
    /// would for its advertised address: its Endpoints and the EndpointSlice
    /// kube-proxy reads.
    pub async fn publish_api_endpoint(&self, endpoint: std::net::SocketAddr) -> Result<(), Error> {
        cluster::publish_api_endpoint(&self.client().await, endpoint).await
    }

    /// Where each component writes its log.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Name and process id of each running component, for tests that check the
    /// processes really go away.
    pub fn processes(&self) -> Vec<(&'static str, u32)> {
        self.processes.iter().map(|p| (p.name(), p.pid())).collect()
    }

    /// Creates a namespace named after `prefix` and unique in this environment,
    /// ready for pods (its `default` service account exists when a controller
    /// manager runs).
    ///
    /// # Panics
    /// When the namespace cannot be created.
    pub async fn namespace(&self, prefix: &str) -> String {
        static SEQ: AtomicU64 = AtomicU64::new(1);
        let name = cluster::namespace_name(prefix, SEQ.fetch_add(1, Ordering::Relaxed));
        let client = self.client().await;
        if let Err(e) =
            cluster::create_namespace(&client, &name, self.controller_manager, NAMESPACE_READY)
                .await
        {
            panic!(
                "creating namespace {name} in {}: {} (logs in {})",
                self.api_url,
                e.report(),
                self.log_dir.display()
            );
        }
        name
    }

    fn start_named(name: &str, opts: Options) -> Result<KubeEnv, Error> {
        // Missing binaries are reported as such, not as a failed start.
        for component in components::needed(&opts) {
            bins::bin(component)?;
        }
        // Each kube-apiserver takes 7 inotify instances (sys.rs).
        crate::sys::raise_inotify_limits().map_err(Error::io("raising the inotify limits"))?;
        let workdir = Workdir::create(name)?;
        let logs = workdir.logs.clone();
        block_on(move || boot(workdir, opts)).map_err(|e| Error::Start {
            logs,
            source: Box::new(e),
        })
    }
}

async fn boot(workdir: Workdir, opts: Options) -> Result<KubeEnv, Error> {
    let extra_san = opts.real_nodes.map(|n| n.address);
    let pki = Pki::generate(&workdir.state.join("pki"), extra_san)?;
    let mut processes = Vec::new();

    let etcd_url = start_etcd(&workdir, &mut processes).await?;
    let (api_url, kubeconfig, client) = start_apiserver(
        &workdir,
        &pki,
        &etcd_url,
        opts.real_nodes.is_some(),
        &mut processes,
    )
    .await?;
    let kubeconfig_path = workdir.state.join("admin.kubeconfig");
    let rendered = serde_norway::to_string(&kubeconfig).map_err(|source| Error::Render {
        what: "the admin kubeconfig",
        source,
    })?;
    pki::write(&kubeconfig_path, &rendered)?;

    if opts.controller_manager {
        let cmd = components::controller_manager(
            &pki,
            &kubeconfig_path,
            &workdir.state.join("controller-manager"),
            // The node-operator's environments, without simulated nodes, see
            // Nodes fail.
            opts.node_monitor_grace
                .or((opts.kwok_nodes > 0).then_some(PATIENT_NODE_GRACE)),
            opts.controller_manager_qps,
            opts.real_nodes.map(|_| crate::meta_network::POD_CIDR),
        )?;
        let log = workdir.logs.join("kube-controller-manager.log");
        processes.push(Supervised::spawn("kube-controller-manager", cmd, &log)?);
    }
    if opts.scheduler {
        let cmd = components::scheduler(&kubeconfig_path)?;
        let log = workdir.logs.join("kube-scheduler.log");
        processes.push(Supervised::spawn("kube-scheduler", cmd, &log)?);
    }
    if opts.kwok_nodes > 0 {
        let cmd = components::kwok(&kubeconfig_path, &workdir.state.join("kwok"))?;
        let log = workdir.logs.join("kwok.log");
        processes.push(Supervised::spawn("kwok", cmd, &log)?);
    }

    let crds = async {
        if opts.install_crds {
            cluster::install_crds_within(&client, SETUP_READY).await?;
        }
        Ok(())
    };
    let nodes = async {
        if opts.kwok_nodes > 0 {
            cluster::create_fake_nodes(&client, opts.kwok_nodes, SETUP_READY).await?;
        }
        Ok(())
    };
    // The `default` service account is the first thing a working controller
    // manager produces; waiting for it catches a broken one at start rather than
    // as a puzzling timeout in some test.
    let controllers = async {
        if opts.controller_manager {
            cluster::wait_service_account(&client, "default", SETUP_READY).await?;
        }
        Ok(())
    };
    let setup = async { tokio::try_join!(crds, nodes, controllers).map(|_| ()) };
    tokio::select! {
        done = setup => done?,
        died = first_exit(&mut processes) => return Err(died),
    }
    for process in &mut processes {
        process.check_running()?;
    }

    Ok(KubeEnv {
        api_url,
        kubeconfig,
        kubeconfig_path,
        log_dir: workdir.logs.clone(),
        controller_manager: opts.controller_manager,
        processes,
        workdir,
    })
}

/// Starts etcd on fresh ports; returns its client URL.
async fn start_etcd(workdir: &Workdir, processes: &mut Vec<Supervised>) -> Result<String, Error> {
    let log = workdir.logs.join("etcd.log");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (client_port, peer_port) = (components::free_port()?, components::free_port()?);
        let data = workdir.state.join(format!("etcd-{attempt}"));
        let cmd = components::etcd(&data, client_port, peer_port)?;
        let mut etcd = Supervised::spawn("etcd", cmd, &log)?;
        match components::wait_etcd(&mut etcd, client_port, ETCD_READY).await {
            Ok(()) => {
                processes.push(etcd);
                return Ok(format!("http://127.0.0.1:{client_port}"));
            }
            Err(e) if attempt < PORT_ATTEMPTS && lost_port_race(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Starts kube-apiserver on a fresh port and waits for `/readyz`; returns its URL,
/// the admin kubeconfig and a client on the current runtime.
async fn start_apiserver(
    workdir: &Workdir,
    pki: &Pki,
    etcd_url: &str,
    real_nodes: bool,
    processes: &mut Vec<Supervised>,
) -> Result<(String, Kubeconfig, Client), Error> {
    let log = workdir.logs.join("kube-apiserver.log");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = components::free_port()?;
        let api_url = format!("https://127.0.0.1:{port}");
        let kubeconfig = pki.admin_kubeconfig(&api_url);
        let client = client_for(&kubeconfig).await?;
        let cmd = components::apiserver(
            pki,
            etcd_url,
            port,
            &workdir.state.join("apiserver"),
            real_nodes,
        )?;
        let mut apiserver = Supervised::spawn("kube-apiserver", cmd, &log)?;
        match components::wait_apiserver(&mut apiserver, &client, APISERVER_READY).await {
            Ok(()) => {
                processes.push(apiserver);
                return Ok((api_url, kubeconfig, client));
            }
            Err(e) if attempt < PORT_ATTEMPTS && lost_port_race(&e) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn lost_port_race(e: &Error) -> bool {
    matches!(e, Error::Exited { tail, .. } if tail.contains("address already in use"))
}

/// Resolves with an error as soon as any process has exited.
async fn first_exit(processes: &mut [Supervised]) -> Error {
    loop {
        for process in processes.iter_mut() {
            if let Err(e) = process.check_running() {
                return e;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn client_for(kubeconfig: &Kubeconfig) -> Result<Client, Error> {
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(Error::Kubeconfig)?;
    Client::try_from(config).map_err(Error::kube("building a client"))
}

/// Runs async start-up work to completion from sync code, including from inside
/// an async test: on a thread of its own with its own runtime, since a runtime
/// cannot be blocked on from within another.
fn block_on<T, F, Fut>(make: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce() -> Fut + Send,
    Fut: Future<Output = Result<T, Error>>,
{
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(Error::io("building a runtime for start-up"))?;
            runtime.block_on(make())
        });
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
