//! Benchmark 3: installing the same three packages on the same number of SSH
//! test hosts with node-operator's installer and with an Ansible playbook
//! (`bench/ansible/provision.yml`), run by Ansible and by Ansible + Mitogen
//! (see [`crate::peer`]), at the same parallelism. Every run starts from
//! fresh, empty hosts, and the tools take turns going first. Each run also
//! measures the transfer floor: every host fetching every artifact and
//! discarding it, what the artifact server's bandwidth allows at best.
//!
//! This calls node-operator's installer in-process (no API server, no
//! Machine, no operator process): a micro-benchmark of the install itself.
//! `kok-bench canary` and `kok-bench workers` go through the operator.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use kok_testenv::hosts::{TestHost, TestHosts};
use node_operator::install::Installer;
use node_operator::ssh::{Session, Target, Timeouts};

use crate::measure::{Cost, Meter, median};
use crate::packages::{self, Package};
use crate::peer::{Ansible, AnsibleArgs, Tool, playbook};

/// Flags of `kok-bench provision`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of SSH test hosts (at most 253).
    #[arg(long, default_value_t = 50)]
    pub hosts: usize,
    /// Hosts worked on at once, by every tool (Ansible's `--forks`).
    #[arg(long, default_value_t = 50)]
    pub parallel: usize,
    /// Runs of each tool; the table reports medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Size of each artifact's payload in MiB.
    #[arg(long, default_value_t = 1)]
    pub payload_mib: usize,
    /// The tools to compare (`node-operator`, `ansible`, `mitogen`), each
    /// as its best users run it (see `bench/src/peer.rs`).
    #[arg(long, value_delimiter = ',', default_values_t = ["node-operator".to_string(), "ansible".to_string(), "mitogen".to_string()])]
    pub tools: Vec<String>,
    /// Where Ansible is, and its strategy.
    #[command(flatten)]
    pub ansible: AnsibleArgs,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One run of one tool, or of the transfer floor (`tool` None).
struct Run {
    run: usize,
    tool: Option<Tool>,
    cost: Cost,
    bytes_per_host: u64,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let tools = Tool::parse_all(&args.tools)?;
    let ansible = Ansible::find(&args.ansible)?;
    let mut results: Vec<Run> = Vec::new();
    for run in 0..args.runs {
        let mut order: Vec<Option<Tool>> = vec![None];
        order.extend(Tool::rotation(&tools, run).into_iter().map(Some));
        for tool in order {
            let (cost, bytes_per_host) = one_run(tool, &args, &ansible).await?;
            eprintln!(
                "run {}/{} {:<16} wall {:>6.1}s  cpu {:>6.1}s  machine cpu {:>6.1}s",
                run + 1,
                args.runs,
                tool.map_or("transfer floor", Tool::label),
                cost.wall_s,
                cost.cpu_s,
                cost.machine_cpu_s
            );
            results.push(Run {
                run,
                tool,
                cost,
                bytes_per_host,
            });
        }
    }
    let table = table(&args, &tools, &results);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

/// One run on fresh hosts: `tool`'s install and the check that it left
/// every host complete, or (None) the transfer floor. Returns its cost and
/// the artifact bytes each host needs.
async fn one_run(tool: Option<Tool>, args: &Args, ansible: &Ansible) -> Result<(Cost, u64)> {
    let hosts = TestHosts::start(args.hosts).context("start test hosts")?;
    let packages = packages::build(&hosts, "1.0.0", args.payload_mib)?;
    let mut bytes = 0;
    for p in &packages {
        let url = &p.spec.artifacts[0].url;
        let file = url.rsplit('/').next().unwrap_or_default();
        bytes += std::fs::metadata(hosts.artifacts_dir().join(file))?.len();
    }
    let cost = match tool {
        None => {
            return Ok((
                transfer_floor(&hosts, &packages, args.parallel).await?,
                bytes,
            ));
        }
        Some(Tool::NodeOperator) => install_all(&hosts, &packages, args.parallel).await?,
        Some(peer) => playbook_install(&hosts, &packages, args.parallel, peer, ansible)?,
    };
    // Every tool must have done the whole job on every host.
    let label = tool.map_or("", Tool::label);
    for host in hosts.hosts() {
        packages::check_host(host, "1.0.0").with_context(|| label)?;
    }
    Ok((cost, bytes))
}

/// What the artifact server's bandwidth allows: every host fetching every
/// artifact with curl to /dev/null (no checksum, no unpacking, nothing
/// written), `parallel` hosts at once over one SSH session each, the way
/// the tools reach them.
async fn transfer_floor(hosts: &TestHosts, packages: &[Package], parallel: usize) -> Result<Cost> {
    let script: String = packages
        .iter()
        .map(|p| format!("curl -fsS -o /dev/null '{}' && ", p.spec.artifacts[0].url))
        .chain(["true".to_string()])
        .collect();
    on_every_host(hosts, parallel, async |session, _host| {
        let out = session.run(&script).await?;
        if out.status != 0 {
            bail!("curl failed: {}", out.stderr.trim());
        }
        Ok(())
    })
    .await
}

/// Installs `packages` on every host with node-operator's installer,
/// `parallel` hosts at once, one SSH session each.
pub(crate) async fn install_all(
    hosts: &TestHosts,
    packages: &[Package],
    parallel: usize,
) -> Result<Cost> {
    on_every_host(hosts, parallel, async |session, host| {
        let installer = Installer::new(session);
        let values = packages::values(&host.ip().to_string());
        for package in packages {
            installer.install(&package.spec, &values).await?;
        }
        Ok(())
    })
    .await
}

/// Runs `work` on every host over an SSH session of its own, `parallel`
/// hosts at once, and returns what that cost; the first error, if any.
pub(crate) async fn on_every_host(
    hosts: &TestHosts,
    parallel: usize,
    work: impl AsyncFn(&Session, &TestHost) -> Result<()>,
) -> Result<Cost> {
    let key = hosts.client_private_key_pem();
    let timeouts = Timeouts {
        connect: Duration::from_secs(30),
        run: Duration::from_secs(300),
        ..Timeouts::default()
    };
    let work = &work;
    let meter = Meter::start();
    let results: Vec<Result<()>> = futures::stream::iter(hosts.hosts())
        .map(|host| {
            let target = Target {
                ip: host.ip(),
                port: host.port(),
                user: "root".into(),
                private_key_pem: key.clone(),
                host_public_key: host.host_public_key().to_string(),
            };
            async move {
                let session = Session::connect(&target, timeouts).await?;
                let result = work(&session, host).await;
                session.close().await;
                result
            }
        })
        .buffer_unordered(parallel.max(1))
        .collect()
        .await;
    let cost = meter.stop();
    for result in results {
        result?;
    }
    Ok(cost)
}

fn playbook_install(
    hosts: &TestHosts,
    packages: &[Package],
    parallel: usize,
    tool: Tool,
    ansible: &Ansible,
) -> Result<Cost> {
    let vars = serde_json::json!({
        "packages": packages.iter().map(|p| p.ansible.clone()).collect::<Vec<_>>()
    });
    let run = playbook(hosts, "provision.yml", &vars, parallel, tool, ansible)?;
    run.succeeded()?;
    Ok(run.cost)
}

fn table(args: &Args, tools: &[Tool], results: &[Run]) -> String {
    let pick = |tool: Option<Tool>, f: &dyn Fn(&Run) -> f64| -> f64 {
        median(
            &results
                .iter()
                .filter(|r| r.tool == tool)
                .map(f)
                .collect::<Vec<_>>(),
        )
    };
    let bytes = results.first().map_or(0, |r| r.bytes_per_host);
    let floor = pick(None, &|r| r.cost.wall_s);
    let mut out = format!(
        "\n### Node provisioning: {} hosts, {} at once, 3 packages of {} MiB ({:.1} MiB per host), Ansible strategy {}, median of {} runs\n\n\
         | tool | wall s | share of the transfer floor | CPU s (controller) | CPU s (rest of the machine: hosts, sshd) | CPU s (machine) |\n\
         |---|---:|---:|---:|---:|---:|\n",
        args.hosts,
        args.parallel,
        args.payload_mib,
        bytes as f64 / (1024.0 * 1024.0),
        args.ansible.ansible_strategy,
        args.runs
    );
    let row = |label: &str, tool: Option<Tool>| {
        let wall = pick(tool, &|r| r.cost.wall_s);
        format!(
            "| {label} | {wall:.1} | {:.0} % | {:.1} | {:.1} | {:.1} |\n",
            100.0 * floor / wall,
            pick(tool, &|r| r.cost.cpu_s),
            pick(tool, &|r| r.cost.machine_cpu_s - r.cost.cpu_s),
            pick(tool, &|r| r.cost.machine_cpu_s)
        )
    };
    out.push_str(&row(
        "transfer floor (curl of every artifact, nothing installed)",
        None,
    ));
    for tool in tools {
        out.push_str(&row(tool.label(), Some(*tool)));
    }
    if tools.contains(&Tool::NodeOperator) {
        for peer in tools.iter().filter(|t| **t != Tool::NodeOperator) {
            let ratio =
                |f: &dyn Fn(&Run) -> f64| pick(Some(*peer), f) / pick(Some(Tool::NodeOperator), f);
            out.push_str(&format!(
                "| **ratio {} / node-operator** | **{:.1}×** | | **{:.1}×** | {:.1}× | {:.1}× |\n",
                peer.label(),
                ratio(&|r| r.cost.wall_s),
                ratio(&|r| r.cost.cpu_s),
                ratio(&|r| r.cost.machine_cpu_s - r.cost.cpu_s),
                ratio(&|r| r.cost.machine_cpu_s)
            ));
        }
    }
    out.push_str(
        "\nAll runs:\n\n| run | tool | wall s | CPU s (controller) | CPU s (machine) |\n|---:|---|---:|---:|---:|\n",
    );
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} |\n",
            r.run + 1,
            r.tool.map_or("transfer floor", Tool::label),
            r.cost.wall_s,
            r.cost.cpu_s,
            r.cost.machine_cpu_s
        ));
    }
    out
}
