//! The marks a release puts on the Machines it claims: which release
//! holds them, the PackageVersions their batch runs, when it was released,
//! what they ran before and which Node conditions were already true.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube_on_kube_api::Machine;
use kube_on_kube_api::canary::HealthGates;

use super::gates::true_conditions;
use super::*;
use crate::rollout::{CANARY_ANNOTATION, CANARY_PACKAGES_ANNOTATION};

/// Field manager of one release's marks on Machines. One manager per release
/// makes the API server refuse a second release's claim on a Machine (a
/// server-side apply conflict), even when two releases race.
pub fn claim_manager(release: &str) -> String {
    let mut m = format!("node-operator-canary-{release}");
    m.truncate(128);
    m
}

/// What this controller keeps on one Machine, besides the claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// Package → PackageVersion the Machine must run (the targets, or the
    /// previous versions when rolling back). None until its batch is released.
    pub packages: Option<BTreeMap<String, String>>,
    /// Package → PackageVersion it ran before the release.
    pub previous: Option<BTreeMap<String, String>>,
    /// Watched Node conditions already True when the batch was released.
    pub baseline: Option<BTreeSet<String>>,
    /// When the batch was released.
    pub released_at: Option<Timestamp>,
}

impl Marks {
    /// The marks as found on `machine`.
    pub fn read(machine: &Machine) -> Marks {
        let a = machine.annotations();
        Marks {
            packages: from_json(a.get(CANARY_PACKAGES_ANNOTATION)),
            previous: from_json(a.get(PREVIOUS_ANNOTATION)),
            baseline: from_json(a.get(BASELINE_ANNOTATION)),
            released_at: a.get(RELEASED_AT_ANNOTATION).and_then(|v| v.parse().ok()),
        }
    }

    /// The annotations that carry the claim of `release` and these marks.
    pub fn annotations(&self, release: &str) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([(CANARY_ANNOTATION.to_string(), release.to_string())]);
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                a.insert(key.to_string(), v);
            }
        };
        put(
            CANARY_PACKAGES_ANNOTATION,
            self.packages.as_ref().map(to_json),
        );
        put(PREVIOUS_ANNOTATION, self.previous.as_ref().map(to_json));
        put(BASELINE_ANNOTATION, self.baseline.as_ref().map(to_json));
        put(
            RELEASED_AT_ANNOTATION,
            self.released_at.map(|t| t.to_string()),
        );
        a
    }
}

/// A mark that does not parse is treated as absent.
pub(super) fn from_json<T: serde::de::DeserializeOwned>(value: Option<&String>) -> Option<T> {
    value.and_then(|v| serde_json::from_str(v).ok())
}

/// Mark values are maps and sets of strings, which always serialise.
pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A change of one Machine's marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkChange {
    /// Claim the Machine with these marks.
    Set(Marks),
    /// Remove the claim and every mark.
    Release,
}

/// The marks of a Machine whose batch is released now: the targets, what it
/// ran before, and the watched Node conditions already True.
pub(super) fn release_marks(
    machine: &Machine,
    node: Option<&Node>,
    targets: &BTreeMap<String, String>,
    gates: &HealthGates,
    now: Timestamp,
) -> Marks {
    let installed = machine.status.as_ref().map(|s| &s.installed);
    let previous = targets
        .keys()
        .filter_map(|pkg| {
            installed
                .and_then(|i| i.get(pkg))
                .map(|i| (pkg.clone(), i.package_version.clone()))
        })
        .collect();
    let baseline = node.map(true_conditions).unwrap_or_default();
    Marks {
        packages: Some(targets.clone()),
        previous: Some(previous),
        baseline: Some(
            gates
                .no_new_conditions
                .iter()
                .filter(|c| baseline.contains(*c))
                .cloned()
                .collect(),
        ),
        released_at: Some(now),
    }
}

/// The server-side apply configuration of `release`'s marks on `machine`.
/// Releasing applies no annotations at all rather than an empty map: a
/// manager that applied `annotations: {}` would keep owning the map and make
/// every later release's claim on the Machine a conflict.
pub fn marks_patch(machine: &str, change: &MarkChange, release: &str) -> serde_json::Value {
    let mut patch = serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": machine},
    });
    if let MarkChange::Set(marks) = change {
        patch["metadata"]["annotations"] = serde_json::json!(marks.annotations(release));
    }
    patch
}
