//! The health gates: whether a released Machine succeeded, failed or is
//! still being judged, from its status and its Node's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::Status;
use kube_on_kube_api::Machine;
use kube_on_kube_api::canary::{CanaryMachineResult, HealthGates};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::shared::OperationResult;

use super::*;
use crate::rollout;

/// What the health gates say about one released Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Upgrading, Succeeded or Failed.
    pub result: CanaryMachineResult,
    /// What failed, or what it is waiting for.
    pub message: Option<String>,
}

/// Judge a released Machine by the gates. `node` is its Node if it has one.
pub fn evaluate(
    machine: Option<&Machine>,
    node: Option<&Node>,
    targets: &BTreeMap<String, String>,
    gates: &HealthGates,
    timeout: Duration,
    now: Timestamp,
) -> Verdict {
    let failed = |m: String| Verdict {
        result: CanaryMachineResult::Failed,
        message: Some(m),
    };
    let Some(machine) = machine else {
        return failed("the Machine was deleted".into());
    };
    let marks = Marks::read(machine);
    let released_at = marks.released_at.unwrap_or(now);
    let status = machine.status.clone().unwrap_or_default();

    if status.phase == Some(MachinePhase::Failed)
        && status.last_operation.as_ref().is_none_or(|op| {
            op.result == OperationResult::Failed
                && op.started_at.0.as_second() >= released_at.as_second()
        })
    {
        let why = status
            .last_operation
            .and_then(|op| op.message.map(|m| format!("{}: {m}", op.step)))
            .unwrap_or_else(|| "the Machine failed".into());
        return failed(format!("upgrade failed: {why}"));
    }
    if let Some(node) = node {
        let baseline = marks.baseline.unwrap_or_default();
        let now_true = true_conditions(node);
        if let Some(new) = gates
            .no_new_conditions
            .iter()
            .find(|c| now_true.contains(*c) && !baseline.contains(*c))
        {
            return failed(format!("Node condition {new} became True"));
        }
    }

    let mut waiting = Vec::new();
    for (pkg, pv) in targets {
        match status.installed.get(pkg) {
            Some(i) if i.package_version == *pv => {
                if gates.package_health && !i.healthy {
                    waiting.push(format!("{pkg} {pv} to pass its health check"));
                }
            }
            _ => waiting.push(format!("{pkg} to be at {pv}")),
        }
    }
    if gates.node_ready && !node.is_some_and(rollout::node_ready) {
        waiting.push("its Node to be Ready".into());
    }
    if waiting.is_empty() {
        return Verdict {
            result: CanaryMachineResult::Succeeded,
            message: None,
        };
    }
    let waited = Duration::from_millis(
        u64::try_from(now.as_millisecond() - released_at.as_millisecond()).unwrap_or(0),
    );
    if waited > timeout {
        return failed(format!(
            "did not pass the health gates within {}s: waiting for {}",
            timeout.as_secs(),
            waiting.join(", ")
        ));
    }
    Verdict {
        result: CanaryMachineResult::Upgrading,
        message: Some(format!("waiting for {}", waiting.join(", "))),
    }
}

pub(super) fn true_conditions(node: &Node) -> BTreeSet<String> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter(|c| c.status == Status::True)
                .map(|c| c.type_.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `machine` runs `previous` again after a rollback: each package at
/// its previous PackageVersion and healthy, and the Machine Ready. A
/// failed upgrade leaves the old PackageVersion recorded (it never became
/// current in status) but unhealthy while the host still runs the new one, so
/// the record alone does not prove the host went back.
pub(super) fn rolled_back(machine: &Machine, previous: &BTreeMap<String, String>) -> bool {
    let Some(status) = machine.status.as_ref() else {
        return false;
    };
    status.phase == Some(MachinePhase::Ready)
        && previous.iter().all(|(pkg, pv)| {
            status
                .installed
                .get(pkg)
                .is_some_and(|i| i.package_version == *pv && i.healthy)
        })
}

pub(super) fn node_of<'a>(
    machine: Option<&Machine>,
    nodes: &'a BTreeMap<&str, &Node>,
) -> Option<&'a Node> {
    let name = machine?.status.as_ref()?.node_name.as_deref()?;
    nodes.get(name).copied()
}
