//! `kok-bench`: the benchmarks of `bench/README.md`, one subcommand each.

mod measure;
mod packages;
mod provision;

use clap::{Parser, Subcommand};

/// Benchmarks of kube-on-kube, run side by side with the tools users would
/// pick instead on the same machine. Results are printed as Markdown tables.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Install three packages on N SSH test hosts with node-operator and with
    /// an equivalent Ansible playbook, at the same parallelism.
    Provision(provision::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Provision(args) => provision::run(args).await,
    }
}
