//! A kubelet for tests: registers Nodes in a test cluster and runs the Pods
//! bound to them as real processes, each Pod in its own network namespace with
//! its own address and its volumes mounted at their `mountPath`s, so a control
//! plane rendered as Pods can be shown to actually work (certificates chain,
//! etcd peers find each other, the apiserver reaches etcd).
//!
//! Container images stand for the locally built programs of the same name
//! (`kube-apiserver`, `etcd`, the project's own operators…). Services resolve
//! through a generated `/etc/hosts`; the meta-cluster API is reachable from Pods
//! as `kubernetes.default.svc` through a proxy on the Pods' gateway. With
//! [`Options::load_balancer`], Services of type LoadBalancer get an address
//! of the machine's (see [`crate::load_balancer`]).

pub mod exec;
pub mod expand;
pub mod hosts_file;
pub mod images;
pub mod net;
pub mod node;
pub mod probe;
mod runner;
pub mod storage;
pub mod volumes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector;
use tokio::sync::Notify;

use crate::background::Background;
use crate::kube_env::KubeEnv;
use crate::load_balancer::LoadBalancer;
use images::ImageMap;
use net::PodNetwork;

/// Label every runner Node carries, for node selectors.
pub const RUNNER_LABEL: &str = "kubeonkube.io/test-runner";

/// Errors starting the runner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot set up the Pod network: {0}")]
    Network(#[from] net::NetError),
    #[error(
        "cannot find {0}; build it with `cargo build -p kok-testenv --bin kok-pod-exec` or set KOK_POD_EXEC"
    )]
    ExecProgram(PathBuf),
    #[error("cannot find the upstream binaries: {0}")]
    Bins(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the API server: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot start the load balancer: {0}")]
    LoadBalancer(#[from] crate::load_balancer::Error),
}

/// How the runner presents itself.
#[derive(Debug, Clone)]
pub struct Options {
    /// Node names; every Pod bound to one of them runs here.
    pub nodes: Vec<String>,
    /// Labels of every Node (besides `kubernetes.io/hostname` and
    /// [`RUNNER_LABEL`]).
    pub labels: BTreeMap<String, String>,
    /// DNS domain of the cluster the Pods run in.
    pub cluster_domain: String,
    /// Extra image name → program mappings (added to the upstream binaries).
    /// A name with a tag (`etcd:3.6.15-0`) maps only that tag, so two
    /// releases of one component can run side by side.
    pub programs: BTreeMap<String, PathBuf>,
    /// Also start a [`LoadBalancer`] for the cluster's Services of type
    /// LoadBalancer, as a bare-metal meta-cluster has (MetalLB and
    /// kube-proxy); it stops with the runner.
    pub load_balancer: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: vec!["runner-0".into()],
            labels: BTreeMap::new(),
            cluster_domain: "cluster.local".into(),
            programs: BTreeMap::new(),
            load_balancer: false,
        }
    }
}

/// A running Pod runner. Dropping it stops every Pod's processes and removes
/// the Pod network.
pub struct PodRunner {
    /// Stopped (every Pod with it) before the load balancer goes.
    _background: Background,
    log_dir: PathBuf,
    gateway: std::net::Ipv4Addr,
    nodes: Vec<String>,
    load_balancer: Option<LoadBalancer>,
}

/// Where `kok-pod-exec` is: `KOK_POD_EXEC`, else beside the running binary's
/// profile directory (`target/debug/kok-pod-exec` for `target/debug/deps/x`).
fn find_exec_program() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("KOK_POD_EXEC") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        what: "current executable".into(),
        source,
    })?;
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("kok-pod-exec"))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| Error::ExecProgram(candidates.last().cloned().unwrap_or_default()))
}

impl PodRunner {
    /// Start a runner for `env`'s cluster. Blocks until its Nodes are
    /// registered.
    pub fn start(env: &KubeEnv, options: Options) -> Result<PodRunner, Error> {
        net::sweep_stale();
        runner::sweep_stale_cgroups();
        runner::install_exit_hook();
        let load_balancer = if options.load_balancer {
            Some(LoadBalancer::start(env)?)
        } else {
            None
        };
        let exec_program = find_exec_program()?;
        let _ = exec::EXEC_PROGRAM.set(exec_program.clone());
        let mut images = ImageMap::default();
        for name in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "etcd",
            "etcdctl",
            "kubectl",
            "kwok",
            "proxy-server",
        ] {
            images.insert(
                name,
                crate::bins::bin(name).map_err(|e| Error::Bins(e.to_string()))?,
            );
        }
        for (name, program) in &options.programs {
            images.insert(name, program.clone());
        }
        let run_id = net::run_id();
        // One /24 per runner, claimed under a lock shared by every test
        // process, so runners side by side never share one.
        let base = net::claim_subnet().map_err(|source| Error::Io {
            what: "claiming a Pod subnet under /run/kok-testenv".into(),
            source,
        })?;
        let net = PodNetwork::create(&run_id, base)?;
        let gateway = net.gateway();
        let state = env.log_dir().join(format!("pods-state-{run_id}"));
        let log_dir = env.log_dir().join("pods");
        std::fs::create_dir_all(&state).map_err(|source| Error::Io {
            what: format!("creating {}", state.display()),
            source,
        })?;
        let mut labels = options.labels.clone();
        labels.insert(RUNNER_LABEL.into(), "true".into());
        let kubeconfig = env.kubeconfig().clone();
        let api_url = env.api_url().to_string();
        let nodes = options.nodes.clone();
        let domain = options.cluster_domain.clone();
        let log_dir_thread = log_dir.clone();
        let background = Background::start(
            "kok-pod-runner",
            2,
            |what, source| Error::Io { what, source },
            move |ready, stop| async move {
                let client = match client_for(&kubeconfig).await {
                    Ok(c) => c,
                    Err(e) => return ready.send(Err(e.into())),
                };
                let proxy = match api_proxy(gateway, &api_url).await {
                    Ok(p) => p,
                    Err(e) => return ready.send(Err(e)),
                };
                let (store, writer) = reflector::store();
                let shared = Arc::new(runner::Shared {
                    client,
                    nodes,
                    node_labels: labels,
                    domain,
                    state: state.clone(),
                    logs: log_dir_thread,
                    images,
                    exec_program,
                    net,
                    slices: store,
                    hosts_files: Mutex::new(Default::default()),
                    slices_changed: Notify::new(),
                });
                ready.send(Ok(()));
                runner::run(shared, stop, writer).await;
                proxy.abort();
                let _ = std::fs::remove_dir_all(&state);
            },
        )?;
        Ok(PodRunner {
            _background: background,
            log_dir,
            gateway,
            nodes: options.nodes,
            load_balancer,
        })
    }

    /// Names of the runner's Nodes.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The Pods' gateway: the machine's address on the Pod network.
    pub fn gateway(&self) -> std::net::Ipv4Addr {
        self.gateway
    }

    /// Log file of one container (all its restarts appended).
    pub fn container_log(&self, namespace: &str, pod: &str, uid: &str, container: &str) -> PathBuf {
        self.log_dir
            .join(format!("{namespace}_{pod}_{}", &uid[..8.min(uid.len())]))
            .join(format!("{container}.log"))
    }

    /// The load balancer started with [`Options::load_balancer`].
    pub fn load_balancer(&self) -> Option<&LoadBalancer> {
        self.load_balancer.as_ref()
    }

    /// Directory of every container log.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

/// A client of the test cluster, for the runner's own runtime.
pub(crate) async fn client_for(
    kubeconfig: &kube::config::Kubeconfig,
) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &Default::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}

/// Forward `gateway:443` to the API server, so Pods reach it as
/// `kubernetes.default.svc` (the server's certificate carries that name).
async fn api_proxy(
    gateway: std::net::Ipv4Addr,
    api_url: &str,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let target = api_url
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    let listener = tokio::net::TcpListener::bind((gateway, 443))
        .await
        .map_err(|source| Error::Io {
            what: format!("listening on {gateway}:443"),
            source,
        })?;
    Ok(tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    }))
}
