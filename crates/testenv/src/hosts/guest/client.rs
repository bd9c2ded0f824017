//! `systemctl` and `journalctl` on a test host: they hand their command line
//! to the host's service manager and print what it answers.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use super::{Request, Response, SOCKET};

pub fn main(tool: &str, args: &[OsString]) -> ExitCode {
    match ask(tool, args) {
        Ok(response) => {
            print!("{}", response.stdout);
            eprint!("{}", response.stderr);
            let _ = std::io::stdout().flush();
            ExitCode::from(response.code)
        }
        Err(e) => {
            // What the real tools say on a machine without systemd as init.
            eprintln!(
                "System has not been booted with systemd as init system (PID 1). Can't operate.\n\
                 Failed to connect to the test host's service manager at {SOCKET}: {e}"
            );
            ExitCode::from(1)
        }
    }
}

fn ask(tool: &str, args: &[OsString]) -> std::io::Result<Response> {
    let request = Request {
        tool: tool.to_owned(),
        args: args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    };
    let mut stream = UnixStream::connect(SOCKET)?;
    stream.write_all(&serde_json::to_vec(&request)?)?;
    stream.shutdown(Shutdown::Write)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(serde_json::from_slice(&answer)?)
}
