//! Everything the examples run on: the meta-cluster and its Pod runner, the
//! worker hosts, the registry and the artifact server, and the operators
//! installed with the Helm chart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};

use kok_testenv::bins;
use kok_testenv::hosts::TestHosts;
use kok_testenv::kube_env::{KubeEnv, Options as KubeOptions};
use kok_testenv::node_software::{self, PackageVersionsOptions};
use kok_testenv::pods::{Options as RunnerOptions, PodRunner};
use kok_testenv::registry::Registry;

use crate::progress::{Progress, Signals};

/// The label the Production example's placement selects.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubeonkube.io/control-plane";

/// The meta-cluster runs every Pod with the Pod runner: no kwok nodes. The
/// CRDs come with the Helm chart.
const META: KubeOptions = KubeOptions {
    controller_manager: true,
    scheduler: true,
    kwok_nodes: 0,
    install_crds: false,
    controller_manager_qps: None,
    node_monitor_grace: None,
    real_nodes: None,
};

/// Namespace and release name of the chart.
pub const RELEASE: &str = "kube-on-kube";
pub const RELEASE_NAMESPACE: &str = "kok-system";

/// The binaries the chart's images stand for.
pub struct Operators {
    programs: BTreeMap<String, PathBuf>,
}

impl Operators {
    pub fn find(dir: &Path) -> anyhow::Result<Operators> {
        let mut programs = BTreeMap::new();
        for name in ["kube-on-kube-operator", "node-operator"] {
            let path = dir.join(name);
            if !path.is_file() {
                bail!(
                    "{} does not exist; build the operators with `cargo build --bins` \
                     (scripts/dev-env.sh does) or point --operators-dir at them",
                    path.display()
                );
            }
            programs.insert(name.to_owned(), std::fs::canonicalize(&path)?);
        }
        for name in ["helm", "kubectl"] {
            bins::bin(name).map_err(|e| {
                anyhow::anyhow!(
                    "{e}; scripts/testenv-bins.sh builds it (scripts/dev-env.sh runs it)"
                )
            })?;
        }
        Ok(Operators { programs })
    }
}

/// Dropped field by field in this order: the Pods before the hosts they
/// manage, the meta-cluster last.
pub struct Site {
    pub runner: PodRunner,
    pub registry: Registry,
    pub hosts: TestHosts,
    /// The PackageVersions of the node software the artifact server
    /// serves, for these hosts (`scripts/node-packageversions.sh`).
    pub package_versions: String,
    pub env: KubeEnv,
}

impl Site {
    /// Starts everything, from this thread (see `main`). None when a signal
    /// came meanwhile; what was started is stopped again on return.
    pub fn start(
        progress: &Progress,
        signals: &mut Signals,
        operators: &Operators,
        hosts: usize,
    ) -> anyhow::Result<Option<Site>> {
        progress.say(
            "starting the meta-cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler",
        );
        let env = KubeEnv::start(META).context("starting the meta-cluster")?;
        if signals.arrived().is_some() {
            return Ok(None);
        }
        progress.say(&format!(
            "starting the Pod runner: nodes cp-0, cp-1, cp-2 labelled {CONTROL_PLANE_LABEL}, \
             with a load balancer for Services of type LoadBalancer"
        ));
        let runner = PodRunner::start(
            &env,
            RunnerOptions {
                nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
                labels: [(CONTROL_PLANE_LABEL.to_owned(), String::new())].into(),
                programs: operators.programs.clone(),
                load_balancer: true,
                ..Default::default()
            },
        )
        .context("starting the Pod runner")?;
        if signals.arrived().is_some() {
            return Ok(None);
        }
        progress.say(&format!(
            "starting {hosts} SSH test host{}, the artifact server and the registry",
            if hosts == 1 { "" } else { "s" }
        ));
        let hosts = TestHosts::start(hosts).context("starting the test hosts")?;
        let registry = Registry::start_with_node_images(hosts.gateway_ip())
            .context("starting the registry")?;
        node_software::serve_artifacts(&hosts).context("serving the node artifacts")?;
        let package_versions = node_software::package_versions(
            &node_software::artifacts_base_url(&hosts),
            &PackageVersionsOptions::for_test_hosts(&registry),
        )
        .context("generating the PackageVersions")?;
        if signals.arrived().is_some() {
            return Ok(None);
        }
        Ok(Some(Site {
            runner,
            registry,
            hosts,
            package_versions,
            env,
        }))
    }

    /// An admin client of the meta-cluster.
    pub async fn meta_client(&self) -> anyhow::Result<kube::Client> {
        let config = kube::Config::from_custom_kubeconfig(
            self.env.kubeconfig().clone(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .with_context(|| format!("loading the kubeconfig of {}", self.env.api_url()))?;
        kube::Client::try_from(config)
            .with_context(|| format!("building a client for {}", self.env.api_url()))
    }
}

/// Adds `address name` lines to every test host's `/etc/hosts`: what the
/// site's DNS would answer for the business clusters' endpoint names (the
/// Production example's `api.prod-east.example.com`), so that kubelets and
/// host-network Pods reach the API at the name its certificate holds.
pub fn publish_dns(
    progress: &Progress,
    hosts: &TestHosts,
    entries: &[(String, String)],
) -> anyhow::Result<()> {
    let mut lines = String::new();
    for (address, name) in entries {
        let address: std::net::IpAddr = address
            .parse()
            .with_context(|| format!("the load balancer's address {address:?} for {name}"))?;
        let valid_name = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !valid_name {
            bail!("the endpoint host {name:?} is not a DNS name");
        }
        lines += &format!("{address} {name}\n");
    }
    for host in hosts.hosts() {
        let out = host.ssh(&format!("printf '%s' '{lines}' >> /etc/hosts"));
        if !out.status.success() {
            bail!(
                "adding the endpoint names to /etc/hosts on {}: {}",
                host.name(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    for (address, name) in entries {
        progress.say(&format!(
            "the test hosts resolve {name} to {address} (/etc/hosts, as the site's DNS would)"
        ));
    }
    Ok(())
}

/// `helm upgrade --install` of the chart into the meta-cluster, waiting until
/// both operators' Deployments are available. helm keeps its cache and
/// configuration under `dir`, away from the user's.
pub async fn helm_install(
    progress: &Progress,
    dir: &Path,
    chart: &Path,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let helm = bins::bin("helm")?;
    let home = dir.join("helm");
    let args = [
        "upgrade",
        "--install",
        RELEASE,
        &chart.display().to_string(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout=5m",
    ]
    .map(str::to_owned);
    progress.say(&format!("helm {}", args.join(" ")));
    let out = tokio::process::Command::new(helm)
        .args(&args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running helm")?;
    if !out.status.success() {
        bail!(
            "helm install failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    progress.say("the operators are installed and available");
    Ok(())
}
