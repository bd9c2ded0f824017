//! The kube-on-kube CLI: the fleet view of business clusters and machines for
//! people and CI systems. Installed as `kubectl-kok` (so `kubectl kok …` works)
//! and as `kokctl`.

pub mod cli;
pub mod table;

use clap::Parser;

/// Parse the command line, run the command, and turn errors into a message and
/// a non-zero exit status.
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
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
