//! `Cluster`: one business cluster's control plane, run as Pods in the
//! meta-cluster by the kube-on-kube-operator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaimSpec, ResourceRequirements,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::{DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, DURATION_PATTERN, VERSION_PATTERN};

/// The desired control plane of one business cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a Cluster name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit): its Services are named after it"),
    validation = Rule::new("size(self.metadata.name) <= 40").message("a Cluster name may be at most 40 characters: the names of its Services and Secrets are built from it"),
    validation = Rule::new("!self.metadata.name.matches('-(etcd|front-proxy)$')").message("a Cluster name may not end in -etcd or -front-proxy: its objects would take the names of another Cluster's (Cluster x-etcd's CA Secret would be x-etcd-ca, the etcd CA of Cluster x)"),
    validation = Rule::new("!self.metadata.name.matches('(^|-)kubeconfig(-|$)')").message("a Cluster name may not contain the segment kubeconfig: its objects would take the names of another Cluster's user kubeconfigs (Cluster x-kubeconfig's x-kubeconfig-sa is the kubeconfig of user sa of Cluster x)"),
    shortname = "kc",
    category = "kok",
    doc = "A business Kubernetes cluster whose control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and add-ons) runs as Pods in this meta-cluster.",
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.version",
        description = "Kubernetes version of the control plane"
    ),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Etcd",
        type_ = "string",
        json_path = ".status.components.etcd.ready",
        description = "ready/desired etcd members"
    ),
    printcolumn(
        name = "APIServer",
        type_ = "string",
        json_path = ".status.components.apiServer.ready",
        description = "ready/desired kube-apiserver replicas"
    ),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Kubernetes version of kube-apiserver, kube-controller-manager and
    /// kube-scheduler, without a leading `v` (for example `1.35.4`). Changing it
    /// upgrades the control plane; an upgrade may move at most one minor version.
    #[schemars(length(min = 5, max = 32), regex(pattern = VERSION_PATTERN))]
    #[x_kube(
        validation = Rule::new("self.split('.')[0] == oldSelf.split('.')[0]").message("the Kubernetes major version cannot change"),
        validation = Rule::new("int(self.split('.')[1]) <= int(oldSelf.split('.')[1]) + 1").message("a Kubernetes upgrade may not skip a minor version: upgrade one minor version at a time (for example 1.34.x to 1.35.x, then 1.36.x)"),
        validation = Rule::new("int(self.split('.')[1]) >= int(oldSelf.split('.')[1])").message("downgrading the Kubernetes minor version is not supported")
    )]
    pub version: String,

    /// `Production` runs three replicas of every component (three etcd members),
    /// `Minimal` runs one of each. Changing it scales etcd one member at a time.
    #[serde(default)]
    pub mode: ClusterMode,

    /// Which meta-cluster nodes host this cluster's control-plane Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// The etcd members that store this cluster's state.
    pub etcd: EtcdSpec,

    /// kube-apiserver settings and how it is exposed.
    #[serde(default)]
    pub api_server: ApiServerSpec,

    /// kube-controller-manager settings.
    #[serde(default)]
    pub controller_manager: ComponentSpec,

    /// kube-scheduler settings.
    #[serde(default)]
    pub scheduler: ComponentSpec,

    /// The business cluster's networks.
    #[serde(default)]
    pub network: NetworkSpec,

    /// Validity and renewal of the leaf certificates.
    #[serde(default)]
    pub certificates: CertificatesSpec,

    /// Additional users; each gets a client certificate with the given groups and
    /// a kubeconfig Secret named `<cluster>-kubeconfig-<user>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub extra_users: Vec<ExtraUser>,

    /// Add-ons applied into the business cluster once its API answers, in
    /// addition to the built-in ones (bootstrap RBAC, kube-proxy, the
    /// kube-router pod network, CoreDNS, node-operator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub addons: Vec<Addon>,

    /// While true the operator makes no change to this cluster's objects; status
    /// is still reported.
    #[serde(default)]
    pub paused: bool,
}

/// How many replicas of each component run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ClusterMode {
    /// Three etcd members and three replicas of every other component.
    #[default]
    Production,
    /// One of everything: for CI and development.
    Minimal,
}

impl ClusterMode {
    /// Replicas of every component (and etcd members) in this mode.
    pub fn replicas(self) -> i32 {
        match self {
            ClusterMode::Production => 3,
            ClusterMode::Minimal => 1,
        }
    }
}

/// Meta-cluster nodes that may run the control plane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Node labels every control-plane Pod's node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations added to every control-plane Pod, for dedicated nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// Settings shared by every control-plane component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// Container image; by default the one the operator pairs with the version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Version of this component when it differs from the cluster's (for
    /// example to try a patch release of one component only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 5, max = 32), regex(pattern = VERSION_PATTERN))]
    pub version: Option<String>,
    /// Extra command-line flags, `flag-name: value` without the leading dashes.
    /// They override the operator's own flags of the same name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
    /// Compute resources of the component's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// etcd settings. A change of `version` may move the minor version forward
/// by at most one, never back: etcd members only run beside peers one minor
/// version apart, and an older minor version cannot run on newer data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.version) || !has(oldSelf.version) || self.version.split('.')[0] == oldSelf.version.split('.')[0]").message("the etcd major version cannot change"),
    validation = Rule::new("!has(self.version) || !has(oldSelf.version) || int(self.version.split('.')[1]) <= int(oldSelf.version.split('.')[1]) + 1").message("an etcd upgrade may not skip a minor version: upgrade one minor version at a time (for example 3.5.x to 3.6.x)"),
    validation = Rule::new("!has(self.version) || !has(oldSelf.version) || int(self.version.split('.')[1]) >= int(oldSelf.version.split('.')[1])").message("downgrading the etcd minor version is not supported: an older etcd cannot run on the data a newer one wrote"),
    validation = Rule::new("has(self.restoreFrom) == has(oldSelf.restoreFrom) && (!has(self.restoreFrom) || self.restoreFrom == oldSelf.restoreFrom)").message("etcd.restoreFrom is set when the Cluster is created and cannot change"),
    validation = Rule::new("!has(self.backup) || !has(self.backup.pvc) || !has(self.restoreFrom) || !has(self.restoreFrom.pvc) || self.backup.pvc.claimName == self.restoreFrom.pvc.claimName").message("etcd.backup.pvc and etcd.restoreFrom.pvc must name the same claim: one snapshot gateway serves a Cluster")
)]
pub struct EtcdSpec {
    /// Image, version, flags and resources of every member.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Where each member keeps its data. Cannot change after creation.
    pub storage: EtcdStorage,
    /// Scheduled snapshots of the cluster's etcd, taken from a healthy
    /// member and kept in S3-compatible storage or on a claim. Absent: no
    /// snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<EtcdBackup>,
    /// Start this Cluster from a snapshot another Cluster's backups took:
    /// its identity (CAs and service-account key) and its etcd data. Only
    /// when the Cluster is created; the members start on the snapshot's
    /// data instead of an empty database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<RestoreFrom>,
}

/// A snapshot to start a new Cluster from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.s3) != has(self.pvc)").message("set exactly one of etcd.restoreFrom.s3 or etcd.restoreFrom.pvc"),
    validation = Rule::new("!has(self.s3) || has(self.s3.prefix)").message("etcd.restoreFrom.s3.prefix must name where the snapshots are (by default the backed-up Cluster's <namespace>/<name>)"),
    validation = Rule::new("!has(self.pvc) || has(self.pvc.prefix)").message("etcd.restoreFrom.pvc.prefix must name where the snapshots are (by default the backed-up Cluster's <namespace>/<name>)")
)]
pub struct RestoreFrom {
    /// Where the snapshots are: the backup settings' `s3` of the Cluster
    /// that took them (with its `prefix`: by default that Cluster's
    /// `<namespace>/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination>,
    /// Or the claim in this Cluster's namespace they were written to: the
    /// backup settings' `pvc` of the Cluster that took them (with its
    /// `prefix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<ClaimDestination>,
    /// The snapshot's name, or `latest` for the newest complete one.
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^(latest|[0-9]{8}T[0-9]{6}Z-r[0-9]+)$")
    )]
    pub snapshot: String,
    /// Secret in this Cluster's namespace whose key `key` is the key the
    /// snapshot's identity was sealed with.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub encryption_key_secret: String,
}

/// When etcd snapshots are taken, how many are kept and where they go.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.s3) != has(self.pvc)").message("set exactly one of etcd.backup.s3 or etcd.backup.pvc"))]
pub struct EtcdBackup {
    /// When to take them.
    pub schedule: BackupSchedule,
    /// Which to keep; the others are deleted after each new snapshot. The
    /// newest is never deleted.
    #[serde(default)]
    pub retention: BackupRetention,
    /// The S3-compatible storage they are written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination>,
    /// Or a PersistentVolumeClaim in the Cluster's namespace they are
    /// written to, through a snapshot gateway the operator runs on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<ClaimDestination>,
    /// Secret in the Cluster's namespace whose key `key` holds 32 random
    /// bytes (raw, or base64 as `openssl rand -base64 32` prints them). The
    /// Cluster's certificate authorities and service-account key are sealed
    /// with it (AES-256-GCM) beside each snapshot, so a restored Cluster
    /// keeps its identity; keep a copy of it apart from the storage.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub encryption_key_secret: String,
    /// Takes no scheduled snapshot while true; one asked for with
    /// `kubectl kok cluster backup` is still taken.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// When a majority of the etcd members lose their data (quorum lost),
    /// rebuild every member from the latest snapshot at once. False: the
    /// Cluster says so (`Restored=False`, reason `QuorumLost`) and waits for
    /// the annotation `kubeonkube.io/recover-from-snapshot` (`latest` or a
    /// snapshot's name). Either way an empty etcd never replaces it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_recover: bool,
}

/// Annotation on a Cluster whose etcd lost its quorum: rebuild it from this
/// snapshot (`latest` or a name) of its backups.
pub const RECOVER_ANNOTATION: &str = "kubeonkube.io/recover-from-snapshot";

/// Exactly one of `every` or `cron`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.every) != has(self.cron)").message("set exactly one of etcd.backup.schedule.every or etcd.backup.schedule.cron"))]
pub struct BackupSchedule {
    /// The time from one snapshot to the next, as `30m` or `6h`; the first
    /// is taken as soon as etcd serves. The operator's
    /// `--backup-min-interval` (default 5m) is the shortest it accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub every: Option<String>,
    /// A five-field cron expression in UTC (`minute hour day month
    /// weekday`), as `0 */6 * * *`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 128))]
    pub cron: Option<String>,
}

/// Which snapshots are kept.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRetention {
    /// The newest this many are kept.
    #[serde(default = "default_retention_count")]
    #[schemars(range(min = 1, max = 1000))]
    pub count: u32,
    /// Snapshots older than this (as `168h`) are deleted even within
    /// `count`, except the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub max_age: Option<String>,
}

fn default_retention_count() -> u32 {
    7
}

impl Default for BackupRetention {
    fn default() -> Self {
        BackupRetention {
            count: default_retention_count(),
            max_age: None,
        }
    }
}

/// A bucket (and prefix) in S3-compatible storage. The operator's
/// `--backup-endpoints` lists the endpoints a Cluster may name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.prefix) || !self.prefix.matches('(^|/)[.][.]?(/|$)')").message("etcd.backup.s3.prefix may not contain . or .. segments"))]
pub struct S3Destination {
    /// `https://host[:port]`; requests are path-style.
    #[schemars(
        length(min = 9, max = 512),
        regex(pattern = r"^https?://[^/?#@\s]+/?$")
    )]
    pub endpoint: String,
    /// The bucket; it must exist.
    #[schemars(
        length(min = 3, max = 63),
        regex(pattern = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
    )]
    pub bucket: String,
    /// Where in the bucket (default: `<namespace>/<cluster>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^[A-Za-z0-9!_.*'()/-]+$")
    )]
    pub prefix: Option<String>,
    /// The region requests are signed for (default `us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9-]+$"))]
    pub region: Option<String>,
    /// Secret in the Cluster's namespace with keys `accessKeyID` and
    /// `secretAccessKey`.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub credentials_secret: String,
    /// Secret in the Cluster's namespace whose key `ca.crt` holds the PEM
    /// CA certificates to trust for the endpoint (default: the system's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub ca_secret: Option<String>,
}

/// A PersistentVolumeClaim that holds snapshots. The operator runs a
/// snapshot gateway on it for the Cluster (one Pod, `<cluster>-snapshots`:
/// an S3-compatible server over the claim's files, with keys and a
/// certificate of its own), so snapshots, restores and retention work as
/// with S3 storage. The claim is the user's: deleting the Cluster leaves it
/// and its snapshots; deleting the namespace does not.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.prefix) || !self.prefix.matches('(^|/)[.][.]?(/|$)')").message("etcd.backup.pvc.prefix may not contain . or .. segments"))]
pub struct ClaimDestination {
    /// The claim, in the Cluster's namespace; it must exist, and may not
    /// be one of the Cluster's etcd members' claims.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub claim_name: String,
    /// Where on the claim (default: `<namespace>/<cluster>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^[A-Za-z0-9!_.*'()/-]+$")
    )]
    pub prefix: Option<String>,
}

/// Exactly one of `claimTemplate` or `volumeSource`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.claimTemplate) != has(self.volumeSource)").message("set exactly one of etcd.storage.claimTemplate or etcd.storage.volumeSource"),
    validation = Rule::new("self == oldSelf").message("etcd storage cannot be changed after the cluster is created"),
    validation = Rule::new("!has(self.claimTemplate) || !has(self.claimTemplate.volumeName)").message("etcd.storage.claimTemplate.volumeName cannot be set: the claims bind to volumes their storage class provides, never to a named PersistentVolume"),
    validation = Rule::new("!has(self.claimTemplate) || !has(self.claimTemplate.selector)").message("etcd.storage.claimTemplate.selector cannot be set: the claims bind to volumes their storage class provides, never to existing PersistentVolumes picked by label")
)]
pub struct EtcdStorage {
    /// A PersistentVolumeClaim is created from this spec for every member; a
    /// replaced member gets a fresh claim. `volumeName` and `selector` are
    /// refused: they would let a claim bind a PersistentVolume that holds
    /// someone else's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_template: Option<PersistentVolumeClaimSpec>,
    /// A volume every member gets without a claim: `emptyDir` for throw-away
    /// clusters, or `hostPath` on dedicated nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_source: Option<EtcdVolumeSource>,
}

/// A volume without a claim. Exactly one of `emptyDir` or `hostPath`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.emptyDir) != has(self.hostPath)").message("set exactly one of volumeSource.emptyDir or volumeSource.hostPath"))]
pub struct EtcdVolumeSource {
    /// Storage that lives as long as the member's Pod: a replaced Pod starts
    /// empty and rejoins as a new member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
    /// A directory on the node; each member uses a subdirectory named after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPathVolumeSource>,
}

/// kube-apiserver settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(oldSelf.kms) || (has(self.kms) && self.kms.name == oldSelf.kms.name)").message("apiServer.kms cannot be removed or renamed once set: the Secrets written under it are read only through it")
)]
pub struct ApiServerSpec {
    /// Image, version, flags and resources.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// How kubelets and users outside the meta-cluster reach the API. The other
    /// control-plane components always use an internal ClusterIP Service.
    #[serde(default)]
    pub external: ExternalAccess,
    /// Audit logging: which requests are recorded (a policy) and where the
    /// events go (a log file on a volume in each kube-apiserver Pod, a
    /// webhook, or both). Without it, nothing is audited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,
    /// Who may authenticate besides client certificates, bootstrap tokens and
    /// service accounts: JWT (OIDC) issuers, in kube-apiserver's structured
    /// authentication configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<AuthenticationSpec>,
    /// A KMS v2 plugin that encrypts the business cluster's Secrets at rest
    /// instead of the operator's own key (which then only reads what it
    /// wrote before). Set once, it stays: what it encrypted is read only
    /// through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<KmsPlugin>,
}

/// A KMS v2 plugin run beside each kube-apiserver, as a container of its
/// Pod, serving kube-apiserver on a Unix socket in a volume they share.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KmsPlugin {
    /// The provider's name in kube-apiserver's encryption configuration,
    /// stored with every value it encrypts (`k8s:enc:kms:v2:<name>:`).
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// The plugin's image (within the operator's `--allowed-image-prefixes`).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// The plugin's arguments. It must serve the socket
    /// `/var/run/kmsplugin/socket.sock` (also in `$(KMS_SOCKET)`, which
    /// arguments may name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub args: Vec<String>,
    /// A Secret of the Cluster's namespace mounted read-only at `/etc/kms`
    /// (the plugin's credentials or configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub config_secret: Option<String>,
}

/// kube-apiserver's audit logging.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.log) || has(self.webhook)").message("audit needs a log, a webhook or both: where its events go")
)]
pub struct AuditSpec {
    /// A ConfigMap in the Cluster's namespace whose key `policy.yaml` holds
    /// an `audit.k8s.io/v1` Policy. Without it, the default policy: the
    /// metadata of every request except health checks and the control
    /// plane's own reads, and no request or response body (Secrets'
    /// values never reach the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub policy_config_map: Option<String>,
    /// A log file in each kube-apiserver Pod (`/var/log/kubernetes/audit`,
    /// an emptyDir sized for the files kept), rotated by size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<AuditLog>,
    /// Events sent in batches to a webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<AuditWebhook>,
}

/// The audit log file's rotation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditLog {
    /// Size in MiB at which the file is rotated.
    #[serde(rename = "maxSizeMB", default = "default_audit_max_size")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_size_mb: u32,
    /// Rotated files kept beside the current one.
    #[serde(default = "default_audit_max_backups")]
    #[schemars(range(min = 0, max = 100))]
    pub max_backups: u32,
}

fn default_audit_max_size() -> u32 {
    100
}

fn default_audit_max_backups() -> u32 {
    3
}

/// The audit webhook backend.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditWebhook {
    /// A Secret in the Cluster's namespace whose key `kubeconfig` is a
    /// kubeconfig naming the webhook's server (https) and credentials, each
    /// given inline (`certificate-authority-data`, `client-certificate-data`,
    /// `client-key-data` or `token`): file paths and exec plugins are
    /// refused, as they would be read or run inside the control plane.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub kubeconfig_secret: String,
}

/// kube-apiserver's structured authentication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationSpec {
    /// A ConfigMap in the Cluster's namespace whose key
    /// `authentication-configuration.yaml` holds an
    /// `apiserver.config.k8s.io/v1` AuthenticationConfiguration with `jwt`
    /// issuers (OIDC). Its `anonymous` section is the operator's (only the
    /// health endpoints and cluster-info) and may not be set.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub config_map: String,
}

/// The external Service in front of kube-apiserver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.nodePort) || self.type == 'NodePort'").message("nodePort can only be set when type is NodePort")
)]
pub struct ExternalAccess {
    /// Service type of the external endpoint.
    #[serde(rename = "type", default)]
    pub type_: ExposureType,
    /// Port of the external Service.
    #[serde(default = "default_api_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Fixed node port when `type` is `NodePort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30000, max = 32767))]
    pub node_port: Option<i32>,
    /// DNS names users and kubelets use for the API (added to the serving
    /// certificate; the first one becomes the endpoint in kubeconfigs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN)))]
    pub dns_names: Vec<String>,
    /// IP addresses users and kubelets use for the API (added to the serving
    /// certificate), for example a load balancer's address. The first is the
    /// address the API advertises (the business cluster's `kubernetes`
    /// Service); with type LoadBalancer it is requested from the load
    /// balancer (`spec.loadBalancerIP`), so reserve it in its pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 2, max = 45)))]
    #[x_kube(validation = Rule::new("self.all(a, isIP(a))").message("every external address must be an IPv4 or IPv6 address"))]
    pub addresses: Vec<String>,
}

impl Default for ExternalAccess {
    fn default() -> Self {
        Self {
            type_: ExposureType::default(),
            port: default_api_port(),
            node_port: None,
            dns_names: Vec::new(),
            addresses: Vec::new(),
        }
    }
}

fn default_api_port() -> i32 {
    6443
}

/// Service type used to expose kube-apiserver.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExposureType {
    /// Reachable inside the meta-cluster only (or through the DNS names given).
    #[default]
    ClusterIP,
    /// A port on every meta-cluster node.
    NodePort,
    /// A cloud or bare-metal load balancer.
    LoadBalancer,
}

/// The business cluster's networks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.serviceCIDR == oldSelf.serviceCIDR").message("network.serviceCIDR cannot be changed after the cluster is created"),
    validation = Rule::new("self.podCIDR == oldSelf.podCIDR").message("network.podCIDR cannot be changed after the cluster is created")
)]
pub struct NetworkSpec {
    /// CIDR of Service ClusterIPs. Its first address becomes the `kubernetes`
    /// Service and its tenth CoreDNS.
    #[serde(rename = "serviceCIDR", default = "default_service_cidr")]
    #[schemars(length(min = 9, max = 49))]
    #[x_kube(validation = Rule::new("isCIDR(self)").message("network.serviceCIDR must be a CIDR such as 10.96.0.0/12"))]
    pub service_cidr: String,
    /// CIDR Pod addresses are allocated from (per-node ranges are cut from it).
    #[serde(rename = "podCIDR", default = "default_pod_cidr")]
    #[schemars(length(min = 9, max = 49))]
    #[x_kube(validation = Rule::new("isCIDR(self)").message("network.podCIDR must be a CIDR such as 10.244.0.0/16"))]
    pub pod_cidr: String,
    /// DNS domain of the business cluster.
    #[serde(default = "default_dns_domain")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub dns_domain: String,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self {
            service_cidr: default_service_cidr(),
            pod_cidr: default_pod_cidr(),
            dns_domain: default_dns_domain(),
        }
    }
}

fn default_service_cidr() -> String {
    "10.96.0.0/12".into()
}
fn default_pod_cidr() -> String {
    "10.244.0.0/16".into()
}
fn default_dns_domain() -> String {
    "cluster.local".into()
}

/// Certificate lifetimes. CAs live ten years; leaf certificates as given here.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("duration(self.renewBefore) < duration(self.validity)").message("certificates.renewBefore must be shorter than certificates.validity")
)]
pub struct CertificatesSpec {
    /// Lifetime of every leaf certificate, as a duration (`8760h` is a year).
    #[serde(default = "default_validity")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10m')").message("certificates.validity must be at least 10m"))]
    pub validity: String,
    /// A leaf certificate is renewed when less than this remains.
    #[serde(default = "default_renew_before")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub renew_before: String,
}

impl Default for CertificatesSpec {
    fn default() -> Self {
        Self {
            validity: default_validity(),
            renew_before: default_renew_before(),
        }
    }
}

fn default_validity() -> String {
    "8760h".into()
}
fn default_renew_before() -> String {
    "720h".into()
}

/// A user who gets a client certificate and kubeconfig for the business cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraUser {
    /// User name (the certificate's common name).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Groups (the certificate's organizations), for example `system:masters`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub groups: Vec<String>,
}

/// One add-on to apply into the business cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Addon {
    /// Name of a registered add-on template (built-in: `bootstrap`,
    /// `kube-proxy`, `kube-router`, `konnectivity`, `coredns`,
    /// `node-operator`; others from ConfigMaps labelled
    /// `kubeonkube.io/addon-template`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Template version to use.
    #[schemars(length(min = 5, max = 32), regex(pattern = VERSION_PATTERN))]
    pub version: String,
    /// Values the template is rendered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub values: Option<serde_json::Value>,
    /// Set false to remove a built-in add-on (`kube-router` when the cluster
    /// brings its own pod network, `konnectivity` when the meta-cluster
    /// routes to the business cluster's nodes, Pods and Services).
    #[serde(default = "default_true")]
    pub enabled: bool,
}

fn default_true() -> bool {
    true
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Observed state of a Cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One-word summary of the cluster's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,
    /// EtcdReady, APIServerReady, ControllerManagerReady, SchedulerReady,
    /// AddonsReady, CertificatesReady and Ready; Progressing is True while a
    /// version upgrade rolls through the components and False once it is
    /// done or refused; Allowed is False while the operator's flags refuse
    /// what the Cluster asks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Version and replica counts of every component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<ComponentStatuses>,
    /// etcd members as the etcd API reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_members: Vec<EtcdMemberStatus>,
    /// The etcd membership change being carried out (adding, starting,
    /// promoting, removing or restarting one member), recorded before it is
    /// taken so that a restarted operator resumes it; absent when etcd needs
    /// no change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub etcd_change: Option<serde_json::Value>,
    /// URL of the business cluster's API for users and kubelets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Secret (in the Cluster's namespace) holding the admin kubeconfig, key
    /// `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_kubeconfig_secret: Option<String>,
    /// Earliest expiry among the leaf certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates_expire_at: Option<Time>,
    /// Fingerprints of the certificate authorities and the service-account
    /// key as first made or found. Once recorded, a Secret that goes missing
    /// or holds another one is not replaced (see
    /// [`REPLACE_AUTHORITIES_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authorities: Option<AuthorityFingerprints>,
    /// The rotation of the key Secrets are encrypted at rest with, while
    /// one runs (see [`ROTATE_ENCRYPTION_KEY_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key_rotation: Option<KeyRotationStatus>,
    /// etcd snapshots: the last one taken, the ones kept, the next due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupStatus>,
    /// The snapshot a Cluster with `spec.etcd.restoreFrom` starts from, and
    /// how far its restore went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreStatus>,
}

/// A Cluster's restore from a snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The snapshot chosen (`latest` resolved once, when the restore began).
    pub snapshot: String,
    /// Its data object's sha256, checked when each member downloads it.
    pub sha256: String,
    /// The etcd revision it holds.
    pub revision: u64,
    /// The CAs and service-account key are this Cluster's now.
    #[serde(default)]
    pub identity_restored: bool,
    /// Every member started on the snapshot's data.
    #[serde(default)]
    pub data_restored: bool,
    /// Why: `restoreFrom` (a new Cluster), or `quorumLost` (the members of
    /// this one lost their data and were rebuilt from its backups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Where the members download the snapshot from: the storage as the
    /// spec named it when the snapshot was chosen (its prefix filled in).
    /// A spec edited while the restore runs does not move it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<S3Destination>,
}

/// Annotation on a Cluster asking for an etcd snapshot now: any new value
/// (`kubectl kok cluster backup` writes the time). The operator records the
/// value it answered in `status.backup.lastRequest`.
pub const BACKUP_REQUEST_ANNOTATION: &str = "kubeonkube.io/backup-requested";

/// What the operator knows of a Cluster's etcd snapshots.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The newest snapshot taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<SnapshotRecord>,
    /// The snapshots kept in storage after the last retention pass, newest
    /// first (at most 50 are listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// When the last attempt, successful or not, started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<Time>,
    /// When the next scheduled snapshot is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due: Option<Time>,
    /// Attempts that failed since the last success.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_failures: u32,
    /// The last value of the `kubeonkube.io/backup-requested` annotation
    /// answered, successfully or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One snapshot in storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// Its name; the objects are `<prefix>/<name>.db` and its manifest.
    pub name: String,
    /// When it was taken.
    pub taken_at: Time,
    /// The etcd revision it holds.
    pub revision: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The business cluster's Kubernetes version when it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
}

/// Annotation on a Cluster that allows one recorded certificate authority or
/// service-account key to be replaced: a comma-separated list of the recorded
/// fingerprints (`sha256:…`, as in `status.certificateAuthorities`) the user
/// gives up. Naming the old fingerprint makes it a one-time action: once the
/// new one is recorded, the annotation no longer matches anything.
pub const REPLACE_AUTHORITIES_ANNOTATION: &str = "kubeonkube.io/replace-authorities";

/// Annotation on a Cluster that rotates the key its business cluster's
/// Secrets are encrypted at rest with: its value is the fingerprint recorded
/// in `status.certificateAuthorities.encryption`. The new key is added for
/// every kube-apiserver to read, then made the one that encrypts, every
/// Secret is written again under it, and the old key is removed; the new
/// fingerprint is recorded, so the annotation then names nothing.
pub const ROTATE_ENCRYPTION_KEY_ANNOTATION: &str = "kubeonkube.io/rotate-encryption-key";

/// How far a rotation of the encryption key is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRotationStatus {
    /// `AddingKey` (every kube-apiserver gets the new key to read),
    /// `SwitchingKey` (the new key encrypts, the old one is still read),
    /// `RewritingSecrets` (every Secret is written again under the new key)
    /// or `RemovingKey` (the old key goes).
    pub phase: String,
    /// Fingerprint of the key being replaced.
    pub from: String,
    /// Fingerprint of the new key.
    pub to: String,
    /// Secrets written again under the new key so far.
    #[serde(default)]
    pub secrets_rewritten: u64,
    /// Where the rewrite goes on from (the business API's list token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
    /// What it waits for, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// SHA-256 fingerprints (`sha256:<hex>`) of a Cluster's certificate
/// authorities (of the DER certificate) and service-account key (of the DER
/// public key).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthorityFingerprints {
    /// The cluster CA (`<cluster>-ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The etcd CA (`<cluster>-etcd-ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
    /// The front-proxy CA (`<cluster>-front-proxy-ca`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub front_proxy: Option<String>,
    /// The service-account signing key (`<cluster>-sa`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The key Secrets are encrypted at rest with (`<cluster>-encryption`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
}

/// Longest Cluster name: the longest name derived from it,
/// `<cluster>-apiserver-external`, must still be a Service name (a DNS-1035
/// label of at most 63 characters).
pub const MAX_CLUSTER_NAME: usize = 40;

/// Endings a Cluster name may not have: a Cluster `<x>-<ending>` would derive
/// names that Cluster `<x>` derives too (`<x>-etcd-ca`, `<x>-front-proxy-ca`).
pub const RESERVED_NAME_ENDINGS: [&str; 2] = ["etcd", "front-proxy"];

/// A segment no Cluster name may contain: a Cluster `<x>-kubeconfig[-<y>]`
/// would derive the names of Cluster `<x>`'s user kubeconfigs
/// (`<x>-kubeconfig-<user>`).
pub const RESERVED_NAME_SEGMENT: &str = "kubeconfig";

/// Whether the API server accepts `name` as a Cluster's name: the same rules
/// as the CRD's CEL rules on `metadata.name`, for code that needs to know
/// beforehand (and for the test that no two accepted names share a derived
/// name).
pub fn cluster_name_allowed(name: &str) -> bool {
    let bytes = name.as_bytes();
    let dns_1035 = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    dns_1035
        && name.len() <= MAX_CLUSTER_NAME
        && !RESERVED_NAME_ENDINGS
            .iter()
            .any(|e| name.ends_with(&format!("-{e}")))
        && !name.split('-').any(|s| s == RESERVED_NAME_SEGMENT)
}

/// Condition types of a Cluster's status.
pub const ETCD_READY: &str = "EtcdReady";
/// True when every etcd member Pod requires a node of its own; False when
/// too few nodes match the placement and members may share one.
pub const ETCD_SPREAD: &str = "EtcdSpread";
pub const APISERVER_READY: &str = "APIServerReady";
pub const CONTROLLER_MANAGER_READY: &str = "ControllerManagerReady";
pub const SCHEDULER_READY: &str = "SchedulerReady";
pub const ADDONS_READY: &str = "AddonsReady";
pub const CERTIFICATES_READY: &str = "CertificatesReady";
pub const READY: &str = "Ready";
/// True while a version upgrade rolls through the components; False with the
/// reason when a version change was refused.
pub const PROGRESSING: &str = "Progressing";

/// Whether a Cluster's conditions have settled: there are some, every
/// readiness condition is True and [`PROGRESSING`] is False (nothing rolls).
pub fn settled(conditions: &[Condition]) -> bool {
    !conditions.is_empty()
        && conditions.iter().all(|c| {
            c.status
                == if c.type_ == PROGRESSING {
                    "False"
                } else {
                    "True"
                }
        })
}
/// False while the operator's flags do not allow what the Cluster asks for
/// (an image, a hostPath) or its namespace holds more labelled objects than
/// the operator reads; nothing of the Cluster is changed until then.
pub const ALLOWED: &str = "Allowed";

/// The conditions of the control plane itself: its certificates, etcd and
/// the three Deployments, without the add-ons (which need a business API
/// that answers).
pub const CONTROL_PLANE_CONDITIONS: [&str; 5] = [
    ETCD_READY,
    APISERVER_READY,
    CONTROLLER_MANAGER_READY,
    SCHEDULER_READY,
    CERTIFICATES_READY,
];

impl ClusterStatus {
    /// The condition of type `type_`, if reported.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Every one of [`CONTROL_PLANE_CONDITIONS`] is True: all the control
    /// plane's objects exist and its Pods are Ready.
    pub fn control_plane_ready(&self) -> bool {
        CONTROL_PLANE_CONDITIONS
            .iter()
            .all(|t| self.condition(t).is_some_and(|c| c.status == "True"))
    }
}

/// One-word summary of a Cluster's state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ClusterPhase {
    /// Accepted; nothing created yet.
    Pending,
    /// Creating the control plane for the first time.
    Provisioning,
    /// Every component is ready at the desired version.
    Running,
    /// Rolling components to a new version or configuration.
    Upgrading,
    /// Some component is not ready; the operator is repairing it.
    Degraded,
    /// The spec cannot be applied; see the conditions.
    Failed,
    /// `spec.paused` is true.
    Paused,
}

/// Per-component status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatuses {
    pub etcd: ComponentStatus,
    pub api_server: ComponentStatus,
    pub controller_manager: ComponentStatus,
    pub scheduler: ComponentStatus,
}

/// Version and replica counts of one component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// Version every ready replica runs (empty while a rollout mixes versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Replicas the mode asks for.
    pub desired_replicas: i32,
    /// Replicas that pass their readiness probe.
    pub ready_replicas: i32,
    /// `ready/desired`, for printing.
    pub ready: String,
}

/// One etcd member.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberStatus {
    /// Member name (also its Pod's and headless Service's name).
    pub name: String,
    /// Member ID in hexadecimal, as etcdctl prints it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Peer URL (the member's headless Service DNS name).
    pub peer_url: String,
    /// Whether the member answered its health check.
    pub healthy: bool,
    /// Whether the member is a learner not yet promoted to voter.
    #[serde(default)]
    pub learner: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_as_the_crd_rules_judge_them() {
        for ok in [
            "x",
            "prod-east",
            "ci-1234",
            "etcd",
            "x-etcd-0",
            "x-proxy",
            "kube-x9",
        ] {
            assert!(cluster_name_allowed(ok), "{ok}");
        }
        let long = "a".repeat(MAX_CLUSTER_NAME + 1);
        for bad in [
            "",
            "a.b",
            "1abc",
            "A",
            "x-",
            "-x",
            "x_y",
            long.as_str(),
            "x-etcd",
            "x-front-proxy",
            "kubeconfig",
            "x-kubeconfig",
            "x-kubeconfig-sa",
        ] {
            assert!(!cluster_name_allowed(bad), "{bad}");
        }
        assert!(cluster_name_allowed(&"a".repeat(MAX_CLUSTER_NAME)));
    }

    fn with(conditions: &[(&str, &str)]) -> ClusterStatus {
        ClusterStatus {
            conditions: conditions
                .iter()
                .map(|(t, s)| Condition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    reason: "Test".into(),
                    message: String::new(),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                    observed_generation: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_control_plane_is_ready_when_its_five_conditions_are_true() {
        let mut all: Vec<(&str, &str)> = CONTROL_PLANE_CONDITIONS
            .iter()
            .map(|t| (*t, "True"))
            .collect();
        // Add-ons do not count.
        all.push((ADDONS_READY, "False"));
        assert!(with(&all).control_plane_ready());
        for missing in 0..CONTROL_PLANE_CONDITIONS.len() {
            let mut some = all.clone();
            some[missing].1 = "False";
            assert!(!with(&some).control_plane_ready(), "{some:?}");
            some.remove(missing);
            assert!(!with(&some).control_plane_ready(), "{some:?}");
        }
        assert!(!ClusterStatus::default().control_plane_ready());
    }
}
