//! `kubectl kok canary …`: where a canary release stands, and the operator's
//! instructions to it (pause, resume, promote, rollback), given by setting
//! `spec.action` with a merge patch so nothing else in the spec is touched.

use std::fmt::Write as _;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::CanaryRelease;
use kube_on_kube_api::canary::CanaryAction;

use crate::error::{Call, Error};
use crate::output::{self, Output, or_dash};

fn call<'a>(verb: &'static str, name: &'a str) -> Call<'a> {
    Call {
        verb,
        kind: "CanaryRelease",
        plural: "canaryreleases",
        name: Some(name),
        namespace: None,
        cluster: "is --kubeconfig/--context pointing at a business cluster (kubectl kok cluster kubeconfig NAME)?",
        list: "kubectl get canaryreleases",
    }
}

/// Print a release's progress.
pub async fn status(client: Client, name: &str, output: Output) -> Result<(), Error> {
    let canary = Api::<CanaryRelease>::all(client)
        .get(name)
        .await
        .map_err(|e| call("get", name).error(e))?;
    output::one(output, &canary, describe)
}

/// The merge patch that sets `spec.action`.
pub fn action_patch(action: CanaryAction) -> serde_json::Value {
    serde_json::json!({"spec": {"action": action}})
}

/// Set `spec.action` of the release.
pub async fn act(client: Client, name: &str, action: CanaryAction) -> Result<(), Error> {
    Api::<CanaryRelease>::all(client)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(action_patch(action)),
        )
        .await
        .map_err(|e| call("patch", name).error(e))?;
    println!("canaryrelease.kubeonkube.io/{name}: action set to {action:?}");
    Ok(())
}

/// `canary status` text.
pub fn describe(c: &CanaryRelease) -> String {
    let status = c.status.clone().unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "Name:       {}", c.name_any());
    let packages: Vec<String> = c
        .spec
        .packages
        .iter()
        .map(|(p, v)| format!("{p}={v}"))
        .collect();
    let _ = writeln!(out, "Packages:   {}", packages.join(", "));
    let _ = writeln!(
        out,
        "Phase:      {}",
        or_dash(status.phase.map(|p| format!("{p:?}")))
    );
    let _ = writeln!(
        out,
        "Action:     {}",
        or_dash(c.spec.action.map(|a| format!("{a:?}")))
    );
    let _ = writeln!(
        out,
        "Batch:      {}",
        or_dash(status.batch_progress.clone())
    );
    let _ = writeln!(
        out,
        "Machines:   {} selected, {} succeeded, {} failed, {} pending",
        status.selected, status.succeeded, status.failed, status.pending
    );
    if !status.machines.is_empty() {
        let _ = writeln!(
            out,
            "  {:<24} {:<6} {:<12} MESSAGE",
            "MACHINE", "BATCH", "RESULT"
        );
        for m in &status.machines {
            let _ = writeln!(
                out,
                "  {:<24} {:<6} {:<12} {}",
                m.name,
                m.batch,
                format!("{:?}", m.result),
                m.message.clone().unwrap_or_default()
            );
        }
    }
    if !status.conditions.is_empty() {
        let _ = writeln!(out, "Conditions:");
        for cond in &status.conditions {
            let _ = writeln!(
                out,
                "  {:<12} {:<8} {:<20} {}",
                cond.type_, cond.status, cond.reason, cond.message
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_sets_only_the_action() {
        assert_eq!(
            action_patch(CanaryAction::Rollback),
            serde_json::json!({"spec": {"action": "Rollback"}})
        );
    }

    #[test]
    fn describe_shows_targets_and_counts() {
        let c: CanaryRelease =
            serde_norway::from_str(include_str!("../../../examples/canaryrelease.yaml"))
                .expect("example");
        let text = describe(&c);
        assert!(text.contains("kubelet="), "{text}");
        assert!(
            text.contains("0 selected, 0 succeeded, 0 failed, 0 pending"),
            "{text}"
        );
    }
}
