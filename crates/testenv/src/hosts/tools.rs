//! Running the system tools hosts are made with (`ip`, `ssh-keygen`), with
//! their stderr in the error when they fail, since that is what says why.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use super::error::Error;

/// Runs `command` with `input` on its stdin; returns its stdout. `what`
/// names it in errors.
pub fn run(command: &mut Command, input: &str, what: &str) -> Result<String, Error> {
    let program = command.get_program().to_string_lossy().into_owned();
    let spawn_error = |source| Error::Spawn {
        program: program.clone(),
        source,
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A tool that exits early closes its stdin; its status says why.
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_error)?;
    if !out.status.success() {
        return Err(Error::Command {
            program: what.to_owned(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Generates an unencrypted ed25519 key pair at `path` and `path.pub`.
pub fn keygen(path: &Path, comment: &str) -> Result<(), Error> {
    let mut command = Command::new("ssh-keygen");
    command
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path);
    run(&mut command, "", "ssh-keygen").map(drop)
}
