//! What runs inside a test host, all from the one `kok-testhost` binary: the
//! host's init (which stands in for systemd), the `systemctl` and
//! `journalctl` the host's users call, and the small wrapper every service
//! process starts through.
//!
//! None of it is product code: it gives node-operator a machine that behaves
//! like a systemd host without being one.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
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
/// The exit statuses systemd reports when a unit's working directory or
/// program was unusable.
const EXIT_CHDIR: u8 = 200;
const EXIT_EXEC: u8 = 203;

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

/// `exec UNIT WORKDIR PROGRAM ARGV0 ARGS...`: becomes a service process.
/// Every process the service manager starts goes through here rather than
/// being exec'd directly, for two reasons: it puts the service in a process
/// group of its own (so stopping it reaches its children), and a program
/// that cannot be run becomes an exit status (200 or 203, as under systemd)
/// instead of a spawn error, which would race with the manager reaping the
/// child.
fn exec_service(args: &[OsString]) -> ExitCode {
    let [unit, workdir, program, argv0, rest @ ..] = args else {
        eprintln!("kok-testhost exec: expected UNIT WORKDIR PROGRAM ARGV0 ARGS...");
        return ExitCode::from(EXIT_EXEC);
    };
    let unit = unit.to_string_lossy();
    if let Err(e) = crate::sys::new_session() {
        eprintln!("{unit}: setsid: {e}");
    }
    if let Err(e) = std::env::set_current_dir(workdir) {
        eprintln!(
            "{unit}: Changing to the requested working directory failed: {}: {e}",
            workdir.to_string_lossy()
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
