//! `node-operator`: runs the Machine, ClusterPackageVersion and CanaryRelease
//! controllers against one business cluster.

use std::time::Duration;

use clap::Parser;
use kok_common::client::ClientArgs;
use kok_common::duration::parse as parse_duration;
use kok_common::operator::RuntimeArgs;
use kok_common::telemetry::LogArgs;
use node_operator::Settings;
use node_operator::context::DEFAULT_SSH_KEY_NAMESPACE;
use node_operator::install::{Limits, parse_size};
use node_operator::repair::{Remediations, Rule, parse_rule};
use node_operator::ssh::Timeouts;

/// Turns Machine objects into Ready Nodes of a business cluster by installing
/// the container runtime, CNI plugins and kubelet over SSH, and keeps them at the
/// declared versions (cluster defaults, overrides and canary releases).
///
/// It usually runs in the meta-cluster, pointed at the business cluster with
/// --kubeconfig. Several replicas may run: they elect a leader with the Lease
/// `node-operator` in `kube-system` of the business cluster (the cluster it
/// writes to), and only the leader reconciles.
#[derive(Parser, Debug)]
#[command(version, after_help = kok_common::operator::AFTER_HELP)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Machines and CanaryReleases reconciled at the same time.
    #[arg(long, env = "KOK_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Hosts worked on over SSH at the same time (a bound on SSH sessions
    /// doing work; idle sessions are kept for reuse).
    #[arg(long, env = "KOK_SSH_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    ssh_concurrency: u16,
    /// SSH connect timeout (TCP plus handshake).
    #[arg(long, env = "KOK_SSH_CONNECT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    ssh_connect_timeout: Duration,
    /// Longest one step on a host may run (a download, a health check).
    #[arg(long, env = "KOK_SSH_STEP_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    ssh_step_timeout: Duration,
    /// How often an SSH connection is probed while nothing else crosses it;
    /// a host that leaves three probes in a row unanswered (gone, cut off)
    /// fails the step in flight as unreachable, so a lost host is noticed
    /// within about four of these.
    #[arg(long, env = "KOK_SSH_KEEPALIVE_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    ssh_keepalive_interval: Duration,
    /// How often a Ready Machine's host is re-checked over SSH: services
    /// active (else restarted), versions as declared (else reinstalled).
    #[arg(long, env = "KOK_RECHECK_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    recheck_interval: Duration,
    /// How long to wait for a Machine's Node to turn Ready after installing
    /// before the host is looked at again.
    #[arg(long, env = "KOK_NODE_WAIT", default_value = "2m", value_parser = parse_duration)]
    node_wait: Duration,
    /// Longest a drain (before an upgrade that requires it, or on delete) may
    /// take; Pods a PodDisruptionBudget protects are retried until then.
    #[arg(long, env = "KOK_DRAIN_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// First wait before a Machine whose reconcile failed (host unreachable,
    /// a download or an API call failed) is tried again; each further
    /// failure in a row doubles it, up to 5 minutes (or this wait, when
    /// longer). Updates of the Machine do not cut it short; a change of its
    /// spec is tried at once.
    #[arg(long, env = "KOK_RETRY_BACKOFF", default_value = "2s", value_parser = parse_duration)]
    retry_backoff: Duration,
    /// How long a deleted Machine's host may stay unreachable before the
    /// Machine is released without cleaning the host (with a Warning Event).
    #[arg(long, env = "KOK_OFFBOARD_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    offboard_timeout: Duration,
    /// `clusterDNS` rendered into kubelet configurations.
    #[arg(long, env = "KOK_CLUSTER_DNS", default_value = "10.96.0.10")]
    cluster_dns: String,
    /// `clusterDomain` rendered into kubelet configurations.
    #[arg(long, env = "KOK_CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    /// A Node-condition remediation, CONDITION=REMEDY, repeatable. REMEDY is
    /// restart:UNIT, command:SHELL (run on the host), reprovision or cordon;
    /// e.g. `DiskPressure=command:crictl rmi --prune`,
    /// `KernelDeadlock=cordon`.
    #[arg(long = "remediation", env = "KOK_REMEDIATIONS", value_delimiter = ';', value_parser = parse_rule)]
    remediations: Vec<Rule>,
    /// Largest artifact a host downloads (bytes, or with a unit: 512Mi,
    /// 2Gi, 1G). A larger one is refused and deleted; nothing is switched.
    #[arg(long, env = "KOK_MAX_ARTIFACT_SIZE", default_value = "1Gi", value_parser = parse_size)]
    max_artifact_size: u64,
    /// Largest total size of the files one archive unpacks to, read from its
    /// listing before anything is unpacked, so an archive that would fill
    /// the host's disk is refused whole.
    #[arg(long, env = "KOK_MAX_UNPACKED_SIZE", default_value = "4Gi", value_parser = parse_size)]
    max_unpacked_size: u64,
    /// Namespaces of the business cluster a Machine's
    /// `spec.ssh.privateKeySecretRef` may name, comma-separated. A Machine
    /// naming a Secret elsewhere is refused (condition Reachable=False,
    /// SecretMissing) with the same message as for a missing Secret.
    #[arg(long, env = "KOK_SSH_KEY_NAMESPACES", value_delimiter = ',', default_value = DEFAULT_SSH_KEY_NAMESPACE)]
    ssh_key_namespaces: Vec<String>,
    /// Networks no Machine's `spec.ip` may be in, comma-separated CIDRs:
    /// those of the network the operator itself runs in (a meta-cluster's
    /// Pod and Service ranges), so that a Machine cannot point the
    /// operator's SSH client at the services beside it. Such a Machine is
    /// refused (InvalidSpec) before any connection.
    #[arg(long, env = "KOK_REFUSED_MACHINE_NETWORKS", value_delimiter = ',')]
    refused_machine_networks: Vec<kok_common::network::Network>,
    /// Least time between two remediations of one Machine.
    #[arg(long, env = "KOK_REMEDIATION_COOLDOWN", default_value = "10m", value_parser = parse_duration)]
    remediation_cooldown: Duration,
    /// Most remediations running at once across the cluster.
    #[arg(long, env = "KOK_MAX_CONCURRENT_REMEDIATIONS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_remediations: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.log.init();
    // Listed on /metrics from the start, before any Machine is visited.
    node_operator::metrics::domain();
    let client = args.client.connect("the business cluster").await?;
    let settings = Settings {
        ssh_concurrency: usize::from(args.ssh_concurrency),
        ssh_timeouts: Timeouts {
            connect: args.ssh_connect_timeout,
            run: args.ssh_step_timeout,
            keepalive: args.ssh_keepalive_interval,
        },
        recheck: args.recheck_interval,
        node_wait: args.node_wait,
        drain_timeout: args.drain_timeout,
        retry_backoff: args.retry_backoff,
        offboard_timeout: args.offboard_timeout,
        cluster_dns: args.cluster_dns,
        cluster_domain: args.cluster_domain,
        limits: Limits {
            artifact_bytes: args.max_artifact_size,
            unpacked_bytes: args.max_unpacked_size,
        },
        ssh_key_namespaces: args.ssh_key_namespaces,
        refused_networks: args.refused_machine_networks,
    };
    let remediations = Remediations::new(
        args.remediations,
        args.remediation_cooldown,
        usize::from(args.max_concurrent_remediations),
    );
    let controllers =
        node_operator::run_with(client.clone(), args.concurrency, settings, remediations);
    kok_common::operator::run(
        &args.runtime,
        client,
        "kube-system",
        "node-operator",
        controllers,
    )
    .await?;
    Ok(())
}
