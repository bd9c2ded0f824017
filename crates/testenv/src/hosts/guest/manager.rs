//! The host's service manager: init keeps sshd and the units running, reaps
//! every process that ends up parented to it, and carries out the jobs
//! `systemctl` asks for.
//!
//! Every process is started through `kok-testhost exec` (see
//! [`super::exec_service`]), so a spawn never fails after fork and the
//! reaper, which waits for any child, never steals a status std expects.
//! Who waits for what is recorded under the state lock before it is
//! released, so the reaper always knows whose status it got.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::unit_file::{self, ExecLine, KillMode, Restart, ServiceType, UnitFile};
use super::{ExecSpec, LOG_DIR, Request, Response, SOCKET, UNIT_DIR};
use crate::hosts::cgroups;
use crate::hosts::error::Error;
use crate::hosts::sys;

/// What services see in their environment before their own settings.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// systemd's default start limit: more automatic restarts than this within
/// the interval fail the unit. Starts asked for by `systemctl` are not
/// counted, so tests may restart a unit as often as they like.
const START_LIMIT_BURST: usize = 5;
const START_LIMIT_INTERVAL: Duration = Duration::from_secs(10);
/// How long a stop waits after SIGKILL before giving up on the process.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// The unit sshd's processes are accounted to, as on a Debian machine.
const SSHD_UNIT: &str = "ssh.service";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Active {
    Inactive,
    Activating,
    Running,
    /// A oneshot with `RemainAfterExit=yes` whose commands succeeded.
    Exited,
    /// Waiting out `RestartSec=` before an automatic restart.
    AutoRestart,
    Failed,
}

impl Active {
    /// systemd's `ActiveState` and `SubState`.
    pub fn states(self) -> (&'static str, &'static str) {
        match self {
            Active::Inactive => ("inactive", "dead"),
            Active::Activating => ("activating", "start"),
            Active::Running => ("active", "running"),
            Active::Exited => ("active", "exited"),
            Active::AutoRestart => ("activating", "auto-restart"),
            Active::Failed => ("failed", "failed"),
        }
    }

    pub fn is_active(self) -> bool {
        matches!(self, Active::Running | Active::Exited)
    }
}

/// A unit file as read from disk, with what it was read from so that a
/// change on disk can be noticed (and, as with systemd, ignored until
/// `daemon-reload`).
#[derive(Clone, Debug)]
pub struct Loaded {
    pub file: UnitFile,
    pub path: PathBuf,
    sources: Vec<(PathBuf, Option<SystemTime>)>,
}

impl Loaded {
    pub fn changed_on_disk(&self, name: &str) -> bool {
        match read_sources(name) {
            Ok(Some((_, sources))) => sources != self.sources,
            _ => true,
        }
    }
}

#[derive(Debug)]
pub struct Unit {
    pub loaded: Option<Loaded>,
    pub active: Active,
    pub main_pid: Option<i32>,
    /// The wait status of the last main process that ended.
    pub last_exit: Option<i32>,
    /// systemd's `Result`: `success`, `exit-code`, `signal`, ...
    pub result: &'static str,
    pub since: SystemTime,
    pub n_restarts: u32,
    stopping: bool,
    auto_restarts: VecDeque<Instant>,
    /// Bumped by every start and stop so that a pending automatic restart
    /// can tell it has been overtaken.
    generation: u64,
}

impl Unit {
    pub fn new() -> Unit {
        Unit {
            loaded: None,
            active: Active::Inactive,
            main_pid: None,
            last_exit: None,
            result: "success",
            since: SystemTime::now(),
            n_restarts: 0,
            stopping: false,
            auto_restarts: VecDeque::new(),
            generation: 0,
        }
    }

    fn set(&mut self, active: Active, result: &'static str) {
        self.active = active;
        self.result = result;
        self.since = SystemTime::now();
    }
}

pub enum LoadError {
    NotFound,
    Bad(String),
}

#[derive(Default)]
pub struct State {
    pub units: BTreeMap<String, Unit>,
    /// Exit statuses of short-lived processes someone is waiting for.
    awaited: HashMap<i32, Option<i32>>,
    sshd_pid: Option<i32>,
}

impl State {
    /// The unit, reading its file if it is not loaded yet.
    pub fn load(&mut self, name: &str) -> Result<&mut Unit, LoadError> {
        if self.units.get(name).is_none_or(|u| u.loaded.is_none()) {
            let loaded = read_unit(name)
                .map_err(LoadError::Bad)?
                .ok_or(LoadError::NotFound)?;
            self.units
                .entry(name.to_owned())
                .or_insert_with(Unit::new)
                .loaded = Some(loaded);
        }
        self.units.get_mut(name).ok_or(LoadError::NotFound)
    }

    fn main_pid(&self, name: &str) -> Option<i32> {
        self.units.get(name).and_then(|u| u.main_pid)
    }
}

/// A failed job: what `systemctl` prints on stderr and exits with.
#[derive(Debug)]
pub struct JobError {
    pub code: u8,
    pub message: String,
}

impl JobError {
    fn new(code: u8, message: String) -> JobError {
        JobError { code, message }
    }

    fn failed(name: &str, why: &str) -> JobError {
        JobError::new(
            1,
            format!(
                "Job for {name} failed because {why}.\nSee \"systemctl status {name}\" and \
                 \"journalctl -xeu {name}\" for details."
            ),
        )
    }
}

pub struct Manager {
    state: Mutex<State>,
    changed: Condvar,
    /// One job at a time, as systemd's job queue would mostly have it.
    jobs: Mutex<()>,
    sshd: Vec<String>,
    /// The host's cgroup root; each unit's processes go to
    /// `<root>/system.slice/<unit>`. `None`: no cgroups, process groups only.
    cgroup_root: Option<String>,
}

impl Manager {
    /// Starts reaping, sshd and the `systemctl` socket.
    pub fn launch(sshd: Vec<String>, cgroup_root: Option<String>) -> Result<Arc<Manager>, Error> {
        let manager = Arc::new(Manager {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            jobs: Mutex::new(()),
            sshd,
            cgroup_root,
        });
        let socket_dir = Path::new(SOCKET).parent().unwrap_or(Path::new("/run"));
        fs::create_dir_all(socket_dir).map_err(Error::io(socket_dir))?;
        let listener = UnixListener::bind(SOCKET).map_err(Error::io(SOCKET))?;
        let thread = |step: &str| {
            let step = format!("start the {step} thread");
            move |source| Error::HostSetup { step, source }
        };
        let reaper = Arc::clone(&manager);
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reaper.reap())
            .map_err(thread("reaper"))?;
        {
            let mut state = manager.lock();
            manager.spawn_sshd(&mut state);
        }
        let server = Arc::clone(&manager);
        std::thread::Builder::new()
            .name("systemctl".into())
            .spawn(move || server.serve(listener))
            .map_err(thread("systemctl socket"))?;
        Ok(manager)
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take the whole host down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn job(&self) -> MutexGuard<'_, ()> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|p| p.into_inner())
    }

    /// Starts what `systemctl enable` linked into a target, as at boot, in
    /// the order their `After=` and `Before=` ask for.
    pub fn start_enabled_units(self: &Arc<Self>) {
        for name in boot_order(enabled_units()) {
            if let Err(e) = self.start(&name) {
                eprintln!("kok-testhost init: starting {name} at boot: {}", e.message);
            }
        }
    }

    pub fn start(self: &Arc<Self>, name: &str) -> Result<(), JobError> {
        let _job = self.job();
        self.start_locked(name)
    }

    pub fn stop(self: &Arc<Self>, name: &str) -> Result<(), JobError> {
        let _job = self.job();
        self.stop_locked(name)
    }

    /// Restarts `name`, and with it the active units that require it
    /// (`Requires=`, `BindsTo=`), as systemd propagates a restart.
    pub fn restart(self: &Arc<Self>, name: &str) -> Result<(), JobError> {
        let _job = self.job();
        let dependents = self.active_dependents(name);
        self.stop_locked(name)?;
        self.start_locked(name)?;
        for dependent in dependents.iter().rev() {
            self.start_locked(dependent)?;
        }
        Ok(())
    }

    /// Re-reads every loaded unit's files. Units whose file is gone are
    /// forgotten unless something of theirs still runs.
    pub fn daemon_reload(&self) {
        let _job = self.job();
        let mut state = self.lock();
        state.units.retain(|name, unit| match read_unit(name) {
            Ok(Some(loaded)) => {
                unit.loaded = Some(loaded);
                true
            }
            Ok(None) | Err(_) => unit.main_pid.is_some(),
        });
    }

    /// `systemctl kill`: signals the unit's processes, all of them as
    /// `--kill-whom=all` (the default) does.
    pub fn kill(&self, name: &str, signal: libc::c_int) -> Result<(), JobError> {
        let state = self.lock();
        match state.main_pid(name) {
            Some(pid) => {
                signal_service(pid, signal);
                self.signal_cgroup(name, signal);
                Ok(())
            }
            None => Err(JobError::new(
                1,
                format!("Failed to kill unit {name}: No main process to kill"),
            )),
        }
    }

    pub fn reset_failed(&self, name: Option<&str>) {
        let mut state = self.lock();
        for (unit_name, unit) in state.units.iter_mut() {
            if name.is_none_or(|n| n == unit_name) && unit.active == Active::Failed {
                unit.set(Active::Inactive, "success");
            }
        }
    }

    fn start_locked(self: &Arc<Self>, name: &str) -> Result<(), JobError> {
        self.start_with_dependencies(name, &mut Vec::new())
    }

    /// Starts what `name` requires and wants first (`chain`: the units
    /// whose start led here, so a cycle ends), then `name`. A required unit
    /// that is missing fails the start; one that fails to start fails it
    /// when `name` is ordered after it, as under systemd.
    fn start_with_dependencies(
        self: &Arc<Self>,
        name: &str,
        chain: &mut Vec<String>,
    ) -> Result<(), JobError> {
        if chain.iter().any(|c| c == name) {
            return Ok(());
        }
        let dependencies = {
            let mut state = self.lock();
            match state.load(name) {
                Ok(unit) => unit.loaded.as_ref().map(|l| {
                    (
                        l.file.requires.clone(),
                        l.file.wants.clone(),
                        l.file.after.clone(),
                    )
                }),
                Err(_) => None,
            }
        };
        if let Some((requires, wants, after)) = dependencies {
            chain.push(name.to_owned());
            let mut failed = None;
            for dependency in requires.iter().filter(|d| is_service(d)) {
                if matches!(read_unit(dependency), Ok(None)) {
                    failed = Some(JobError::new(
                        5,
                        format!("Failed to start {name}: Unit {dependency} not found."),
                    ));
                    break;
                }
                if self.start_with_dependencies(dependency, chain).is_err()
                    && after.contains(dependency)
                {
                    failed = Some(JobError::new(
                        1,
                        format!(
                            "A dependency job for {name} failed. See 'journalctl -xe' for details."
                        ),
                    ));
                    break;
                }
            }
            if failed.is_none() {
                for dependency in wants.iter().filter(|d| is_service(d)) {
                    if matches!(read_unit(dependency), Ok(Some(_))) {
                        let _ = self.start_with_dependencies(dependency, chain);
                    }
                }
            }
            chain.pop();
            if let Some(error) = failed {
                return Err(error);
            }
        }
        self.start_unit(name)
    }

    fn start_unit(self: &Arc<Self>, name: &str) -> Result<(), JobError> {
        let file = {
            let mut state = self.lock();
            let unit = state.load(name).map_err(|e| match e {
                LoadError::NotFound => {
                    JobError::new(5, format!("Failed to start {name}: Unit {name} not found."))
                }
                LoadError::Bad(why) => JobError::new(
                    1,
                    format!(
                        "Failed to start {name}: Unit {name} has a bad unit file setting.\n{why}"
                    ),
                ),
            })?;
            let Some(file) = unit.loaded.as_ref().map(|l| l.file.clone()) else {
                return Err(JobError::new(5, format!("Unit {name} not found.")));
            };
            if matches!(
                unit.active,
                Active::Running | Active::Exited | Active::Activating
            ) {
                return Ok(());
            }
            unit.generation += 1;
            unit.set(Active::Activating, "success");
            file
        };
        let result = self.activate(name, &file);
        if result.is_err() {
            // Whatever stopped it on the way, the unit must not stay activating.
            if let Some(unit) = self.lock().units.get_mut(name)
                && unit.active == Active::Activating
            {
                unit.set(Active::Failed, "resources");
            }
        }
        result
    }

    fn activate(&self, name: &str, file: &UnitFile) -> Result<(), JobError> {
        let env = service_environment(file).map_err(|why| {
            self.finish_failed(name, "resources", &why);
            JobError::failed(name, "of unavailable resources or another system error")
        })?;
        self.run_all(name, &file.exec_start_pre, &env, file, "ExecStartPre")?;
        match file.service_type {
            ServiceType::Simple => {
                let line = file.main_command().map_err(|why| {
                    self.finish_failed(name, "resources", &why);
                    JobError::new(1, format!("Failed to start {name}: {why}"))
                })?;
                let mut state = self.lock();
                let pid = self.spawn(&mut state, name, line, &env, file)?;
                if let Some(unit) = state.units.get_mut(name) {
                    unit.main_pid = Some(pid);
                    unit.stopping = false;
                    unit.set(Active::Running, "success");
                }
            }
            ServiceType::Oneshot => {
                self.run_all(name, &file.exec_start, &env, file, "ExecStart")?;
                let done = if file.remain_after_exit {
                    Active::Exited
                } else {
                    Active::Inactive
                };
                if let Some(unit) = self.lock().units.get_mut(name) {
                    unit.set(done, "success");
                }
            }
        }
        Ok(())
    }

    /// Runs `lines` one after the other, each to completion; the first that
    /// fails (and may not) fails the unit.
    fn run_all(
        &self,
        name: &str,
        lines: &[ExecLine],
        env: &HashMap<String, String>,
        file: &UnitFile,
        setting: &str,
    ) -> Result<(), JobError> {
        for line in lines {
            let status = self.run_to_completion(name, line, env, file)?;
            if !exited_cleanly(status) && !line.ignore_failure {
                let why = format!("{setting}= process exited, {}", describe(status));
                self.finish_failed(name, "exit-code", &why);
                return Err(JobError::failed(
                    name,
                    "the control process exited with error code",
                ));
            }
        }
        Ok(())
    }

    fn finish_failed(&self, name: &str, result: &'static str, why: &str) {
        append_log(name, &format!("{name}: {why}\n"));
        if let Some(unit) = self.lock().units.get_mut(name) {
            unit.set(Active::Failed, result);
        }
    }

    /// Stops `name`, after the active units that require it (`Requires=`,
    /// `BindsTo=`), as systemd propagates a stop.
    fn stop_locked(&self, name: &str) -> Result<(), JobError> {
        for dependent in self.active_dependents(name) {
            self.stop_unit(&dependent)?;
        }
        self.stop_unit(name)
    }

    /// Active units that require `name`, directly or through others; those
    /// further away first, the order to stop them in.
    fn active_dependents(&self, name: &str) -> Vec<String> {
        let state = self.lock();
        let requires = |unit: &Unit, of: &str| {
            unit.loaded
                .as_ref()
                .is_some_and(|l| l.file.requires.iter().any(|r| r == of))
        };
        let mut found: Vec<String> = Vec::new();
        fn visit(
            state: &State,
            of: &str,
            found: &mut Vec<String>,
            requires: &dyn Fn(&Unit, &str) -> bool,
        ) {
            for (other, unit) in &state.units {
                let active = !matches!(unit.active, Active::Inactive | Active::Failed);
                if active && requires(unit, of) && !found.contains(other) {
                    found.push(other.clone());
                    visit(state, other, found, requires);
                }
            }
        }
        visit(&state, name, &mut found, &requires);
        found.retain(|n| n != name);
        // Discovery order is nearest first; stop the furthest first.
        found.reverse();
        found
    }

    fn stop_unit(&self, name: &str) -> Result<(), JobError> {
        let mut state = self.lock();
        let Some(unit) = state.units.get_mut(name) else {
            return match read_unit(name) {
                Ok(Some(_)) => Ok(()),
                _ => Err(JobError::new(
                    5,
                    format!("Failed to stop {name}: Unit {name} not loaded."),
                )),
            };
        };
        unit.generation += 1;
        let (timeout, kill_mode) = unit
            .loaded
            .as_ref()
            .map_or((Duration::from_secs(90), KillMode::ControlGroup), |l| {
                (l.file.timeout_stop, l.file.kill_mode)
            });
        let Some(pid) = unit.main_pid else {
            if unit.active != Active::Failed {
                unit.set(Active::Inactive, "success");
            }
            drop(state);
            // What a oneshot or an ended main process left behind.
            if kill_mode != KillMode::Process {
                self.signal_cgroup(name, libc::SIGKILL);
            }
            return Ok(());
        };
        unit.stopping = true;
        self.signal_for_stop(name, pid, kill_mode, libc::SIGTERM);
        let still_running = |s: &mut State| s.main_pid(name) == Some(pid);
        let (mut state, _) = self
            .changed
            .wait_timeout_while(state, timeout, still_running)
            .unwrap_or_else(|p| p.into_inner());
        if still_running(&mut state) {
            self.signal_for_stop(name, pid, kill_mode, libc::SIGKILL);
            state = self
                .changed
                .wait_timeout_while(state, KILL_WAIT, still_running)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if let Some(unit) = state.units.get_mut(name) {
            unit.stopping = false;
            if unit.main_pid.is_none() {
                unit.set(Active::Inactive, "success");
            }
        }
        Ok(())
    }

    /// The signal a stop sends: to the main process only with
    /// `KillMode=process` and `mixed` (whose other processes get SIGKILL
    /// once the main one is gone), to every process of the unit otherwise.
    fn signal_for_stop(&self, name: &str, pid: i32, mode: KillMode, signal: libc::c_int) {
        match mode {
            KillMode::ControlGroup => {
                signal_service(pid, signal);
                self.signal_cgroup(name, signal);
            }
            KillMode::Mixed | KillMode::Process => {
                let _ = sys::kill(pid, signal);
            }
        }
    }

    /// The unit's cgroup, when the host has cgroups.
    pub fn unit_cgroup(&self, name: &str) -> Option<String> {
        self.cgroup_root
            .as_ref()
            .map(|root| cgroups::unit_cgroup(root, name))
    }

    /// Signals every process in the unit's cgroup (none without cgroups).
    fn signal_cgroup(&self, name: &str, signal: libc::c_int) {
        let Some(cgroup) = self.unit_cgroup(name) else {
            return;
        };
        for pid in cgroups::processes(&cgroup) {
            let _ = sys::kill(pid, signal);
        }
    }

    fn exec_spec(&self, unit: &str, workdir: &Path, file: Option<&UnitFile>) -> ExecSpec {
        ExecSpec {
            unit: unit.to_owned(),
            workdir: workdir.to_owned(),
            cgroup: self.unit_cgroup(unit),
            limits: file.map(|f| f.limits.clone()).unwrap_or_default(),
        }
    }

    /// Starts one of a unit's processes. The caller holds the state lock and
    /// records the pid before releasing it.
    fn spawn(
        &self,
        _state: &mut MutexGuard<'_, State>,
        name: &str,
        line: &ExecLine,
        env: &HashMap<String, String>,
        file: &UnitFile,
    ) -> Result<i32, JobError> {
        let (program, argv) = unit_file::expand(line, env);
        let workdir = file
            .working_directory
            .clone()
            .unwrap_or_else(|| PathBuf::from("/"));
        let log = open_log(name).map_err(|e| JobError::new(1, e))?;
        let spec = self.exec_spec(name, &workdir, Some(file));
        let mut command = exec_command(&spec, &program, &argv);
        command.env_clear().envs(env);
        spawn_logged(command, log)
            .map_err(|e| JobError::new(1, format!("Failed to start {name}: {e}")))
    }

    fn run_to_completion(
        &self,
        name: &str,
        line: &ExecLine,
        env: &HashMap<String, String>,
        file: &UnitFile,
    ) -> Result<i32, JobError> {
        let mut state = self.lock();
        let pid = self.spawn(&mut state, name, line, env, file)?;
        state.awaited.insert(pid, None);
        loop {
            if let Some(Some(status)) = state.awaited.get(&pid).copied() {
                state.awaited.remove(&pid);
                return Ok(status);
            }
            state = self.wait(state);
        }
    }

    fn spawn_sshd(self: &Arc<Self>, state: &mut State) {
        let [program, args @ ..] = self.sshd.as_slice() else {
            return;
        };
        let mut argv = vec![program.clone()];
        argv.extend(args.iter().cloned());
        let spec = self.exec_spec(SSHD_UNIT, Path::new("/"), None);
        let mut command = exec_command(&spec, program, &argv);
        command
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null());
        match command.spawn() {
            Ok(child) => state.sshd_pid = i32::try_from(child.id()).ok(),
            Err(e) => eprintln!("kok-testhost init: cannot start sshd: {e}"),
        }
    }

    /// Waits for every child and orphan of init, for as long as the host lives.
    fn reap(self: Arc<Self>) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid pointer to an int.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid <= 0 {
                // No child right now (sshd is between restarts): poll.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            self.exited(pid, status);
        }
    }

    fn exited(self: &Arc<Self>, pid: i32, status: i32) {
        let mut state = self.lock();
        if state.sshd_pid == Some(pid) {
            state.sshd_pid = None;
            eprintln!(
                "kok-testhost init: sshd exited ({}), restarting it",
                describe(status)
            );
            let manager = Arc::clone(self);
            // Not at once, in case it fails at startup every time.
            detach("sshd restart", move || {
                std::thread::sleep(Duration::from_millis(500));
                let mut state = manager.lock();
                manager.spawn_sshd(&mut state);
            });
        } else if let Some(slot) = state.awaited.get_mut(&pid) {
            *slot = Some(status);
        } else if let Some((name, unit)) = state
            .units
            .iter_mut()
            .find(|(_, u)| u.main_pid == Some(pid))
        {
            self.main_process_exited(name.clone(), unit, pid, status);
        }
        self.changed.notify_all();
    }

    fn main_process_exited(self: &Arc<Self>, name: String, unit: &mut Unit, pid: i32, status: i32) {
        unit.main_pid = None;
        unit.last_exit = Some(status);
        // Whatever the main process left behind in its group and cgroup goes
        // with it, unless the unit keeps them (`KillMode=process`).
        let kill_mode = unit
            .loaded
            .as_ref()
            .map_or(KillMode::ControlGroup, |l| l.file.kill_mode);
        if kill_mode != KillMode::Process {
            let _ = sys::kill(-pid, libc::SIGKILL);
            self.signal_cgroup(&name, libc::SIGKILL);
        }
        if unit.stopping {
            unit.set(Active::Inactive, "success");
            return;
        }
        let clean = exited_cleanly(status) || killed_cleanly(status);
        let result = if clean {
            "success"
        } else if libc::WIFEXITED(status) {
            "exit-code"
        } else {
            "signal"
        };
        append_log(
            &name,
            &format!("{name}: Main process exited, {}\n", describe(status)),
        );
        let policy = unit
            .loaded
            .as_ref()
            .map(|l| (l.file.restart, l.file.restart_sec));
        let restart_after = match policy {
            Some((Restart::Always, after)) => Some(after),
            Some((Restart::OnFailure, after)) if !clean => Some(after),
            _ => None,
        };
        let Some(after) = restart_after else {
            unit.set(
                if clean {
                    Active::Inactive
                } else {
                    Active::Failed
                },
                result,
            );
            return;
        };
        let now = Instant::now();
        while unit
            .auto_restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > START_LIMIT_INTERVAL)
        {
            unit.auto_restarts.pop_front();
        }
        if unit.auto_restarts.len() >= START_LIMIT_BURST {
            append_log(
                &name,
                &format!("{name}: Start request repeated too quickly.\n"),
            );
            unit.set(Active::Failed, "start-limit-hit");
            return;
        }
        unit.auto_restarts.push_back(now);
        unit.set(Active::AutoRestart, result);
        let generation = unit.generation;
        let manager = Arc::clone(self);
        detach("restart timer", move || {
            std::thread::sleep(after);
            manager.auto_restart(&name, generation);
        });
    }

    fn auto_restart(self: &Arc<Self>, name: &str, generation: u64) {
        let _job = self.job();
        {
            let mut state = self.lock();
            let Some(unit) = state.units.get_mut(name) else {
                return;
            };
            if unit.generation != generation || unit.active != Active::AutoRestart {
                return;
            }
            unit.n_restarts += 1;
            unit.active = Active::Inactive;
        }
        if let Err(e) = self.start_locked(name) {
            append_log(name, &format!("{}\n", e.message));
        }
    }

    fn serve(self: Arc<Self>, listener: UnixListener) {
        for stream in listener.incoming().flatten() {
            let manager = Arc::clone(&self);
            detach("systemctl request", move || manager.answer(stream));
        }
    }

    fn answer(self: Arc<Self>, mut stream: UnixStream) {
        let mut request = Vec::new();
        if stream.read_to_end(&mut request).is_err() {
            return;
        }
        let response = match serde_json::from_slice::<Request>(&request) {
            Ok(request) => super::commands::run(&self, &request.tool, &request.args),
            Err(e) => Response {
                code: 1,
                stderr: format!("bad request: {e}\n"),
                ..Response::default()
            },
        };
        if let Ok(bytes) = serde_json::to_vec(&response) {
            let _ = stream.write_all(&bytes);
        }
    }
}

/// Runs `work` on a thread of its own. Not being able to start one is
/// logged rather than fatal: init must keep reaping whatever happens.
fn detach(what: &str, work: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name(what.into()).spawn(work) {
        eprintln!("kok-testhost init: cannot start a {what} thread: {e}");
    }
}

/// `kok-testhost exec SPEC PROGRAM ARGV0 ARGS...` through this binary.
fn exec_command(spec: &ExecSpec, program: &str, argv: &[String]) -> Command {
    let argv0 = argv.first().map_or(program, String::as_str);
    let mut command = Command::new("/proc/self/exe");
    command
        .arg("exec")
        .arg(serde_json::to_string(spec).unwrap_or_default())
        .arg(program)
        .arg(argv0)
        .args(argv.iter().skip(1));
    command
}

fn spawn_logged(mut command: Command, log: File) -> std::io::Result<i32> {
    let err = log.try_clone()?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()?;
    i32::try_from(child.id()).map_err(std::io::Error::other)
}

/// SIGTERM or SIGKILL to the service's process group, and to the process
/// itself in case it has not made its group yet.
fn signal_service(pid: i32, signal: libc::c_int) {
    let _ = sys::kill(-pid, signal);
    let _ = sys::kill(pid, signal);
}

fn exited_cleanly(status: i32) -> bool {
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// systemd counts these signals as a clean end, not a failure.
fn killed_cleanly(status: i32) -> bool {
    libc::WIFSIGNALED(status)
        && matches!(
            libc::WTERMSIG(status),
            libc::SIGHUP | libc::SIGINT | libc::SIGTERM | libc::SIGPIPE
        )
}

/// As systemd words it: `code=exited, status=1/FAILURE`.
pub fn describe(status: i32) -> String {
    if libc::WIFEXITED(status) {
        let code = libc::WEXITSTATUS(status);
        let name = match code {
            0 => "SUCCESS",
            200 => "CHDIR",
            203 => "EXEC",
            205 => "LIMITS",
            219 => "CGROUP",
            _ => "FAILURE",
        };
        format!("code=exited, status={code}/{name}")
    } else {
        let signal = libc::WTERMSIG(status);
        format!("code=killed, status={signal}/{}", signal_name(signal))
    }
}

pub fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGHUP => "HUP",
        libc::SIGINT => "INT",
        libc::SIGQUIT => "QUIT",
        libc::SIGABRT => "ABRT",
        libc::SIGKILL => "KILL",
        libc::SIGSEGV => "SEGV",
        libc::SIGPIPE => "PIPE",
        libc::SIGTERM => "TERM",
        libc::SIGUSR1 => "USR1",
        libc::SIGUSR2 => "USR2",
        _ => "UNKNOWN",
    }
}

fn service_environment(file: &UnitFile) -> Result<HashMap<String, String>, String> {
    let mut env = HashMap::from([("PATH".to_owned(), DEFAULT_PATH.to_owned())]);
    env.extend(file.environment.iter().cloned());
    for source in &file.environment_files {
        match fs::read_to_string(&source.path) {
            Ok(text) => env.extend(unit_file::parse_environment_file(&text)),
            Err(_) if source.optional => {}
            Err(e) => {
                return Err(format!(
                    "Failed to load environment files: {}: {e}",
                    source.path.display()
                ));
            }
        }
    }
    Ok(env)
}

pub fn log_path(name: &str) -> PathBuf {
    Path::new(LOG_DIR).join(format!("{name}.log"))
}

fn open_log(name: &str) -> Result<File, String> {
    let path = log_path(name);
    File::options()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn append_log(name: &str, line: &str) {
    if let Ok(mut log) = open_log(name) {
        let _ = log.write_all(line.as_bytes());
    }
}

type Sources = Vec<(PathBuf, Option<SystemTime>)>;

/// The unit file and its drop-ins, in the order they apply.
fn read_sources(name: &str) -> Result<Option<(PathBuf, Sources)>, String> {
    let path = Path::new(UNIT_DIR).join(name);
    if !path.exists() {
        return Ok(None);
    }
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut sources = vec![(path.clone(), mtime(&path))];
    let drop_ins = Path::new(UNIT_DIR).join(format!("{name}.d"));
    if let Ok(entries) = fs::read_dir(&drop_ins) {
        let mut confs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        confs.sort();
        sources.extend(confs.into_iter().map(|p| {
            let t = mtime(&p);
            (p, t)
        }));
    }
    Ok(Some((path, sources)))
}

pub fn read_unit(name: &str) -> Result<Option<Loaded>, String> {
    let Some((path, sources)) = read_sources(name)? else {
        return Ok(None);
    };
    let mut texts = Vec::new();
    for (source, _) in &sources {
        texts.push(fs::read_to_string(source).map_err(|e| format!("{}: {e}", source.display()))?);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let file = UnitFile::parse(&refs).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(Loaded {
        file,
        path,
        sources,
    }))
}

/// Directories holding `systemctl enable`'s links: `multi-user.target.wants`
/// and the like.
pub fn link_dirs() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(UNIT_DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(".wants") || n.ends_with(".requires"))
        })
        .collect()
}

/// The links that make `name` enabled.
pub fn enablement_links(name: &str) -> Vec<PathBuf> {
    link_dirs()
        .into_iter()
        .map(|dir| dir.join(name))
        .filter(|link| link.symlink_metadata().is_ok())
        .collect()
}

/// Only services are units here; targets and the like are always reached.
fn is_service(name: &str) -> bool {
    name.ends_with(".service")
}

/// `names` ordered so that each comes after the units it is `After=` and
/// before those it is `Before=` (among `names`); ties and cycles keep the
/// names' order.
fn boot_order(names: BTreeSet<String>) -> Vec<String> {
    let files: BTreeMap<String, UnitFile> = names
        .iter()
        .filter_map(|n| Some((n.clone(), read_unit(n).ok()??.file)))
        .collect();
    let must_follow = |a: &str, b: &str| {
        // a comes after b
        files.get(a).is_some_and(|f| f.after.iter().any(|x| x == b))
            || files
                .get(b)
                .is_some_and(|f| f.before.iter().any(|x| x == a))
    };
    let mut pending: Vec<String> = names.into_iter().collect();
    let mut order = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let ready = pending
            .iter()
            .position(|a| !pending.iter().any(|b| b != a && must_follow(a, b)))
            .unwrap_or(0);
        order.push(pending.remove(ready));
    }
    order
}

fn enabled_units() -> BTreeSet<String> {
    link_dirs()
        .iter()
        .filter_map(|dir| fs::read_dir(dir).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.ends_with(".service"))
        .collect()
}
