//! Command-line structure and the commands themselves.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use kok_common::client::ClientArgs;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::cluster::ComponentStatus;
use kube_on_kube_api::{Cluster, Machine};
use serde::Serialize;

use crate::table;

/// Manage kube-on-kube business clusters and their machines.
///
/// Talks to the meta-cluster for clusters and to a business cluster for
/// machines, with the usual kubeconfig flags.
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
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// The fleet view: version, health and endpoint of every business cluster.
    List {
        /// List Clusters in every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
enum MachineCommand {
    /// Every Machine with its phase, Node and installed kubelet.
    List {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// How objects are printed.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// An aligned table.
    Table,
    /// The objects as YAML.
    Yaml,
    /// The objects as JSON.
    Json,
}

impl Cli {
    /// Run the selected command.
    pub async fn run(self) -> anyhow::Result<()> {
        let client = self
            .client
            .client()
            .await
            .context("connect to the cluster (check --kubeconfig and --context)")?;
        match self.command {
            Command::Cluster(ClusterCommand::List {
                all_namespaces,
                output,
            }) => {
                let api: Api<Cluster> = if all_namespaces {
                    Api::all(client)
                } else {
                    namespaced(client, self.namespace.as_deref())
                };
                let list = api.list(&ListParams::default()).await.context(
                    "list Clusters (are the kube-on-kube CRDs installed in this cluster?)",
                )?;
                print(output, &list.items, cluster_row, &CLUSTER_HEADER)
            }
            Command::Machine(MachineCommand::List { output }) => {
                let list = Api::<Machine>::all(client)
                    .list(&ListParams::default())
                    .await
                    .context(
                        "list Machines (is this a business cluster with the node-operator CRDs?)",
                    )?;
                print(output, &list.items, machine_row, &MACHINE_HEADER)
            }
        }
    }
}

fn namespaced(client: Client, namespace: Option<&str>) -> Api<Cluster> {
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::default_namespaced(client),
    }
}

fn print<T: Serialize>(
    output: Output,
    items: &[T],
    row: fn(&T) -> Vec<String>,
    header: &[&str],
) -> anyhow::Result<()> {
    match output {
        Output::Table => print!(
            "{}",
            table::render(header, &items.iter().map(row).collect::<Vec<_>>())
        ),
        Output::Yaml => print!("{}", serde_norway::to_string(items)?),
        Output::Json => println!("{}", serde_json::to_string_pretty(items)?),
    }
    Ok(())
}

const CLUSTER_HEADER: [&str; 8] = [
    "NAMESPACE",
    "NAME",
    "VERSION",
    "MODE",
    "PHASE",
    "READY",
    "APISERVER",
    "ENDPOINT",
];

fn cluster_row(c: &Cluster) -> Vec<String> {
    let status = c.status.clone().unwrap_or_default();
    let ready = status.condition("Ready").map(|x| x.status.clone());
    let apiserver = status
        .components
        .map(|x| x.api_server)
        .map(|ComponentStatus { ready, .. }| ready);
    vec![
        c.namespace().unwrap_or_default(),
        c.name_any(),
        c.spec.version.clone(),
        format!("{:?}", c.spec.mode),
        status
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "-".into()),
        ready.unwrap_or_else(|| "-".into()),
        apiserver.unwrap_or_else(|| "-".into()),
        status.endpoint.unwrap_or_else(|| "-".into()),
    ]
}

const MACHINE_HEADER: [&str; 6] = ["NAME", "IP", "PHASE", "NODE", "KUBELET", "CANARY"];

fn machine_row(m: &Machine) -> Vec<String> {
    let status = m.status.clone().unwrap_or_default();
    vec![
        m.name_any(),
        m.spec.ip.clone(),
        status
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "-".into()),
        status.node_name.unwrap_or_else(|| "-".into()),
        status
            .installed
            .get("kubelet")
            .map(|p| p.version.clone())
            .unwrap_or_else(|| "-".into()),
        status.canary.unwrap_or_else(|| "-".into()),
    ]
}
