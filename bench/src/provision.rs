//! Benchmark 3: installing the same three packages on the same number of SSH
//! test hosts with node-operator's installer and with an Ansible playbook
//! (`bench/ansible/provision.yml`), at the same parallelism. Every run starts
//! from fresh, empty hosts, and the tools take turns going first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use kok_testenv::hosts::TestHosts;
use node_operator::install::Installer;
use node_operator::ssh::{Session, Target, Timeouts};

use crate::measure::{Cost, Meter, median};
use crate::packages::{self, Package};

/// Flags of `kok-bench provision`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of SSH test hosts (at most 253).
    #[arg(long, default_value_t = 50)]
    pub hosts: usize,
    /// Hosts worked on at once, by both tools (Ansible's `--forks`).
    #[arg(long, default_value_t = 50)]
    pub parallel: usize,
    /// Runs of each tool; the table reports medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Size of each artifact's payload in MiB.
    #[arg(long, default_value_t = 1)]
    pub payload_mib: usize,
    /// The `ansible-playbook` to run (`bench/setup-ansible.sh` installs one).
    #[arg(long, env = "ANSIBLE_PLAYBOOK")]
    pub ansible_playbook: Option<PathBuf>,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
enum Tool {
    NodeOperator,
    Ansible,
}

impl Tool {
    fn label(self) -> &'static str {
        match self {
            Tool::NodeOperator => "node-operator",
            Tool::Ansible => "ansible-playbook",
        }
    }
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let playbook_bin = match &args.ansible_playbook {
        Some(p) => p.clone(),
        None => default_playbook()?,
    };
    let mut results: Vec<(Tool, Cost)> = Vec::new();
    for run in 0..args.runs {
        let order = if run % 2 == 0 {
            [Tool::NodeOperator, Tool::Ansible]
        } else {
            [Tool::Ansible, Tool::NodeOperator]
        };
        for tool in order {
            let cost = one_run(tool, &args, &playbook_bin).await?;
            eprintln!(
                "run {}/{} {:<16} wall {:>6.1}s  cpu {:>6.1}s  machine cpu {:>6.1}s",
                run + 1,
                args.runs,
                tool.label(),
                cost.wall_s,
                cost.cpu_s,
                cost.machine_cpu_s
            );
            results.push((tool, cost));
        }
    }
    let table = table(&args, &results);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

async fn one_run(tool: Tool, args: &Args, playbook_bin: &Path) -> Result<Cost> {
    let hosts = TestHosts::start(args.hosts).context("start test hosts")?;
    let packages = packages::build(&hosts, "1.0.0", args.payload_mib)?;
    let cost = match tool {
        Tool::NodeOperator => install_all(&hosts, &packages, args.parallel).await?,
        Tool::Ansible => ansible(&hosts, &packages, args.parallel, playbook_bin)?,
    };
    // Both tools must have done the whole job on every host.
    for host in hosts.hosts() {
        packages::check_host(host, "1.0.0").with_context(|| tool.label())?;
    }
    Ok(cost)
}

/// Installs `packages` on every host with node-operator's installer,
/// `parallel` hosts at once, one SSH session each.
pub(crate) async fn install_all(
    hosts: &TestHosts,
    packages: &[Package],
    parallel: usize,
) -> Result<Cost> {
    let key = hosts.client_private_key_pem();
    let timeouts = Timeouts {
        connect: Duration::from_secs(30),
        run: Duration::from_secs(300),
    };
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
                let installer = Installer::new(&session);
                let values = packages::values(&host.ip().to_string());
                for package in packages {
                    installer.install(&package.spec, &values).await?;
                }
                session.close().await;
                Ok(())
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

fn ansible(
    hosts: &TestHosts,
    packages: &[Package],
    parallel: usize,
    playbook_bin: &Path,
) -> Result<Cost> {
    let vars = serde_json::json!({
        "packages": packages.iter().map(|p| p.ansible.clone()).collect::<Vec<_>>()
    });
    let run = playbook(hosts, "provision.yml", &vars, parallel, playbook_bin)?;
    run.succeeded()?;
    Ok(run.cost)
}

/// One `ansible-playbook` run: what it cost, and how it ended.
pub struct PlaybookRun {
    pub cost: Cost,
    pub output: std::process::Output,
}

impl PlaybookRun {
    /// An error with the end of its output unless every host succeeded.
    pub fn succeeded(&self) -> Result<()> {
        if !self.output.status.success() {
            let stdout = String::from_utf8_lossy(&self.output.stdout);
            let tail: Vec<&str> = stdout.lines().rev().take(30).collect();
            bail!(
                "ansible-playbook failed ({}):\n{}\n{}",
                self.output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
                String::from_utf8_lossy(&self.output.stderr)
            );
        }
        Ok(())
    }
}

/// Runs `bench/ansible/<name>` on every host with `vars`, `parallel` forks,
/// and Ansible's fastest settings.
pub fn playbook(
    hosts: &TestHosts,
    name: &str,
    vars: &serde_json::Value,
    parallel: usize,
    playbook_bin: &Path,
) -> Result<PlaybookRun> {
    let work = tempfile::tempdir()?;
    let mut inventory = String::from("[all]\n");
    for host in hosts.hosts() {
        inventory.push_str(&format!(
            "{} ansible_host={} ansible_port={}\n",
            host.name(),
            host.ip(),
            host.port()
        ));
    }
    inventory.push_str(&format!(
        "[all:vars]\nansible_user=root\nansible_ssh_private_key_file={}\nansible_python_interpreter=/usr/bin/python3\nansible_ssh_common_args='-o UserKnownHostsFile={} -o StrictHostKeyChecking=yes'\n",
        hosts.client_key_path().display(),
        hosts.known_hosts_path().display()
    ));
    let inventory_path = work.path().join("inventory.ini");
    std::fs::write(&inventory_path, inventory)?;
    let vars_path = work.path().join("vars.json");
    std::fs::write(&vars_path, serde_json::to_vec(vars)?)?;
    let playbook = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("ansible")
        .join(name);
    let meter = Meter::start();
    let output = Command::new(playbook_bin)
        .arg("-i")
        .arg(&inventory_path)
        .arg("-e")
        .arg(format!("@{}", vars_path.display()))
        .arg("--forks")
        .arg(parallel.max(1).to_string())
        .arg(&playbook)
        // Ansible's fastest settings: one connection per host kept open,
        // modules piped rather than copied.
        .env("ANSIBLE_PIPELINING", "True")
        .env("ANSIBLE_HOST_KEY_CHECKING", "True")
        .env("ANSIBLE_LOCAL_TEMP", work.path().join("tmp"))
        .env("ANSIBLE_SSH_CONTROL_PATH_DIR", work.path().join("cp"))
        .env("ANSIBLE_NOCOLOR", "1")
        .output()
        .with_context(|| format!("run {}", playbook_bin.display()))?;
    Ok(PlaybookRun {
        cost: meter.stop(),
        output,
    })
}

/// `ansible-playbook` from the virtualenv `bench/setup-ansible.sh` makes.
pub fn default_playbook() -> Result<PathBuf> {
    let output = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("setup-ansible.sh"))
        .output()
        .context("run bench/setup-ansible.sh")?;
    if !output.status.success() {
        bail!(
            "bench/setup-ansible.sh failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
    ))
}

fn table(args: &Args, results: &[(Tool, Cost)]) -> String {
    let pick = |tool: Tool, f: fn(&Cost) -> f64| -> f64 {
        median(
            &results
                .iter()
                .filter(|(t, _)| *t == tool)
                .map(|(_, c)| f(c))
                .collect::<Vec<_>>(),
        )
    };
    let mut out = format!(
        "\n### Node provisioning: {} hosts, {} at once, 3 packages of {} MiB, median of {} runs\n\n| tool | wall s | CPU s (tool) | CPU s (machine) |\n|---|---:|---:|---:|\n",
        args.hosts, args.parallel, args.payload_mib, args.runs
    );
    for tool in [Tool::NodeOperator, Tool::Ansible] {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} |\n",
            tool.label(),
            pick(tool, |c| c.wall_s),
            pick(tool, |c| c.cpu_s),
            pick(tool, |c| c.machine_cpu_s)
        ));
    }
    let ratio = |f: fn(&Cost) -> f64| pick(Tool::Ansible, f) / pick(Tool::NodeOperator, f);
    out.push_str(&format!(
        "| **ratio ansible / node-operator** | **{:.1}×** | **{:.1}×** | **{:.1}×** |\n",
        ratio(|c| c.wall_s),
        ratio(|c| c.cpu_s),
        ratio(|c| c.machine_cpu_s)
    ));
    out.push_str("\nAll runs:\n\n| run | tool | wall s | CPU s (tool) | CPU s (machine) |\n|---:|---|---:|---:|---:|\n");
    for (i, (tool, c)) in results.iter().enumerate() {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} |\n",
            i / 2 + 1,
            tool.label(),
            c.wall_s,
            c.cpu_s,
            c.machine_cpu_s
        ));
    }
    out
}
