//! The snapshot gateway of a Cluster whose snapshots go to a claim
//! (`spec.etcd.backup.pvc`, or `restoreFrom.pvc` until the restore is
//! done): one Pod of an S3-compatible server (versitygw with its POSIX
//! backend) serving the claim's files, with keys and a certificate of its
//! own. The operator cannot mount a tenant's claim itself; through the
//! gateway, snapshots, listings, retention and restores take the same S3
//! path as object storage, and a restoring etcd member downloads from it
//! like from any storage. Pure: the objects, and the storage they make.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, ResourceRequirements, SecretKeySelector,
    SecurityContext, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_on_kube_api::cluster::{
    ClaimDestination, Cluster, EtcdBackup, RestoreFrom, S3Destination,
};

use super::{component_labels, owner};
use crate::names::{Component, Names};

/// The port it serves S3 on (HTTPS).
pub const PORT: i32 = 7070;
/// The one bucket it serves: the claim's root.
pub const BUCKET: &str = "snapshots";
/// Keys of its Secret.
pub const ACCESS_KEY_FIELD: &str = "accessKeyID";
pub const SECRET_KEY_FIELD: &str = "secretAccessKey";
pub const CA_FIELD: &str = "ca.crt";
pub const CERT_FIELD: &str = "tls.crt";
pub const KEY_FIELD: &str = "tls.key";
/// Every key its Secret must hold.
pub const SECRET_FIELDS: [&str; 5] = [
    ACCESS_KEY_FIELD,
    SECRET_KEY_FIELD,
    CA_FIELD,
    CERT_FIELD,
    KEY_FIELD,
];
/// The POSIX backend's root: its directories are buckets, and the claim is
/// mounted as the one bucket (the root itself is scratch).
const ROOT: &str = "/var/lib/kok-snapshots";
const TLS_DIR: &str = "/etc/kok-snapshots";
/// The unprivileged user and group it runs as; the claim is made writable
/// for the group.
const USER: i64 = 65532;

/// Where snapshots are stored, as S3 storage: the spec's own, or the
/// gateway's in front of a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Storage {
    /// The endpoint, bucket, prefix and Secrets to use.
    pub s3: S3Destination,
    /// The claim behind the gateway, when it is one; its endpoint is the
    /// operator's own and needs no `--backup-endpoints` entry.
    pub claim: Option<ClaimDestination>,
}

/// The gateway's URL: its Service's name in the namespace, which the
/// operator and the Cluster's Pods resolve alike.
pub fn endpoint(names: &Names) -> String {
    format!(
        "https://{}.{}.svc:{PORT}",
        names.snapshot_gateway(),
        names.namespace
    )
}

fn storage(
    names: &Names,
    s3: Option<&S3Destination>,
    pvc: Option<&ClaimDestination>,
) -> Option<Storage> {
    if let Some(s3) = s3 {
        return Some(Storage {
            s3: s3.clone(),
            claim: None,
        });
    }
    let claim = pvc?;
    let secret = names.snapshot_gateway();
    Some(Storage {
        s3: S3Destination {
            endpoint: endpoint(names),
            bucket: BUCKET.into(),
            prefix: claim.prefix.clone(),
            region: None,
            credentials_secret: secret.clone(),
            ca_secret: Some(secret),
        },
        claim: Some(claim.clone()),
    })
}

/// Where `backup` stores snapshots.
pub fn backup_storage(names: &Names, backup: &EtcdBackup) -> Option<Storage> {
    storage(names, backup.s3.as_ref(), backup.pvc.as_ref())
}

/// Where the snapshot `from` names is.
pub fn restore_storage(names: &Names, from: &RestoreFrom) -> Option<Storage> {
    storage(names, from.s3.as_ref(), from.pvc.as_ref())
}

/// The claim the Cluster needs a gateway on: its backups', or the one it
/// restores from while the restore is not done.
pub fn claim(cluster: &Cluster) -> Option<&ClaimDestination> {
    let etcd = &cluster.spec.etcd;
    if let Some(pvc) = etcd.backup.as_ref().and_then(|b| b.pvc.as_ref()) {
        return Some(pvc);
    }
    let restored = cluster
        .status
        .as_ref()
        .and_then(|s| s.restore.as_ref())
        .is_some_and(|r| r.data_restored);
    etcd.restore_from
        .as_ref()
        .and_then(|r| r.pvc.as_ref())
        .filter(|_| !restored)
}

/// Every name its certificate is for.
pub fn dns_names(names: &Names) -> Vec<String> {
    names.service_dns_names(&names.snapshot_gateway())
}

/// Its Service: the one port, to its Pod.
pub fn service(cluster: &Cluster, names: &Names) -> Service {
    let labels = component_labels(names, Component::SnapshotGateway);
    Service {
        metadata: ObjectMeta {
            name: Some(names.snapshot_gateway()),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(labels),
            ports: Some(vec![ServicePort {
                name: Some("s3".into()),
                port: PORT,
                target_port: Some(IntOrString::Int(PORT)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Its Deployment: one Pod on `claim`, stopped before its successor starts
/// (a claim is mostly ReadWriteOnce, and two servers must not write one
/// directory); `config_hash` rolls it when its Secret changes. `resources`
/// are the operator's (`--snapshot-gateway-resources`).
pub fn deployment(
    cluster: &Cluster,
    names: &Names,
    claim: &ClaimDestination,
    image: &str,
    resources: &ResourceRequirements,
    config_hash: &str,
) -> Deployment {
    let secret = names.snapshot_gateway();
    let credential = |name: &str, key: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.clone(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mount = |name: &str, path: String, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path,
        read_only: Some(read_only).filter(|r| *r),
        ..Default::default()
    };
    let container = Container {
        name: "versitygw".into(),
        image: Some(image.into()),
        resources: Some(resources.clone()),
        args: Some(vec![
            "--port".into(),
            format!(":{PORT}"),
            "--cert".into(),
            format!("{TLS_DIR}/{CERT_FIELD}"),
            "--key".into(),
            format!("{TLS_DIR}/{KEY_FIELD}"),
            "--health".into(),
            "/health".into(),
            "posix".into(),
            ROOT.into(),
        ]),
        // The root account's keys from the environment, never the command
        // line (which `ps` shows).
        env: Some(vec![
            credential("ROOT_ACCESS_KEY_ID", ACCESS_KEY_FIELD),
            credential("ROOT_SECRET_ACCESS_KEY", SECRET_KEY_FIELD),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("s3".into()),
            container_port: PORT,
            ..Default::default()
        }]),
        readiness_probe: Some(super::control_plane::https_probe("/health", PORT, 3, 1)),
        liveness_probe: Some(super::control_plane::https_probe("/health", PORT, 8, 15)),
        // Mounted in this order: the root, then the claim inside it.
        volume_mounts: Some(vec![
            mount("root", ROOT.into(), false),
            mount("snapshots", format!("{ROOT}/{BUCKET}"), false),
            mount("tls", TLS_DIR.into(), true),
        ]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(USER),
            run_as_group: Some(USER),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let volumes = vec![
        Volume {
            name: "root".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "snapshots".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.claim_name.clone(),
                read_only: None,
            }),
            ..Default::default()
        },
        super::control_plane::projected(
            "tls",
            vec![super::control_plane::projection(
                secret.clone(),
                &[(CERT_FIELD, CERT_FIELD), (KEY_FIELD, KEY_FIELD)],
            )],
        ),
    ];
    let mut deployment = super::control_plane::deployment(
        cluster,
        names,
        Component::SnapshotGateway,
        container,
        volumes,
        config_hash,
    );
    if let Some(spec) = deployment.spec.as_mut() {
        spec.replicas = Some(1);
        spec.strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
        if let Some(pod) = spec.template.spec.as_mut() {
            pod.security_context = Some(PodSecurityContext {
                fs_group: Some(USER),
                ..Default::default()
            });
            // One Pod: no one to spread from.
            pod.affinity = None;
        }
    }
    deployment
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(etcd: serde_json::Value) -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.metadata.namespace = Some("team-a".into());
        c.metadata.uid = Some("uid-1".into());
        let mut spec = serde_json::to_value(&c.spec.etcd).expect("etcd");
        for (k, v) in etcd.as_object().expect("object") {
            spec[k] = v.clone();
        }
        c.spec.etcd = serde_json::from_value(spec).expect("etcd");
        c
    }

    fn backup(destination: serde_json::Value) -> serde_json::Value {
        let mut b = json!({"schedule": {"every": "1h"}, "encryptionKeySecret": "key"});
        for (k, v) in destination.as_object().expect("object") {
            b[k] = v.clone();
        }
        json!({"backup": b})
    }

    #[test]
    fn a_claim_is_storage_behind_the_gateway_and_s3_is_itself() {
        let c = cluster(backup(
            json!({"pvc": {"claimName": "snaps", "prefix": "p"}}),
        ));
        let names = Names::new(&c, "cluster.local");
        let storage =
            backup_storage(&names, c.spec.etcd.backup.as_ref().expect("backup")).expect("storage");
        assert_eq!(
            storage.s3.endpoint,
            format!("https://{}.team-a.svc:7070", names.snapshot_gateway())
        );
        assert_eq!(storage.s3.bucket, BUCKET);
        assert_eq!(storage.s3.prefix.as_deref(), Some("p"));
        assert_eq!(storage.s3.credentials_secret, names.snapshot_gateway());
        assert_eq!(storage.s3.ca_secret, Some(names.snapshot_gateway()));
        assert_eq!(
            storage.claim.as_ref().map(|c| c.claim_name.as_str()),
            Some("snaps")
        );
        assert_eq!(claim(&c).map(|c| c.claim_name.as_str()), Some("snaps"));

        let s3 =
            json!({"endpoint": "https://s3.example", "bucket": "b", "credentialsSecret": "creds"});
        let c = cluster(backup(json!({"s3": s3})));
        let storage =
            backup_storage(&names, c.spec.etcd.backup.as_ref().expect("backup")).expect("storage");
        assert_eq!(storage.s3.endpoint, "https://s3.example");
        assert!(storage.claim.is_none());
        assert!(claim(&c).is_none(), "no gateway for S3 storage");
    }

    #[test]
    fn a_restore_from_a_claim_needs_the_gateway_until_its_data_is_restored() {
        let mut c = cluster(json!({"restoreFrom": {
            "pvc": {"claimName": "snaps", "prefix": "team-a/old"},
            "snapshot": "latest",
            "encryptionKeySecret": "key",
        }}));
        assert_eq!(claim(&c).map(|c| c.claim_name.as_str()), Some("snaps"));
        c.status = Some(
            serde_json::from_value(json!({"restore": {
                "snapshot": "20261127T120500Z-r1", "sha256": "x", "revision": 1,
                "identityRestored": true, "dataRestored": true,
            }}))
            .expect("status"),
        );
        assert!(claim(&c).is_none(), "restored: the gateway goes");
    }

    #[test]
    fn the_gateway_runs_one_unprivileged_pod_on_the_claim_with_its_keys_from_the_secret() {
        let c = cluster(backup(json!({"pvc": {"claimName": "snaps"}})));
        let names = Names::new(&c, "cluster.local");
        let d = deployment(
            &c,
            &names,
            claim(&c).expect("claim"),
            "ghcr.io/versity/versitygw:v1.8.0",
            &crate::resources::parse(r#"{"limits":{"memory":"300Mi"}}"#).expect("resources"),
            "h1",
        );
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(
            spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
            Some("Recreate")
        );
        let pod = spec.template.spec.as_ref().expect("pod");
        assert_eq!(pod.automount_service_account_token, Some(false));
        let claim_volume = pod
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.persistent_volume_claim.as_ref())
            .expect("claim volume");
        assert_eq!(claim_volume.claim_name, "snaps");
        let container = &pod.containers[0];
        let args = container.args.clone().unwrap_or_default();
        assert_eq!(
            args[args.len() - 2..],
            ["posix".to_string(), ROOT.to_string()]
        );
        let mounts: Vec<&str> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, [ROOT, "/var/lib/kok-snapshots/snapshots", TLS_DIR]);
        let env = serde_json::to_string(&container.env).expect("env");
        assert!(!env.contains("\"value\""), "keys only by reference: {env}");
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        assert_eq!(limits.expect("limits")["memory"].0, "300Mi");
        let security = container.security_context.as_ref().expect("security");
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        let service = service(&c, &names);
        assert_eq!(
            service.spec.as_ref().and_then(|s| s.selector.clone()),
            pod_labels(&d)
        );
        assert!(dns_names(&names).contains(&format!("{}.team-a.svc", names.snapshot_gateway())));
    }

    fn pod_labels(d: &Deployment) -> Option<std::collections::BTreeMap<String, String>> {
        d.spec.as_ref()?.template.metadata.as_ref()?.labels.clone()
    }
}
