//! The CanaryRelease controller: fetches, applies what the plan says and
//! publishes its Events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::{CanaryRelease, ClusterPackageVersion, Machine};

use super::*;
use crate::Error;
use crate::rollout;
use kok_common::finalizer;

/// What the CanaryRelease reconcile shares.
pub struct Context {
    /// Client of the business cluster.
    pub client: Client,
    /// Publishes Events on CanaryReleases.
    pub recorder: Recorder,
}

/// Converge one CanaryRelease.
pub async fn reconcile(release: Arc<CanaryRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let client = &ctx.client;
    let name = release.name_any();
    let releases = Api::<CanaryRelease>::all(client.clone());
    // The controller's cache can lag behind the status the last reconcile
    // wrote; planning on that older status would redo steps already taken.
    let Some(release) = releases
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("get CanaryRelease {name}")))?
    else {
        return Ok(Action::await_change());
    };
    let machines_api = Api::<Machine>::all(client.clone());
    let machines = rollout::list_machines(client)
        .await
        .map_err(Error::kube("list Machines"))?;
    let has_finalizer = finalizer::has(&release, FINALIZER);

    if release.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            let claimed: Vec<String> = machines
                .iter()
                .filter(|m| rollout::canary_claim(m) == Some(name.as_str()))
                .map(|m| m.name_any())
                .collect();
            for m in &claimed {
                apply_marks(&machines_api, &name, m, &MarkChange::Release).await?;
            }
            publish(
                &ctx,
                &release,
                EventType::Normal,
                "ClaimsReleased",
                format!(
                    "released {} Machines: {}",
                    claimed.len(),
                    claimed.join(", ")
                ),
            )
            .await;
            finalizer::remove(&releases, &release, FINALIZER)
                .await
                .map_err(Error::kube(format!(
                    "remove finalizer from CanaryRelease {name}"
                )))?;
        }
        return Ok(Action::await_change());
    }

    let nodes = rollout::list_nodes(client)
        .await
        .map_err(Error::kube("list Nodes"))?;
    let mut plan = plan(&release, &machines, &nodes, Timestamp::now());

    let claims = plan.marks.values().any(|c| matches!(c, MarkChange::Set(_)));
    if claims && !has_finalizer {
        finalizer::add(&releases, &release, FINALIZER)
            .await
            .map_err(Error::kube(format!(
                "add finalizer to CanaryRelease {name}"
            )))?;
    }
    if let Some(packages) = &plan.promote {
        promote(client, packages).await?;
    }
    let mut conflicts = Vec::new();
    for (machine, change) in &plan.marks {
        match apply_marks(&machines_api, &name, machine, change).await {
            Ok(()) => {}
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.is_conflict() => conflicts.push(machine.clone()),
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    // A refused mark on a Machine this release already claimed changes
    // nothing it holds; a refused claim means the Machine is not ours, even
    // when this plan released it in the same step.
    conflicts.retain(|c| {
        !machines
            .iter()
            .any(|m| m.name_any() == *c && rollout::canary_claim(m) == Some(name.as_str()))
    });
    if !conflicts.is_empty() {
        drop_conflicts(
            &mut plan.status,
            &conflicts,
            release.metadata.generation,
            Timestamp::now(),
        );
        plan.events.push((
            EventType::Warning,
            "ClaimConflict",
            format!("another release claimed {} first", conflicts.join(", ")),
        ));
    }
    for (type_, reason, note) in &plan.events {
        publish(&ctx, &release, *type_, reason, note.clone()).await;
    }
    if release.status.as_ref() != Some(&plan.status) {
        kok_common::apply::apply_status(&releases, MANAGER, &name, &plan.status).await?;
    }
    Ok(Action::requeue(plan.requeue))
}

pub(super) async fn apply_marks(
    api: &Api<Machine>,
    release: &str,
    machine: &str,
    change: &MarkChange,
) -> Result<(), Error> {
    let patch = marks_patch(machine, change, release);
    // Not forced: a claim another release holds is a conflict, not a takeover.
    let params = PatchParams::apply(&claim_manager(release));
    api.patch(machine, &params, &Patch::Apply(&patch))
        .await
        .map_err(Error::kube(format!(
            "apply canary marks of CanaryRelease {release} to Machine {machine}"
        )))?;
    Ok(())
}

pub(super) async fn promote(
    client: &Client,
    targets: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let api = Api::<ClusterPackageVersion>::all(client.clone());
    // Apply every default, not only the targets: this manager's earlier
    // promotions must not be dropped from the map.
    let mut packages = api
        .get_opt(crate::cpv::NAME)
        .await
        .map_err(Error::kube(format!(
            "get ClusterPackageVersion {}",
            crate::cpv::NAME
        )))?
        .map(|c| c.spec.packages)
        .unwrap_or_default();
    packages.extend(targets.clone());
    let patch = serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "ClusterPackageVersion",
        "metadata": {"name": crate::cpv::NAME},
        "spec": {"packages": packages},
    });
    api.patch(
        crate::cpv::NAME,
        &kok_common::apply::params(MANAGER),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!(
        "apply ClusterPackageVersion {}",
        crate::cpv::NAME
    )))?;
    Ok(())
}

pub(super) async fn publish(
    ctx: &Context,
    release: &CanaryRelease,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // Failures of upgrades carry what the host printed.
    kok_common::events::publish(
        &ctx.recorder,
        &release.object_ref(&()),
        type_,
        reason,
        "Canary",
        &crate::redact::text(&note),
        None,
    )
    .await;
}

pub(super) fn error_policy(
    release: Arc<CanaryRelease>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    tracing::warn!(name = %release.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Run the CanaryRelease controller until shutdown. A change of a Machine a
/// release claims reconciles that release.
pub async fn run(client: Client, changes: impl Stream<Item = Arc<Machine>> + Send + 'static) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), Reporter::from("node-operator")),
    });
    let controller = Controller::new(
        Api::<CanaryRelease>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_shared_stream(changes, |m: Arc<Machine>| {
        rollout::canary_claim(&m).map(ObjectRef::<CanaryRelease>::new)
    });
    kok_common::controller::run(
        "canaryrelease",
        controller,
        reconcile,
        error_policy,
        ctx,
        Error::category,
    )
    .await;
}
