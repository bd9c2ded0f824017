//! A deleted Cluster: its processes stopped at once, then its finalizer
//! removed (garbage collection deletes the rest).

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kok_common::finalizer;
use kube::api::{Api, DeleteParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use kube_on_kube_api::Cluster;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::context::{Context, list};
use crate::names::Names;

/// Finalizer through which a deleted Cluster's processes are stopped at once
/// rather than each after its own graceful shutdown (see [`teardown`]).
pub const TEARDOWN_FINALIZER: &str = "kubeonkube.io/teardown";

/// Seconds a deleted Cluster's Pods get between SIGTERM and SIGKILL.
const TEARDOWN_GRACE_SECONDS: i64 = 1;

/// The listed objects whose controller is one of `owners` (by UID).
fn controlled<K: Resource>(listed: Result<Vec<K>, Error>, owners: &[String]) -> Vec<K> {
    listed
        .unwrap_or_default()
        .into_iter()
        .filter(|o| crate::ownership::controller(o.meta()).is_some_and(|c| owners.contains(&c.uid)))
        .collect()
}

/// Delete `object` (that very one: its UID is the precondition), already
/// gone being fine; whether it was asked for. Failures are only logged:
/// garbage collection deletes it anyway.
async fn delete_quietly<K>(api: &Api<K>, object: &K, params: &DeleteParams) -> bool
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: object.meta().uid.clone(),
            resource_version: None,
        }),
        ..params.clone()
    };
    match api.delete(&name, &params).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(error) => {
            tracing::warn!(object = %name, %error, "cannot delete during teardown");
            false
        }
    }
}

/// A deleted Cluster: stop its processes now, then let garbage collection
/// remove the rest.
///
/// Garbage collection alone deletes the Pods with their own grace periods,
/// and the control plane's graceful shutdown then waits on parts that are
/// going away at the same moment: kube-apiserver tries to remove its lease
/// and drain requests from an etcd that is shutting down, etcd waits for
/// kube-apiserver's watch streams, and the node-operator tries to release
/// its lease on a business API that is gone; the Pods are then killed only
/// when their grace periods run out, tens of seconds later. That shutdown
/// matters while a component is rolled (etcd hands over leadership,
/// kube-apiserver finishes requests), so the Pod templates keep their grace
/// periods; when the whole cluster is deleted there is nothing left to hand
/// over to, and the Pods are deleted with a short grace period instead.
/// Deployments and ReplicaSets go first so that nothing replaces the Pods.
/// Every step is best effort: what it cannot do, garbage collection does at
/// its own pace, and the finalizer is removed regardless.
pub(crate) async fn teardown(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
) -> Result<Action, Error> {
    let key = names.key();
    ctx.polls.forget(&key);
    ctx.addon_backoff.succeeded(&key);
    ctx.applied.forget(&key);
    ctx.addon_waits.forget(&key);
    if !finalizer::has(cluster, TEARDOWN_FINALIZER) {
        return Ok(Action::await_change());
    }
    let ns = &names.namespace;
    let client = &ctx.client;
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    // Only what the Cluster controls, directly or through its Deployments:
    // the label alone is no proof (anyone who may create Pods in the
    // namespace can set it, and another Cluster's objects may carry it).
    // The chain is read whole before anything is deleted: garbage collection
    // removes a deleted Deployment's ReplicaSets within moments, and Pods
    // whose ReplicaSet was no longer listed would not be known as the
    // Cluster's.
    let mut owners: Vec<String> = cluster.uid().into_iter().collect();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let owned_deployments = controlled(list(ctx, &deployments, names).await, &owners);
    owners.extend(owned_deployments.iter().filter_map(|d| d.uid()));
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let owned_replica_sets = controlled(list(ctx, &replica_sets, names).await, &owners);
    owners.extend(owned_replica_sets.iter().filter_map(|rs| rs.uid()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let owned_pods = controlled(list(ctx, &pods, names).await, &owners);
    for d in &owned_deployments {
        delete_quietly(&deployments, d, &background).await;
    }
    for rs in &owned_replica_sets {
        delete_quietly(&replica_sets, rs, &background).await;
    }
    let quick = DeleteParams {
        grace_period_seconds: Some(TEARDOWN_GRACE_SECONDS as u32),
        ..background
    };
    let mut stopped = 0;
    for p in &owned_pods {
        if p.metadata
            .deletion_grace_period_seconds
            .is_some_and(|g| g <= TEARDOWN_GRACE_SECONDS)
        {
            continue;
        }
        if delete_quietly(&pods, p, &quick).await {
            stopped += 1;
        }
    }
    tracing::info!(cluster = %names.cluster, pods = stopped, "cluster deleted: stopping its Pods");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    finalizer::remove(&clusters, cluster, TEARDOWN_FINALIZER)
        .await
        .map_err(Error::kube("removing the teardown finalizer"))?;
    Ok(Action::await_change())
}
