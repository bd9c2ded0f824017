//! `kube-on-kube-operator`: runs the Cluster controller against the meta-cluster.

use clap::Parser;
use kok_common::client::ClientArgs;
use kok_common::duration::parse as parse_duration;
use kok_common::leader::pod_namespace;
use kok_common::operator::RuntimeArgs;
use kok_common::telemetry::LogArgs;

/// Runs business-cluster control planes as Pods in this meta-cluster: watches
/// Cluster objects and converges each one's etcd, kube-apiserver,
/// kube-controller-manager, kube-scheduler and add-ons to its spec.
///
/// Several replicas may run: they elect a leader with the Lease
/// `kube-on-kube-operator` (`kube-on-kube-operator-<namespace>` with
/// --namespace) in the Pod's namespace, and only the leader reconciles.
#[derive(Parser, Debug)]
#[command(version, after_help = kok_common::operator::AFTER_HELP)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Watch Clusters in this namespace only (default: all namespaces).
    #[arg(long, env = "KOK_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Clusters reconciled at the same time.
    #[arg(long, env = "KOK_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// DNS domain of this meta-cluster; control-plane Service names in
    /// certificates and kubeconfigs end with it.
    #[arg(long, env = "KOK_META_CLUSTER_DOMAIN", default_value = "cluster.local")]
    meta_cluster_domain: String,
    /// Registry of the control-plane images (`<registry>/kube-apiserver:v<version>`,
    /// `<registry>/etcd:<version>-0`, …) when a Cluster does not name an image.
    #[arg(long, env = "KOK_IMAGE_REGISTRY", default_value = "registry.k8s.io")]
    image_registry: String,
    /// etcd version of Clusters that do not set `spec.etcd.version`.
    #[arg(long, env = "KOK_ETCD_VERSION", default_value = "3.6.16")]
    etcd_version: String,
    /// Image of the node-operator run for each Cluster (default:
    /// `<image registry>/node-operator:<this operator's version>`). A Cluster
    /// can override it with `spec.addons[{name: node-operator}].values.image`.
    #[arg(long, env = "KOK_NODE_OPERATOR_IMAGE")]
    node_operator_image: Option<String>,
    /// The namespace this operator runs in (the chart passes its Pod's).
    /// Each Cluster gets a NetworkPolicy that lets only its own Pods and
    /// Pods of this namespace reach its etcd members. Unset (the operator
    /// runs outside the meta-cluster): no such NetworkPolicy.
    #[arg(long, env = "POD_NAMESPACE")]
    operator_namespace: Option<String>,
    /// Namespace whose ConfigMaps labelled `kubeonkube.io/addon-template`
    /// register add-on templates for every Cluster (each Cluster's own namespace
    /// is always searched first).
    #[arg(long, env = "KOK_ADDON_TEMPLATE_NAMESPACE")]
    addon_template_namespace: Option<String>,
    /// First wait before a failed add-on step (say, a business API that does
    /// not answer yet) is tried again, as `1s`, `1m`; each further failure
    /// doubles it, up to 5 minutes (or this wait, when longer). A retry is a
    /// whole reconcile of the Cluster.
    #[arg(long, env = "KOK_ADDON_RETRY", default_value = "1s", value_parser = parse_duration)]
    addon_retry: std::time::Duration,
    /// How long an etcd member Pod that has restarted 5 times may stay not
    /// ready before it is judged failed, as `30s`, `5m`: its member is then
    /// removed and added back on fresh data while the others keep a quorum,
    /// or, when a version roll has just restarted it, the roll stops with
    /// the member left on its data.
    #[arg(long, env = "KOK_ETCD_FAILED_AFTER", default_value = "5m", value_parser = parse_duration)]
    etcd_failed_after: std::time::Duration,
    /// Image of this operator, run in the etcd Pods of a Cluster restored
    /// from a snapshot to download it (default:
    /// `<image registry>/kube-on-kube-operator:<this operator's version>`).
    #[arg(long, env = "KOK_OPERATOR_IMAGE")]
    operator_image: Option<String>,
    /// Image of the snapshot gateway: for a Cluster whose snapshots go to a
    /// PersistentVolumeClaim (`spec.etcd.backup.pvc`), one Pod of this
    /// S3-compatible server (versitygw, `posix` backend) runs on the claim
    /// in the Cluster's namespace, and the operator stores snapshots
    /// through it.
    #[arg(long, env = "KOK_SNAPSHOT_GATEWAY_IMAGE", default_value = kube_on_kube_operator::config::DEFAULT_SNAPSHOT_GATEWAY_IMAGE)]
    snapshot_gateway_image: String,
    /// CPU and memory of the node-operator Pod run for each Cluster, as the
    /// container's `resources` in JSON: `requests` and `limits` of `cpu`,
    /// `memory` and `ephemeral-storage`; `limits.memory` is required. A
    /// tenant cannot change them.
    #[arg(long, env = "KOK_NODE_OPERATOR_RESOURCES", default_value = kube_on_kube_operator::resources::NODE_OPERATOR_DEFAULT, value_parser = kube_on_kube_operator::resources::parse)]
    node_operator_resources: k8s_openapi::api::core::v1::ResourceRequirements,
    /// CPU and memory of each snapshot gateway Pod, in the same form as
    /// --node-operator-resources.
    #[arg(long, env = "KOK_SNAPSHOT_GATEWAY_RESOURCES", default_value = kube_on_kube_operator::resources::SNAPSHOT_GATEWAY_DEFAULT, value_parser = kube_on_kube_operator::resources::parse)]
    snapshot_gateway_resources: k8s_openapi::api::core::v1::ResourceRequirements,
    /// The meta-cluster's own networks (its Pod and Service ranges, and any
    /// other it must keep to itself), comma-separated CIDRs. Each Cluster's
    /// node-operator refuses a Machine whose `spec.ip` is in one of them
    /// (`--refused-machine-networks`), so a tenant cannot point its SSH
    /// client at the services of the meta-cluster beside it.
    #[arg(long, env = "KOK_META_CLUSTER_NETWORKS", value_delimiter = ',')]
    meta_cluster_networks: Vec<kok_common::network::Network>,
    #[command(flatten)]
    policy: kube_on_kube_operator::policy::PolicyArgs,
    #[command(flatten)]
    limits: kube_on_kube_operator::bounded::LimitArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Download an etcd snapshot for a member to restore (the operator runs
    /// this in a restoring Cluster's etcd Pods, before `etcdutl snapshot
    /// restore`). The storage's keys come from KOK_S3_ACCESS_KEY_ID and
    /// KOK_S3_SECRET_ACCESS_KEY.
    RestoreSnapshot(RestoreSnapshot),
}

#[derive(clap::Args, Debug)]
struct RestoreSnapshot {
    /// The storage, `https://host[:port]`.
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    bucket: String,
    #[arg(long, default_value = "")]
    prefix: String,
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// PEM CA certificates to trust for the endpoint.
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// The snapshot's name.
    #[arg(long)]
    snapshot: String,
    /// The sha256 its manifest had when the restore began.
    #[arg(long)]
    sha256: String,
    /// Where to write it.
    #[arg(long)]
    out: std::path::PathBuf,
    /// A data directory to remove first (left by an interrupted restore).
    #[arg(long)]
    clear_data_dir: Option<std::path::PathBuf>,
    #[arg(long, env = "KOK_S3_ACCESS_KEY_ID", hide_env_values = true)]
    access_key_id: String,
    #[arg(long, env = "KOK_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret_access_key: String,
}

async fn restore_snapshot(a: RestoreSnapshot) -> anyhow::Result<()> {
    use kube_on_kube_operator::backup::{SnapshotStore, StoreConfig};
    let mut config = StoreConfig::new(
        a.endpoint.clone(),
        a.bucket,
        a.prefix,
        a.access_key_id,
        a.secret_access_key,
    );
    config.region = a.region;
    config.allow_http = a.endpoint.starts_with("http://");
    if let Some(path) = &a.ca_file {
        config.ca_pem = Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?,
        );
    }
    let store = SnapshotStore::new(&config)?;
    kube_on_kube_operator::backup::restore::fetch(
        &store,
        &a.snapshot,
        &a.sha256,
        &a.out,
        a.clear_data_dir.as_deref(),
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::RestoreSnapshot(restore)) = args.command {
        return restore_snapshot(restore).await;
    }
    args.log.init();
    // Listed on /metrics from the start, before any Cluster is reconciled.
    kube_on_kube_operator::metrics::domain();
    let client = args.client.connect("the meta-cluster").await?;
    let config = kube_on_kube_operator::config::Config {
        meta_domain: args.meta_cluster_domain,
        registry: args.image_registry,
        etcd_version: args.etcd_version,
        node_operator_image: args.node_operator_image,
        operator_image: args.operator_image,
        snapshot_gateway_image: args.snapshot_gateway_image,
        node_operator_resources: args.node_operator_resources,
        snapshot_gateway_resources: args.snapshot_gateway_resources,
        meta_networks: args.meta_cluster_networks,
        addon_template_namespace: args.addon_template_namespace,
        operator_namespace: args.operator_namespace.filter(|ns| !ns.is_empty()),
        addon_retry: args.addon_retry,
        etcd_failed_after: args.etcd_failed_after,
        policy: args.policy.policy(),
        limits: args.limits.limits(),
    };
    // Operators scoped to different namespaces do not compete for one Lease.
    let lease = match &args.namespace {
        Some(ns) => format!("kube-on-kube-operator-{ns}"),
        None => "kube-on-kube-operator".to_string(),
    };
    let controllers =
        kube_on_kube_operator::run(client.clone(), args.namespace, args.concurrency, config);
    kok_common::operator::run(&args.runtime, client, &pod_namespace(), &lease, controllers).await?;
    Ok(())
}
