//! What the user sees: timed progress lines, the banner, and the signals
//! that stop the environment.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::FutureExt as _;
use tokio::signal::unix::{Signal, SignalKind, signal};

use kok_testenv::bins;
use kok_testenv::hosts::TestHosts;

use crate::examples::Worker;
use crate::kubeconfig::Reachable;

/// The workload image the banner's commands run (from the local registry).
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";

/// The banner's heading of the commands that make a cluster of one's own.
pub const SPARE_HEADING: &str = "A cluster of your own, with the spare host as its worker";

/// Timed lines of this program's own.
pub struct Progress {
    started: Instant,
}

impl Progress {
    pub fn new(started: Instant) -> Progress {
        Progress { started }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// `[ 12.3s] message`.
    pub fn say(&self, message: &str) {
        self.out(&format!(
            "[{:>6.1}s] {message}\n",
            self.elapsed().as_secs_f64()
        ));
    }

    /// Writes to stdout in one piece; a closed stdout is no reason to stop.
    pub fn out(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}

/// The name of the signal that asked to stop; an error, so that `?` ends
/// whatever was waiting.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Stop(pub &'static str);

/// SIGINT and SIGTERM, handled instead of ending the process, so whatever is
/// running gets stopped and cleaned up.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("handling SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("handling SIGTERM")?,
        })
    }

    /// Waits for the next signal.
    pub async fn next(&mut self) -> Stop {
        tokio::select! {
            _ = self.interrupt.recv() => Stop("SIGINT"),
            _ = self.terminate.recv() => Stop("SIGTERM"),
        }
    }

    /// A signal that arrived while the program was busy, if any.
    pub fn arrived(&mut self) -> Option<Stop> {
        self.next().now_or_never()
    }

    /// `work`, unless a signal comes first.
    pub async fn until<T>(&mut self, work: impl Future<Output = T>) -> Result<T, Stop> {
        tokio::select! {
            stop = self.next() => Err(stop),
            value = work => Ok(value),
        }
    }
}

/// Prints `line` when it differs from the last one printed through `last`:
/// progress on a long wait without repeating itself.
pub fn report_change(progress: &Progress, last: &mut String, line: String) {
    if *last != line {
        progress.say(&line);
        *last = line;
    }
}

/// The spare hosts and the file that makes them a cluster's workers.
pub struct Spare {
    pub path: PathBuf,
    /// Names of its Machines.
    pub machines: Vec<String>,
}

pub struct Banner<'a> {
    pub up_after: Duration,
    pub dir: &'a Path,
    pub meta_url: &'a str,
    pub meta_kubeconfig: &'a Path,
    pub clusters: &'a [Reachable],
    /// Every Ready worker.
    pub workers: &'a [Worker],
    pub spare: Option<&'a Spare>,
    pub hosts: &'a TestHosts,
    /// The OCI registry's URL, mirror of the upstream registries for the
    /// hosts.
    pub registry: String,
    pub operators: &'a Path,
    pub pod_logs: &'a Path,
    pub meta_logs: &'a Path,
    pub exit_after: u64,
}

/// What runs and what to try, printed once the workers are Ready.
pub fn banner(b: &Banner<'_>) -> String {
    let mut with_workers: Vec<&str> = b.workers.iter().map(|w| w.cluster.as_str()).collect();
    with_workers.dedup();
    let mut text = format!(
        "\nkube-on-kube dev environment is up: {} Ready worker{} in business cluster{} {}, \
         {:.1}s after the command started.\n\n",
        b.workers.len(),
        if b.workers.len() == 1 { "" } else { "s" },
        if with_workers.len() == 1 { "" } else { "s" },
        with_workers.join(" and "),
        b.up_after.as_secs_f64()
    );
    text += &format!(
        "  meta-cluster  {}\n    kubeconfig  {}\n    operators   helm release kube-on-kube in namespace kok-system\n\n",
        b.meta_url,
        b.meta_kubeconfig.display()
    );
    for c in b.clusters {
        text += &format!("  business cluster {}  {}\n", c.key, c.server);
        text += &format!("    kubeconfig  {}\n", c.path.display());
        match &c.through_load_balancer {
            Some(note) => text += &format!("    reached     {note}\n"),
            None => {
                text += "    reached     inside the meta-cluster only (spec.apiServer.external.type is ClusterIP)\n";
            }
        }
        for w in b.workers.iter().filter(|w| w.cluster == c.key) {
            text += &format!("    worker      {} Ready, kubelet {}\n", w.node, w.kubelet);
        }
        text += "\n";
    }
    for host in b.hosts.hosts() {
        text += &format!(
            "  test host {}  ssh -i {} -o UserKnownHostsFile={} root@{}\n",
            host.name(),
            b.hosts.client_key_path().display(),
            b.hosts.known_hosts_path().display(),
            host.ip()
        );
    }
    text += &format!(
        "  registry {} (the hosts' mirror of registry.k8s.io, docker.io, ghcr.io, quay.io)\n  \
         artifacts {}\n",
        b.registry,
        kok_testenv::node_software::artifacts_base_url(b.hosts)
    );
    let kubectl_dir = bins::bin_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let first = b
        .clusters
        .iter()
        .find(|c| b.workers.iter().any(|w| w.cluster == c.key));
    let meta = b.meta_kubeconfig.display();
    text += &format!(
        "\nTry:\n\
         \x20 export PATH={operators}:{kubectl_dir}:$PATH\n",
        operators = b.operators.display(),
    );
    if let Some(c) = first {
        let workers = c.path.display();
        let (namespace, name) = c.key.split_once('/').unwrap_or(("default", &c.key));
        text += &format!(
            "\x20 kubectl --kubeconfig {workers} get nodes -o wide\n\
             \x20 kubectl --kubeconfig {workers} run hello --image={AGNHOST} -- netexec\n\
             \x20 kubectl --kubeconfig {workers} get kok\n\
             \x20 kubectl --kubeconfig {meta} get clusters -A\n\
             \x20 kubectl kok --kubeconfig {meta} -n {namespace} cluster kubeconfig {name} > {name}.kubeconfig\n\
             \x20 kubectl --kubeconfig {name}.kubeconfig get nodes\n",
        );
    }
    if let Some(spare) = b.spare {
        let first = spare
            .machines
            .first()
            .map(String::as_str)
            .unwrap_or("spare-0");
        text += &format!(
            "\n{SPARE_HEADING} ({} spare host{}, Machine{} {}):\n\
             \x20 kubectl kok --kubeconfig {meta} cluster create demo --wait\n\
             \x20 kubectl kok --kubeconfig {meta} cluster kubeconfig demo > demo.kubeconfig\n\
             \x20 kubectl --kubeconfig demo.kubeconfig apply -f {kit}\n\
             \x20 kubectl --kubeconfig demo.kubeconfig wait --for=condition=Ready machine/{first} --timeout=10m\n\
             \x20 kubectl --kubeconfig demo.kubeconfig run hello --image={AGNHOST} -- netexec\n\
             \x20 kubectl --kubeconfig demo.kubeconfig wait --for=condition=Ready pod/hello --timeout=5m\n",
            spare.machines.len(),
            if spare.machines.len() == 1 { "" } else { "s" },
            if spare.machines.len() == 1 { "" } else { "s" },
            spare.machines.join(", "),
            kit = spare.path.display(),
        );
    }
    text += &format!(
        "\n\
         Files: kubeconfigs and helm's own in {files}\n\
         Logs:  Pods of the meta-cluster (operators, control planes) {pod_logs}\n\
         \x20      meta-cluster {meta_logs}; test hosts under {dir}\n\n\
         {stop}\n\n",
        files = b.dir.display(),
        pod_logs = b.pod_logs.display(),
        meta_logs = b.meta_logs.display(),
        dir = b
            .hosts
            .hosts()
            .first()
            .and_then(|h| h
                .log_path()
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf))
            .unwrap_or_default()
            .display(),
        stop = match b.exit_after {
            0 => "Ctrl-C stops everything (no data is kept).".to_owned(),
            secs =>
                format!("Stops by itself {secs}s after every example converged (--exit-after)."),
        },
    );
    text
}
