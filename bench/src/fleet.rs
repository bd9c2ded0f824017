//! Benchmark 2: fleet scale with simulated Pods. N Clusters are applied at
//! once to a fresh meta-cluster whose nodes are kwok's (Pods turn Running and
//! Ready without running anything); the operator runs as its own process and
//! the time until every Cluster has all its objects with its control-plane
//! Pods Ready is measured, with the operator's CPU seconds and memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kok_testenv::kube_env::{KubeEnv, Options};
use kok_testenv::operator_http::{logged_port, scrape, sum};
use kube::api::{Api, ListParams, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;

use crate::measure::median;

/// Flags of `kok-bench fleet`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Fleet sizes, one fresh meta-cluster each.
    #[arg(long, value_delimiter = ',', default_values_t = [10, 100, 300])]
    pub clusters: Vec<usize>,
    /// Runs of each size; the table reports medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Mode of every Cluster (Minimal: 4 Pods each; Production: 12).
    #[arg(long, default_value = "Minimal")]
    pub mode: String,
    /// kwok nodes of the meta-cluster.
    #[arg(long, default_value_t = 20)]
    pub nodes: usize,
    /// The meta-cluster's kube-controller-manager `--kube-api-qps` (its
    /// default is 20 a second per controller, with which its Deployment
    /// and ReplicaSet controllers, not the operator, set how fast a fleet
    /// of hundreds of Clusters comes up; a meta-cluster meant for such a
    /// fleet raises it). 0 keeps the default.
    #[arg(long, default_value_t = 200)]
    pub controller_manager_qps: u32,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// The operator's `--addon-retry`. The simulated business APIs never
    /// answer, so each Cluster's add-on step fails and is retried (1 s,
    /// doubling) for as long as the run lasts, and longer runs do more
    /// retries (each the add-on step alone, without a full reconcile). A
    /// wait longer than the run (`30m`) leaves only the work of converging
    /// the Clusters.
    #[arg(long)]
    pub addon_retry: Option<String>,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the curves of operator CPU, reconciles, API requests and memory
    /// per Cluster against the fleet size as `fleet-cpu.svg`,
    /// `fleet-reconciles.svg`, `fleet-requests.svg` and `fleet-memory.svg`
    /// into this directory.
    #[arg(long)]
    pub plots: Option<PathBuf>,
}

/// One run of one size.
#[derive(Clone, Copy, Debug)]
struct Sample {
    clusters: usize,
    seconds: f64,
    cpu_s: f64,
    idle_rss_mib: f64,
    peak_rss_mib: f64,
    /// Cluster reconciles the operator counted (`kok_reconciles_total`).
    reconciles: f64,
    /// Watch events of owned Pods and Deployments, and those of them that
    /// woke a reconcile (`kok_watch_events_total`).
    watch_events: f64,
    woke: f64,
    /// Reconciles that only retried the add-on step
    /// (`kok_addon_attempts_total{pass="alone"}`).
    alone: f64,
    /// Requests the operator sent to the API server, watches aside
    /// (`kok_api_requests_total`).
    requests: f64,
}

impl Sample {
    fn mib_per_cluster(&self) -> f64 {
        (self.peak_rss_mib - self.idle_rss_mib) / self.clusters as f64
    }
    fn cpu_ms_per_cluster(&self) -> f64 {
        self.cpu_s * 1000.0 / self.clusters as f64
    }
    fn reconciles_per_cluster(&self) -> f64 {
        self.reconciles / self.clusters as f64
    }
    fn wakeups_per_cluster(&self) -> f64 {
        self.woke / self.clusters as f64
    }
    fn alone_per_cluster(&self) -> f64 {
        self.alone / self.clusters as f64
    }
    fn requests_per_cluster(&self) -> f64 {
        self.requests / self.clusters as f64
    }
    fn cpu_ms_per_reconcile(&self) -> f64 {
        self.cpu_s * 1000.0 / self.reconciles.max(1.0)
    }
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let mode: ClusterMode = serde_json::from_value(serde_json::json!(args.mode))
        .with_context(|| format!("unknown mode {}", args.mode))?;
    let operator = sibling("kube-on-kube-operator")?;
    let mut samples = Vec::new();
    for &n in &args.clusters {
        for run in 0..args.runs {
            let sample = one_run(&args, &operator, n, mode).await?;
            eprintln!(
                "{n} clusters, run {}/{}: {:.1}s, operator cpu {:.1}s, {:.0} reconciles ({:.0} add-on retries alone), {:.0} API requests, {:.0} of {:.0} watch events woke one, rss idle {:.1} MiB peak {:.1} MiB",
                run + 1,
                args.runs,
                sample.seconds,
                sample.cpu_s,
                sample.reconciles,
                sample.alone,
                sample.requests,
                sample.woke,
                sample.watch_events,
                sample.idle_rss_mib,
                sample.peak_rss_mib
            );
            samples.push(sample);
        }
    }
    let table = table(&args, &samples);
    println!("{table}");
    if let Some(dir) = &args.plots {
        plots(&args, &samples, dir)?;
    }
    crate::append(args.out.as_deref(), &table)
}

/// The median of `f` over the runs of each fleet size.
fn medians(args: &Args, samples: &[Sample], f: fn(&Sample) -> f64) -> Vec<(f64, f64)> {
    args.clusters
        .iter()
        .map(|&n| {
            let values: Vec<f64> = samples.iter().filter(|s| s.clusters == n).map(f).collect();
            (n as f64, median(&values))
        })
        .collect()
}

fn plots(args: &Args, samples: &[Sample], dir: &std::path::Path) -> Result<()> {
    use crate::plot::{Chart, Series};
    std::fs::create_dir_all(dir)?;
    let charts = [
        (
            "fleet-cpu.svg",
            Chart {
                title: format!("Operator CPU per {} Cluster (median)", args.mode),
                x_label: "Clusters applied at once".into(),
                y_label: "CPU ms per Cluster".into(),
                series: vec![Series {
                    label: "kube-on-kube-operator".into(),
                    points: medians(args, samples, Sample::cpu_ms_per_cluster),
                }],
            },
        ),
        (
            "fleet-reconciles.svg",
            Chart {
                title: format!("Reconciles per {} Cluster (median)", args.mode),
                x_label: "Clusters applied at once".into(),
                y_label: "reconciles per Cluster until converged".into(),
                series: vec![
                    Series {
                        label: "reconciles".into(),
                        points: medians(args, samples, Sample::reconciles_per_cluster),
                    },
                    Series {
                        label: "of them add-on retries alone".into(),
                        points: medians(args, samples, Sample::alone_per_cluster),
                    },
                    Series {
                        label: "owned-object events that woke one".into(),
                        points: medians(args, samples, Sample::wakeups_per_cluster),
                    },
                ],
            },
        ),
        (
            "fleet-requests.svg",
            Chart {
                title: format!("Operator API requests per {} Cluster (median)", args.mode),
                x_label: "Clusters applied at once".into(),
                y_label: "requests per Cluster until converged (watches aside)".into(),
                series: vec![Series {
                    label: "kube-on-kube-operator".into(),
                    points: medians(args, samples, Sample::requests_per_cluster),
                }],
            },
        ),
        (
            "fleet-memory.svg",
            Chart {
                title: format!("Operator memory per {} Cluster (median)", args.mode),
                x_label: "Clusters applied at once".into(),
                y_label: "MiB per Cluster (peak - idle RSS)".into(),
                series: vec![Series {
                    label: "kube-on-kube-operator".into(),
                    points: medians(args, samples, Sample::mib_per_cluster),
                }],
            },
        ),
    ];
    for (file, chart) in charts {
        let path = dir.join(file);
        std::fs::write(&path, chart.svg()).with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

async fn one_run(args: &Args, operator: &PathBuf, n: usize, mode: ClusterMode) -> Result<Sample> {
    let env = KubeEnv::start(Options {
        controller_manager: true,
        scheduler: true,
        kwok_nodes: args.nodes,
        install_crds: true,
        controller_manager_qps: (args.controller_manager_qps > 0)
            .then_some(args.controller_manager_qps),
        node_monitor_grace: None,
        real_nodes: None,
    })
    .context("start the meta-cluster")?;
    let client = env.client().await;
    let ns = env.namespace("fleet").await;
    let log_path = env.log_dir().join("kube-on-kube-operator.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(operator)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg("--namespace")
        .arg(&ns)
        // Its metrics count the reconciles; the port it binds is in its log.
        .arg("--http-address=127.0.0.1:0")
        .args(
            args.addon_retry
                .iter()
                .map(|w| format!("--addon-retry={w}")),
        )
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .with_context(|| format!("start {}", operator.display()))?;
    let pid = child.id();
    let result = async {
        // Connected and idle: the baseline every Cluster adds to.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = proc_status_kib(pid, "VmRSS:")? as f64 / 1024.0;
        let port = logged_port(&log_path)
            .with_context(|| format!("no HTTP address in {}", log_path.display()))?;
        let counts = || -> Result<(f64, f64, f64, f64, f64)> {
            let metrics = scrape(port).context("scrape the operator's /metrics")?;
            let events = "kok_watch_events_total{";
            let woke = metrics
                .iter()
                .filter(|(k, _)| k.starts_with(events) && k.contains("woke=\"true\""))
                .map(|(_, v)| v)
                .sum();
            Ok((
                sum(&metrics, "kok_reconciles_total{controller=\"cluster\""),
                sum(&metrics, events),
                woke,
                sum(&metrics, "kok_addon_attempts_total{pass=\"alone\""),
                api_requests(&metrics),
            ))
        };
        let before = counts()?;
        let cpu_before = cpu_seconds(pid)?;
        let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
        let started = Instant::now();
        let creates = (0..n).map(|i| {
            let api = api.clone();
            let cluster = cluster(&ns, &format!("c{i:03}"), mode);
            async move { api.create(&PostParams::default(), &cluster).await }
        });
        for result in futures::future::join_all(creates).await {
            result.context("create a Cluster")?;
        }
        let deadline = started + Duration::from_secs(args.timeout);
        loop {
            let clusters = api.list(&ListParams::default()).await?.items;
            let done = clusters.iter().filter(|c| converged(c)).count();
            if done == n {
                break;
            }
            if Instant::now() > deadline {
                bail!("{done}/{n} Clusters converged after {}s", args.timeout);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = counts()?;
        Ok(Sample {
            clusters: n,
            seconds,
            cpu_s: cpu_seconds(pid)? - cpu_before,
            idle_rss_mib: idle,
            peak_rss_mib: proc_status_kib(pid, "VmHWM:")? as f64 / 1024.0,
            reconciles: after.0 - before.0,
            watch_events: after.1 - before.1,
            woke: after.2 - before.2,
            alone: after.3 - before.3,
            requests: after.4 - before.4,
        })
    }
    .await;
    stop(&mut child);
    result
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Every component condition True: all the Cluster's objects exist and its
/// control-plane Pods are Ready. (Add-ons need a business API that answers,
/// which simulated Pods do not have.)
fn converged(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .is_some_and(kube_on_kube_api::ClusterStatus::control_plane_ready)
}

fn cluster(ns: &str, name: &str, mode: ClusterMode) -> Cluster {
    let mut c: Cluster =
        serde_norway::from_str(include_str!("../../examples/cluster-minimal.yaml"))
            .expect("the minimal example parses");
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.spec.mode = mode;
    c.spec.placement = None;
    c.spec.etcd.storage =
        serde_json::from_value(serde_json::json!({"volumeSource": {"emptyDir": {}}}))
            .expect("storage");
    c
}

/// Requests an operator sent to its API server, watches aside, from its
/// scraped metrics (`kok_api_requests_total`).
pub(crate) fn api_requests(metrics: &std::collections::BTreeMap<String, f64>) -> f64 {
    sum(metrics, "kok_api_requests_total{")
        - sum(metrics, "kok_api_requests_total{method=\"WATCH\"")
}

/// A binary built next to this one (`cargo build --release` puts them side by side).
pub fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .map(|d| d.join(name))
        .context("no directory of the running binary")?;
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p {name}`",
            path.display()
        );
    }
    Ok(path)
}

pub(crate) fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("the operator (pid {pid}) is gone"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// User + system CPU seconds of a process, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Result<f64> {
    process_cpu_seconds(pid, false)
}

/// User + system CPU seconds of a process, from `/proc/<pid>/stat`; with
/// `children`, also those of the children it has waited for (the ssh
/// clients a node-operator runs).
pub(crate) fn process_cpu_seconds(pid: u32, children: bool) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> f64 { fields.get(i).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the
    // name; cutime and cstime 16 and 17.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let waited = if children { ticks(13) + ticks(14) } else { 0.0 };
    Ok((ticks(11) + ticks(12) + waited) / hz)
}

fn table(args: &Args, samples: &[Sample]) -> String {
    let mut out = format!(
        "\n### Fleet scale (kwok): {} Clusters applied at once, median of {} runs, kube-controller-manager `--kube-api-qps={}`{}\n\n| Clusters | time to all converged s | operator CPU s | CPU ms per Cluster | API requests per Cluster | reconciles per Cluster | of them add-on retries alone | owned-object events that woke it, per Cluster | CPU ms per reconcile | peak RSS MiB | MiB per Cluster |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        args.mode,
        args.runs,
        if args.controller_manager_qps > 0 {
            args.controller_manager_qps.to_string()
        } else {
            "20 (default)".to_string()
        },
        args.addon_retry
            .as_deref()
            .map(|w| format!(", operator `--addon-retry={w}`"))
            .unwrap_or_default()
    );
    for (i, &n) in args.clusters.iter().enumerate() {
        let of = |f: fn(&Sample) -> f64| medians(args, samples, f)[i].1;
        out.push_str(&format!(
            "| {n} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
            of(|s| s.seconds),
            of(|s| s.cpu_s),
            of(Sample::cpu_ms_per_cluster),
            of(Sample::requests_per_cluster),
            of(Sample::reconciles_per_cluster),
            of(Sample::alone_per_cluster),
            of(Sample::wakeups_per_cluster),
            of(Sample::cpu_ms_per_reconcile),
            of(|s| s.peak_rss_mib),
            of(Sample::mib_per_cluster),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_of_this_process_is_read() {
        let pid = std::process::id();
        let before = cpu_seconds(pid).unwrap();
        let mut x = 0u64;
        for i in 0..100_000_000u64 {
            x = x.wrapping_add(i ^ (i >> 3));
        }
        std::hint::black_box(x);
        assert!(cpu_seconds(pid).unwrap() > before);
        assert!(proc_status_kib(pid, "VmHWM:").unwrap() > 0);
    }
}
