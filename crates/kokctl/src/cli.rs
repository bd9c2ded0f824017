//! Command-line structure: flags and subcommands, and which module runs each.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kok_common::client::ClientArgs;
use kube::Client;
use kube_on_kube_api::canary::CanaryAction;
use kube_on_kube_api::cluster::{ClusterMode, ExposureType};

use crate::cluster::{self, CreateArgs};
use crate::error::Error;
use crate::output::Output;
use crate::{backup, canary, machine};

/// Manage kube-on-kube business clusters and their machines.
///
/// `cluster` commands talk to the meta-cluster (where Cluster objects live);
/// `machine` and `canary` commands talk to a business cluster (write its
/// kubeconfig with `cluster kubeconfig NAME --output-file F` and pass
/// `--kubeconfig F`).
///
/// Exit status: 0 on success, 2 when a --wait timed out, 1 on any other error.
#[derive(Parser, Debug)]
#[command(name = "kubectl-kok", bin_name = "kubectl kok", version)]
pub struct Cli {
    #[command(flatten)]
    client: ClientArgs,
    /// Namespace of the Clusters (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Business clusters (Cluster objects in the meta-cluster).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Hosts of a business cluster (Machine objects in it).
    #[command(subcommand)]
    Machine(MachineCommand),
    /// Canary releases of package versions in a business cluster.
    #[command(subcommand)]
    Canary(CanaryCommand),
}

/// `--timeout` values: Go-style durations.
fn duration(text: &str) -> Result<Duration, String> {
    kok_common::duration::parse(text).map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Create a business cluster, and with --wait wait until it is Ready,
    /// printing each condition as it turns True.
    Create {
        /// Name of the Cluster (at most 40 characters).
        name: String,
        /// Kubernetes version, for example 1.35.4 (default: the file's, else 1.35.4).
        #[arg(long)]
        version: Option<String>,
        /// Production (3 of everything) or Minimal (1 of everything)
        /// (default: the file's, else Production).
        #[arg(long, value_parser = parse_mode)]
        mode: Option<ClusterMode>,
        /// etcd storage: `emptyDir` or a claim size such as `10Gi` (default:
        /// the file's; else emptyDir for Minimal, 10Gi for Production).
        #[arg(long)]
        etcd_storage: Option<String>,
        /// Service type of the API's external endpoint: LoadBalancer,
        /// NodePort or ClusterIP (default: the file's, else LoadBalancer, so
        /// that kubelets and users outside the meta-cluster reach it).
        #[arg(long, value_parser = parse_exposure)]
        expose: Option<ExposureType>,
        /// Start from this Cluster manifest (YAML or JSON); NAME, the namespace
        /// and the flags above override its values.
        #[arg(long, short = 'f')]
        from: Option<PathBuf>,
        /// Wait until the Cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, as a duration (90s, 10m).
        #[arg(long, default_value = "10m", value_parser = duration)]
        timeout: Duration,
    },
    /// Print the kubeconfig of a business cluster's admin or of one of its
    /// spec.extraUsers, or write it to a file (mode 0600).
    Kubeconfig {
        /// Name of the Cluster.
        name: String,
        /// An extraUsers entry instead of the admin.
        #[arg(long)]
        user: Option<String>,
        /// Write it to this file instead of standard output.
        #[arg(long)]
        output_file: Option<PathBuf>,
        /// Use this API server URL instead of the Cluster's endpoint (for
        /// example a load balancer or Pod address reachable from here); the
        /// certificate is still checked against the endpoint's host name.
        #[arg(long)]
        server: Option<String>,
    },
    /// Delete a business cluster, and with --wait wait until it and every
    /// object it owned are gone.
    Delete {
        /// Name of the Cluster.
        name: String,
        /// Wait until the Cluster and its objects are gone.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, as a duration (90s, 10m).
        #[arg(long, default_value = "5m", value_parser = duration)]
        timeout: Duration,
    },
    /// The fleet view: version, health and endpoint of every business cluster.
    List {
        /// List Clusters in every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Take an etcd snapshot of a Cluster now, whatever its schedule, and
    /// wait for the operator's answer: the snapshot's name and size, or why
    /// it failed (exit status 1; 2 when no answer came in time). The Cluster
    /// must set spec.etcd.backup.
    Backup {
        /// Name of the Cluster.
        name: String,
        /// How long to wait for the answer.
        #[arg(long, default_value = "10m", value_parser = duration)]
        timeout: Duration,
    },
    /// List the etcd snapshots the operator keeps of a Cluster, newest
    /// first (from its status, as of its last snapshot).
    Snapshots {
        /// Name of the Cluster.
        name: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

fn parse_exposure(text: &str) -> Result<ExposureType, String> {
    match text.to_ascii_lowercase().as_str() {
        "loadbalancer" => Ok(ExposureType::LoadBalancer),
        "nodeport" => Ok(ExposureType::NodePort),
        "clusterip" => Ok(ExposureType::ClusterIP),
        _ => Err(format!("{text:?}: use LoadBalancer, NodePort or ClusterIP")),
    }
}

fn parse_mode(text: &str) -> Result<ClusterMode, String> {
    match text.to_ascii_lowercase().as_str() {
        "production" => Ok(ClusterMode::Production),
        "minimal" => Ok(ClusterMode::Minimal),
        _ => Err(format!("{text:?}: use Production or Minimal")),
    }
}

#[derive(Subcommand, Debug)]
enum MachineCommand {
    /// Every Machine with its phase, Node and installed kubelet.
    List {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// One Machine: packages, conditions and the last operation.
    Describe {
        /// Name of the Machine.
        name: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
enum CanaryCommand {
    /// Phase, batch and per-Machine results of a release.
    Status {
        /// Name of the CanaryRelease.
        name: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Finish the Machines in flight and start no new batch.
    Pause { name: String },
    /// Continue a paused or halted release.
    Resume { name: String },
    /// Make the release's target versions the cluster default.
    Promote { name: String },
    /// Return every upgraded Machine to its previous version.
    Rollback { name: String },
}

impl Cli {
    /// Run the selected command.
    pub async fn run(self) -> Result<(), Error> {
        let client: Client = self.client.client().await.map_err(Error::Connect)?;
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        match self.command {
            Command::Cluster(command) => match command {
                ClusterCommand::Create {
                    name,
                    version,
                    mode,
                    etcd_storage,
                    expose,
                    from,
                    wait,
                    timeout,
                } => {
                    let args = CreateArgs {
                        version,
                        mode,
                        etcd_storage,
                        expose,
                        from: from.as_deref().map(cluster::read_manifest).transpose()?,
                    };
                    cluster::create(client, &namespace, &name, &args, wait.then_some(timeout)).await
                }
                ClusterCommand::Kubeconfig {
                    name,
                    user,
                    output_file,
                    server,
                } => {
                    cluster::kubeconfig(
                        client,
                        &namespace,
                        &name,
                        user.as_deref(),
                        server.as_deref(),
                        output_file.as_ref(),
                    )
                    .await
                }
                ClusterCommand::Delete {
                    name,
                    wait,
                    timeout,
                } => cluster::delete(client, &namespace, &name, wait.then_some(timeout)).await,
                ClusterCommand::List {
                    all_namespaces,
                    output,
                } => {
                    let ns = (!all_namespaces).then_some(namespace.as_str());
                    cluster::list(client, ns, output).await
                }
                ClusterCommand::Backup { name, timeout } => {
                    backup::backup(client, &namespace, &name, timeout).await
                }
                ClusterCommand::Snapshots { name, output } => {
                    backup::snapshots(client, &namespace, &name, output).await
                }
            },
            Command::Machine(MachineCommand::List { output }) => {
                machine::list(client, output).await
            }
            Command::Machine(MachineCommand::Describe { name, output }) => {
                machine::describe(client, &name, output).await
            }
            Command::Canary(command) => {
                let (name, action) = match command {
                    CanaryCommand::Status { name, output } => {
                        return canary::status(client, &name, output).await;
                    }
                    CanaryCommand::Pause { name } => (name, CanaryAction::Pause),
                    CanaryCommand::Resume { name } => (name, CanaryAction::Resume),
                    CanaryCommand::Promote { name } => (name, CanaryAction::Promote),
                    CanaryCommand::Rollback { name } => (name, CanaryAction::Rollback),
                };
                canary::act(client, &name, action).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn create_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "kubectl-kok",
            "-n",
            "ci",
            "cluster",
            "create",
            "c1",
            "--mode",
            "minimal",
            "--expose",
            "nodeport",
            "--wait",
            "--timeout",
            "20s",
        ])
        .expect("parse");
        assert_eq!(cli.namespace.as_deref(), Some("ci"));
        match cli.command {
            Command::Cluster(ClusterCommand::Create {
                name,
                mode,
                expose,
                wait,
                timeout,
                ..
            }) => {
                assert_eq!(name, "c1");
                assert_eq!(mode, Some(ClusterMode::Minimal));
                assert_eq!(expose, Some(ExposureType::NodePort));
                assert!(wait);
                assert_eq!(timeout, Duration::from_secs(20));
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["kubectl-kok", "cluster", "create", "c", "--timeout", "5d"])
                .is_err()
        );
    }
}
