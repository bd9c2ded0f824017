//! The kube-on-kube CLI: the fleet view of business clusters and machines for
//! people and CI systems, and the commands CI needs (create a cluster and wait
//! for it, print its kubeconfig, delete it). Installed as `kubectl-kok` (so
//! `kubectl kok …` works) and as `kokctl`.

pub mod backup;
pub mod canary;
pub mod cli;
pub mod cluster;
pub mod error;
pub mod machine;
pub mod output;
pub mod progress;
pub mod table;

pub use error::Error;

use clap::Parser;

/// Parse the command line, run the command, and turn errors into a message and
/// a non-zero exit status (2 for a timed-out wait, 1 otherwise).
pub fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
