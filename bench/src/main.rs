//! `kok-bench`: the benchmarks of `bench/README.md`, one subcommand each.

mod backup;
mod canary;
mod cluster;
mod controlplane;
mod fleet;
mod measure;
mod packages;
mod peer;
mod plot;
mod provision;
mod steady;
mod workers;

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
    /// Apply 10, 100, 300 Clusters at once to a meta-cluster with simulated
    /// Pods and measure time to converged, operator CPU and memory.
    Fleet(fleet::Args),
    /// Upgrade N hosts' kubelet at maxUnavailable with node-operator and with
    /// an Ansible rolling upgrade: Machines per minute, and the time from a
    /// bad version's first failed health check to the halt.
    Canary(canary::Args),
    /// Create and delete Minimal and Production Clusters whose Pods run as
    /// real processes; time to a working business API and to deletion.
    Controlplane(controlplane::Args),
    /// Start the node-operator against 10,000 Machines that need nothing, with
    /// their kwok Nodes: time to reconcile all once, memory, SSH sessions
    /// opened, API requests per minute.
    Steady(steady::Args),
    /// Join N real worker nodes (containerd, runc, CNI plugins, kubelet on
    /// SSH test hosts) to a business cluster with node-operator and with an
    /// Ansible playbook: per worker, applied → Node Ready → first Pods
    /// Running, and the bytes each host moved.
    Workers(workers::Args),
    /// From nothing to a workload on N real worker nodes: a Cluster and N
    /// Machines with kube-on-kube, against `kubeadm init` and `kubeadm join`
    /// on SSH test hosts of the same kind.
    Cluster(cluster::Args),
    /// etcd snapshots into S3, restores into a new Cluster and rebuilds
    /// after losing every member, of a Production Cluster holding 1,000,
    /// 10,000 and 100,000 objects.
    Backup(backup::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Provision(args) => provision::run(args).await,
        Command::Fleet(args) => fleet::run(args).await,
        Command::Canary(args) => canary::run(args).await,
        Command::Controlplane(args) => controlplane::run(args).await,
        Command::Steady(args) => steady::run(args).await,
        Command::Workers(args) => workers::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
        Command::Backup(args) => backup::run(args).await,
    }
}

/// Appends `table` to `out`, when given.
fn append(out: Option<&std::path::Path>, table: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let Some(out) = out else { return Ok(()) };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    writeln!(file, "{table}")?;
    Ok(())
}
