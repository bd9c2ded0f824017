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

/// Whether the API server refused a write for a reason a retry alone does
/// not fix: a 4xx status (invalid, denied by admission, over a quota,
/// forbidden) other than a missing object (404), a conflict of versions or
/// names (409) and throttling (429). Such an error is for the user to see on
/// the object the write was for, not only for the log.
pub fn refused(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e)
        if (400..500).contains(&e.code) && ![404, 409, 429].contains(&e.code))
}

/// The last segment of a type's path (`Deployment`, `DynamicObject`), to
/// say which object a failed call was about.
fn type_name<K>() -> &'static str {
    let full = std::any::type_name::<K>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Server-side apply `obj` (which must carry apiVersion, kind and name).
pub async fn apply<K>(api: &Api<K>, manager: &str, name: &str, obj: &K) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    api.patch(name, &params(manager), &Patch::Apply(obj))
        .await
        .map_err(|source| Error::Api {
            call: format!("applying {} {name}", type_name::<K>()),
            source,
        })
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
        .map_err(|source| Error::Api {
            call: format!("applying the status of {} {name}", K::kind(&())),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status =
            serde_json::from_value(serde_json::json!({"code": code, "message": "m"}))
                .expect("status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn only_what_a_retry_cannot_fix_is_refused() {
        for code in [400, 403, 422] {
            assert!(refused(&api_error(code)), "{code}");
        }
        for code in [404, 409, 429, 500, 503] {
            assert!(!refused(&api_error(code)), "{code}");
        }
    }
}
