//! Bringing hosts up from the machine's side: starting their launchers,
//! plugging their veths into the bridge, and waiting until sshd answers;
//! all hosts of a batch at each step before the next, so that a large run
//! boots in about the time of one host.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::Error;
use super::guest::BootConfig;
use super::network::{self, Subnet};
use super::run_dir;
use crate::process::spawn_tied_to_process;
use crate::sys;

/// A host that is up. Dropping it powers the host off.
pub struct Running {
    launcher: Child,
    init_pid: Option<u32>,
    /// Held open for as long as the host should live: init leaves when it
    /// closes, which is the last line of defence should a kill be missed.
    control: Option<ChildStdin>,
}

impl Running {
    pub fn init_pid(&self) -> Option<u32> {
        self.init_pid
    }

    /// SIGKILL to the host's init: the kernel then kills every process in
    /// the host's PID namespace, and the launcher exits. Not waited for here,
    /// so that many hosts can be killed at once and then waited for.
    pub fn kill(&mut self) {
        // Once the launcher has exited, init is gone and its pid may belong
        // to someone else.
        if !matches!(self.launcher.try_wait(), Ok(None)) {
            return;
        }
        match self.init_pid {
            Some(pid) => {
                let _ = sys::kill(pid as i32, libc::SIGKILL);
            }
            // Init's parent-death signal takes it down with the launcher.
            None => {
                let _ = self.launcher.kill();
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
        // The launcher reaps init, then exits; waiting for it means every
        // process of the host is gone.
        let _ = self.launcher.wait();
    }
}

/// A host between spawning and `up`.
struct Booting<'a> {
    name: &'a str,
    log: &'a Path,
    running: Running,
    output: ChildStdout,
}

impl Booting<'_> {
    fn failure(&self, detail: String) -> Error {
        let log = std::fs::read_to_string(self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Error::Boot {
            host: self.name.to_owned(),
            detail: if tail.is_empty() {
                detail
            } else {
                format!(
                    "{detail}; its log ({}) ends with:\n{}",
                    self.log.display(),
                    tail.join("\n")
                )
            },
        }
    }

    fn read_line(&mut self, deadline: Instant, waiting_for: &str) -> Result<String, Error> {
        match sys::read_line_until(&mut self.output, deadline) {
            Ok(Some(line)) => match line.strip_prefix("error ") {
                Some(error) => Err(self.failure(error.to_owned())),
                None => Ok(line),
            },
            Ok(None) => Err(self.failure(format!("it exited while {waiting_for}"))),
            Err(e) => Err(self.failure(format!("{e} while {waiting_for}"))),
        }
    }
}

/// One host to boot: its index in the run, its configuration, and where its
/// log goes.
pub struct Plan {
    pub index: usize,
    pub config: BootConfig,
    pub log: std::path::PathBuf,
}

/// Boots the planned hosts; on failure none of them is left running.
pub fn boot(
    helper: &Path,
    run_id: &str,
    subnet: Subnet,
    plans: &[Plan],
) -> Result<Vec<Running>, Error> {
    // Generous, because a 2-core machine booting 200 hosts is busy.
    let deadline =
        Instant::now() + Duration::from_secs(30) + Duration::from_millis(200) * plans.len() as u32;
    let mut booting = Vec::with_capacity(plans.len());
    for plan in plans {
        booting.push(spawn(helper, plan)?);
    }
    let mut pids = Vec::with_capacity(plans.len());
    for (host, plan) in booting.iter_mut().zip(plans) {
        let line = host.read_line(deadline, "creating its namespaces")?;
        let pid = line
            .strip_prefix("pid ")
            .and_then(|p| p.parse::<u32>().ok())
            .ok_or_else(|| host.failure(format!("unexpected `{line}` from its launcher")))?;
        host.running.init_pid = Some(pid);
        run_dir::record_process(&plan.config.state_dir.join("init"), pid)?;
        pids.push((plan.index, pid));
    }
    network::connect_hosts(run_id, subnet, &pids)?;
    for host in &mut booting {
        let told = host
            .running
            .control
            .as_mut()
            .map(|c| c.write_all(b"net\n").and_then(|()| c.flush()));
        if let Some(Err(e)) = told {
            return Err(host.failure(format!("cannot reach its init: {e}")));
        }
    }
    for host in &mut booting {
        let line = host.read_line(deadline, "starting sshd")?;
        if line != "up" {
            return Err(host.failure(format!("unexpected `{line}` from its init")));
        }
    }
    Ok(booting.into_iter().map(|b| b.running).collect())
}

fn spawn<'a>(helper: &Path, plan: &'a Plan) -> Result<Booting<'a>, Error> {
    let config = serde_json::to_string(&plan.config).map_err(|e| Error::Boot {
        host: plan.config.hostname.clone(),
        detail: e.to_string(),
    })?;
    let log = File::options()
        .create(true)
        .append(true)
        .open(&plan.log)
        .map_err(Error::io(&plan.log))?;
    let mut command = Command::new(helper);
    // A group of its own, so that a Ctrl-C aimed at the test run does not
    // power hosts off under the test's feet; they go with the test process.
    command
        .process_group(0)
        .arg("boot")
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log);
    let mut launcher = spawn_tied_to_process(command).map_err(|source| Error::Spawn {
        program: helper.display().to_string(),
        source,
    })?;
    let control = launcher.stdin.take();
    let output = launcher.stdout.take();
    let running = Running {
        launcher,
        init_pid: None,
        control,
    };
    let Some(output) = output else {
        return Err(Error::Boot {
            host: plan.config.hostname.clone(),
            detail: "its launcher has no stdout".into(),
        });
    };
    Ok(Booting {
        name: &plan.config.hostname,
        log: &plan.log,
        running,
        output,
    })
}
