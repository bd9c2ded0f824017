//! Benchmark 5: steady state at the seeds' scale. N Machines whose hosts are
//! already at their declared versions, each with its Ready kwok Node, and the
//! node-operator started against them as its own process. Measured: the time
//! until every Machine has been reconciled once (from the operator's own
//! "reconciled" log lines), its peak memory, the SSH connections it opened
//! (every Machine points at a TCP listener here that counts connection
//! attempts, so a session cannot go unnoticed), and the API requests per
//! minute it adds to what the API server serves without it, and by its own
//! count (`kok_api_requests_total`).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kok_testenv::kube_env::{KubeEnv, Options, fake_node};
use kok_testenv::operator_http::{logged_port, scrape};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::machine::{
    InstalledPackage, LastOperation, MachinePhase, MachineSpec, MachineStatus, SshSpec,
};
use kube_on_kube_api::shared::OperationResult;
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};
use serde_json::json;

use crate::fleet::{api_requests, proc_status_kib, sibling};
use crate::measure::median;
use node_operator::machine::status;

const MANAGER: &str = "kok-bench";
/// Requests in flight while the fixture is written.
const WRITERS: usize = 48;

/// Flags of `kok-bench steady`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Machines (and kwok Nodes) in the business cluster.
    #[arg(long, default_value_t = 10_000)]
    pub machines: usize,
    /// How long API requests are counted, once without the operator and once
    /// with it after its first full pass.
    #[arg(long, default_value_t = 60)]
    pub window: u64,
    /// Give up waiting for the first full pass after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Starts of the operator against the same Machines (each a fresh
    /// process, as after a restart or a new leader); the table reports
    /// medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let operator = sibling("node-operator")?;
    let env = KubeEnv::start(Options {
        controller_manager: false,
        scheduler: false,
        kwok_nodes: 1,
        install_crds: true,
        controller_manager_qps: None,
        node_monitor_grace: None,
        real_nodes: None,
    })
    .context("start the business cluster")?;
    let client = env.client().await;
    let ssh = Counter::start().await?;

    let t = Instant::now();
    let installed = apply_packages(&client).await?;
    let names: Vec<String> = (0..args.machines)
        .map(|i| format!("kwok-node-{i}"))
        .collect();
    // Labelled as the node-operator labels the Nodes of its Machines.
    create_nodes(&client, &names, true).await?;
    wait_nodes_ready(&client, args.machines, Duration::from_secs(args.timeout)).await?;
    create_machines(&client, &names, ssh.port, &installed).await?;
    eprintln!(
        "{} Machines with Ready Nodes written in {:.0}s",
        args.machines,
        t.elapsed().as_secs_f64()
    );

    let window = Duration::from_secs(args.window);
    let baseline = requests_per_minute(&client, window).await?;
    eprintln!("API requests without the operator: {baseline:.0}/min");

    let mut samples = Vec::new();
    for run in 0..args.runs {
        let not_ready_before = machines_not_ready(&client).await?;
        let log_path = env.log_dir().join(format!("node-operator-{run}.log"));
        let mut child = Command::new(&operator)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args([
                "--log-format",
                "json",
                "--log-level",
                "info,kok_common=debug",
                "--http-address=127.0.0.1:0",
                // The periodic host checks (every 5 minutes by default) are
                // one SSH session per Machine per interval, due one interval
                // after the check each Machine's status records (its
                // provisioning, here). Any the operator opens during the run
                // is counted below.
                "--recheck-interval=1h",
            ])
            .stdout(Stdio::from(std::fs::File::create(&log_path)?))
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {}", operator.display()))?;
        let connections_before = ssh.count();
        let result = measure(&args, &client, &child, &log_path, baseline).await;
        stop(&mut child);
        let mut sample = result?;
        sample.ssh_connections = ssh.count() - connections_before;
        // Only this run's: earlier runs' visits stay NotReady.
        let not_ready = machines_not_ready(&client).await?;
        sample.left_ready = not_ready.saturating_sub(not_ready_before);
        if sample.left_ready > 0 {
            eprintln!(
                "{} Machines left Ready during the run: they were visited (log: {})",
                sample.left_ready,
                log_path.display()
            );
        }
        eprintln!("run {}/{}: {sample:?}", run + 1, args.runs);
        samples.push(sample);
    }
    let table = table(&args, &samples, baseline);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

/// Stops the operator as a rollout would, with SIGTERM: it gives up its
/// Lease, so the next run leads at once rather than after the Lease expires.
fn stop(child: &mut Child) {
    // SAFETY: kill(2) on the pid of a child this process started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[derive(Debug)]
struct Sample {
    full_pass_s: f64,
    peak_rss_mib: f64,
    ssh_connections: u64,
    /// Machines no longer Ready at the end: visited, and the counting
    /// listener (no sshd) failed the visit.
    left_ready: usize,
    requests_per_min: f64,
    /// The operator's own count of its API requests (watches aside): from
    /// its start to the end of the first full pass, and per minute over the
    /// window after it.
    pass_requests: f64,
    own_requests_per_min: f64,
}

async fn measure(
    args: &Args,
    client: &Client,
    child: &Child,
    log: &std::path::Path,
    baseline: f64,
) -> Result<Sample> {
    let pid = child.id();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let mut last_report = Instant::now();
    let full_pass = loop {
        let done = reconciled_machines(log)?;
        if done >= args.machines {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            bail!(
                "{done} of {} Machines reconciled after {}s (log: {})",
                args.machines,
                args.timeout,
                log.display()
            );
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "  {done}/{} Machines reconciled after {:.0}s",
                args.machines,
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        proc_status_kib(pid, "VmRSS:")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "first full pass over {} Machines: {:.1}s",
        args.machines,
        full_pass.as_secs_f64()
    );
    let own = || -> Result<f64> {
        let port =
            logged_port(log).with_context(|| format!("no HTTP address in {}", log.display()))?;
        Ok(api_requests(
            &scrape(port).context("scrape the operator's /metrics")?,
        ))
    };
    let pass_requests = own()?;
    let with = requests_per_minute(client, Duration::from_secs(args.window)).await?;
    let own_requests_per_min = (own()? - pass_requests) * 60.0 / args.window as f64;
    let peak = proc_status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    Ok(Sample {
        full_pass_s: full_pass.as_secs_f64(),
        peak_rss_mib: peak,
        // Counted by the caller, around the whole run.
        ssh_connections: 0,
        left_ready: 0,
        requests_per_min: (with - baseline).max(0.0),
        pass_requests,
        own_requests_per_min,
    })
}

/// A TCP listener that counts connection attempts and closes them.
struct Counter {
    port: u16,
    count: Arc<AtomicU64>,
}

impl Counter {
    async fn start() -> Result<Counter> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let count = Arc::new(AtomicU64::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        });
        Ok(Counter { port, count })
    }
    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The examples' PackageVersions and ClusterPackageVersion; returns what a
/// host at the defaults has installed.
async fn apply_packages(client: &Client) -> Result<Vec<(String, InstalledPackage)>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let params = PatchParams::apply(MANAGER).force();
    let mut versions = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("packageversions.yaml"))?;
    for doc in serde_norway::Deserializer::from_str(&text) {
        let pv: PackageVersion = serde::Deserialize::deserialize(doc)?;
        versions.insert(pv.name_any(), pv.spec.version.clone());
        Api::<PackageVersion>::all(client.clone())
            .patch(&pv.name_any(), &params, &Patch::Apply(&pv))
            .await?;
    }
    let cpv: ClusterPackageVersion = serde_norway::from_str(&std::fs::read_to_string(
        dir.join("clusterpackageversion.yaml"),
    )?)?;
    Api::<ClusterPackageVersion>::all(client.clone())
        .patch(&cpv.name_any(), &params, &Patch::Apply(&cpv))
        .await?;
    cpv.spec
        .packages
        .iter()
        .map(|(package, pv)| {
            let version = versions
                .get(pv)
                .with_context(|| format!("no PackageVersion {pv} in the examples"))?;
            Ok((
                package.clone(),
                InstalledPackage {
                    version: version.clone(),
                    package_version: pv.clone(),
                    previous: None,
                    healthy: true,
                },
            ))
        })
        .collect()
}

pub(crate) async fn create_nodes(client: &Client, names: &[String], labelled: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let params = PatchParams::apply(MANAGER).force();
    futures::stream::iter(names)
        .map(|name| {
            let nodes = nodes.clone();
            let params = params.clone();
            let mut node = fake_node(name);
            if labelled {
                node["metadata"]["labels"][node_operator::bootstrap::MACHINE_LABEL] =
                    name.clone().into();
            }
            async move {
                nodes
                    .patch(name, &params, &Patch::Apply(node))
                    .await
                    .with_context(|| format!("create Node {name}"))
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

pub(crate) async fn wait_nodes_ready(client: &Client, n: usize, timeout: Duration) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|node| node_operator::rollout::node_ready(node))
            .count();
        if ready >= n {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!("{ready} of {n} kwok Nodes Ready after {timeout:?}");
        }
        eprintln!("  {ready}/{n} kwok Nodes Ready");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Machines as the node-operator leaves them after provisioning: Ready, at
/// the cluster defaults, their Node registered, the last check a success.
async fn create_machines(
    client: &Client,
    names: &[String],
    port: u16,
    installed: &[(String, InstalledPackage)],
) -> Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "ssh-key", "namespace": "kube-system"},
        "stringData": {"ssh-privatekey": "unused: no host is visited"}
    }))?;
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await?;
    let machines: Api<Machine> = Api::all(client.clone());
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    futures::stream::iter(names)
        .map(|name| {
            let machines = machines.clone();
            let now = now.clone();
            async move {
                let spec = MachineSpec {
                    hostname: None,
                    // TEST-NET-1: no host is visited.
                    ip: "192.0.2.1".into(),
                    zone: None,
                    idc: None,
                    ssh: SshSpec {
                        user: "root".into(),
                        port: port.into(),
                        private_key_secret_ref: serde_json::from_value(json!({
                            "name": "ssh-key", "namespace": "kube-system", "key": "ssh-privatekey"
                        }))?,
                        host_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchmarkHostKeyNotUsedAtAll0000000000000".into(),
                    },
                    packages: Default::default(),
                    kubelet: Default::default(),
                    sysctls: Default::default(),
                };
                let mut machine = Machine::new(name, spec);
                machine.metadata.finalizers = Some(vec!["kubeonkube.io/machine".into()]);
                let created = machines.create(&PostParams::default(), &machine).await?;
                let mut status = MachineStatus {
                    observed_generation: created.metadata.generation,
                    phase: Some(MachinePhase::Ready),
                    installed: installed.iter().cloned().collect(),
                    node_name: Some(name.clone()),
                    last_checked_at: Some(now.clone()),
                    last_operation: Some(LastOperation {
                        step: "check".into(),
                        started_at: now.clone(),
                        finished_at: Some(now),
                        result: OperationResult::Succeeded,
                        message: None,
                        output_tail: None,
                    }),
                    ..Default::default()
                };
                // The conditions the node-operator leaves on a Ready Machine.
                let generation = created.metadata.generation;
                for (type_, reason, message) in [
                    (status::REACHABLE, "Connected", format!("logged in to 127.0.0.1:{port}")),
                    (status::PACKAGES_INSTALLED, "Installed", "every package at its declared version".to_string()),
                    (status::NODE_READY, "NodeReady", format!("Node {name} is Ready")),
                ] {
                    status::set(&mut status, generation, type_, true, reason, message);
                }
                machines
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": status})),
                    )
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Distinct Machines the operator logged as reconciled.
fn reconciled_machines(log: &std::path::Path) -> Result<usize> {
    let file = std::fs::File::open(log)?;
    let mut seen = HashSet::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["message"] == "reconciled"
            && v["controller"] == "machine"
            && let Some(object) = v["object"].as_str()
        {
            seen.insert(object.to_string());
        }
    }
    Ok(seen.len())
}

async fn machines_not_ready(client: &Client) -> Result<usize> {
    let list = Api::<Machine>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|m| m.status.as_ref().and_then(|s| s.phase) != Some(MachinePhase::Ready))
        .count())
}

/// Requests the API server served per minute over `window`, from its own
/// `apiserver_request_total` counters.
async fn requests_per_minute(client: &Client, window: Duration) -> Result<f64> {
    let before = requests_total(client).await?;
    tokio::time::sleep(window).await;
    let after = requests_total(client).await?;
    Ok((after - before) * 60.0 / window.as_secs_f64())
}

async fn requests_total(client: &Client) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum())
}

fn table(args: &Args, samples: &[Sample], baseline: f64) -> String {
    let pick = |f: fn(&Sample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let mut out = format!(
        "\n### Steady state: {} Machines at their versions with Ready kwok Nodes, median of {} starts of the operator\n\n| first full pass s | peak RSS MiB | SSH connections | Machines visited (left Ready) | operator's API requests in its first pass | operator's API requests/min after it | API server's requests/min added (baseline without operator) |\n|---:|---:|---:|---:|---:|---:|---:|\n| {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} ({:.0}) |\n",
        args.machines,
        samples.len(),
        pick(|s| s.full_pass_s),
        pick(|s| s.peak_rss_mib),
        pick(|s| s.ssh_connections as f64),
        pick(|s| s.left_ready as f64),
        pick(|s| s.pass_requests),
        pick(|s| s.own_requests_per_min),
        pick(|s| s.requests_per_min),
        baseline
    );
    out.push_str(
        "\nAll runs:\n\n| run | first full pass s | peak RSS MiB | SSH connections | Machines visited | operator's requests in its first pass | operator's requests/min after | API server's requests/min added |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (i, s) in samples.iter().enumerate() {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {} | {} | {:.0} | {:.0} | {:.0} |\n",
            i + 1,
            s.full_pass_s,
            s.peak_rss_mib,
            s.ssh_connections,
            s.left_ready,
            s.pass_requests,
            s.own_requests_per_min,
            s.requests_per_min
        ));
    }
    out
}
