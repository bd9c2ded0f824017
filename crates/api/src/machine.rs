//! `Machine`: one host that the node-operator turns into a Ready Node and keeps
//! that way.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::{
    DNS_SUBDOMAIN_PATTERN, LABEL_VALUE_PATTERN, OperationResult, SecretKeyRef, label_value_map,
    one_line_map, taints, threshold_map,
};

/// A host and the Node it becomes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "Machine",
    status = "MachineStatus",
    validation = Rule::new("size(self.metadata.name) <= 63").message("a Machine name may be at most 63 characters: its bootstrap token and its Node are labelled with it, and a label value has at most 63 characters"),
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
        // Not an address of the operator's own host or network: loopback,
        // link-local (cloud metadata services live there), unspecified or
        // multicast.
        validation = Rule::new("!isIP(self) || ip(self).isGlobalUnicast()").message("ip must be a unicast address of the host: not loopback, link-local (169.254.0.0/16, fe80::/10), unspecified or multicast"),
        validation = Rule::new("self == oldSelf").message("ip cannot be changed; create a new Machine for a host with a new address")
    )]
    pub ip: String,
    /// Zone of the host; becomes the Node's `topology.kubernetes.io/zone`
    /// label, so it is a label value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = LABEL_VALUE_PATTERN))]
    pub zone: Option<String>,
    /// Data centre (IDC) of the host; becomes the Node's `kubeonkube.io/idc`
    /// label, so it is a label value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = LABEL_VALUE_PATTERN))]
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
    /// example `vm.max_map_count: "262144"`. Only names on the allowlist
    /// (`docs/machine.md`, [`sysctl_allowed`]): others, such as
    /// `kernel.core_pattern`, run code as root. Values are one line.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "one_line_map")]
    #[x_kube(
        validation = Rule::new(r"self.all(k, k.matches('^(vm|net|fs[.]inotify)([.][a-z0-9_-]+)+$') || k in ['fs.file-max', 'fs.nr_open', 'fs.aio-max-nr', 'kernel.pid_max', 'kernel.threads-max', 'kernel.panic', 'kernel.panic_on_oops', 'kernel.keys.root_maxkeys', 'kernel.keys.root_maxbytes'])").message("sysctl names must be on the allowlist: vm.*, net.*, fs.inotify.*, fs.file-max, fs.nr_open, fs.aio-max-nr, kernel.pid_max, kernel.threads-max, kernel.panic, kernel.panic_on_oops, kernel.keys.root_maxkeys, kernel.keys.root_maxbytes (see docs/machine.md)")
    )]
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

/// kubelet settings rendered into its configuration file and unit. Every
/// value here ends up in a file on the host, so the rules below keep each to
/// its syntax and out of control characters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSpec {
    /// Labels put on the Node: label keys and values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "label_value_map")]
    #[x_kube(validation = Rule::new(r"self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$'))").message("node label keys are an optional DNS subdomain and /, then a name of at most 63 letters, digits, -, _ and . such as example.com/pool"))]
    pub node_labels: BTreeMap<String, String>,
    /// Taints put on the Node: label keys and values, and an effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "taints")]
    pub taints: Vec<Taint>,
    /// Resources reserved for Kubernetes daemons (`cpu`, `memory`,
    /// `ephemeral-storage`, `pid`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage', 'pid'])").message("reserved resources are cpu, memory, ephemeral-storage and pid"))]
    pub kube_reserved: BTreeMap<String, Quantity>,
    /// Resources reserved for the operating system (`cpu`, `memory`,
    /// `ephemeral-storage`, `pid`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage', 'pid'])").message("reserved resources are cpu, memory, ephemeral-storage and pid"))]
    pub system_reserved: BTreeMap<String, Quantity>,
    /// Hard eviction thresholds, for example `memory.available: 500Mi`,
    /// `nodefs.available: 10%`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "threshold_map")]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-z]+[.][a-zA-Z]+$'))").message("eviction signals look like memory.available or nodefs.inodesFree"))]
    pub eviction_hard: BTreeMap<String, String>,
    /// Extra kubelet flags, `flag-name: value` without the leading dashes.
    /// Values are one line of at most 4096 characters: the unit template
    /// quotes each as one argument.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "one_line_map")]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-z0-9][-a-z0-9]{0,62}$'))").message("kubelet flag names are lowercase letters, digits and - without the leading dashes, such as max-pods"))]
    pub extra_args: BTreeMap<String, String>,
}

/// Whether `sysctl -w name=…` may be run for a Machine: the names its
/// `spec.sysctls` rule allows (memory, networking and file-watch tunables and
/// a few kernel limits), and nothing that makes the kernel run a program
/// (`kernel.core_pattern`, `kernel.modprobe`, `kernel.hotplug`, …) or
/// weakens its protections (`fs.protected_*`, `fs.suid_dumpable`, …).
pub fn sysctl_allowed(name: &str) -> bool {
    const NAMES: [&str; 9] = [
        "fs.file-max",
        "fs.nr_open",
        "fs.aio-max-nr",
        "kernel.pid_max",
        "kernel.threads-max",
        "kernel.panic",
        "kernel.panic_on_oops",
        "kernel.keys.root_maxkeys",
        "kernel.keys.root_maxbytes",
    ];
    let under = |prefix: &str| {
        name.strip_prefix(prefix).is_some_and(|rest| {
            rest.split('.').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                    })
            })
        })
    };
    NAMES.contains(&name) || under("vm.") || under("net.") || under("fs.inotify.")
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

#[cfg(test)]
mod tests {
    use super::sysctl_allowed;

    #[test]
    fn sysctls_outside_the_allowlist_are_refused() {
        for ok in [
            "vm.max_map_count",
            "net.ipv4.ip_forward",
            "net.bridge.bridge-nf-call-iptables",
            "fs.inotify.max_user_watches",
            "kernel.pid_max",
        ] {
            assert!(sysctl_allowed(ok), "{ok}");
        }
        for bad in [
            "kernel.core_pattern",
            "kernel.modprobe",
            "kernel.hotplug",
            "fs.suid_dumpable",
            "vm",
            "vm.",
            "vm..x",
            "vm/../kernel/core_pattern",
            "net.ipv4/../../kernel/modprobe",
            "vm.Max",
            "fs.inotify",
        ] {
            assert!(!sysctl_allowed(bad), "{bad}");
        }
    }
}
