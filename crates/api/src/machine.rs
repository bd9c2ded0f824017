//! `Machine`: one host that the node-operator turns into a Ready Node and keeps
//! that way.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::{DNS_SUBDOMAIN_PATTERN, OperationResult, SecretKeyRef};

/// A host and the Node it becomes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "Machine",
    status = "MachineStatus",
    shortname = "mach",
    category = "kok",
    doc = "A host the node-operator provisions over SSH (container runtime, CNI plugins, kubelet) into a Ready Node of this cluster, and keeps at its declared versions.",
    printcolumn(name = "IP", type_ = "string", json_path = ".spec.ip"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Kubelet",
        type_ = "string",
        json_path = ".status.installed.kubelet.version",
        description = "installed kubelet version"
    ),
    printcolumn(
        name = "Canary",
        type_ = "string",
        json_path = ".status.canary",
        priority = 1
    ),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".spec.zone",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// Host name the Node registers with; defaults to the Machine's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub hostname: Option<String>,
    /// Address the operator reaches the host at over SSH and the kubelet
    /// advertises. Cannot change: a host with a new address is a new Machine.
    #[schemars(length(min = 2, max = 45))]
    #[x_kube(
        validation = Rule::new("isIP(self)").message("ip must be an IPv4 or IPv6 address"),
        validation = Rule::new("self == oldSelf").message("ip cannot be changed; create a new Machine for a host with a new address")
    )]
    pub ip: String,
    /// Zone of the host; becomes the Node's `topology.kubernetes.io/zone` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub zone: Option<String>,
    /// Data centre (IDC) of the host; becomes the Node's `kubeonkube.io/idc` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub idc: Option<String>,
    /// How the operator logs in.
    pub ssh: SshSpec,
    /// Package overrides for this host: package name → PackageVersion name.
    /// Packages not listed follow the ClusterPackageVersion default.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message("package names must be lowercase DNS labels such as kubelet or containerd"))]
    pub packages: BTreeMap<String, String>,
    /// kubelet settings for this host's Node.
    #[serde(default)]
    pub kubelet: KubeletSpec,
    /// Kernel parameters applied on the host (`sysctl -w` and persisted), for
    /// example `vm.max_map_count: "262144"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-z0-9_]+([./][a-z0-9_-]+)+$'))").message("sysctl names look like vm.max_map_count or net.ipv4.ip_forward"))]
    pub sysctls: BTreeMap<String, String>,
}

/// SSH access to a host. The host key is pinned: the operator refuses to talk to
/// a host whose key differs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshSpec {
    /// User to log in as; it needs root or passwordless sudo.
    #[serde(default = "default_ssh_user")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z_][a-z0-9_-]*$"))]
    pub user: String,
    /// SSH port.
    #[serde(default = "default_ssh_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Secret key holding the private key (OpenSSH format).
    pub private_key_secret_ref: SecretKeyRef,
    /// The host's public key as in `known_hosts` without the host name, for
    /// example `ssh-ed25519 AAAAC3Nza…`.
    #[schemars(
        length(min = 16, max = 16384),
        regex(
            pattern = r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521|sk-ssh-ed25519@openssh.com) [A-Za-z0-9+/]+=*( .*)?$"
        )
    )]
    pub host_public_key: String,
}

fn default_ssh_user() -> String {
    "root".into()
}
fn default_ssh_port() -> i32 {
    22
}

/// kubelet settings rendered into its configuration file.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSpec {
    /// Labels put on the Node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Taints put on the Node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Resources reserved for Kubernetes daemons (`cpu`, `memory`,
    /// `ephemeral-storage`, `pid`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, Quantity>,
    /// Resources reserved for the operating system.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, Quantity>,
    /// Hard eviction thresholds, for example `memory.available: 500Mi`,
    /// `nodefs.available: 10%`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    /// Extra kubelet flags, `flag-name: value` without the leading dashes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
}

/// Observed state of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One-word summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// Reachable, PackagesInstalled, NodeReady, Ready and the like.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// What is installed and current on the host, by package name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message("installed package names must be lowercase DNS labels such as kubelet or containerd"))]
    pub installed: BTreeMap<String, InstalledPackage>,
    /// Name of the Node this Machine became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Facts gathered from the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostFacts>,
    /// The most recent operation and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// When the host was last visited and found (or left) as declared. The
    /// periodic check comes one re-check interval after it, also after the
    /// node-operator restarts or another replica takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checked_at: Option<Time>,
    /// The CanaryRelease that currently claims this Machine, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<String>,
}

/// One-word summary of a Machine's state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MachinePhase {
    /// Accepted; nothing done on the host yet.
    Pending,
    /// Installing packages and joining the Node.
    Provisioning,
    /// The Node is Ready with every package at its declared version.
    Ready,
    /// Moving a package to a new version.
    Upgrading,
    /// Remedying a fault (a stopped service, drift, a Node problem).
    Repairing,
    /// The last operation failed; it is retried with backoff.
    Failed,
    /// Draining and removing the Node and packages before the Machine goes.
    Deleting,
}

/// A package as installed on the host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstalledPackage {
    /// Version that `current` points at.
    pub version: String,
    /// PackageVersion it was installed from.
    pub package_version: String,
    /// Version kept as `previous` for a one-step rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Whether the last health check passed.
    #[serde(default)]
    pub healthy: bool,
}

/// Facts read from the host over SSH.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    /// CPU architecture as Go names it (`amd64`, `arm64`).
    pub arch: String,
    /// Operating system and release, from `/etc/os-release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// Kernel release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Host name the host reports.
    pub hostname: String,
}

/// The last operation on a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// Step name, for example `install kubelet 1.35.4` or `drain`.
    pub step: String,
    /// When it started.
    pub started_at: Time,
    /// When it ended, if it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How it ended.
    pub result: OperationResult,
    /// Human-readable outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last lines of the command output, secrets redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
}
