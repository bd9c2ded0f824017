//! What only the controller can see reaches the user: a write the API server
//! refused (an invalid object, an admission policy, a quota) or one the
//! operator refused itself (a name another owner's object holds) becomes
//! `Ready=False` on the Cluster with the message, and a Warning Event, instead
//! of a log line and a retry every few seconds. The Cluster is looked at
//! again after [`RECHECK`], or at once when its spec changes.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::cluster::{Cluster, ClusterPhase, ClusterStatus, READY};

use crate::Error;
use crate::context::{Context, MANAGER, publish_related};

/// Condition reason: an object the Cluster needs has a name another owner's
/// object holds.
pub const NAME_CONFLICT: &str = "NameConflict";
/// Condition reason: the API server refused an object the Cluster needs.
pub const OBJECT_REJECTED: &str = "ObjectRejected";

/// How long a refused Cluster waits before it tries again on its own: what
/// refused it (an admission policy, a quota, another's object) can go away
/// without the Cluster changing, but trying sooner only repeats the refusal.
pub const RECHECK: Duration = Duration::from_secs(300);

/// What the user is shown of a refused write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Condition and Event reason.
    pub reason: &'static str,
    /// The object that was not written: (kind, name).
    pub object: (String, String),
    /// Why, with the API server's own message.
    pub message: String,
}

impl Refusal {
    /// The refusal `error` is, if it is one.
    pub fn of(error: &Error) -> Option<Refusal> {
        match error {
            Error::NameConflict(c) => Some(Refusal {
                reason: NAME_CONFLICT,
                object: (c.kind.clone(), c.name.clone()),
                message: c.to_string(),
            }),
            Error::Rejected { kind, name, .. } => Some(Refusal {
                reason: OBJECT_REJECTED,
                object: (kind.clone(), name.clone()),
                message: error.to_string(),
            }),
            _ => None,
        }
    }
}

/// The Cluster's status with the refusal as `Ready=False` and the phase
/// `Failed` (the spec cannot be applied as it is); the rest as it was.
pub fn status(cluster: &Cluster, refusal: &Refusal, now: Timestamp) -> ClusterStatus {
    with_condition(
        cluster,
        Desired {
            type_: READY,
            status: Status::False,
            reason: refusal.reason,
            message: refusal.message.clone(),
        },
        Some(ClusterPhase::Failed),
        now,
    )
}

/// The Cluster's status with `condition` set (and `phase`, when given); the
/// rest as it was.
pub fn with_condition(
    cluster: &Cluster,
    condition: Desired<'_>,
    phase: Option<ClusterPhase>,
    now: Timestamp,
) -> ClusterStatus {
    let mut status = cluster.status.clone().unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        condition,
        cluster.metadata.generation,
        now,
    );
    if phase.is_some() {
        status.phase = phase;
    }
    status
}

/// Apply `status` as the Cluster controller's status of `cluster`: for a
/// pass that stops early and only has a condition to show.
pub async fn write_status(
    ctx: &Context,
    cluster: &Cluster,
    status: &ClusterStatus,
) -> Result<(), Error> {
    let clusters: Api<Cluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    kok_common::apply::apply_status(&clusters, MANAGER, &cluster.name_any(), status).await?;
    Ok(())
}

/// Show the refusal on the Cluster (status and Event) and wait for
/// [`RECHECK`] or a change of the Cluster.
pub async fn report(ctx: &Context, cluster: &Cluster, refusal: &Refusal) -> Result<Action, Error> {
    tracing::warn!(cluster = %cluster.name_any(), reason = refusal.reason, message = %refusal.message, "write refused");
    let (kind, name) = &refusal.object;
    let related = ObjectReference {
        api_version: None,
        kind: Some(kind.clone()),
        namespace: cluster.namespace(),
        name: Some(name.clone()),
        ..Default::default()
    };
    publish_related(
        ctx,
        cluster,
        EventType::Warning,
        refusal.reason,
        "Apply",
        refusal.message.clone(),
        Some(related),
    )
    .await;
    write_status(ctx, cluster, &status(cluster, refusal, Timestamp::now())).await?;
    Ok(Action::requeue(RECHECK))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Conflict;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.metadata.generation = Some(3);
        c
    }

    #[test]
    fn a_name_conflict_is_ready_false_with_the_object_and_its_owner() {
        let error = Error::NameConflict(Conflict {
            kind: "Secret".into(),
            name: "x-etcd-ca".into(),
            owner: "Cluster x-etcd".into(),
        });
        let refusal = Refusal::of(&error).expect("a refusal");
        let s = status(&cluster(), &refusal, Timestamp::UNIX_EPOCH);
        let ready = s.condition(READY).expect("Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, NAME_CONFLICT);
        assert!(
            ready.message.contains("Secret x-etcd-ca"),
            "{}",
            ready.message
        );
        assert!(
            ready.message.contains("Cluster x-etcd"),
            "{}",
            ready.message
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(s.phase, Some(ClusterPhase::Failed));
    }

    #[test]
    fn only_refusals_are_reported() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "code": 403, "reason": "Forbidden",
            "message": "services \"x-apiserver\" is forbidden: exceeded quota: q"
        }))
        .expect("status");
        let error = Error::writing("Service", "x-apiserver", kube::Error::Api(Box::new(status)));
        let refusal = Refusal::of(&error).expect("a refusal");
        assert_eq!(refusal.reason, OBJECT_REJECTED);
        assert!(
            refusal.message.contains("exceeded quota: q"),
            "{}",
            refusal.message
        );
        for code in [404, 409, 429, 500] {
            let status: kube::core::Status =
                serde_json::from_value(serde_json::json!({"code": code})).expect("status");
            let error = Error::writing("Service", "s", kube::Error::Api(Box::new(status)));
            assert!(Refusal::of(&error).is_none(), "{code}");
        }
    }
}
