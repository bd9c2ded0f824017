//! A controller's finalizer on the objects it must clean up after: added
//! before it creates anything for the object, removed once that is gone.
//! Both writes carry the resourceVersion the controller read, so they fail
//! with a conflict (and the controller reads again) instead of overwriting a
//! finalizer someone else added or removed in between.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Whether `object` carries `finalizer`.
pub fn has<K: Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// `object` with `finalizer` added, as the API server stored it; `object`
/// itself when it already carries it (nothing is written).
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if has(object, finalizer) {
        return Ok(object.clone());
    }
    let mut finalizers = object.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    set(api, object, finalizers).await
}

/// Remove `finalizer` from `object`: what the API server stored, or None
/// when the object is already gone (its last finalizer removed by someone
/// else, or deleted and collected).
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let finalizers = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    match set(api, object, finalizers).await {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replace the finalizer list, only if the object did not change since it
/// was read: a merge patch carrying the resourceVersion fails with a
/// conflict otherwise.
async fn set<K>(api: &Api<K>, object: &K, finalizers: Vec<String>) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": object.resource_version(),
    }});
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}
