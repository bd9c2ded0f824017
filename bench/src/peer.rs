//! The tools compared, each run the way its best users run it.
//!
//! - **node-operator**, with its default settings.
//! - **Ansible** (`ansible-core`, from PyPI by `bench/setup-ansible.sh`):
//!   `--forks` equal to the hosts worked on at once, pipelining (modules
//!   piped to the remote Python, no temporary files), one SSH connection per
//!   host kept open (`ControlPersist`), no SSH compression (the hosts are on
//!   the local network, where compressing costs CPU and saves nothing),
//!   strict host-key checking as in production, and the `free` strategy
//!   (each host runs through its tasks without waiting for the slowest one
//!   at every task; `--ansible-strategy linear` runs Ansible's default one
//!   instead).
//! - **Ansible + Mitogen** (`mitogen` from PyPI, the same virtualenv): the
//!   same settings, with Mitogen's `mitogen_free` strategy, which replaces
//!   Ansible's per-task SSH and module transfer with one persistent Python
//!   interpreter per host. This is what Ansible users who care about speed
//!   run.
//!
//! Every playbook's health checks run the node-operator's own deadline loop
//! (`node_operator::install::health_script`) as one task, so both sides wait
//! the same way for the same deadline.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use kok_testenv::hosts::TestHosts;

use crate::measure::{Cost, Meter, children_cpu};

/// A tool under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Tool {
    NodeOperator,
    Ansible,
    Mitogen,
}

impl Tool {
    /// The name in tables and flags.
    pub fn label(self) -> &'static str {
        match self {
            Tool::NodeOperator => "node-operator",
            Tool::Ansible => "ansible",
            Tool::Mitogen => "ansible+mitogen",
        }
    }

    /// The tool a flag names.
    pub fn parse(name: &str) -> Result<Tool> {
        match name {
            "node-operator" => Ok(Tool::NodeOperator),
            "ansible" | "ansible-playbook" => Ok(Tool::Ansible),
            "mitogen" | "ansible+mitogen" => Ok(Tool::Mitogen),
            other => bail!("unknown tool {other} (node-operator, ansible, mitogen)"),
        }
    }

    /// The tools a comma-separated flag names, in the order given, each once.
    pub fn parse_all(names: &[String]) -> Result<Vec<Tool>> {
        let mut tools = Vec::new();
        for name in names {
            let tool = Tool::parse(name)?;
            if !tools.contains(&tool) {
                tools.push(tool);
            }
        }
        if tools.is_empty() {
            bail!("no tool to run");
        }
        Ok(tools)
    }

    /// `tools` rotated by `run`, so that each goes first in turn.
    pub fn rotation(tools: &[Tool], run: usize) -> Vec<Tool> {
        let mut order = tools.to_vec();
        if !order.is_empty() {
            order.rotate_left(run % tools.len());
        }
        order
    }
}

/// The flags every benchmark with an Ansible peer takes.
#[derive(clap::Args, Debug, Clone)]
pub struct AnsibleArgs {
    /// The `ansible-playbook` to run (`bench/setup-ansible.sh` installs one,
    /// with Mitogen).
    #[arg(long, env = "ANSIBLE_PLAYBOOK")]
    pub ansible_playbook: Option<PathBuf>,
    /// Ansible's strategy, for both peers: `free` (each host runs through
    /// its tasks on its own; `mitogen_free` with Mitogen) or `linear` (all
    /// hosts task by task; `mitogen_linear`).
    #[arg(long, default_value = "free", value_parser = ["free", "linear"])]
    pub ansible_strategy: String,
}

/// The installed Ansible: its `ansible-playbook`, Mitogen's strategy
/// plugins, and the strategy to run.
#[derive(Clone, Debug)]
pub struct Ansible {
    pub playbook: PathBuf,
    pub mitogen_strategies: PathBuf,
    /// `free` or `linear`.
    pub strategy: String,
}

impl Ansible {
    /// The virtualenv `bench/setup-ansible.sh` makes (installing it the
    /// first time), or the `ansible-playbook` the flags name; Mitogen from
    /// the same virtualenv.
    pub fn find(args: &AnsibleArgs) -> Result<Ansible> {
        let playbook = match &args.ansible_playbook {
            Some(p) => p.clone(),
            None => setup()?,
        };
        let python = playbook.with_file_name("python3");
        let output = Command::new(&python)
            .args([
                "-c",
                "import os, ansible_mitogen; print(os.path.dirname(ansible_mitogen.__file__))",
            ])
            .output()
            .with_context(|| format!("run {}", python.display()))?;
        if !output.status.success() {
            bail!(
                "no Mitogen beside {} (bench/setup-ansible.sh installs it): {}",
                playbook.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        Ok(Ansible {
            playbook,
            mitogen_strategies: dir.join("plugins").join("strategy"),
            strategy: args.ansible_strategy.clone(),
        })
    }
}

/// Runs `bench/setup-ansible.sh` and returns the `ansible-playbook` it
/// printed.
fn setup() -> Result<PathBuf> {
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

/// One `ansible-playbook` run: what it cost, and how it ended.
pub struct PlaybookRun {
    /// Its cost; `cpu_s` includes the connections it kept open.
    pub cost: Cost,
    /// CPU seconds of `ansible-playbook`, its workers and its SSH clients
    /// (the connections it kept open included): the controller's side.
    pub controller_cpu_s: f64,
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

/// The environment `ansible-playbook` runs with for `tool` (see the module
/// documentation), its temporary files under `work`.
fn environment(tool: Tool, ansible: &Ansible, work: &Path) -> Result<Vec<(&'static str, String)>> {
    let strategy = match tool {
        Tool::Ansible => ansible.strategy.clone(),
        Tool::Mitogen => format!("mitogen_{}", ansible.strategy),
        Tool::NodeOperator => bail!("node-operator runs no playbook"),
    };
    let mut env = vec![
        ("ANSIBLE_PIPELINING", "True".to_string()),
        ("ANSIBLE_HOST_KEY_CHECKING", "True".to_string()),
        (
            "ANSIBLE_SSH_ARGS",
            "-o ControlMaster=auto -o ControlPersist=300s".to_string(),
        ),
        ("ANSIBLE_STRATEGY", strategy),
        ("ANSIBLE_LOCAL_TEMP", work.join("tmp").display().to_string()),
        (
            "ANSIBLE_SSH_CONTROL_PATH_DIR",
            work.join("cp").display().to_string(),
        ),
        ("ANSIBLE_NOCOLOR", "1".to_string()),
    ];
    if tool == Tool::Mitogen {
        env.push((
            "ANSIBLE_STRATEGY_PLUGINS",
            ansible.mitogen_strategies.display().to_string(),
        ));
    }
    Ok(env)
}

/// Runs `bench/ansible/<name>` on every host with `vars` and `parallel`
/// forks, as `tool` (Ansible or Ansible + Mitogen).
pub fn playbook(
    hosts: &TestHosts,
    name: &str,
    vars: &serde_json::Value,
    parallel: usize,
    tool: Tool,
    ansible: &Ansible,
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
    let env = environment(tool, ansible, work.path())?;
    let children_before = children_cpu();
    let meter = Meter::start();
    let result = Command::new(&ansible.playbook)
        .arg("-i")
        .arg(&inventory_path)
        .arg("-e")
        .arg(format!("@{}", vars_path.display()))
        .arg("--forks")
        .arg(parallel.max(1).to_string())
        .arg(&playbook)
        .envs(env)
        .output();
    // The SSH connections Ansible keeps open (ControlPersist) outlive it,
    // detached from it: their CPU (the encryption of every byte sent) is
    // the controller's too, read before they are closed.
    let persisted = close_persisted_connections(&work.path().join("cp"));
    let output = result.with_context(|| format!("run {}", ansible.playbook.display()))?;
    let mut cost = meter.stop();
    cost.cpu_s += persisted;
    Ok(PlaybookRun {
        cost,
        controller_cpu_s: children_cpu() - children_before + persisted,
        output,
    })
}

/// Ends the SSH master connections whose control sockets are under `dir`
/// and returns the CPU seconds they used.
fn close_persisted_connections(dir: &Path) -> f64 {
    let needle = dir.display().to_string();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut seconds = 0.0;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(&needle) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: state is the 3rd
        // field of the line, utime and stime the 14th and 15th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<f64> = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse().ok())
            .collect();
        seconds += fields.iter().sum::<f64>() / ticks;
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_parsed_once_each_and_take_turns_first() {
        let names: Vec<String> = ["ansible", "node-operator", "mitogen", "ansible"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let tools = Tool::parse_all(&names).unwrap();
        assert_eq!(tools, [Tool::Ansible, Tool::NodeOperator, Tool::Mitogen]);
        assert_eq!(
            Tool::rotation(&tools, 1),
            [Tool::NodeOperator, Tool::Mitogen, Tool::Ansible]
        );
        assert_eq!(Tool::rotation(&tools, 3), tools);
        assert!(Tool::parse("salt").is_err());
        assert!(Tool::parse_all(&[]).is_err());
    }

    #[test]
    fn peers_run_without_compression_and_with_their_strategy() {
        let mut ansible = Ansible {
            playbook: "/venv/bin/ansible-playbook".into(),
            mitogen_strategies: "/venv/mitogen/strategy".into(),
            strategy: "free".into(),
        };
        let work = Path::new("/w");
        let plain = environment(Tool::Ansible, &ansible, work).unwrap();
        let get = |env: &[(&str, String)], key: &str| {
            env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
        };
        assert_eq!(get(&plain, "ANSIBLE_STRATEGY").as_deref(), Some("free"));
        assert!(!get(&plain, "ANSIBLE_SSH_ARGS").unwrap().contains("-C"));
        assert_eq!(get(&plain, "ANSIBLE_PIPELINING").as_deref(), Some("True"));
        assert_eq!(get(&plain, "ANSIBLE_STRATEGY_PLUGINS"), None);
        let mitogen = environment(Tool::Mitogen, &ansible, work).unwrap();
        assert_eq!(
            get(&mitogen, "ANSIBLE_STRATEGY").as_deref(),
            Some("mitogen_free")
        );
        assert_eq!(
            get(&mitogen, "ANSIBLE_STRATEGY_PLUGINS").as_deref(),
            Some("/venv/mitogen/strategy")
        );
        assert!(environment(Tool::NodeOperator, &ansible, work).is_err());
        ansible.strategy = "linear".into();
        let linear = environment(Tool::Mitogen, &ansible, work).unwrap();
        assert_eq!(
            get(&linear, "ANSIBLE_STRATEGY").as_deref(),
            Some("mitogen_linear")
        );
    }
}
