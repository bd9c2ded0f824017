//! A dynamic volume provisioner for the runner's nodes: a default StorageClass
//! whose claims get a PersistentVolume backed by a directory, bound by the real
//! persistent-volume controller, and deleted (directory included) when the claim
//! goes, so claim semantics (survive Pod restarts, vanish with the claim) hold.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use super::node::MANAGER;

/// Name of the StorageClass (and provisioner) the runner serves.
pub const CLASS: &str = "kok-testenv";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Directory of the volume for claim `uid`.
pub fn claim_dir(state: &Path, uid: &str) -> PathBuf {
    state.join("claims").join(uid)
}

/// Make the runner's StorageClass the cluster default.
pub async fn install_class(client: &Client) -> Result<(), kube::Error> {
    let class = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": CLASS,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    });
    Api::<StorageClass>::all(client.clone())
        .patch(
            CLASS,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&class),
        )
        .await
        .map(drop)
}

/// The PersistentVolume for a pending claim of our class.
pub fn volume_for(claim: &PersistentVolumeClaim, state: &Path) -> Option<PersistentVolume> {
    let spec = claim.spec.as_ref()?;
    if spec.storage_class_name.as_deref() != Some(CLASS) || spec.volume_name.is_some() {
        return None;
    }
    let uid = claim.uid()?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned())
        .unwrap_or_else(|| Quantity("1Gi".into()));
    Some(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pvc-{uid}")),
            annotations: Some([(PROVISIONED_BY.to_string(), CLASS.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some([("storage".to_string(), size)].into()),
            access_modes: spec
                .access_modes
                .clone()
                .or_else(|| Some(vec!["ReadWriteOnce".into()])),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some(CLASS.into()),
            host_path: Some(HostPathVolumeSource {
                path: claim_dir(state, &uid).display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            claim_ref: Some(ObjectReference {
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: Some(uid),
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// One provisioning pass: create volumes for new claims, delete released ones.
pub async fn reconcile(client: &Client, state: &Path) -> Result<(), kube::Error> {
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for claim in &claims.items {
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending") {
            continue;
        }
        if let Some(volume) = volume_for(claim, state) {
            if let Some(spec) = &volume.spec
                && let Some(path) = spec.host_path.as_ref().map(|h| PathBuf::from(&h.path))
            {
                let _ = std::fs::create_dir_all(path);
            }
            match volumes.create(&PostParams::default(), &volume).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    for volume in volumes.list(&ListParams::default()).await?.items {
        let ours = volume.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(CLASS);
        let released = matches!(
            volume.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Released") | Some("Failed")
        );
        if ours && released {
            if let Some(path) = volume
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| PathBuf::from(&h.path))
                && path.starts_with(state)
            {
                let _ = std::fs::remove_dir_all(&path);
            }
            match volumes
                .delete(&volume.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};

    #[test]
    fn volume_follows_the_claim() {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(CLASS.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("2Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        let pv = volume_for(&claim, Path::new("/state")).expect("volume");
        let spec = pv.spec.expect("spec");
        assert_eq!(
            spec.capacity.expect("capacity")["storage"],
            Quantity("2Gi".into())
        );
        assert_eq!(spec.host_path.expect("hostPath").path, "/state/claims/u-1");
        assert_eq!(
            spec.claim_ref.expect("claimRef").uid.as_deref(),
            Some("u-1")
        );
        let mut other = claim.clone();
        other.spec.as_mut().expect("spec").storage_class_name = Some("fast".into());
        assert!(volume_for(&other, Path::new("/state")).is_none());
    }
}
