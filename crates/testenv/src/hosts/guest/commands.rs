//! The `systemctl` and `journalctl` command lines the service manager
//! answers: the verbs and options installers and tests use, with systemd's
//! wording and exit codes where callers look at them (`is-active` exits 3
//! for an inactive unit, `status` 4 for an unknown one).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::manager::{self, Active, JobError, LoadError, Manager, Unit};
use super::{Response, UNIT_DIR};

/// Options after the verb, and the unit names.
#[derive(Default)]
struct Args {
    names: Vec<String>,
    quiet: bool,
    now: bool,
    value: bool,
    properties: Vec<String>,
    signal: Option<String>,
    lines: Option<usize>,
    units: Vec<String>,
}

impl Args {
    fn parse(args: &[String]) -> Result<Args, String> {
        let mut parsed = Args::default();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if arg.starts_with("--") => (flag, Some(value.to_owned())),
                _ => (arg.as_str(), None),
            };
            let mut value = |flag: &str| {
                inline
                    .clone()
                    .or_else(|| iter.next().cloned())
                    .ok_or_else(|| format!("option '{flag}' requires an argument"))
            };
            match flag {
                "-q" | "--quiet" => parsed.quiet = true,
                "--now" => parsed.now = true,
                "--value" => parsed.value = true,
                "-p" | "--property" => parsed
                    .properties
                    .extend(value(flag)?.split(',').map(str::to_owned)),
                "-s" | "--signal" => parsed.signal = Some(value(flag)?),
                "-n" | "--lines" => {
                    parsed.lines = Some(
                        value(flag)?
                            .parse()
                            .map_err(|_| "bad line count".to_owned())?,
                    )
                }
                "-u" | "--unit" => parsed.units.push(value(flag)?),
                // Output and behaviour switches that change nothing here.
                "--no-pager" | "--no-block" | "--system" | "-l" | "--full" | "--no-legend"
                | "--plain" | "-a" | "--all" | "--no-ask-password" | "-b" | "--boot" | "-x"
                | "-e" | "--no-hostname" | "--no-reload" | "-f" | "--force" => {}
                "-o" | "--output" => {
                    value(flag)?;
                }
                _ if flag.starts_with("-n") && flag[2..].parse::<usize>().is_ok() => {
                    parsed.lines = flag[2..].parse().ok();
                }
                _ if flag.starts_with('-') && flag.len() > 1 => {
                    return Err(format!("unrecognized option '{flag}'"));
                }
                _ => parsed.names.push(arg.clone()),
            }
        }
        Ok(parsed)
    }
}

#[derive(Default)]
struct Output {
    code: u8,
    stdout: String,
    stderr: String,
}

impl Output {
    fn fail(&mut self, code: u8, message: &str) {
        self.code = self.code.max(code);
        self.stderr.push_str(message);
        self.stderr.push('\n');
    }

    fn job(&mut self, result: Result<(), JobError>) {
        if let Err(e) = result {
            self.fail(e.code, &e.message);
        }
    }
}

pub fn run(manager: &Arc<Manager>, tool: &str, args: &[String]) -> Response {
    let mut out = Output::default();
    match Args::parse(args) {
        Ok(args) if tool == "journalctl" => journalctl(&args, &mut out),
        Ok(args) => systemctl(manager, args, &mut out),
        Err(e) => out.fail(1, &format!("{tool}: {e}")),
    }
    Response {
        code: out.code,
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

/// `foo` means `foo.service`; other unit types do not exist here.
fn unit_name(arg: &str) -> Result<String, String> {
    if arg.contains('/') || arg.is_empty() {
        return Err(format!("Invalid unit name \"{arg}\""));
    }
    match arg.rsplit_once('.') {
        None => Ok(format!("{arg}.service")),
        Some((_, "service")) => Ok(arg.to_owned()),
        Some((_, kind)) => Err(format!(
            "Unit type .{kind} is not supported by the test host's service manager"
        )),
    }
}

fn systemctl(manager: &Arc<Manager>, mut args: Args, out: &mut Output) {
    if args.names.is_empty() {
        out.fail(
            1,
            "Listing units is not supported by the test host's service manager.",
        );
        return;
    }
    let verb = args.names.remove(0);
    let mut names = Vec::new();
    for arg in &args.names {
        match unit_name(arg) {
            Ok(name) => names.push(name),
            Err(e) => return out.fail(1, &e),
        }
    }
    let needs_units = !matches!(
        verb.as_str(),
        "daemon-reload" | "reset-failed" | "daemon-reexec"
    );
    if needs_units && names.is_empty() {
        return out.fail(1, &format!("Too few arguments for {verb}."));
    }
    match verb.as_str() {
        "start" => names.iter().for_each(|n| out.job(manager.start(n))),
        "stop" => names.iter().for_each(|n| out.job(manager.stop(n))),
        "restart" | "reload-or-restart" | "force-reload" => {
            names.iter().for_each(|n| out.job(manager.restart(n)))
        }
        "try-restart" | "condrestart" | "try-reload-or-restart" => {
            for name in &names {
                if unit_state(manager, name).is_some_and(|(active, _)| active.is_active()) {
                    out.job(manager.restart(name));
                }
            }
        }
        "kill" => {
            let signal = match parse_signal(args.signal.as_deref().unwrap_or("TERM")) {
                Ok(signal) => signal,
                Err(e) => return out.fail(1, &e),
            };
            names.iter().for_each(|n| out.job(manager.kill(n, signal)));
        }
        "daemon-reload" | "daemon-reexec" => manager.daemon_reload(),
        "reset-failed" => match names.as_slice() {
            [] => manager.reset_failed(None),
            names => names.iter().for_each(|n| manager.reset_failed(Some(n))),
        },
        "is-active" | "is-failed" => {
            let want_failed = verb == "is-failed";
            let mut any = false;
            for name in &names {
                let active = unit_state(manager, name).map_or(Active::Inactive, |(a, _)| a);
                let matched = if want_failed {
                    active == Active::Failed
                } else {
                    active.is_active()
                };
                any |= matched;
                if !args.quiet {
                    let _ = writeln!(out.stdout, "{}", active.states().0);
                }
            }
            out.code = match (any, want_failed) {
                (true, _) => 0,
                (false, false) => 3,
                (false, true) => 1,
            };
        }
        "is-enabled" => {
            let mut any = false;
            for name in &names {
                match unit_file_state(name) {
                    Some(state) => {
                        any |= state != "disabled";
                        if !args.quiet {
                            let _ = writeln!(out.stdout, "{state}");
                        }
                    }
                    None => out.fail(
                        1,
                        &format!(
                            "Failed to get unit file state for {name}: No such file or directory"
                        ),
                    ),
                }
            }
            if !any {
                out.code = out.code.max(1);
            }
        }
        "enable" => {
            for name in &names {
                enable(name, out);
            }
            if args.now {
                names.iter().for_each(|n| out.job(manager.start(n)));
            }
        }
        "disable" => {
            for name in &names {
                for link in manager::enablement_links(name) {
                    if fs::remove_file(&link).is_ok() {
                        let _ = writeln!(out.stderr, "Removed \"{}\".", link.display());
                    }
                }
            }
            if args.now {
                names.iter().for_each(|n| out.job(manager.stop(n)));
            }
        }
        "status" => {
            let mut code = 0;
            for name in &names {
                code = code.max(status(manager, name, args.lines.unwrap_or(10), out));
            }
            out.code = out.code.max(code);
        }
        "show" => {
            for (i, name) in names.iter().enumerate() {
                if i > 0 && !args.value {
                    out.stdout.push('\n');
                }
                show(manager, name, &args, out);
            }
        }
        "cat" => {
            for name in &names {
                cat(name, out);
            }
        }
        other => out.fail(1, &format!("Unknown command verb '{other}'.")),
    }
}

fn parse_signal(text: &str) -> Result<libc::c_int, String> {
    let name = text.trim_start_matches("SIG");
    if let Ok(number) = name.parse() {
        return Ok(number);
    }
    [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGKILL,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ]
    .into_iter()
    .find(|s| manager::signal_name(*s) == name)
    .ok_or_else(|| format!("Failed to parse signal string {text}."))
}

/// The unit's state and main pid, loading it if its file exists (as
/// systemd does when asked about a unit it has not loaded yet).
fn unit_state(manager: &Manager, name: &str) -> Option<(Active, Option<i32>)> {
    let mut state = manager.lock();
    match state.load(name) {
        Ok(unit) => Some((unit.active, unit.main_pid)),
        Err(_) => state.units.get(name).map(|u| (u.active, u.main_pid)),
    }
}

/// `enabled`, `disabled`, or `static` (nothing to enable it into).
fn unit_file_state(name: &str) -> Option<&'static str> {
    let loaded = manager::read_unit(name).ok()??;
    Some(if !manager::enablement_links(name).is_empty() {
        "enabled"
    } else if loaded.file.wanted_by.is_empty() && loaded.file.required_by.is_empty() {
        "static"
    } else {
        "disabled"
    })
}

fn enable(name: &str, out: &mut Output) {
    let loaded = match manager::read_unit(name) {
        Ok(Some(loaded)) => loaded,
        Ok(None) => {
            return out.fail(
                1,
                &format!("Failed to enable unit: Unit file {name} does not exist."),
            );
        }
        Err(e) => return out.fail(1, &format!("Failed to enable unit: {e}")),
    };
    let file = &loaded.file;
    if file.wanted_by.is_empty() && file.required_by.is_empty() {
        let _ = writeln!(
            out.stderr,
            "The unit files have no installation config (WantedBy=, RequiredBy=, Also=,\n\
             Alias= settings in the [Install] section, and DefaultInstance= for template\n\
             units). This means they are not meant to be enabled or disabled using systemctl."
        );
        return;
    }
    let targets = file
        .wanted_by
        .iter()
        .map(|t| format!("{t}.wants"))
        .chain(file.required_by.iter().map(|t| format!("{t}.requires")));
    for dir in targets {
        let dir = Path::new(UNIT_DIR).join(dir);
        let link = dir.join(name);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        let made =
            fs::create_dir_all(&dir).and_then(|()| std::os::unix::fs::symlink(&loaded.path, &link));
        match made {
            Ok(()) => {
                let _ = writeln!(
                    out.stderr,
                    "Created symlink {} \u{2192} {}.",
                    link.display(),
                    loaded.path.display()
                );
            }
            Err(e) => out.fail(
                1,
                &format!("Failed to enable unit: {}: {e}", link.display()),
            ),
        }
    }
}

fn status(manager: &Manager, name: &str, lines: usize, out: &mut Output) -> u8 {
    let mut state = manager.lock();
    let load_error = state.load(name).err();
    let Some(unit) = state.units.get(name) else {
        out.fail(4, &format!("Unit {name} could not be found."));
        return 4;
    };
    let (active, sub) = unit.active.states();
    let dot = match unit.active {
        Active::Running | Active::Exited => '●',
        Active::Failed => '×',
        _ => '○',
    };
    let description = unit
        .loaded
        .as_ref()
        .and_then(|l| l.file.description.clone())
        .unwrap_or_else(|| name.to_owned());
    let s = &mut out.stdout;
    let _ = writeln!(s, "{dot} {name} - {description}");
    match (&unit.loaded, load_error) {
        (Some(loaded), _) => {
            let file_state = unit_file_state(name).unwrap_or("disabled");
            let _ = writeln!(
                s,
                "     Loaded: loaded ({}; {file_state}; preset: enabled)",
                loaded.path.display()
            );
            if loaded.changed_on_disk(name) {
                let _ = writeln!(
                    out.stderr,
                    "Warning: The unit file, source configuration file or drop-ins of {name} \
                     changed on disk. Run 'systemctl daemon-reload' to reload units."
                );
            }
        }
        (None, Some(LoadError::Bad(why))) => {
            let _ = writeln!(s, "     Loaded: bad-setting (Reason: {why})");
        }
        (None, _) => {
            let _ = writeln!(s, "     Loaded: not-found (Reason: Unit {name} not found.)");
        }
    }
    let result = match unit.active {
        Active::Failed => format!("(Result: {})", unit.result),
        _ => format!("({sub})"),
    };
    let _ = writeln!(
        s,
        "     Active: {active} {result} since {}; {} ago",
        format_time(unit.since),
        format_ago(unit.since)
    );
    if let Some(pid) = unit.main_pid {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let _ = writeln!(s, "   Main PID: {pid} ({})", comm.trim());
    } else if let Some(status) = unit.last_exit {
        let _ = writeln!(s, "    Process: ({})", manager::describe(status));
    }
    let tail = log_tail(name, lines);
    if !tail.is_empty() {
        s.push('\n');
        s.push_str(&tail);
    }
    if unit.active.is_active() { 0 } else { 3 }
}

fn show(manager: &Manager, name: &str, args: &Args, out: &mut Output) {
    let mut state = manager.lock();
    let load_state = match state.load(name) {
        Ok(_) => "loaded",
        Err(LoadError::NotFound) => "not-found",
        Err(LoadError::Bad(_)) => "bad-setting",
    };
    let fresh = Unit::new();
    let unit = state.units.get(name).unwrap_or(&fresh);
    let (active, sub) = unit.active.states();
    let (exit_code, exit_status) = match unit.last_exit {
        Some(s) if libc::WIFEXITED(s) => (1, libc::WEXITSTATUS(s)),
        Some(s) => (2, libc::WTERMSIG(s)),
        None => (0, 0),
    };
    let fragment: PathBuf = unit
        .loaded
        .as_ref()
        .map(|l| l.path.clone())
        .unwrap_or_default();
    let properties: Vec<(&str, String)> = vec![
        ("Id", name.to_owned()),
        (
            "Description",
            unit.loaded
                .as_ref()
                .and_then(|l| l.file.description.clone())
                .unwrap_or_else(|| name.to_owned()),
        ),
        ("LoadState", load_state.to_owned()),
        ("ActiveState", active.to_owned()),
        ("SubState", sub.to_owned()),
        ("Result", unit.result.to_owned()),
        ("MainPID", unit.main_pid.unwrap_or(0).to_string()),
        ("ExecMainPID", unit.main_pid.unwrap_or(0).to_string()),
        ("ExecMainCode", exit_code.to_string()),
        ("ExecMainStatus", exit_status.to_string()),
        ("NRestarts", unit.n_restarts.to_string()),
        (
            "UnitFileState",
            unit_file_state(name).unwrap_or("").to_owned(),
        ),
        ("FragmentPath", fragment.display().to_string()),
        (
            "ControlGroup",
            manager.unit_cgroup(name).unwrap_or_default(),
        ),
    ];
    let file = unit
        .loaded
        .as_ref()
        .map(|l| l.file.clone())
        .unwrap_or_default();
    let nofile = file.limits.iter().find(|l| l.resource == "NOFILE");
    let limit = |v: Option<u64>| v.map_or("infinity".to_owned(), |v| v.to_string());
    let properties = properties.into_iter().chain([
        ("KillMode", file.kill_mode.name().to_owned()),
        (
            "Delegate",
            if file.delegate { "yes" } else { "no" }.to_owned(),
        ),
        ("Requires", file.requires.join(" ")),
        ("Wants", file.wants.join(" ")),
        ("After", file.after.join(" ")),
        (
            "LimitNOFILE",
            nofile.map(|l| limit(l.hard)).unwrap_or_default(),
        ),
        (
            "LimitNOFILESoft",
            nofile.map(|l| limit(l.soft)).unwrap_or_default(),
        ),
    ]);
    for (key, value) in properties {
        if !args.properties.is_empty() && !args.properties.iter().any(|p| p == key) {
            continue;
        }
        if args.value {
            let _ = writeln!(out.stdout, "{value}");
        } else {
            let _ = writeln!(out.stdout, "{key}={value}");
        }
    }
}

fn cat(name: &str, out: &mut Output) {
    let loaded = match manager::read_unit(name) {
        Ok(Some(loaded)) => loaded,
        _ => return out.fail(1, &format!("No files found for {name}.")),
    };
    let mut files = vec![loaded.path.clone()];
    let drop_ins = Path::new(UNIT_DIR).join(format!("{name}.d"));
    if let Ok(entries) = fs::read_dir(drop_ins) {
        let mut confs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        confs.sort();
        files.extend(confs);
    }
    for (i, file) in files.iter().enumerate() {
        if i > 0 {
            out.stdout.push('\n');
        }
        let _ = writeln!(out.stdout, "# {}", file.display());
        out.stdout
            .push_str(&fs::read_to_string(file).unwrap_or_default());
    }
}

fn journalctl(args: &Args, out: &mut Output) {
    if args.units.is_empty() {
        out.fail(
            1,
            "journalctl: only -u UNIT is supported by the test host's service manager",
        );
        return;
    }
    for unit in &args.units {
        match unit_name(unit) {
            Ok(name) => out
                .stdout
                .push_str(&log_tail(&name, args.lines.unwrap_or(usize::MAX))),
            Err(e) => out.fail(1, &e),
        }
    }
    if out.stdout.is_empty() && out.code == 0 {
        out.stdout.push_str("-- No entries --\n");
    }
}

fn log_tail(name: &str, lines: usize) -> String {
    let text = fs::read_to_string(manager::log_path(name)).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    all[start..].iter().map(|l| format!("{l}\n")).collect()
}

fn format_time(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let Ok(secs) = libc::time_t::try_from(secs) else {
        return String::new();
    };
    // SAFETY: localtime_r fills the zeroed struct we own; strftime writes at
    // most buf.len() bytes and returns how many it wrote.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return String::new();
        }
        let mut buf = [0u8; 64];
        let len = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%a %Y-%m-%d %H:%M:%S %Z".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..len]).into_owned()
    }
}

fn format_ago(time: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(time)
        .map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}min {}s", secs / 60, secs % 60),
        _ => format!("{}h {}min", secs / 3600, secs % 3600 / 60),
    }
}
