//! Machine status bookkeeping: conditions (Reachable, PackagesInstalled,
//! NodeReady and the Ready summary), the last operation, and writing it all
//! with server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired};
use kube::ResourceExt;
use kube::api::Api;
use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::{LastOperation, MachinePhase, MachineStatus};
use kube_on_kube_api::shared::OperationResult;

use crate::Error;
use crate::context::{Context, MANAGER};

pub const REACHABLE: &str = "Reachable";
pub const PACKAGES_INSTALLED: &str = "PackagesInstalled";
pub const NODE_READY: &str = "NodeReady";
pub const READY: &str = "Ready";

/// Sets one condition; `Ready` is recomputed from the others.
pub fn set(
    status: &mut MachineStatus,
    generation: Option<i64>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
) {
    let now = Timestamp::now();
    conditions::set(
        &mut status.conditions,
        Desired {
            type_,
            status: ok.into(),
            reason,
            // Messages carry errors, and errors what a host printed.
            message: crate::redact::text(&message.into()),
        },
        generation,
        now,
    );
    let parts = [REACHABLE, PACKAGES_INSTALLED, NODE_READY];
    let not_ready: Vec<&str> = parts
        .iter()
        .copied()
        .filter(|t| !conditions::is_true(&status.conditions, t))
        .collect();
    let (ok, reason, message) = if not_ready.is_empty() {
        (
            true,
            "Ready",
            "host reachable, packages installed, Node Ready".to_string(),
        )
    } else {
        (
            false,
            "NotReady",
            format!("not yet: {}", not_ready.join(", ")),
        )
    };
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: READY,
            status: ok.into(),
            reason,
            message,
        },
        generation,
        now,
    );
}

/// Whether condition `type_` is True.
pub fn is_true(status: &MachineStatus, type_: &str) -> bool {
    conditions::is_true(&status.conditions, type_)
}

/// Records that the host was just visited and is as declared.
pub fn checked(status: &mut MachineStatus) {
    status.last_checked_at = Some(Time(Timestamp::now()));
}

/// Time since `t`; none for a time in the future (another clock ahead).
pub fn age(t: &Time) -> std::time::Duration {
    let ms = Timestamp::now().as_millisecond() - t.0.as_millisecond();
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Starts recording an operation.
pub fn begin(status: &mut MachineStatus, step: impl Into<String>) {
    status.last_operation = Some(LastOperation {
        step: step.into(),
        started_at: Time(Timestamp::now()),
        finished_at: None,
        result: OperationResult::Running,
        message: None,
        output_tail: None,
    });
}

/// Finishes the current operation (or records a one-shot one).
pub fn finish(
    status: &mut MachineStatus,
    step: impl Into<String>,
    ok: bool,
    message: impl Into<String>,
    tail: Option<String>,
) {
    let step = step.into();
    let started = match &status.last_operation {
        Some(op) if op.step == step && op.finished_at.is_none() => op.started_at.clone(),
        _ => Time(Timestamp::now()),
    };
    status.last_operation = Some(LastOperation {
        step,
        started_at: started,
        finished_at: Some(Time(Timestamp::now())),
        result: if ok {
            OperationResult::Succeeded
        } else {
            OperationResult::Failed
        },
        message: Some(crate::redact::text(&message.into())),
        output_tail: tail
            .filter(|t| !t.is_empty())
            .map(|t| crate::redact::text(&t)),
    });
}

/// Whether the Machine was ever fully up (so a change now disrupts a
/// working Node, rather than provisioning a new one).
pub fn was_ready(status: &MachineStatus) -> bool {
    !status.installed.is_empty() && status.node_name.is_some()
}

/// Whether the last operation failed.
pub fn failed(status: &MachineStatus) -> bool {
    status.phase == Some(MachinePhase::Failed)
}

/// Writes `status` (server-side apply on the status subresource) and records
/// the Machine's new resourceVersion in `ctx`.
pub async fn write(ctx: &Context, machine: &Machine, status: &MachineStatus) -> Result<(), Error> {
    if machine.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let written =
        kok_common::apply::apply_status(&api, MANAGER, &machine.name_any(), status).await?;
    ctx.wrote(&written);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_all_three() {
        let mut s = MachineStatus::default();
        set(&mut s, Some(1), REACHABLE, true, "Connected", "ok");
        set(&mut s, Some(1), PACKAGES_INSTALLED, true, "Installed", "ok");
        assert!(!is_true(&s, READY));
        set(&mut s, Some(1), NODE_READY, true, "NodeReady", "ok");
        assert!(is_true(&s, READY));
        set(&mut s, Some(1), REACHABLE, false, "HostKeyMismatch", "no");
        assert!(!is_true(&s, READY));
        let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert!(ready.message.contains("Reachable"));
    }

    #[test]
    fn operations_keep_their_start() {
        let mut s = MachineStatus::default();
        begin(&mut s, "install kubelet 1.0.0");
        let started = s.last_operation.clone().unwrap().started_at;
        finish(
            &mut s,
            "install kubelet 1.0.0",
            true,
            "done",
            Some(String::new()),
        );
        let op = s.last_operation.unwrap();
        assert_eq!(op.started_at, started);
        assert_eq!(op.result, OperationResult::Succeeded);
        assert_eq!(op.output_tail, None);
    }

    #[test]
    fn age_of_a_check() {
        let mut s = MachineStatus::default();
        checked(&mut s);
        let at = s.last_checked_at.clone().unwrap();
        assert!(age(&at) < std::time::Duration::from_secs(5));
        let hour_ago = Time(Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600));
        let a = age(&hour_ago).as_secs();
        assert!((3599..=3601).contains(&a), "{a}");
        let ahead = Time(Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(60));
        assert_eq!(age(&ahead), std::time::Duration::ZERO);
    }
}
