//! Benchmark 7: a cluster with worker nodes, side by side with kubeadm. From
//! nothing to the first workload running on real workers (containerd, runc,
//! CNI plugins and kubelet on SSH test hosts), the way each tool's users get
//! there:
//! - kube-on-kube: a Cluster applied to the meta-cluster; once it is Ready,
//!   N Machines applied to it (the node-operator installs every package and
//!   joins them). Both waits are on the clock; starting the hosts is not.
//! - kubeadm (`cluster/kubeadm.rs`): `kubeadm init` on one more host of the
//!   same kind, then `kubeadm join` on N, the pod network and the workload
//!   applied as soon as `init` returns. Its hosts are prepared off the clock
//!   with the node software installed and kubeadm's images pulled, as from
//!   a golden image: the strongest case for kubeadm (`--kubeadm-hosts`
//!   starts them without the images, or bare).
//!
//! Both end in the same state: N Ready worker Nodes running kube-proxy,
//! kube-router and the workload (agnhost on the Pod network, Ready on every
//! worker), CoreDNS running, from the same images in the same registry.

mod kubeadm;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::measure::median;
use crate::peer::Tool;
use crate::workers::site::Site;
use crate::workers::timeline::Timeline;
use crate::workers::{self, check_inotify};

/// Flags of `kok-bench cluster`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Runs of each tool, taking turns going first; the table reports
    /// medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Worker nodes of each cluster.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// The tools to run: `kube-on-kube`, `kubeadm`.
    #[arg(long, value_delimiter = ',', default_values_t = ["kube-on-kube".to_string(), "kubeadm".to_string()])]
    pub tools: Vec<String>,
    /// How kubeadm's hosts start: `golden` (node software installed and
    /// kubeadm's images pulled off the clock, the strongest case for
    /// kubeadm), `golden-without-images` (images pulled on the clock) or
    /// `bare` (node software installed on the clock too, as kube-on-kube's
    /// Machines start).
    #[arg(long, value_enum, default_value_t = kubeadm::HostStart::Golden)]
    pub kubeadm_hosts: kubeadm::HostStart,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// The kube-on-kube-operator's log filter; logs are kept under
    /// `target/testenv-logs/`.
    #[arg(long, default_value = "info")]
    pub operator_log_level: String,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    KubeOnKube,
    Kubeadm,
}

impl Which {
    fn parse(name: &str) -> Result<Which> {
        match name {
            "kube-on-kube" => Ok(Which::KubeOnKube),
            "kubeadm" => Ok(Which::Kubeadm),
            other => bail!("unknown tool {other:?} (kube-on-kube, kubeadm)"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Which::KubeOnKube => "kube-on-kube",
            Which::Kubeadm => "kubeadm",
        }
    }
}

/// One run, in seconds from the tool's first step.
#[derive(Clone, Debug)]
struct Sample {
    which: Which,
    /// The control plane answering with its add-ons applied: the Cluster
    /// Ready, or `kubeadm init` returned.
    control_plane_s: f64,
    /// Every worker Node Ready.
    nodes_ready_s: f64,
    /// The first Pod Running on a worker.
    first_pod_s: f64,
    /// The workload's Pod Ready on every worker.
    workload_s: f64,
    /// kube-proxy and kube-router Ready on every worker, CoreDNS available.
    addons_s: f64,
    /// CPU of everything on the test hosts (kube-on-kube's control plane
    /// runs in the meta-cluster, not on them).
    hosts_cpu_s: f64,
    /// kubeadm's hosts: preparing them, off the clock.
    prepare_s: Option<f64>,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let tools: Vec<Which> = args
        .tools
        .iter()
        .map(|t| Which::parse(t))
        .collect::<Result<_>>()?;
    if tools.is_empty() || args.workers == 0 {
        bail!("nothing to run: give --tools and at least one worker");
    }
    check_inotify(args.workers + 1)?;
    let timeout = Duration::from_secs(args.timeout);
    // The site serves both: the artifacts and the registry for every host,
    // and the meta-cluster for kube-on-kube. Its first Cluster is the first
    // run's.
    let mut site = Site::start(&args.operator_log_level, timeout).await?;
    let mut have_cluster = true;
    let mut samples = Vec::new();
    for run in 0..args.runs {
        let mut order = tools.clone();
        order.rotate_left(run % tools.len());
        for which in order {
            let sample = match which {
                Which::KubeOnKube => {
                    if !have_cluster {
                        site.create_cluster(&format!("ci-{run}"), timeout).await?;
                    }
                    let s = kube_on_kube(&site, args.workers, timeout).await;
                    // The next tool runs without an idle Cluster beside it.
                    site.delete_cluster(timeout).await?;
                    have_cluster = false;
                    s
                }
                Which::Kubeadm => {
                    if have_cluster {
                        site.delete_cluster(timeout).await?;
                        have_cluster = false;
                    }
                    kubeadm_run(&site, args.workers, args.kubeadm_hosts, timeout).await
                }
            }
            .with_context(|| format!("{}, run {}", which.label(), run + 1))?;
            eprintln!(
                "run {}/{} {:<13} control plane {:>5.1}s, Nodes Ready {:>5.1}s, first Pod {:>5.1}s, workload Ready {:>5.1}s",
                run + 1,
                args.runs,
                which.label(),
                sample.control_plane_s,
                sample.nodes_ready_s,
                sample.first_pod_s,
                sample.workload_s
            );
            samples.push(sample);
        }
    }
    let table = table(&args, &tools, &samples);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

/// The Cluster is Ready (its time measured when it was created); N Machines
/// applied to it at once, until their workloads are Ready.
async fn kube_on_kube(site: &Site, workers: usize, timeout: Duration) -> Result<Sample> {
    let timeline = Timeline::start(&site.business);
    let run = workers::one_run(site, &timeline, Tool::NodeOperator, workers, timeout, None).await?;
    let cp = site.cluster_ready_s;
    let max = |f: fn(&workers::Worker) -> f64| run.workers.iter().map(f).fold(0.0, f64::max);
    let min =
        |f: fn(&workers::Worker) -> f64| run.workers.iter().map(f).fold(f64::INFINITY, f64::min);
    Ok(Sample {
        which: Which::KubeOnKube,
        control_plane_s: cp,
        nodes_ready_s: cp + max(|w| w.ready_s),
        first_pod_s: cp + min(|w| w.first_pod_s),
        workload_s: cp + max(|w| w.workload_s),
        addons_s: cp + run.addons_s,
        hosts_cpu_s: run.hosts_cpu_s,
        prepare_s: None,
    })
}

async fn kubeadm_run(
    site: &Site,
    workers: usize,
    start: kubeadm::HostStart,
    timeout: Duration,
) -> Result<Sample> {
    let run = kubeadm::one_run(site, workers, start, timeout).await?;
    let max = |f: fn(&(f64, f64, f64)) -> f64| run.workers.iter().map(f).fold(0.0, f64::max);
    Ok(Sample {
        which: Which::Kubeadm,
        control_plane_s: run.init_s,
        nodes_ready_s: max(|w| w.0),
        first_pod_s: run
            .workers
            .iter()
            .map(|w| w.1)
            .fold(f64::INFINITY, f64::min),
        workload_s: run.all_s.max(max(|w| w.2)),
        addons_s: run.addons_s,
        hosts_cpu_s: run.hosts_cpu_s,
        prepare_s: Some(run.prepare_s),
    })
}

fn table(args: &Args, tools: &[Which], samples: &[Sample]) -> String {
    let pick = |which: Which, f: fn(&Sample) -> f64| {
        median(
            &samples
                .iter()
                .filter(|s| s.which == which)
                .map(f)
                .collect::<Vec<_>>(),
        )
    };
    let mut out = format!(
        "\n### A cluster with {} worker nodes: kube-on-kube against kubeadm on {} hosts, median of {} runs\n\n\
         | tool | control plane ready s | every worker Node Ready s | first Pod Running on a worker s | workload Ready on every worker s | add-ons Ready (kube-proxy, kube-router, CoreDNS) s | hosts' CPU s |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        args.workers,
        match args.kubeadm_hosts {
            kubeadm::HostStart::Golden => "golden",
            kubeadm::HostStart::GoldenWithoutImages => "golden-without-images",
            kubeadm::HostStart::Bare => "bare",
        },
        args.runs
    );
    for &which in tools {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            which.label(),
            pick(which, |s| s.control_plane_s),
            pick(which, |s| s.nodes_ready_s),
            pick(which, |s| s.first_pod_s),
            pick(which, |s| s.workload_s),
            pick(which, |s| s.addons_s),
            pick(which, |s| s.hosts_cpu_s),
        ));
    }
    if tools.len() == 2 {
        let ratio = |f: fn(&Sample) -> f64| pick(Which::Kubeadm, f) / pick(Which::KubeOnKube, f);
        out.push_str(&format!(
            "| kubeadm / kube-on-kube | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {:.2}× | |\n",
            ratio(|s| s.control_plane_s),
            ratio(|s| s.nodes_ready_s),
            ratio(|s| s.first_pod_s),
            ratio(|s| s.workload_s),
            ratio(|s| s.addons_s),
        ));
    }
    let runs = |which: Which, f: fn(&Sample) -> f64| {
        samples
            .iter()
            .filter(|s| s.which == which)
            .map(|s| format!("{:.1}", f(s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for &which in tools {
        out.push_str(&format!(
            "\n{}: workload Ready in {} s per run.",
            which.label(),
            runs(which, |s| s.workload_s)
        ));
    }
    if tools.contains(&Which::Kubeadm) {
        out.push_str(&format!(
            "\nkubeadm's hosts: {}; preparing them took {} s per run. kube-on-kube's Machines start bare: its times include installing the node software and pulling every image.",
            args.kubeadm_hosts.describe(),
            runs(Which::Kubeadm, |s| s.prepare_s.unwrap_or(f64::NAN))
        ));
    }
    out.push('\n');
    out
}
