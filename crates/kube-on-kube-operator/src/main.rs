//! `kube-on-kube-operator`: runs the Cluster controller against the meta-cluster.

use clap::Parser;
use kok_common::client::ClientArgs;
use kok_common::telemetry::LogArgs;

/// Runs business-cluster control planes as Pods in this meta-cluster: watches
/// Cluster objects and converges each one's etcd, kube-apiserver,
/// kube-controller-manager, kube-scheduler and add-ons to its spec.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    log: LogArgs,
    /// Watch Clusters in this namespace only (default: all namespaces).
    #[arg(long, env = "KOK_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Clusters reconciled at the same time.
    #[arg(long, env = "KOK_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.log.init();
    let client = args.client.client().await?;
    let version = client.apiserver_version().await?;
    tracing::info!(server = %version.git_version, namespace = ?args.namespace, "connected to the meta-cluster");
    kube_on_kube_operator::run(client, args.namespace.as_deref(), args.concurrency).await;
    Ok(())
}
