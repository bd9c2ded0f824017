//! Server-side apply with one field manager per controller: the way every
//! operator writes the objects and statuses it owns.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

use crate::Error;

/// Patch parameters for a controller's field manager. `force` takes over fields
/// another manager set, which is what a controller converging to its spec wants.
pub fn params(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force()
}

/// Server-side apply `obj` (which must carry apiVersion, kind and name).
pub async fn apply<K>(api: &Api<K>, manager: &str, name: &str, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    api.patch(name, &params(manager), &Patch::Apply(obj))
        .await
        .map_err(Error::Api)
}

/// Server-side apply a status: `status` is the `.status` value only; it is sent
/// with the kind's apiVersion and kind, as the status subresource requires.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    status: &S,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    let status = serde_json::to_value(status).map_err(|source| Error::Serialize {
        kind: "status",
        source,
    })?;
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(name, &params(manager), &Patch::Apply(patch))
        .await
        .map_err(Error::Api)
}
