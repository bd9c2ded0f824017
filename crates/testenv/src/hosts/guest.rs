//! What runs inside a test host, all from the one `kok-testhost` binary: the
//! host's init (which stands in for systemd), the `systemctl` and
//! `journalctl` the host's users call, and the small wrapper every service
//! process starts through.
//!
//! None of it is product code: it gives node-operator a machine that behaves
//! like a systemd host without being one.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use serde::{Deserialize, Serialize};

mod boot;
mod client;
mod commands;
mod manager;
pub mod unit_file;

pub use boot::BootConfig;

/// Inside a host, its state directory on the machine (host key, sshd config,
/// the install paths' contents) appears here.
pub const STATE_MOUNT: &str = "/run/kok-testhost";
/// Where the service manager listens for `systemctl` and `journalctl`.
const SOCKET: &str = "/run/kok-systemd/socket";
/// Each unit's stdout and stderr, standing in for the journal.
const LOG_DIR: &str = "/run/kok-systemd/log";
/// Unit files, as on a systemd host; the other unit directories hold the
/// machine's own units, which a test host must not see.
const UNIT_DIR: &str = "/etc/systemd/system";
/// The exit statuses systemd reports when a unit's working directory,
/// program, resource limits or cgroup were unusable.
const EXIT_CHDIR: u8 = 200;
const EXIT_EXEC: u8 = 203;
const EXIT_LIMITS: u8 = 205;
const EXIT_CGROUP: u8 = 219;

/// A `systemctl` or `journalctl` invocation sent to the service manager.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    tool: String,
    args: Vec<String>,
}

/// What the invocation prints and exits with.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Response {
    code: u8,
    stdout: String,
    stderr: String,
}

/// Entry point of the `kok-testhost` binary; called as `systemctl` or
/// `journalctl` through the links each host has on its `PATH`.
pub fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let tool = std::path::Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let args: Vec<OsString> = args.collect();
    match tool.as_str() {
        "systemctl" | "journalctl" => client::main(&tool, &args),
        _ => match args.first().and_then(|a| a.to_str()) {
            Some("boot") => boot::main(args.get(1)),
            Some("exec") => exec_service(&args[1..]),
            _ => {
                eprintln!(
                    "kok-testhost: test host helper of kok-testenv; run as `systemctl`, \
                     `journalctl`, or by the test environment"
                );
                ExitCode::from(2)
            }
        },
    }
}

/// How a service process is set up before it runs its program: the first
/// argument of `kok-testhost exec`, as JSON.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ExecSpec {
    unit: String,
    workdir: PathBuf,
    /// The cgroup to move into (every hierarchy), when the host has them.
    cgroup: Option<String>,
    limits: Vec<unit_file::Limit>,
}

/// `exec SPEC PROGRAM ARGV0 ARGS...`: becomes a service process.
/// Every process the service manager starts goes through here rather than
/// being exec'd directly, for three reasons: it puts the service in a process
/// group and a cgroup of its own (so stopping it reaches its children), it
/// applies the unit's resource limits, and a program that cannot be run
/// becomes an exit status (200, 203, 205 or 219, as under systemd) instead
/// of a spawn error, which would race with the manager reaping the child.
fn exec_service(args: &[OsString]) -> ExitCode {
    let [spec, program, argv0, rest @ ..] = args else {
        eprintln!("kok-testhost exec: expected SPEC PROGRAM ARGV0 ARGS...");
        return ExitCode::from(EXIT_EXEC);
    };
    let spec: ExecSpec = match serde_json::from_str(&spec.to_string_lossy()) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("kok-testhost exec: bad SPEC: {e}");
            return ExitCode::from(EXIT_EXEC);
        }
    };
    let unit = &spec.unit;
    if let Err(e) = crate::sys::new_session() {
        eprintln!("{unit}: setsid: {e}");
    }
    if let Some(cgroup) = &spec.cgroup
        && let Err(e) = super::cgroups::join(cgroup)
    {
        eprintln!("{unit}: Failed to attach to cgroup {cgroup}: {e}");
        return ExitCode::from(EXIT_CGROUP);
    }
    for limit in &spec.limits {
        if let Err(e) = apply_limit(unit, limit) {
            eprintln!(
                "{unit}: Failed to adjust resource limit Limit{}=: {e}",
                limit.resource
            );
            return ExitCode::from(EXIT_LIMITS);
        }
    }
    if let Err(e) = std::env::set_current_dir(&spec.workdir) {
        eprintln!(
            "{unit}: Changing to the requested working directory failed: {}: {e}",
            spec.workdir.display()
        );
        return ExitCode::from(EXIT_CHDIR);
    }
    let error = Command::new(program).arg0(argv0).args(rest).exec();
    eprintln!(
        "{unit}: Failed to execute {}: {error}",
        program.to_string_lossy()
    );
    ExitCode::from(EXIT_EXEC)
}

/// Sets one resource limit as systemd does (its `setrlimit_closest`): when
/// the hard limit cannot be raised that far (root without
/// `CAP_SYS_RESOURCE`, as on hosts that are containers themselves), as
/// close as allowed. `infinity` for `NOFILE` is the kernel's `fs.nr_open`,
/// the most it accepts.
fn apply_limit(unit: &str, limit: &unit_file::Limit) -> std::io::Result<()> {
    let Some(&(_, resource)) = unit_file::LIMITS
        .iter()
        .find(|(name, _)| *name == limit.resource)
    else {
        return Err(std::io::Error::other("unknown resource"));
    };
    let infinity = if limit.resource == "NOFILE" {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        libc::RLIM_INFINITY
    };
    let soft = limit.soft.unwrap_or(infinity);
    let hard = limit.hard.unwrap_or(infinity);
    match crate::sys::setrlimit(resource, soft, hard) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let (_, highest) = crate::sys::getrlimit(resource)?;
            if highest == libc::RLIM_INFINITY {
                return Err(e);
            }
            let (soft, hard) = (soft.min(highest), hard.min(highest));
            eprintln!(
                "{unit}: Limit{}=: the hard limit cannot be raised above {highest} here; \
                 set to {soft}:{hard}",
                limit.resource
            );
            crate::sys::setrlimit(resource, soft, hard)
        }
        other => other,
    }
}
