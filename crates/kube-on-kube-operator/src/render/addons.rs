//! The built-in `bootstrap` add-on: what a kubelet needs in the business cluster
//! to join with a bootstrap token, as kubeadm's bootstrap-token phase sets it up:
//! the public `cluster-info` ConfigMap (CA and API address) readable without
//! credentials, bootstrap tokens allowed to create node CSRs, and those CSRs
//! (and nodes' renewals) approved automatically.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{
    ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

/// Group every bootstrap token authenticates as.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// Group of every node.
pub const NODES: &str = "system:nodes";

/// Objects of the bootstrap add-on, applied into the business cluster.
pub struct Bootstrap {
    pub cluster_info: ConfigMap,
    pub cluster_info_role: Role,
    pub cluster_info_binding: RoleBinding,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(
            [(
                "app.kubernetes.io/managed-by".to_string(),
                "kube-on-kube-operator".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

fn group(name: &str) -> Subject {
    Subject {
        kind: "Group".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        namespace: None,
    }
}

fn cluster_role_binding(name: &str, role: &str, subject: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(name, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![group(subject)]),
    }
}

/// The bootstrap objects for a cluster reachable at `server` with CA `ca_pem`.
pub fn bootstrap(server: &str, ca_pem: &str) -> Bootstrap {
    use base64::Engine;
    // The kubeconfig kubelets discover the cluster with: no credentials.
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "contexts": [],
        "users": [],
    });
    let cluster_info = ConfigMap {
        metadata: meta("cluster-info", Some("kube-public")),
        data: Some(
            [(
                "kubeconfig".to_string(),
                serde_json::to_string_pretty(&kubeconfig).unwrap_or_default(),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let cluster_info_role = Role {
        metadata: meta(
            "kube-on-kube:bootstrap-signer-clusterinfo",
            Some("kube-public"),
        ),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec!["cluster-info".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    let cluster_info_binding = RoleBinding {
        metadata: meta(
            "kube-on-kube:bootstrap-signer-clusterinfo",
            Some("kube-public"),
        ),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "kube-on-kube:bootstrap-signer-clusterinfo".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "system:anonymous".into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            namespace: None,
        }]),
    };
    let cluster_role_bindings = vec![
        cluster_role_binding(
            "kube-on-kube:kubelet-bootstrap",
            "system:node-bootstrapper",
            BOOTSTRAPPERS,
        ),
        cluster_role_binding(
            "kube-on-kube:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            BOOTSTRAPPERS,
        ),
        cluster_role_binding(
            "kube-on-kube:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            NODES,
        ),
        cluster_role_binding(
            "kube-on-kube:node-operator",
            "cluster-admin",
            "kube-on-kube:node-operators",
        ),
    ];
    Bootstrap {
        cluster_info,
        cluster_info_role,
        cluster_info_binding,
        cluster_role_bindings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_info_is_a_credential_free_kubeconfig() {
        let b = bootstrap("https://api.example.com:6443", "CA PEM");
        let text = &b.cluster_info.data.expect("data")["kubeconfig"];
        let parsed = kube::config::Kubeconfig::from_yaml(text).expect("kubeconfig");
        assert!(parsed.auth_infos.is_empty());
        assert_eq!(
            parsed.clusters[0]
                .cluster
                .as_ref()
                .and_then(|c| c.server.as_deref()),
            Some("https://api.example.com:6443")
        );
        let subjects = b.cluster_info_binding.subjects.expect("subjects");
        assert_eq!(subjects[0].name, "system:anonymous");
        let roles: Vec<_> = b
            .cluster_role_bindings
            .iter()
            .map(|c| c.role_ref.name.as_str())
            .collect();
        assert!(
            roles.contains(&"system:certificates.k8s.io:certificatesigningrequests:nodeclient")
        );
    }
}
