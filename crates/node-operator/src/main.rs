//! `node-operator`: runs the Machine, ClusterPackageVersion and CanaryRelease
//! controllers against one business cluster.

use clap::Parser;
use kok_common::client::ClientArgs;
use kok_common::telemetry::LogArgs;

/// Turns Machine objects into Ready Nodes of a business cluster by installing
/// the container runtime, CNI plugins and kubelet over SSH, and keeps them at the
/// declared versions (cluster defaults, overrides and canary releases).
///
/// It usually runs in the meta-cluster, pointed at the business cluster with
/// --kubeconfig.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    log: LogArgs,
    /// Machines and CanaryReleases reconciled at the same time.
    #[arg(long, env = "KOK_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.log.init();
    let client = args.client.connect("the business cluster").await?;
    node_operator::run(client, args.concurrency).await;
    Ok(())
}
