//! Benchmark 6: real worker nodes, from applied to running Pods. N fresh SSH
//! test hosts at once, each running the real containerd, runc, CNI plugins
//! and kubelet once joined, to one business cluster (its control plane real
//! processes under the Pod runner). node-operator joins them from Machines;
//! the peer, an Ansible playbook (`bench/ansible/workers.yml`), joins the
//! same kind of hosts from the same artifacts and the same rendered
//! configuration with a bootstrap token, as kubespray and `kubeadm join` do.
//! Per worker, from the moment the Machines are applied (the playbook
//! started): its Node Ready, the first Pod bound to it Running (one of the
//! add-ons' DaemonSets), and the workload's Pod on it (agnhost on the Pod
//! network) Ready; and the bytes each host moved: artifacts (the artifact
//! server's log), images (the registry's access log), everything it
//! received (its `eth0`).

mod peer;
pub(crate) mod site;
pub(crate) mod timeline;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Node, Secret};
use kok_testenv::hosts::TestHosts;
use kok_testenv::node_software;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::Machine;

use crate::fleet::process_cpu_seconds;
use crate::measure::{Meter, median};
use crate::peer::{Ansible, AnsibleArgs, Tool, playbook};
use site::Site;
use timeline::Timeline;

/// Flags of `kok-bench workers`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hosts joined at once; several sizes run one after the other on the
    /// same site.
    #[arg(long, value_delimiter = ',', default_values_t = [2])]
    pub hosts: Vec<usize>,
    /// Runs of each tool per size, taking turns going first; the tables
    /// report medians over every worker of every run.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// The tools to run (`node-operator`, `ansible`, `mitogen`), each as
    /// its best users run it (see `bench/src/peer.rs`).
    #[arg(long, value_delimiter = ',', default_values_t = ["node-operator".to_string(), "ansible".to_string(), "mitogen".to_string()])]
    pub tools: Vec<String>,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Where Ansible is, and its strategy.
    #[command(flatten)]
    pub ansible: AnsibleArgs,
    /// The kube-on-kube-operator's log filter; the node-operator logs at
    /// `info`. Their logs are kept under `target/testenv-logs/`.
    #[arg(long, default_value = "info")]
    pub operator_log_level: String,
    /// Append the results tables to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One worker of one run, in seconds from the start and bytes.
#[derive(Clone, Debug)]
pub(crate) struct Worker {
    pub(crate) ready_s: f64,
    pub(crate) first_pod_s: f64,
    first_pod: String,
    pub(crate) workload_s: f64,
    artifact_bytes: u64,
    image_bytes: u64,
    received_bytes: u64,
}

/// One run of one tool.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    tool: Tool,
    hosts: usize,
    /// Until every worker's workload Pod was Ready.
    all_s: f64,
    /// CPU of the tool until then: node-operator's process and its ssh
    /// clients, or `ansible-playbook` and its workers (NaN when unknown).
    pub(crate) tool_cpu_s: f64,
    /// CPU of everything on the hosts until then.
    pub(crate) hosts_cpu_s: f64,
    /// CPU of the whole machine, whoever used it.
    machine_cpu_s: f64,
    /// When `ansible-playbook` exited.
    play_s: Option<f64>,
    /// When the add-ons were Ready on every worker and CoreDNS available
    /// (after the workloads; off the clock of `all_s`).
    pub(crate) addons_s: f64,
    pub(crate) workers: Vec<Worker>,
}

/// Runs the benchmark and prints (and optionally appends) the tables.
pub async fn run(args: Args) -> Result<()> {
    let tools = Tool::parse_all(&args.tools)?;
    let ansible = if tools.iter().any(|t| *t != Tool::NodeOperator) {
        Some(Ansible::find(&args.ansible)?)
    } else {
        None
    };
    check_inotify(args.hosts.iter().copied().max().unwrap_or(0))?;
    let timeout = Duration::from_secs(args.timeout);
    let site = Site::start(&args.operator_log_level, timeout).await?;
    let timeline = Timeline::start(&site.business);
    let mut runs = Vec::new();
    for &n in &args.hosts {
        for run in 0..args.runs {
            for tool in Tool::rotation(&tools, run) {
                let r = one_run(&site, &timeline, tool, n, timeout, ansible.as_ref())
                    .await
                    .with_context(|| format!("{} on {n} hosts, run {}", tool.label(), run + 1))?;
                eprintln!(
                    "{n} hosts, run {}/{} {:<16} all workload Pods Ready {:>6.1}s (Node Ready median {:.1}s, max {:.1}s){}",
                    run + 1,
                    args.runs,
                    tool.label(),
                    r.all_s,
                    median(&r.workers.iter().map(|w| w.ready_s).collect::<Vec<_>>()),
                    r.workers.iter().map(|w| w.ready_s).fold(0.0, f64::max),
                    r.play_s
                        .map(|p| format!(", play ended {p:.1}s"))
                        .unwrap_or_default()
                );
                runs.push(r);
            }
        }
    }
    let mut tables = String::new();
    for &n in &args.hosts {
        let of_size: Vec<Run> = runs.iter().filter(|r| r.hosts == n).cloned().collect();
        tables.push_str(&table(&args, n, &tools, &of_size, site.cluster_ready_s));
    }
    println!("{tables}");
    crate::append(args.out.as_deref(), &tables)
}

/// inotify instances one joined host takes: its kubelet about 6, containerd
/// 2, kube-proxy 1, with room to spare.
const INOTIFY_PER_HOST: u64 = 12;

/// The test hosts share the machine's kernel, and with it the per-user limit
/// of inotify instances (128 by default), which every real host has for
/// itself. Past it kube-proxy exits with "too many open files" and kubelets
/// fail, so a run that would pass it is refused before it starts.
pub(crate) fn check_inotify(hosts: usize) -> Result<()> {
    let path = "/proc/sys/fs/inotify/max_user_instances";
    let limit: u64 = std::fs::read_to_string(path)?.trim().parse()?;
    let need = INOTIFY_PER_HOST * hosts as u64 + 64;
    if limit < need {
        bail!(
            "{path} is {limit}; {hosts} hosts' kubelets, containerds and kube-proxies share it \
             (on separate machines each has its own) and need about {need}: raise it first, \
             e.g. `sysctl -w fs.inotify.max_user_instances={}`",
            need.next_power_of_two()
        );
    }
    Ok(())
}

pub(crate) async fn one_run(
    site: &Site,
    timeline: &Timeline,
    tool: Tool,
    n: usize,
    timeout: Duration,
    ansible: Option<&Ansible>,
) -> Result<Run> {
    let hosts = tokio::task::block_in_place(|| TestHosts::start(n)).context("start the hosts")?;
    let machines = hosts
        .hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| node_software::example_machine(h, &format!("zone-{}", i % 2)))
        .collect::<Result<Vec<_>, _>>()?;
    site.ssh_key(&hosts).await?;
    let artifacts_mark = site.depot.artifact_log().len();
    let images_mark = site.registry.served()?.len();
    let received_before: Vec<u64> = hosts.hosts().iter().map(received).collect();

    let node_operator_before = node_operator_cpu();
    let mut controller_cpu_s = None;
    let meter = Meter::start();
    let started = Instant::now();
    let mut play_s = None;
    let mut token = None;
    let result = async {
        match tool {
            Tool::NodeOperator => {
                let api: Api<Machine> = Api::all(site.business.clone());
                for machine in &machines {
                    api.create(&PostParams::default(), machine).await?;
                }
            }
            peer => {
                let (vars, secret) = peer::prepare(
                    &site.business,
                    &site.packages,
                    &machines,
                    &site.cluster_values,
                )
                .await?;
                token = Some(secret);
                let ansible = ansible.context("no ansible-playbook")?;
                let play = tokio::task::block_in_place(|| {
                    playbook(&hosts, "workers.yml", &vars, n, peer, ansible)
                })?;
                play_s = Some(started.elapsed().as_secs_f64());
                controller_cpu_s = Some(play.controller_cpu_s);
                play.succeeded()?;
            }
        }
        let nodes: Vec<&str> = hosts.hosts().iter().map(|h| h.name()).collect();
        wait_workloads(timeline, &nodes, started, timeout).await
    }
    .await;
    let cost = meter.stop();
    let addons_s = match &result {
        Ok(()) => {
            let nodes: Vec<&str> = hosts.hosts().iter().map(|h| h.name()).collect();
            wait_addons(&site.business, &nodes, started, timeout).await?
        }
        Err(_) => f64::NAN,
    };
    let tool_cpu_s = match tool {
        Tool::NodeOperator => node_operator_cpu() - node_operator_before,
        _ => controller_cpu_s.unwrap_or(f64::NAN),
    };
    let hosts_cpu_s = hosts
        .hosts()
        .iter()
        .filter_map(|h| h.cpu_time())
        .map(|t| t.as_secs_f64())
        .sum();
    let workers = match result {
        Ok(()) => {
            let workers = measure(site, timeline, &hosts, started, artifacts_mark, images_mark)?;
            let received: Vec<u64> = hosts.hosts().iter().map(received).collect();
            check_nodes(site, &hosts).await?;
            workers
                .into_iter()
                .zip(received.iter().zip(&received_before))
                .map(|(w, (after, before))| Worker {
                    received_bytes: after.saturating_sub(*before),
                    ..w
                })
                .collect()
        }
        Err(e) => {
            clean_up(site, tool, hosts, token).await;
            return Err(e);
        }
    };
    clean_up(site, tool, hosts, token).await;
    Ok(Run {
        tool,
        hosts: n,
        all_s: cost.wall_s,
        tool_cpu_s,
        hosts_cpu_s,
        machine_cpu_s: cost.machine_cpu_s,
        play_s,
        addons_s,
        workers,
    })
}

/// Waits until the workload Pod on every one of `nodes` is Ready, saying now and then how
/// far they are.
pub(crate) async fn wait_workloads(
    timeline: &Timeline,
    nodes: &[&str],
    started: Instant,
    timeout: Duration,
) -> Result<()> {
    let mut reported = Instant::now();
    loop {
        let seen: Vec<_> = nodes.iter().map(|n| timeline.get(n)).collect();
        let count = |f: fn(&timeline::Seen) -> bool| seen.iter().filter(|s| f(s)).count();
        let ready = count(|s| s.ready.is_some());
        let workload = count(|s| s.workload_ready.is_some());
        if workload == seen.len() {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!(
                "after {timeout:?}: {ready} of {} Nodes Ready, {workload} workload Pods Ready",
                seen.len()
            );
        }
        if reported.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "  {:.0}s: {ready}/{} Nodes Ready, {}/{} with a Pod Running, {workload}/{} workload Pods Ready",
                started.elapsed().as_secs_f64(),
                seen.len(),
                count(|s| s.first_running.is_some()),
                seen.len(),
                seen.len()
            );
            reported = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the cluster is complete on `nodes`: a kube-proxy and a
/// kube-router Pod Ready on each, and every CoreDNS replica available;
/// returns the seconds from `started` until then.
pub(crate) async fn wait_addons(
    client: &kube::Client,
    nodes: &[&str],
    started: Instant,
    timeout: Duration,
) -> Result<f64> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    loop {
        let listed = pods.list(&ListParams::default()).await?;
        let ready_on = |prefix: &str, node: &str| {
            listed.items.iter().any(|p| {
                p.metadata
                    .generate_name
                    .as_deref()
                    .is_some_and(|g| g.trim_end_matches('-') == prefix)
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        };
        let daemons = nodes
            .iter()
            .all(|n| ready_on("kube-proxy", n) && ready_on("kube-router", n));
        let dns = deployments.get_opt("coredns").await?.is_some_and(|d| {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let available = d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            want >= 1 && available >= want
        });
        if daemons && dns {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > timeout {
            bail!(
                "after {timeout:?}: kube-proxy and kube-router Ready on every node: {daemons}, CoreDNS available: {dns}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each worker's times, and the artifact and image bytes sent to it since
/// the marks.
fn measure(
    site: &Site,
    timeline: &Timeline,
    hosts: &TestHosts,
    started: Instant,
    artifacts_mark: usize,
    images_mark: usize,
) -> Result<Vec<Worker>> {
    let artifacts = site.depot.artifact_log();
    let images = site.registry.served()?;
    let since = |at: Option<Instant>| at.map(|t| t.duration_since(started).as_secs_f64());
    hosts
        .hosts()
        .iter()
        .map(|h| {
            let seen = timeline.get(h.name());
            let (first_pod_at, first_pod) = seen.first_running.clone().unzip();
            Ok(Worker {
                ready_s: since(seen.ready).context("Node not Ready")?,
                first_pod_s: since(first_pod_at).context("no Pod Running")?,
                first_pod: first_pod.unwrap_or_default(),
                workload_s: since(seen.workload_ready).context("workload not Ready")?,
                artifact_bytes: artifacts[artifacts_mark.min(artifacts.len())..]
                    .iter()
                    .filter(|r| r.from == h.ip())
                    .map(|r| r.bytes)
                    .sum(),
                image_bytes: images[images_mark.min(images.len())..]
                    .iter()
                    .filter(|r| r.client == h.ip())
                    .map(|r| r.bytes)
                    .sum(),
                received_bytes: 0,
            })
        })
        .collect()
}

/// CPU seconds of the site's node-operator (the process of that name the
/// Pod runner started under this one) and the ssh clients it waited for;
/// NaN when it is not found.
fn node_operator_cpu() -> f64 {
    let ours = std::process::id();
    let descends = |mut pid: u32| {
        while let Some(p) = kok_testenv::parent_of(pid).filter(|p| *p > 1) {
            if p == ours {
                return true;
            }
            pid = p;
        }
        false
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return f64::NAN;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "node-operator")
        })
        .find(|pid| descends(*pid))
        .and_then(|pid| process_cpu_seconds(pid, true).ok())
        .unwrap_or(f64::NAN)
}

/// Bytes the host's `eth0` received, from its network namespace's
/// `/proc/net/dev` (0 when it cannot be read).
fn received(host: &kok_testenv::hosts::TestHost) -> u64 {
    let Some(pid) = host.init_pid() else { return 0 };
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix("eth0:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Both tools must leave the same Nodes: the kubelet and runtime as
/// packaged, and the Machine's labels and taints.
async fn check_nodes(site: &Site, hosts: &TestHosts) -> Result<()> {
    let version = |package: &str| {
        site.packages
            .iter()
            .find(|w| w.package == package)
            .map(|w| w.spec.version.clone())
            .unwrap_or_default()
    };
    let kubelet = format!("v{}", version("kubelet"));
    let runtime = format!("containerd://{}", version("containerd"));
    let nodes: Api<Node> = Api::all(site.business.clone());
    for host in hosts.hosts() {
        let node = nodes.get(host.name()).await?;
        let info = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .context("no nodeInfo")?;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "dedicated"));
        if info.kubelet_version != kubelet
            || info.container_runtime_version != runtime
            || labels.get("pool").map(String::as_str) != Some("general")
            || !tainted
        {
            bail!(
                "{} is not the Node the Machine describes: {} {}, labels {labels:?}, tainted {tainted}",
                host.name(),
                info.kubelet_version,
                info.container_runtime_version
            );
        }
    }
    Ok(())
}

/// Leaves the cluster as before the run: node-operator's Machines deleted
/// (it drains and cleans their hosts and deletes their Nodes), the hosts
/// powered off, any Node left deleted, the peer's token removed. Failures
/// are reported, not returned: the next run starts from fresh hosts anyway.
async fn clean_up(site: &Site, tool: Tool, hosts: TestHosts, token: Option<String>) {
    let names: Vec<String> = hosts.hosts().iter().map(|h| h.name().to_string()).collect();
    if tool == Tool::NodeOperator
        && let Err(e) = delete_machines(site, &names).await
    {
        eprintln!("  cleaning up Machines: {e:#}");
    }
    tokio::task::block_in_place(|| drop(hosts));
    let nodes: Api<Node> = Api::all(site.business.clone());
    for name in &names {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    if let Some(token) = token {
        let secrets: Api<Secret> = Api::namespaced(site.business.clone(), "kube-system");
        let _ = secrets.delete(&token, &DeleteParams::default()).await;
    }
}

/// Deletes the Machines and waits for node-operator to offboard them; after
/// two minutes their finalizers are removed.
async fn delete_machines(site: &Site, names: &[String]) -> Result<()> {
    let api: Api<Machine> = Api::all(site.business.clone());
    for name in names {
        api.delete(name, &DeleteParams::background()).await?;
    }
    let started = Instant::now();
    loop {
        let left: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|m| m.metadata.name)
            .filter(|m| names.contains(m))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(120) {
            for name in &left {
                let patch = serde_json::json!({"metadata": {"finalizers": null}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            bail!("{} Machines not offboarded in 2 minutes", left.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value at the `q`-quantile by nearest rank (`q` = 0.9: the smallest
/// value at least 90% of the values are not above).
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn spread(values: &[f64]) -> String {
    format!(
        "{:.1} / {:.1} / {:.1}",
        median(values),
        quantile(values, 0.9),
        quantile(values, 1.0)
    )
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn table(args: &Args, n: usize, tools: &[Tool], runs: &[Run], cluster_ready_s: f64) -> String {
    let workers = |tool: Tool| -> Vec<&Worker> {
        runs.iter()
            .filter(|r| r.tool == tool)
            .flat_map(|r| &r.workers)
            .collect()
    };
    let of = |tool: Tool, f: fn(&Worker) -> f64| -> Vec<f64> {
        workers(tool).into_iter().map(f).collect()
    };
    let of_runs = |tool: Tool, f: fn(&Run) -> f64| -> Vec<f64> {
        runs.iter().filter(|r| r.tool == tool).map(f).collect()
    };
    let mut out = format!(
        "\n### Worker nodes: Machines applied → Node Ready → Pods, {n} real hosts at once, Ansible strategy {}, {} runs of each tool\n\n\
         Seconds from applying the Machines (starting the playbook), per worker: median / p90 / max over {} workers.\n\n\
         | tool | Node Ready s | first Pod Running s | workload Pod Ready s | all {n} ready s | CPU s (tool) | CPU s (hosts) | artifacts MiB per host | images MiB per host | received MiB per host |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        args.ansible.ansible_strategy,
        args.runs,
        args.runs * n
    );
    for &tool in tools {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            tool.label(),
            spread(&of(tool, |w| w.ready_s)),
            spread(&of(tool, |w| w.first_pod_s)),
            spread(&of(tool, |w| w.workload_s)),
            median(&of_runs(tool, |r| r.all_s)),
            median(&of_runs(tool, |r| r.tool_cpu_s)),
            median(&of_runs(tool, |r| r.hosts_cpu_s)),
            mib(median(&of(tool, |w| w.artifact_bytes as f64))),
            mib(median(&of(tool, |w| w.image_bytes as f64))),
            mib(median(&of(tool, |w| w.received_bytes as f64))),
        ));
    }
    let peers = tools.iter().filter(|t| **t != Tool::NodeOperator);
    for &peer in peers.filter(|_| tools.contains(&Tool::NodeOperator)) {
        let ratio =
            |f: fn(&Worker) -> f64| median(&of(peer, f)) / median(&of(Tool::NodeOperator, f));
        let ratio_runs = |f: fn(&Run) -> f64| {
            median(&of_runs(peer, f)) / median(&of_runs(Tool::NodeOperator, f))
        };
        out.push_str(&format!(
            "| **ratio {} / node-operator (medians)** | **{:.1}×** | **{:.1}×** | **{:.1}×** | **{:.1}×** | **{:.1}×** | **{:.1}×** | {:.2}× | {:.2}× | {:.2}× |\n",
            peer.label(),
            ratio(|w| w.ready_s),
            ratio(|w| w.first_pod_s),
            ratio(|w| w.workload_s),
            ratio_runs(|r| r.all_s),
            ratio_runs(|r| r.tool_cpu_s),
            ratio_runs(|r| r.hosts_cpu_s),
            ratio(|w| w.artifact_bytes as f64),
            ratio(|w| w.image_bytes as f64),
            ratio(|w| w.received_bytes as f64),
        ));
    }
    let firsts: std::collections::BTreeMap<&str, usize> = runs
        .iter()
        .flat_map(|r| &r.workers)
        .fold(Default::default(), |mut m, w| {
            *m.entry(w.first_pod.as_str()).or_default() += 1;
            m
        });
    out.push_str(&format!(
        "\nThe business Cluster was Ready {cluster_ready_s:.1}s after it was created (once, before the runs). First Pod Running on a worker, by Pod: {}.\n\nAll runs:\n\n\
         | run | tool | all ready s | play ended s | CPU s (tool / hosts / machine) | Node Ready s (median / max) | workload Pod Ready s (median / max) | artifacts MiB (min / max host) | images MiB (min / max host) |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
        firsts
            .iter()
            .map(|(p, c)| format!("{p} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for (i, r) in runs.iter().enumerate() {
        let v = |f: fn(&Worker) -> f64| r.workers.iter().map(f).collect::<Vec<_>>();
        let range = |f: fn(&Worker) -> f64| {
            let v = v(f);
            format!(
                "{:.1} / {:.1}",
                mib(quantile(&v, 0.0)),
                mib(quantile(&v, 1.0))
            )
        };
        out.push_str(&format!(
            "| {} | {} | {:.1} | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} |\n",
            i / tools.len() + 1,
            r.tool.label(),
            r.all_s,
            r.play_s.map(|p| format!("{p:.1}")).unwrap_or("–".into()),
            r.tool_cpu_s,
            r.hosts_cpu_s,
            r.machine_cpu_s,
            median(&v(|w| w.ready_s)),
            quantile(&v(|w| w.ready_s), 1.0),
            median(&v(|w| w.workload_s)),
            quantile(&v(|w| w.workload_s), 1.0),
            range(|w| w.artifact_bytes as f64),
            range(|w| w.image_bytes as f64),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.9), 5.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&ten, 0.9), 9.0);
        assert!(quantile(&[], 0.9).is_nan());
    }
}
