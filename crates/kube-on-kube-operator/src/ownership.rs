//! No object of one owner is written for another: everything the operator
//! writes for a Cluster names that Cluster as its controller, and an object
//! of the same name that something else controls (another Cluster whose
//! derived names collide, a tenant's own object, or nothing at all) is left
//! as it is and reported instead of being applied over, replaced or deleted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::api::{Api, DeleteParams, Preconditions};
use serde::de::DeserializeOwned;

use crate::Error;
use crate::error::Conflict;

/// The controller owner reference of an object, if it has one.
pub fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Whether `live` may be written on behalf of the controller `owner`: only
/// when `owner` controls it already, or a deleted predecessor of the same
/// kind and name did (its objects are garbage to be collected: names are
/// unique in a namespace, so the owner of that name with another UID is
/// gone, and a Cluster recreated at once takes them over as before).
pub fn check(kind: &str, owner: &OwnerReference, live: &ObjectMeta) -> Result<(), Conflict> {
    let group = |r: &OwnerReference| r.api_version.split('/').next().map(str::to_string);
    match controller(live) {
        Some(o) if o.uid == owner.uid => Ok(()),
        Some(o) if o.kind == owner.kind && o.name == owner.name && group(o) == group(owner) => {
            Ok(())
        }
        other => Err(Conflict {
            kind: kind.to_string(),
            name: live.name.clone().unwrap_or_default(),
            owner: other.map_or_else(
                || "nobody this operator manages (it has no controller)".to_string(),
                |o| format!("{} {}", o.kind, o.name),
            ),
        }),
    }
}

/// Refuse to apply `desired` over an object its controller does not control.
/// `known` is the live object when the caller read it already (the Cluster's
/// objects, listed by label); otherwise its metadata is read, which happens
/// only when an object is written that the Cluster's lists did not hold
/// (being created, or another's).
pub async fn guard<K>(api: &Api<K>, desired: &K, known: Option<&K>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(owner) = controller(desired.meta()) else {
        return Ok(());
    };
    let kind = K::kind(&());
    let check_meta = |live: &ObjectMeta| check(&kind, owner, live).map_err(Error::NameConflict);
    if let Some(live) = known {
        return check_meta(live.meta());
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    match live_metadata(api, &name).await? {
        Some(live) => check_meta(&live),
        None => Ok(()),
    }
}

/// After a create answered "already exists": the object is the owner's own
/// (made by an earlier attempt) or a conflict.
pub async fn existing<K>(api: &Api<K>, name: &str, owner: &OwnerReference) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match live_metadata(api, name).await? {
        Some(live) => check(&K::kind(&()), owner, &live).map_err(Error::NameConflict),
        None => Ok(()),
    }
}

/// The metadata of the live object `name`, if there is one; a failed read
/// says which object it was (formatted only then).
async fn live_metadata<K>(api: &Api<K>, name: &str) -> Result<Option<ObjectMeta>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_metadata_opt(name)
        .await
        .map(|live| live.map(|l| l.metadata))
        .map_err(|source| Error::Kube {
            call: format!("reading {} {name}", K::kind(&())),
            source,
        })
}

/// Delete `name` if `owner` controls it (see [`check`]), with its UID as the
/// precondition (so an object of that name made since it was read is not
/// the one deleted); whether a delete was sent. Gone already is fine.
pub async fn delete_owned<K>(
    api: &Api<K>,
    name: &str,
    owner: &OwnerReference,
    params: &DeleteParams,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(live) = live_metadata(api, name).await? else {
        return Ok(false);
    };
    check(&K::kind(&()), owner, &live).map_err(Error::NameConflict)?;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.uid.clone(),
            resource_version: None,
        }),
        ..params.clone()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(source) => Err(Error::Kube {
            call: format!("deleting {} {name}", K::kind(&())),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "kubeonkube.io/v1alpha1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: Some(true),
        }
    }

    fn meta(owner: Option<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            name: Some("x-etcd-ca".into()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_controller_may_write() {
        let x = reference("Cluster", "x", "u1", true);
        assert_eq!(check("Secret", &x, &meta(Some(x.clone()))), Ok(()));
        let other = check(
            "Secret",
            &x,
            &meta(Some(reference("Cluster", "x-etcd", "u2", true))),
        )
        .expect_err("another Cluster's");
        assert_eq!(other.owner, "Cluster x-etcd");
        assert_eq!(other.name, "x-etcd-ca");
        assert!(other.to_string().contains("Secret x-etcd-ca"), "{other}");
        // Nobody's, owned without being controlled, or another kind's: not
        // the operator's either.
        assert!(check("Secret", &x, &meta(None)).is_err());
        assert!(
            check(
                "Secret",
                &x,
                &meta(Some(reference("Cluster", "x", "u1", false)))
            )
            .is_err()
        );
        assert!(
            check(
                "Secret",
                &x,
                &meta(Some(reference("ConfigMap", "x", "u3", true)))
            )
            .is_err()
        );
    }

    #[test]
    fn a_deleted_predecessor_of_the_same_name_is_taken_over() {
        let x = reference("Cluster", "x", "new", true);
        let before = reference("Cluster", "x", "old", true);
        assert_eq!(check("Secret", &x, &meta(Some(before.clone()))), Ok(()));
        let elsewhere = OwnerReference {
            api_version: "example.com/v1".into(),
            ..before
        };
        assert!(check("Secret", &x, &meta(Some(elsewhere))).is_err());
    }
}
