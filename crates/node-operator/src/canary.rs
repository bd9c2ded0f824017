//! The CanaryRelease controller: claims the Machines a release selects, hands
//! them their target PackageVersions batch by batch through annotations the
//! Machine controller reads (see [`crate::rollout`]), judges each batch by its
//! health gates, halts when the failure budget is spent, rolls back, and
//! promotes the targets to the cluster default.
//!
//! Every decision is made by [`plan`], a pure function of the release, the
//! Machines and the Nodes; the reconcile only fetches, applies what the plan
//! says and publishes its Events.

mod controller;
mod gates;
mod marks;
mod plan;
#[cfg(test)]
mod tests;

pub use controller::{Context, reconcile, run};
pub use gates::{Verdict, evaluate};
pub use marks::{MarkChange, Marks, claim_manager, marks_patch};
pub use plan::{Plan, aggregate, batch_sizes, drop_conflicts, failure_budget, plan};

/// Field manager of the release status and of promotions into the
/// ClusterPackageVersion.
pub const MANAGER: &str = "node-operator-canary";

/// Finalizer that releases a deleted release's claims.
pub const FINALIZER: &str = "kubeonkube.io/canary-claims";

/// Annotation on a released Machine: when its batch was released (RFC 3339);
/// the health-gate timeout runs from here.
pub const RELEASED_AT_ANNOTATION: &str = "kubeonkube.io/canary-released-at";

/// Annotation on a released Machine: JSON object package → the PackageVersion
/// it ran before the release, what a rollback returns it to.
pub const PREVIOUS_ANNOTATION: &str = "kubeonkube.io/canary-previous";

/// Annotation on a released Machine: JSON list of the watched Node condition
/// types that were already True when its batch was released.
pub const BASELINE_ANNOTATION: &str = "kubeonkube.io/canary-baseline";

/// Condition types of a CanaryRelease.
pub mod condition {
    pub const PROGRESSING: &str = "Progressing";
    pub const HALTED: &str = "Halted";
    pub const ROLLED_BACK: &str = "RolledBack";
    pub const PROMOTED: &str = "Promoted";
    /// Machines the selector picked that another release had claimed.
    pub const CLAIM_CONFLICT: &str = "ClaimConflict";
}
