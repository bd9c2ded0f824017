//! `kok-pod-exec SPEC.json` starts one container of a test Pod;
//! `kok-pod-exec --join PID ROOT ARGV…` runs a command inside a running one (exec
//! probes). See `kok_testenv::pods::exec`. Used by the test environment's Pod
//! runner.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--join") if args.len() >= 4 => {
            let Ok(pid) = args[1].parse::<u32>() else {
                eprintln!("kok-pod-exec: --join needs a PID, got {:?}", args[1]);
                return ExitCode::from(2);
            };
            let error =
                kok_testenv::pods::exec::join_and_exec(pid, Path::new(&args[2]), &args[3..]);
            eprintln!(
                "kok-pod-exec: cannot run {:?} in {pid}: {error}",
                &args[3..]
            );
            ExitCode::from(126)
        }
        Some(path) if args.len() == 1 => {
            let spec = match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<kok_testenv::pods::exec::Spec>(&b)
                        .map_err(|e| e.to_string())
                }) {
                Ok(spec) => spec,
                Err(e) => {
                    eprintln!("kok-pod-exec: cannot read {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            let error = kok_testenv::pods::exec::enter_and_exec(&spec);
            eprintln!("kok-pod-exec: cannot start {:?}: {error}", spec.argv);
            ExitCode::from(127)
        }
        _ => {
            eprintln!(
                "usage: kok-pod-exec SPEC.json | kok-pod-exec --join PID ROOT COMMAND [ARG…]"
            );
            ExitCode::from(2)
        }
    }
}
