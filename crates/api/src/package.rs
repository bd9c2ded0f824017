//! `PackageVersion` (how to install one version of one on-host package) and
//! `ClusterPackageVersion` (which version every Machine runs by default).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::{PACKAGE_NAME_PATTERN, SHA256_PATTERN, VERSION_PATTERN};

/// One version of one package. PackageVersions are immutable: the set of them is
/// the version history Machines and canaries roll back along.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "PackageVersion",
    status = "PackageVersionStatus",
    shortname = "pkgv",
    category = "kok",
    doc = "How to obtain, verify, install and health-check one version of one on-host package (container runtime, CNI plugins, kubelet, or any other).",
    printcolumn(name = "Package", type_ = "string", json_path = ".spec.package"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(
        name = "Machines",
        type_ = "integer",
        json_path = ".status.machines",
        description = "Machines that have it current"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a PackageVersion cannot be changed; create a new PackageVersion for a new version or fix"))]
#[serde(rename_all = "camelCase")]
pub struct PackageVersionSpec {
    /// Package name, for example `kubelet`, `containerd` or `cni-plugins`.
    #[schemars(length(min = 1, max = 63), regex(pattern = PACKAGE_NAME_PATTERN))]
    pub package: String,
    /// Version of the package, without a leading `v`.
    #[schemars(length(min = 5, max = 64), regex(pattern = VERSION_PATTERN))]
    pub version: String,
    /// Where to download the package, one entry per CPU architecture.
    #[schemars(length(min = 1, max = 8))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["arch".into()]))]
    pub artifacts: Vec<Artifact>,
    /// What goes where on the host.
    #[serde(default)]
    pub install: InstallSpec,
    /// How to tell that the installed version works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Packages that must be installed and healthy first (the container runtime
    /// and CNI plugins before kubelet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63), regex(pattern = PACKAGE_NAME_PATTERN)))]
    pub depends_on: Vec<String>,
}

/// One downloadable artifact.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// CPU architecture as Go names it.
    pub arch: Arch,
    /// HTTP(S) URL of the artifact, fetched from the host itself.
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("artifact url must start with http:// or https://"))]
    pub url: String,
    /// SHA-256 of the artifact, lowercase hex. Nothing is switched in before the
    /// download matches it.
    #[schemars(regex(pattern = SHA256_PATTERN))]
    pub sha256: String,
    /// How the artifact is packed.
    #[serde(default)]
    pub format: ArtifactFormat,
}

/// CPU architecture.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Amd64,
    Arm64,
}

/// How an artifact is packed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ArtifactFormat {
    /// A gzip-compressed tarball unpacked into the version directory.
    #[default]
    TarGz,
    /// A single executable; placed in the version directory under the name of
    /// the first `binaries` entry.
    Binary,
}

/// What the package puts on the host. Each version is unpacked into
/// `/opt/kube-on-kube/packages/<package>/<version>/` and switched in by pointing
/// the `current` symlink at it (the former target stays as `previous`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstallSpec {
    /// Executables to expose, each linked from `link` to `current/<path>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub binaries: Vec<Binary>,
    /// Configuration files rendered on the host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub files: Vec<ConfigFile>,
    /// The systemd unit that runs the package, if it is a service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systemd_unit: Option<SystemdUnit>,
    /// Cordon and drain the Node before restarting this package's service.
    #[serde(default)]
    pub requires_drain: bool,
    /// Command run on the host before the package is removed (its Machine
    /// deleted), while its service still runs: what a Debian package's
    /// `prerm` does. A container runtime stops the containers it still runs
    /// here, which would otherwise outlive it. Its failure is reported and
    /// the removal goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub before_remove: Vec<String>,
}

/// One executable of a package.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Binary {
    /// Path inside the version directory, for example `bin/kubelet`: relative,
    /// without `.` or `..` segments or control characters, so it cannot lead
    /// out of the version directory.
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[^/\x00-\x1f\x7f][^\x00-\x1f\x7f]*$")
    )]
    #[x_kube(validation = Rule::new("!self.matches('(^|/)[.][.]?(/|$)')").message("binary path must stay inside the version directory: no . or .. segments"))]
    pub path: String,
    /// Absolute path of the symlink to create, for example `/usr/local/bin/kubelet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/[^\x00-\x1f\x7f]*$"))]
    #[x_kube(validation = Rule::new("!self.matches('(^|/)[.][.](/|$)')").message("binary link must be an absolute path without .. segments"))]
    pub link: Option<String>,
}

/// A configuration file rendered from a Jinja template (`docs/packages.md`):
/// `{{ key | filter }}` prints `nodeName`, `nodeIP`, `hostname`, `arch`,
/// `clusterDNS`, `clusterDomain`, `apiServer`, `packageDir`, `version`, and the
/// kubelet settings `nodeLabels`, `registerTaints`, `kubeReserved`,
/// `systemReserved`, `evictionHard`, `kubeletExtraArgs`, quoted by the filter
/// for the file's format (`yaml`, `systemd`, `shell`); an unknown key is an
/// error.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFile {
    /// Absolute path on the host.
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/.*$"))]
    pub path: String,
    /// File content: a template.
    #[schemars(length(max = 65536))]
    pub template: String,
    /// File mode in octal.
    #[serde(default = "default_mode")]
    #[schemars(regex(pattern = r"^0?[0-7]{3}$"))]
    pub mode: String,
}

fn default_mode() -> String {
    "0644".into()
}

/// A systemd unit.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemdUnit {
    /// Unit name, for example `kubelet.service`.
    #[schemars(
        length(min = 9, max = 255),
        regex(pattern = r"^[a-zA-Z0-9:_.@-]+\.service$")
    )]
    pub name: String,
    /// Unit file content: a template as for config files; quote values on
    /// command lines with `| systemd`.
    #[schemars(length(min = 1, max = 65536))]
    pub content: String,
}

/// How to tell that an installed package works. Exactly one of `command` or
/// `httpGet`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.command) != has(self.httpGet)").message("a health check has exactly one of command or httpGet"))]
pub struct HealthCheck {
    /// Command run on the host; exit code 0 means healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), inner(length(max = 4096)))]
    pub command: Option<Vec<String>>,
    /// URL fetched on the host (for example `http://127.0.0.1:10248/healthz`);
    /// a 2xx answer means healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    pub http_get: Option<String>,
    /// Seconds to keep trying after a (re)start before declaring failure.
    #[serde(default = "default_health_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i32,
}

fn default_health_timeout() -> i32 {
    60
}

/// Observed state of a PackageVersion.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageVersionStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of Machines on which this version is current.
    #[serde(default)]
    pub machines: i32,
    /// Conditions such as InUse.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The cluster-wide default version of every package. There is one, named
/// `default`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "ClusterPackageVersion",
    status = "ClusterPackageVersionStatus",
    shortname = "cpv",
    category = "kok",
    doc = "The cluster's default PackageVersion per package. Machines without an override follow it; changing it rolls the cluster within the rollout budget.",
    validation = Rule::new("self.metadata.name == 'default'").message("there is one ClusterPackageVersion per cluster and it must be named default"),
    printcolumn(name = "Up-to-date", type_ = "integer", json_path = ".status.upToDate"),
    printcolumn(name = "Unavailable", type_ = "integer", json_path = ".status.unavailable"),
    printcolumn(name = "Machines", type_ = "integer", json_path = ".status.machines"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPackageVersionSpec {
    /// Package name → PackageVersion name, for example
    /// `kubelet: kubelet-1.35.4`.
    #[x_kube(
        validation = Rule::new("size(self) > 0").message("packages must name at least one package"),
        validation = Rule::new("self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message("package names must be lowercase DNS labels such as kubelet or containerd")
    )]
    pub packages: BTreeMap<String, String>,
    /// How fast a change rolls out.
    #[serde(default)]
    pub rollout: RolloutSpec,
}

/// Rollout budget of a default-version change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Most Machines that may be upgrading or not Ready at once, across the
    /// cluster: a count (`1`) or a percentage (`10%`).
    #[serde(default = "default_max_unavailable")]
    #[schemars(schema_with = "crate::shared::int_or_percent")]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')").message("maxUnavailable is a count of at least 1 or a percentage between 1% and 100%"))]
    pub max_unavailable: IntOrString,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

/// Observed state of the cluster default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPackageVersionStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Machines following the default.
    #[serde(default)]
    pub machines: i32,
    /// Of those, Machines at the default versions and Ready.
    #[serde(default)]
    pub up_to_date: i32,
    /// Of those, Machines upgrading or not Ready.
    #[serde(default)]
    pub unavailable: i32,
    /// Conditions such as RolledOut and MissingPackageVersion.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
