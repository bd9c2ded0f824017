//! What the last apply of each object returned, so that a reconcile skips
//! applying an object that nobody changed since, to the same desired state.
//!
//! Most reconciles of a converging Cluster are woken by its Pods and
//! Deployments getting ready; applying its Services and Deployments again,
//! unchanged, was about half of each pass's requests. An object is applied
//! again when what it should be changed, when its live copy is another object
//! (recreated), or when anyone changed it since: a new `metadata.generation`
//! for kinds that have one (a Deployment's status updates do not change it),
//! a new `resourceVersion` for the others, and for both any change of its
//! labels, annotations or owners.

use std::collections::HashMap;
use std::sync::Mutex;

use kok_common::watch::hash;
use kube::Resource;
use serde::Serialize;

/// What changes when anyone but the apply's own field manager changes an
/// object: for a Deployment its generation (not its status), for a Service its
/// resourceVersion.
pub type Version<K> = fn(&K) -> Option<String>;

/// The generation: changes with every change of the spec.
pub fn generation<K: Resource>(k: &K) -> Option<String> {
    k.meta().generation.map(|g| g.to_string())
}

/// The resourceVersion: changes with every write.
pub fn resource_version<K: Resource>(k: &K) -> Option<String> {
    k.meta().resource_version.clone()
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    desired: u64,
    uid: String,
    version: String,
    meta: u64,
}

/// The last applies, per Cluster (dropped with it) and object.
#[derive(Default)]
pub struct Applied {
    clusters: Mutex<HashMap<String, HashMap<String, Entry>>>,
}

/// The hash of what an apply sends.
pub fn desired_hash<K: Serialize>(desired: &K) -> u64 {
    hash(&serde_json::to_vec(desired).unwrap_or_default())
}

fn object_key<K: Resource<DynamicType = ()>>(k: &K) -> String {
    format!(
        "{}/{}",
        K::kind(&()),
        k.meta().name.as_deref().unwrap_or_default()
    )
}

fn meta_hash<K: Resource>(k: &K) -> u64 {
    let m = k.meta();
    let owners: Vec<(&str, &str, Option<bool>)> = m
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.as_str(), o.uid.as_str(), o.controller))
        .collect();
    hash(&(&m.labels, &m.annotations, owners))
}

impl Applied {
    /// Whether `live` is still what the last apply of `desired` (of hash
    /// `desired_hash`) returned, so that applying it again would change nothing.
    pub fn unchanged<K: Resource<DynamicType = ()>>(
        &self,
        cluster: &str,
        desired_hash: u64,
        live: &K,
        version: Version<K>,
    ) -> bool {
        let m = live.meta();
        if m.deletion_timestamp.is_some() {
            return false;
        }
        let (Some(uid), Some(live_version)) = (&m.uid, version(live)) else {
            return false;
        };
        let clusters = self.lock();
        clusters
            .get(cluster)
            .and_then(|objects| objects.get(&object_key(live)))
            .is_some_and(|e| {
                e.desired == desired_hash
                    && &e.uid == uid
                    && e.version == live_version
                    && e.meta == meta_hash(live)
            })
    }

    /// Remember what applying an object of hash `desired_hash` returned.
    pub fn record<K: Resource<DynamicType = ()>>(
        &self,
        cluster: &str,
        desired_hash: u64,
        written: &K,
        version: Version<K>,
    ) {
        let (Some(uid), Some(version)) = (written.meta().uid.clone(), version(written)) else {
            return;
        };
        let entry = Entry {
            desired: desired_hash,
            uid,
            version,
            meta: meta_hash(written),
        };
        self.lock()
            .entry(cluster.to_string())
            .or_default()
            .insert(object_key(written), entry);
    }

    /// Forget a Cluster's objects (it is being deleted).
    pub fn forget(&self, cluster: &str) {
        self.lock().remove(cluster);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Entry>>> {
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
    use k8s_openapi::api::core::v1::Service;

    fn deployment(generation: i64, image: &str) -> Deployment {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c-apiserver", "uid": "u1", "generation": generation,
                         "resourceVersion": "10", "labels": {"a": "b"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "x", "image": image}]}}}
        }))
        .expect("deployment");
        d.metadata.managed_fields = None;
        d
    }

    #[test]
    fn an_object_nobody_changed_is_not_applied_again() {
        let applied = Applied::default();
        let want = desired_hash(&deployment(0, "v1"));
        let written = deployment(1, "v1");
        let live = |f: &dyn Fn(&mut Deployment)| {
            let mut d = written.clone();
            f(&mut d);
            d
        };
        // Never applied: apply.
        assert!(!applied.unchanged("ns/c", want, &written, generation));
        applied.record("ns/c", want, &written, generation);
        assert!(applied.unchanged("ns/c", want, &written, generation));
        // Its status moved on: still unchanged.
        let status = live(&|d| {
            d.metadata.resource_version = Some("11".into());
            d.status = Some(DeploymentStatus {
                ready_replicas: Some(1),
                ..Default::default()
            });
        });
        assert!(applied.unchanged("ns/c", want, &status, generation));
        // What it should be changed.
        assert!(!applied.unchanged(
            "ns/c",
            desired_hash(&deployment(0, "v2")),
            &written,
            generation
        ));
        // Someone changed its spec, its labels, or recreated it; or it goes.
        assert!(!applied.unchanged(
            "ns/c",
            want,
            &live(&|d| d.metadata.generation = Some(2)),
            generation
        ));
        assert!(!applied.unchanged(
            "ns/c",
            want,
            &live(&|d| d.metadata.labels = None),
            generation
        ));
        assert!(!applied.unchanged(
            "ns/c",
            want,
            &live(&|d| d.metadata.uid = Some("u2".into())),
            generation
        ));
        assert!(!applied.unchanged(
            "ns/c",
            want,
            &live(&|d| d.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH
                ))),
            generation
        ));
        // Another Cluster, or after the Cluster was forgotten.
        assert!(!applied.unchanged("ns/other", want, &written, generation));
        applied.forget("ns/c");
        assert!(!applied.unchanged("ns/c", want, &written, generation));
    }

    #[test]
    fn kinds_without_a_generation_compare_their_resource_version() {
        let applied = Applied::default();
        let mut svc = Service::default();
        svc.metadata.name = Some("c-apiserver".into());
        svc.metadata.uid = Some("u1".into());
        svc.metadata.resource_version = Some("5".into());
        let want = desired_hash(&Service::default());
        applied.record("ns/c", want, &svc, resource_version);
        assert!(applied.unchanged("ns/c", want, &svc, resource_version));
        svc.metadata.resource_version = Some("6".into());
        assert!(!applied.unchanged("ns/c", want, &svc, resource_version));
        // A Deployment of the same name is another object.
        let mut d = deployment(1, "v1");
        d.metadata.name = Some("c-apiserver".into());
        assert!(!applied.unchanged("ns/c", want, &d, generation));
    }
}
