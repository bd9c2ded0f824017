//! Desired child objects of a Cluster, as pure functions of its spec: what the
//! apply step sends with server-side apply. Unit-tested without a cluster.

pub mod addons;
pub mod apiserver_files;
pub mod control_plane;
pub mod etcd;
#[cfg(test)]
mod golden;
pub mod konnectivity;
pub mod kubeconfig;
pub mod network_policy;
pub mod restore;
pub mod snapshot_gateway;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube_on_kube_api::cluster::Cluster;
use kube_on_kube_api::shared::{CLUSTER_LABEL, COMPONENT_LABEL};

use crate::names::{Component, Names};

/// Annotation on Pod templates with the hash of the certificates and
/// configuration they mount; when it changes, the Pods roll.
pub const CONFIG_HASH_ANNOTATION: &str = "kubeonkube.io/config-hash";

/// Labels of every object of one component of one cluster.
pub fn component_labels(names: &Names, component: Component) -> BTreeMap<String, String> {
    [
        (CLUSTER_LABEL.to_string(), names.cluster.clone()),
        (COMPONENT_LABEL.to_string(), component.as_str().to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "kube-on-kube-operator".to_string(),
        ),
    ]
    .into()
}

/// What every control-plane container runs with: no privilege escalation,
/// no capabilities, the runtime's default seccomp profile; as the image's
/// user (root for etcd on a node directory), see [`restricted_non_root`]
/// for the others.
pub fn restricted() -> k8s_openapi::api::core::v1::SecurityContext {
    k8s_openapi::api::core::v1::SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

/// The user and group every control-plane container runs as (distroless'
/// `nonroot`, the user the node-operator's and konnectivity's images name;
/// upstream's kube-apiserver, controller-manager, scheduler and etcd run
/// as any user that can read their files).
pub const NON_ROOT: i64 = 65532;

/// [`restricted`], as [`NON_ROOT`] whatever user the image names.
pub fn restricted_non_root() -> k8s_openapi::api::core::v1::SecurityContext {
    k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NON_ROOT),
        run_as_group: Some(NON_ROOT),
        ..restricted()
    }
}

/// [`restricted_pod`] whose volumes (certificates and kubeconfigs of mode
/// 0400, data directories) are group-owned by [`NON_ROOT`], so containers
/// running as it can read and write them.
pub fn restricted_pod_non_root() -> k8s_openapi::api::core::v1::PodSecurityContext {
    k8s_openapi::api::core::v1::PodSecurityContext {
        run_as_non_root: Some(true),
        fs_group: Some(NON_ROOT),
        ..restricted_pod()
    }
}

/// The Pod-level counterpart of [`restricted`].
pub fn restricted_pod() -> k8s_openapi::api::core::v1::PodSecurityContext {
    k8s_openapi::api::core::v1::PodSecurityContext {
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> k8s_openapi::api::core::v1::SeccompProfile {
    k8s_openapi::api::core::v1::SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// The controller owner reference every child carries, so deleting the Cluster
/// garbage-collects it.
pub fn owner(cluster: &Cluster) -> OwnerReference {
    // A Cluster read from the API server always has a name and UID; the
    // fallbacks only matter for objects built in tests.
    cluster
        .controller_owner_ref(&())
        .unwrap_or_else(|| OwnerReference {
            api_version: Cluster::api_version(&()).to_string(),
            kind: Cluster::kind(&()).to_string(),
            name: cluster.metadata.name.clone().unwrap_or_default(),
            uid: cluster.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        })
}

/// A stable hash of configuration content (for [`CONFIG_HASH_ANNOTATION`]):
/// hex of the first 16 bytes of SHA-256 over the sorted entries.
pub fn config_hash<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    use sha2::{Digest, Sha256};
    let mut sorted: Vec<_> = entries.into_iter().collect();
    sorted.sort();
    let mut hasher = Sha256::new();
    for (key, value) in sorted {
        hasher.update((key.len() as u64).to_le_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_le_bytes());
        hasher.update(value);
    }
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_hash_is_order_independent_and_content_sensitive() {
        let a = config_hash([("a", b"1".as_slice()), ("b", b"2".as_slice())]);
        let b = config_hash([("b", b"2".as_slice()), ("a", b"1".as_slice())]);
        let c = config_hash([("a", b"1".as_slice()), ("b", b"3".as_slice())]);
        let d = config_hash([("a1", b"".as_slice()), ("b", b"2".as_slice())]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(a.len(), 32);
    }
}
