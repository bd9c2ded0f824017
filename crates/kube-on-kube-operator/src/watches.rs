//! The Cluster controller's wiring: which watches wake a Cluster's pass,
//! read no further than the pass needs, and the controller runtime that
//! runs [`crate::controller::reconcile`] for them.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kok_common::watch::{changes, hash};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::CLUSTER_LABEL;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::config::Config;
use crate::context::{Context, MANAGER};
use crate::controller::{error_policy, reconcile};

/// Run the Cluster controller until SIGTERM/SIGINT. `namespace` limits it to one
/// namespace; `None` watches all.
pub async fn run(client: Client, namespace: Option<String>, concurrency: u16, config: Config) {
    let namespace = namespace.as_deref();
    fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let selector = watcher::Config::default().labels(CLUSTER_LABEL);
    let reporter = Reporter {
        controller: MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        Recorder::new(client.clone(), reporter),
        config,
    ));
    let controller_config = kube::runtime::controller::Config::default().concurrency(concurrency);
    // A Cluster wakes its reconcile when what it asks for changes, not when
    // its status does: only the reconcile writes the status, and it already
    // knows what it wrote (each status change woke one more pass that found
    // nothing to do).
    let (store, writer) = reflector::store();
    tokio::spawn(crate::metrics::forget_deleted_clusters(store.clone()));
    let clusters = watcher(
        scoped::<Cluster>(&client, namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(wakes, Default::default())
    .inspect({
        let ctx = ctx.clone();
        move |event| {
            if let Ok(cluster) = event {
                let ns = cluster.namespace().unwrap_or_default();
                ctx.addon_waits
                    .touch(&format!("{ns}/{}", cluster.name_any()));
            }
        }
    });
    // What wakes a Cluster, read no further than needed: the metadata of its
    // Secrets, Services and claims (created, edited or deleted: the watch
    // sends each change's metadata, without the certificates and keys), and
    // of Pods only the etcd members, the only ones a Cluster owns (a
    // Deployment's Pods belong to its ReplicaSets).
    fn metadata<K>(
        api: Api<PartialObjectMeta<K>>,
        selector: &watcher::Config,
    ) -> impl futures::Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        kok_common::watch::touched(watcher(api, selector.clone()).default_backoff())
    }
    let members = watcher::Config::default().labels(&format!(
        "{CLUSTER_LABEL},{}",
        crate::render::etcd::MEMBER_LABEL
    ));
    let named = store.clone();
    let controller = Controller::for_stream(clusters, store)
        .with_config(controller_config)
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            metadata(
                scoped::<PartialObjectMeta<Secret>>(&client, namespace),
                &selector,
            ),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            changes::<Cluster, _>(scoped::<Pod>(&client, namespace), members, pod_fingerprint),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            metadata(
                scoped::<PartialObjectMeta<Service>>(&client, namespace),
                &selector,
            ),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            changes::<Cluster, _>(
                scoped::<Deployment>(&client, namespace),
                selector.clone(),
                deployment_fingerprint,
            ),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            metadata(
                scoped::<PartialObjectMeta<PersistentVolumeClaim>>(&client, namespace),
                &selector,
            ),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            metadata(
                scoped::<PartialObjectMeta<PodDisruptionBudget>>(&client, namespace),
                &selector,
            ),
        ))
        .owns_stream(ends_addon_waits(
            ctx.clone(),
            metadata(
                scoped::<PartialObjectMeta<NetworkPolicy>>(&client, namespace),
                &selector,
            ),
        ));
    // The tenant's objects a Cluster's spec names for kube-apiserver (audit
    // policy, JWT issuers, audit webhook kubeconfig): a change wakes the
    // Clusters naming them. Their metadata only, and only their names
    // matter.
    let every = watcher::Config::default();
    let controller = controller
        .watches_stream(
            metadata(
                scoped::<PartialObjectMeta<ConfigMap>>(&client, namespace),
                &every,
            ),
            naming(named.clone(), crate::apiserver_files::config_maps),
        )
        .watches_stream(
            metadata(
                scoped::<PartialObjectMeta<Secret>>(&client, namespace),
                &every,
            ),
            naming(named, crate::apiserver_files::secrets),
        );
    // Snapshots run beside, never inside, the Cluster's passes.
    let backups = crate::backup::scheduled::run(client.clone(), namespace, ctx.clone());
    let clusters = kok_common::controller::run(
        "cluster",
        controller,
        reconcile,
        error_policy,
        ctx,
        Error::category,
    );
    futures::join!(clusters, backups);
}

/// The Clusters of an object's namespace whose spec names it (`names`:
/// the objects of that kind a Cluster names).
fn naming<K>(
    clusters: reflector::Store<Cluster>,
    names: fn(&Cluster) -> Vec<&str>,
) -> impl Fn(PartialObjectMeta<K>) -> Vec<ObjectRef<Cluster>> + Send + Sync + 'static
where
    K: Resource,
{
    move |object| {
        let (ns, name) = (object.namespace(), object.name_any());
        clusters
            .state()
            .iter()
            .filter(|c| c.namespace() == ns && names(c).contains(&name.as_str()))
            .map(|c| ObjectRef::from_obj(&**c))
            .collect()
    }
}

/// Passes on the events of a Cluster's objects, ending the Cluster's wait
/// for an add-on retry with each (see [`crate::addon_retry`]).
fn ends_addon_waits<K, S>(ctx: Arc<Context>, events: S) -> impl futures::Stream<Item = S::Item>
where
    K: Resource,
    S: futures::Stream<Item = Result<K, watcher::Error>>,
{
    events.inspect(move |event| {
        if let Ok(object) = event {
            let ns = object.meta().namespace.as_deref().unwrap_or_default();
            for owner in object
                .owner_references()
                .iter()
                .filter(|o| o.kind == "Cluster")
            {
                ctx.addon_waits.touch(&format!("{ns}/{}", owner.name));
            }
        }
    })
}

/// What the reconcile reads of a member Pod (see `etcd::pod_state`, the
/// rollout and teardown): its other writes, as being scheduled or a probe
/// time, wake nothing.
fn pod_fingerprint(pod: &Pod) -> u64 {
    let m = &pod.metadata;
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone());
    let images: Vec<Option<&str>> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| c.image.as_deref())
        .collect();
    hash(&(
        &m.labels,
        &m.annotations,
        m.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        status.and_then(|s| s.phase.as_deref()),
        ready,
        crate::etcd::restarts(pod),
        images,
    ))
}

/// What the reconcile reads of a Deployment: its generation and replica
/// counts (the status conditions' own updates wake nothing).
fn deployment_fingerprint(d: &Deployment) -> u64 {
    let m = &d.metadata;
    let s = d.status.as_ref();
    hash(&(
        m.generation,
        &m.labels,
        &m.annotations,
        m.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
        s.and_then(|s| s.observed_generation),
        s.and_then(|s| s.replicas),
        s.and_then(|s| s.updated_replicas),
        s.and_then(|s| s.ready_replicas),
        s.and_then(|s| s.available_replicas),
    ))
}

/// What of a Cluster wakes its reconcile: spec (its generation), labels,
/// annotations, finalizers and deletion; not its status.
fn wakes(cluster: &Cluster) -> Option<u64> {
    let m = &cluster.metadata;
    Some(hash(&(
        m.generation,
        &m.labels,
        &m.annotations,
        &m.finalizers,
        m.deletion_timestamp.as_ref().map(|t| t.0.as_second()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::tests::member;
    use crate::teardown::TEARDOWN_FINALIZER;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube_on_kube_api::cluster::ClusterStatus;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.metadata.generation = Some(1);
        c
    }

    #[test]
    fn a_status_change_does_not_wake_a_cluster_and_a_spec_change_does() {
        let before = cluster();
        let mut status_only = before.clone();
        status_only.status = Some(ClusterStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Ready".into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: Some(1),
            }],
            ..Default::default()
        });
        status_only.metadata.resource_version = Some("2".into());
        assert_eq!(wakes(&before), wakes(&status_only));

        let mut spec = before.clone();
        spec.metadata.generation = Some(2);
        assert_ne!(wakes(&before), wakes(&spec));
        let mut deleted = before.clone();
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_ne!(wakes(&before), wakes(&deleted));
        let mut finalized = before.clone();
        finalized.metadata.finalizers = Some(vec![TEARDOWN_FINALIZER.into()]);
        assert_ne!(wakes(&before), wakes(&finalized));
        let mut annotated = before;
        annotated.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert_ne!(wakes(&cluster()), wakes(&annotated));
    }

    #[test]
    fn only_what_the_reconcile_reads_of_pods_and_deployments_wakes_it() {
        let pending = member(false, 0);
        let mut scheduled = pending.clone();
        scheduled.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        if let Some(c) = scheduled
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
        {
            c.push(
                serde_json::from_value(serde_json::json!(
                    {"type": "PodScheduled", "status": "True"}
                ))
                .expect("condition"),
            );
        }
        assert_eq!(pod_fingerprint(&pending), pod_fingerprint(&scheduled));
        assert_ne!(pod_fingerprint(&pending), pod_fingerprint(&member(true, 0)));
        assert_ne!(
            pod_fingerprint(&pending),
            pod_fingerprint(&member(false, 1))
        );

        let deployment = |ready: i32, condition: &str| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "d", "generation": 1},
                "status": {
                    "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                    "readyReplicas": ready, "availableReplicas": ready,
                    "conditions": [{"type": "Progressing", "status": "True", "reason": condition}]
                }
            }))
            .expect("deployment")
        };
        assert_eq!(
            deployment_fingerprint(&deployment(0, "ReplicaSetUpdated")),
            deployment_fingerprint(&deployment(0, "NewReplicaSetAvailable"))
        );
        assert_ne!(
            deployment_fingerprint(&deployment(0, "ReplicaSetUpdated")),
            deployment_fingerprint(&deployment(1, "ReplicaSetUpdated"))
        );
    }
}
