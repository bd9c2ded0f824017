//! `CanaryRelease`: roll new package versions to a chosen subset of Machines in
//! batches, stop when the failure budget is spent, roll back, or promote.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::shared::DURATION_PATTERN;

/// A canary release of package versions to selected Machines.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubeonkube.io",
    version = "v1alpha1",
    kind = "CanaryRelease",
    status = "CanaryReleaseStatus",
    validation = Rule::new("size(self.metadata.name) <= 63").message("a CanaryRelease name may be at most 63 characters: it is the value of the label that marks the Machines the release selects, and a label value has at most 63 characters"),
    shortname = "canary",
    category = "kok",
    doc = "Rolls target PackageVersions to the Machines its selector picks, batch by batch, with health gates between batches, a failure budget that halts it, rollback and promotion to the cluster default.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Batch",
        type_ = "string",
        json_path = ".status.batchProgress",
        description = "current/total batches"
    ),
    printcolumn(name = "Succeeded", type_ = "integer", json_path = ".status.succeeded"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
    printcolumn(name = "Selected", type_ = "integer", json_path = ".status.selected"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CanaryReleaseSpec {
    /// Machines this release applies to, by their labels. Must not be empty:
    /// a canary for every Machine is a cluster default change.
    #[x_kube(
        validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("selector must have at least one matchLabels entry or matchExpressions term"),
        validation = Rule::new("self == oldSelf").message("selector cannot change once the release exists; create a new CanaryRelease")
    )]
    pub selector: LabelSelector,
    /// Package name → target PackageVersion name.
    #[x_kube(
        validation = Rule::new("size(self) > 0").message("packages must name at least one target PackageVersion"),
        validation = Rule::new("self == oldSelf").message("target packages cannot change once the release exists; create a new CanaryRelease")
    )]
    pub packages: BTreeMap<String, String>,
    /// Size of each batch, in order: a count (`1`) or a percentage of the
    /// selected Machines (`25%`). Machines left after the last batch form one
    /// final batch.
    #[schemars(schema_with = "crate::shared::int_or_percent_list")]
    #[x_kube(validation = Rule::new("self.all(b, type(b) == int ? b >= 1 : b.matches('^(100|[1-9][0-9]?)%$'))").message("each batch is a count of at least 1 or a percentage between 1% and 100%"))]
    pub batches: Vec<IntOrString>,
    /// Wait this long after a batch passes its health gates before the next one.
    #[serde(default = "default_pause")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub pause_between_batches: String,
    /// What must hold for a batch to count as healthy.
    #[serde(default)]
    pub health_gates: HealthGates,
    /// Failed Machines tolerated before the release halts: a count (`0` halts on
    /// the first failure) or a percentage of the selected Machines.
    #[serde(default = "default_failure_budget")]
    #[schemars(schema_with = "crate::shared::int_or_percent")]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')").message("failureBudget is a count of at least 0 or a percentage between 0% and 100%"))]
    pub failure_budget: IntOrString,
    /// Roll every upgraded Machine back to its previous version when the release
    /// halts.
    #[serde(default)]
    pub auto_rollback: bool,
    /// An operator's instruction: `Pause`, `Resume`, `Promote` (make the targets
    /// the cluster default) or `Rollback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<CanaryAction>,
}

fn default_pause() -> String {
    "0s".into()
}

fn default_failure_budget() -> IntOrString {
    IntOrString::Int(0)
}

/// Gates a batch must pass.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthGates {
    /// The Node of every Machine in the batch is Ready.
    #[serde(default = "default_true")]
    pub node_ready: bool,
    /// Every upgraded package passes its PackageVersion health check.
    #[serde(default = "default_true")]
    pub package_health: bool,
    /// Node condition types (for example from node-problem-detector) that must
    /// not newly become True on the batch's Nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 316)))]
    pub no_new_conditions: Vec<String>,
    /// How long a batch may take to pass its gates before its unfinished
    /// Machines count as failed.
    #[serde(default = "default_gate_timeout")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub timeout: String,
}

impl Default for HealthGates {
    fn default() -> Self {
        Self {
            node_ready: true,
            package_health: true,
            no_new_conditions: Vec::new(),
            timeout: default_gate_timeout(),
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_gate_timeout() -> String {
    "10m".into()
}

/// An instruction to the canary controller.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CanaryAction {
    /// Finish the Machines in flight, start no new batch.
    Pause,
    /// Continue a paused or halted release.
    Resume,
    /// Make the target versions the ClusterPackageVersion default.
    Promote,
    /// Return every upgraded Machine to its previous version.
    Rollback,
}

/// Observed state of a CanaryRelease.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryReleaseStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One-word summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CanaryPhase>,
    /// Index (from 0) of the batch in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_batch: Option<i32>,
    /// `current/total` batches, for printing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_progress: Option<String>,
    /// When the current batch passed its gates (the pause starts here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_passed_at: Option<Time>,
    /// Machines the selector picked.
    #[serde(default)]
    pub selected: i32,
    /// Machines upgraded and healthy.
    #[serde(default)]
    pub succeeded: i32,
    /// Machines whose upgrade failed.
    #[serde(default)]
    pub failed: i32,
    /// Machines not yet upgraded.
    #[serde(default)]
    pub pending: i32,
    /// Per-Machine results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub machines: Vec<CanaryMachine>,
    /// Progressing, Halted, RolledBack, Promoted and the like.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// One-word summary of a CanaryRelease.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CanaryPhase {
    Pending,
    Progressing,
    Paused,
    /// The failure budget is spent; no new batch starts.
    Halted,
    RollingBack,
    RolledBack,
    /// Every selected Machine runs the targets.
    Succeeded,
    /// The targets became the cluster default.
    Promoted,
}

/// Result of the release on one Machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryMachine {
    /// Machine name.
    pub name: String,
    /// Batch (from 0) the Machine belongs to.
    pub batch: i32,
    /// Where the Machine stands.
    pub result: CanaryMachineResult,
    /// Why, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where one Machine stands in a release.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CanaryMachineResult {
    Pending,
    Upgrading,
    Succeeded,
    Failed,
    RolledBack,
}
