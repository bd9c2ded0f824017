//! The operator's own settings, set by its flags: where images come from,
//! the defaults a Cluster spec falls back to, what a spec may ask for beyond
//! them ([`Policy`]) and how much one read may return. Plain values, read by
//! every step; nothing here talks to an API.

use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::bounded::Limits;

/// Snapshot attempts of one namespace at once: half of what the backup
/// controller runs at once, so that one tenant's Clusters (asking again and
/// again, or on slow storage) always leave room for the others'.
pub const BACKUPS_PER_NAMESPACE: usize = 2;

/// First retry of a failed add-on step; it doubles up to [`ADDON_RETRY_MAX`].
/// Short, because the first attempts often meet a business API that has just
/// started (replicas Ready before every one is reachable) and answers
/// seconds later.
const ADDON_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const ADDON_RETRY_MAX: Duration = Duration::from_secs(300);

/// How long a crash-looping etcd member Pod may stay not ready before its
/// member is replaced, unless `--etcd-failed-after` says otherwise. Long
/// enough for a member that only waits on its peers, or a slow disk, to come
/// back on its own: a replacement throws its data away and copies it anew.
pub const ETCD_FAILED_AFTER: Duration = Duration::from_secs(300);

/// The snapshot gateway's image unless `--snapshot-gateway-image` says
/// otherwise: versitygw's upstream release the operator is tested with.
pub const DEFAULT_SNAPSHOT_GATEWAY_IMAGE: &str = "ghcr.io/versity/versitygw:v1.8.0";

/// Settings of the operator itself.
#[derive(Debug, Clone)]
pub struct Config {
    /// DNS domain of the meta-cluster (for Service names in certificates and URLs).
    pub meta_domain: String,
    /// Registry the component images come from.
    pub registry: String,
    /// etcd version used when the Cluster does not set one.
    pub etcd_version: String,
    /// Image of the node-operator each Cluster gets (default:
    /// `<registry>/node-operator:<operator version>`).
    pub node_operator_image: Option<String>,
    /// Image of the operator itself, run in a restoring Cluster's etcd Pods
    /// to download the snapshot (default:
    /// `<registry>/kube-on-kube-operator:<operator version>`).
    pub operator_image: Option<String>,
    /// Image of the snapshot gateway run on the claim of a Cluster whose
    /// snapshots go to a PersistentVolumeClaim (versitygw).
    pub snapshot_gateway_image: String,
    /// CPU and memory of each Cluster's node-operator
    /// (`--node-operator-resources`).
    pub node_operator_resources: ResourceRequirements,
    /// CPU and memory of each snapshot gateway
    /// (`--snapshot-gateway-resources`).
    pub snapshot_gateway_resources: ResourceRequirements,
    /// The meta-cluster's own networks, which no Machine may be in
    /// (`--meta-cluster-networks`).
    pub meta_networks: Vec<kok_common::network::Network>,
    /// The namespace the operator runs in (`--operator-namespace`, its Pod's):
    /// each Cluster's etcd admits clients from it. None (run outside the
    /// meta-cluster): no NetworkPolicy fences etcd, since the operator's own
    /// connections would not come from a namespace.
    pub operator_namespace: Option<String>,
    /// Namespace whose add-on template ConfigMaps every Cluster can use, besides
    /// its own namespace's.
    pub addon_template_namespace: Option<String>,
    /// First wait before a failed add-on step is tried again; it doubles up
    /// to [`ADDON_RETRY_MAX`] (or this wait, when longer).
    pub addon_retry: Duration,
    /// How long an etcd member Pod that has restarted
    /// [`crate::etcd::FAILED_RESTARTS`] times may stay not ready before it is
    /// judged failed (and its member replaced, or a roll stopped).
    pub etcd_failed_after: Duration,
    /// The images and hostPaths a Cluster may ask for beyond the defaults.
    pub policy: Policy,
    /// How much one list of a namespace may return.
    pub limits: Limits,
}

impl Config {
    /// The operator's own image (see [`Config::operator_image`]).
    pub fn operator_image(&self) -> String {
        self.operator_image.clone().unwrap_or_else(|| {
            format!(
                "{}/kube-on-kube-operator:{}",
                self.registry,
                env!("CARGO_PKG_VERSION")
            )
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            meta_domain: "cluster.local".into(),
            registry: "registry.k8s.io".into(),
            etcd_version: "3.6.16".into(),
            node_operator_image: None,
            operator_image: None,
            snapshot_gateway_image: DEFAULT_SNAPSHOT_GATEWAY_IMAGE.into(),
            node_operator_resources: crate::resources::parse(
                crate::resources::NODE_OPERATOR_DEFAULT,
            )
            .expect("the default parses"),
            snapshot_gateway_resources: crate::resources::parse(
                crate::resources::SNAPSHOT_GATEWAY_DEFAULT,
            )
            .expect("the default parses"),
            meta_networks: Vec::new(),
            addon_template_namespace: None,
            operator_namespace: None,
            addon_retry: ADDON_RETRY_FIRST,
            etcd_failed_after: ETCD_FAILED_AFTER,
            policy: Default::default(),
            limits: Default::default(),
        }
    }
}

/// What the operator's flags allow a Cluster spec beyond its defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Images allowed besides the repositories of the built-in defaults
    /// (see [`crate::policy::image_allowed`] for the forms).
    pub images: Vec<String>,
    /// Node directories under which `<prefix>/<namespace>` may hold a
    /// Cluster's etcd data; none: no hostPath is allowed.
    pub host_path_prefixes: Vec<String>,
    /// S3 endpoints etcd snapshots may go to; none: no Cluster may name one.
    pub backup_endpoints: Vec<String>,
    /// The shortest interval between scheduled snapshots.
    pub backup_min_interval: Duration,
    /// Whether snapshots may be written under any prefix of a bucket, not
    /// only under the Cluster's namespace.
    pub backup_any_prefix: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            images: Vec::new(),
            host_path_prefixes: Vec::new(),
            backup_endpoints: Vec::new(),
            backup_min_interval: Duration::from_secs(300),
            backup_any_prefix: false,
        }
    }
}
