//! No object of one owner is written for another: everything the operator
//! writes for a Cluster names that Cluster as its controller, and an object
//! of the same name that something else controls (another Cluster whose
//! derived names collide, a tenant's own object, or nothing at all) is left
//! as it is and reported instead of being applied over, replaced or deleted.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::Error;

/// An object the operator would write for one owner that another controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Kind of the object, for example `Secret`.
    pub kind: String,
    /// Its name (in the Cluster's namespace).
    pub name: String,
    /// Who controls it: `Cluster x-etcd`, or that nothing does.
    pub owner: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} already exists and belongs to {}: it is left unchanged; rename this Cluster or remove that object",
            self.kind, self.name, self.owner
        )
    }
}

/// The controller owner reference of an object, if it has one.
pub fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Whether `live` may be written on behalf of the controller `owner_uid`:
/// only when that owner controls it already.
pub fn check(kind: &str, owner_uid: &str, live: &ObjectMeta) -> Result<(), Conflict> {
    match controller(live) {
        Some(o) if o.uid == owner_uid => Ok(()),
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
    let check_meta =
        |live: &ObjectMeta| check(&kind, &owner.uid, live).map_err(Error::NameConflict);
    if let Some(live) = known {
        return check_meta(live.meta());
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    match api.get_metadata_opt(&name).await.map_err(Error::Kube)? {
        Some(live) => check_meta(&live.metadata),
        None => Ok(()),
    }
}

/// After a create answered "already exists": the object is the owner's own
/// (made by an earlier attempt) or a conflict.
pub async fn existing<K>(api: &Api<K>, name: &str, owner_uid: &str) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get_metadata_opt(name).await.map_err(Error::Kube)? {
        Some(live) => check(&K::kind(&()), owner_uid, &live.metadata).map_err(Error::NameConflict),
        None => Ok(()),
    }
}

/// Delete `name` if `owner_uid` controls it, with its uid as the
/// precondition (so an object of that name made since it was read is not
/// the one deleted); whether a delete was sent. Gone already is fine.
pub async fn delete_owned<K>(
    api: &Api<K>,
    name: &str,
    owner_uid: &str,
    params: &DeleteParams,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(live) = api.get_metadata_opt(name).await.map_err(Error::Kube)? else {
        return Ok(false);
    };
    check(&K::kind(&()), owner_uid, &live.metadata).map_err(Error::NameConflict)?;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.uid(),
            resource_version: None,
        }),
        ..params.clone()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(Error::Kube(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, owner: Option<(&str, &str, bool)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|(kind, uid, controller)| {
                vec![OwnerReference {
                    api_version: "kubeonkube.io/v1alpha1".into(),
                    kind: kind.into(),
                    name: format!("{kind}-{uid}").to_lowercase(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_controller_may_write() {
        assert_eq!(
            check(
                "Secret",
                "u1",
                &meta("x-etcd-ca", Some(("Cluster", "u1", true)))
            ),
            Ok(())
        );
        let other = check(
            "Secret",
            "u1",
            &meta("x-etcd-ca", Some(("Cluster", "u2", true))),
        )
        .expect_err("another Cluster's");
        assert_eq!(other.owner, "Cluster cluster-u2");
        assert_eq!(other.name, "x-etcd-ca");
        assert!(other.to_string().contains("Secret x-etcd-ca"), "{other}");
        // Nobody's, or owned without being controlled: not the operator's either.
        assert!(check("Secret", "u1", &meta("x-etcd-ca", None)).is_err());
        assert!(
            check(
                "Secret",
                "u1",
                &meta("x-etcd-ca", Some(("Cluster", "u1", false)))
            )
            .is_err()
        );
        assert!(
            check(
                "Secret",
                "u1",
                &meta("x-etcd-ca", Some(("ConfigMap", "u3", true)))
            )
            .is_err()
        );
    }
}
