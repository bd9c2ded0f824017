//! What the members of a restoring Cluster run before etcd (see
//! `backup::restore`): pure, so the etcd step renders it without reaching
//! into the backup module.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, Pod, SecretKeySelector, SecretVolumeSource, Volume,
    VolumeMount,
};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{RestoreStatus, S3Destination};

use super::snapshot_gateway::{backup_storage, restore_storage};
use crate::names::Names;

/// Where the snapshot is downloaded to inside a member's Pod.
const SCRATCH: &str = "/var/run/kok-restore";
/// Where the storage's CA is mounted for the download.
const CA_DIR: &str = "/etc/kok-restore-ca";

/// Why a restore of a Cluster's own backups runs.
pub const QUORUM_LOST: &str = "quorumLost";

/// The restore in progress, when `cluster`'s members have yet to start on a
/// snapshot: what was recorded.
pub fn pending(cluster: &Cluster) -> Option<&RestoreStatus> {
    let status = cluster.status.as_ref()?.restore.as_ref()?;
    (status.identity_restored && !status.data_restored).then_some(status)
}

/// Where the snapshot of the restore in progress is: as recorded when it
/// was chosen (a spec edited meanwhile does not move it), or, for a restore
/// recorded before records named it, as the spec names it now.
pub fn source(cluster: &Cluster, names: &Names) -> Option<S3Destination> {
    let status = pending(cluster)?;
    status
        .storage
        .clone()
        .or_else(|| storage(cluster, names, status.cause.as_deref()))
}

/// Where a restore for `cause` reads its snapshot from, as the spec names
/// it (its prefix filled in): the Cluster's own backups after a quorum
/// loss, else `restoreFrom`.
pub fn storage(cluster: &Cluster, names: &Names, cause: Option<&str>) -> Option<S3Destination> {
    let etcd = &cluster.spec.etcd;
    if cause == Some(QUORUM_LOST) {
        let mut s3 = backup_storage(names, etcd.backup.as_ref()?)?.s3;
        s3.prefix
            .get_or_insert_with(|| format!("{}/{}", names.namespace, names.cluster));
        Some(s3)
    } else {
        Some(restore_storage(names, etcd.restore_from.as_ref()?)?.s3)
    }
}

/// `pod`, a member of the first bootstrap of a restoring Cluster, with the
/// init containers that put the snapshot's data in place: the operator's
/// image downloads it (removing what an interrupted earlier attempt left in
/// the data directory), etcd's image restores it as this member.
pub fn with_restore(
    mut pod: Pod,
    s3: &S3Destination,
    status: &RestoreStatus,
    operator_image: &str,
    restore_args: Vec<String>,
) -> Pod {
    let Some(spec) = pod.spec.as_mut() else {
        return pod;
    };
    let Some(etcd) = spec.containers.first() else {
        return pod;
    };
    let data_dir = etcd
        .args
        .iter()
        .flatten()
        .chain(etcd.command.iter().flatten())
        .find_map(|a| a.strip_prefix("--data-dir="))
        .unwrap_or(crate::render::etcd::DATA_DIR)
        .to_string();
    let mut mounts: Vec<VolumeMount> = etcd
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name == "data")
        .cloned()
        .collect();
    mounts.push(VolumeMount {
        name: "restore".into(),
        mount_path: SCRATCH.into(),
        ..Default::default()
    });
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: "restore".into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    });
    let mut fetch_mounts = mounts.clone();
    let mut args = vec![
        "restore-snapshot".to_string(),
        format!("--endpoint={}", s3.endpoint),
        format!("--bucket={}", s3.bucket),
        format!("--prefix={}", s3.prefix.clone().unwrap_or_default()),
        format!("--snapshot={}", status.snapshot),
        format!("--sha256={}", status.sha256),
        format!("--out={SCRATCH}/snapshot.db"),
        format!("--clear-data-dir={data_dir}"),
    ];
    if let Some(region) = &s3.region {
        args.push(format!("--region={region}"));
    }
    if let Some(ca) = &s3.ca_secret {
        volumes.push(Volume {
            name: "restore-ca".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(ca.clone()),
                default_mode: Some(0o444),
                ..Default::default()
            }),
            ..Default::default()
        });
        fetch_mounts.push(VolumeMount {
            name: "restore-ca".into(),
            mount_path: CA_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
        args.push(format!("--ca-file={CA_DIR}/ca.crt"));
    }
    let credential = |name: &str, key: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: s3.credentials_secret.clone(),
                key: key.into(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let fetch = Container {
        name: "fetch-snapshot".into(),
        image: Some(operator_image.to_string()),
        args: Some(args),
        env: Some(vec![
            credential("KOK_S3_ACCESS_KEY_ID", "accessKeyID"),
            credential("KOK_S3_SECRET_ACCESS_KEY", "secretAccessKey"),
        ]),
        volume_mounts: Some(fetch_mounts),
        security_context: etcd.security_context.clone(),
        ..Default::default()
    };
    let mut command = vec![
        "etcdutl".to_string(),
        "snapshot".into(),
        "restore".into(),
        format!("{SCRATCH}/snapshot.db"),
        format!("--data-dir={data_dir}"),
        // Revisions move on past any a watcher of the lost cluster saw, and
        // those watchers are told to list again: a kube-apiserver that kept
        // running never serves its stale cache as current.
        "--bump-revision=1000000000".into(),
        "--mark-compacted".into(),
    ];
    command.extend(restore_args);
    let restore = Container {
        name: "restore-snapshot".into(),
        image: etcd.image.clone(),
        command: Some(command),
        volume_mounts: Some(mounts),
        security_context: etcd.security_context.clone(),
        ..Default::default()
    };
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .extend([fetch, restore]);
    pod
}

/// The flags of `etcdutl snapshot restore` that make the data this
/// member's, from its etcd flags: name, peer URL, the bootstrap's initial
/// cluster and token.
pub fn restore_flags(pod: &Pod) -> Vec<String> {
    let wanted = [
        "--name=",
        "--initial-cluster=",
        "--initial-cluster-token=",
        "--initial-advertise-peer-urls=",
    ];
    pod.spec
        .iter()
        .flat_map(|s| s.containers.first())
        .flat_map(|c| c.args.iter().flatten())
        .filter(|a| wanted.iter().any(|w| a.starts_with(w)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Names;
    use crate::render::etcd::{ClusterState, MemberPod, Peer, member_pod};
    use serde_json::json;

    fn member(index: usize) -> Pod {
        let c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let n = Names::new(&c, "cluster.local");
        let initial: Vec<Peer> = (0..3)
            .map(|i| {
                let name = n.etcd_member(i);
                Peer {
                    peer_url: n.etcd_peer_url(&name),
                    name,
                }
            })
            .collect();
        member_pod(
            &c,
            &n,
            &MemberPod {
                index,
                initial_cluster: &initial,
                state: ClusterState::New,
                version: "3.6.16",
                image: "registry.k8s.io/etcd:3.6.16-0",
                config_hash: "abc",
            },
        )
    }

    /// A rebuild reads its snapshot from the storage recorded when it was
    /// chosen: the tenant moving `spec.etcd.backup` meanwhile does not move
    /// where the members download from. A restore recorded before records
    /// named their storage reads the spec.
    #[test]
    fn a_rebuild_downloads_from_the_storage_recorded_not_the_spec_edited_since() {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let backup = |endpoint: &str| {
            serde_json::from_value(json!({
                "schedule": {"every": "6h"},
                "s3": {"endpoint": endpoint, "bucket": "etcd", "credentialsSecret": "s3"},
                "encryptionKeySecret": "key",
            }))
            .expect("backup")
        };
        c.spec.etcd.backup = Some(backup("https://s3.example.com"));
        let n = Names::new(&c, "cluster.local");
        let chosen = storage(&c, &n, Some(QUORUM_LOST)).expect("storage");
        assert_eq!(chosen.endpoint, "https://s3.example.com");
        assert_eq!(chosen.prefix.as_deref(), Some("clusters/prod-east"));
        let mut status = RestoreStatus {
            snapshot: "20261127T120500Z-r12".into(),
            sha256: "ab".repeat(32),
            revision: 12,
            identity_restored: true,
            data_restored: false,
            cause: Some(QUORUM_LOST.into()),
            storage: Some(chosen.clone()),
        };
        c.status = Some(Default::default());
        c.status.as_mut().unwrap().restore = Some(status.clone());
        c.spec.etcd.backup = Some(backup("https://elsewhere.example.com"));
        assert_eq!(source(&c, &n), Some(chosen));
        status.storage = None;
        c.status.as_mut().unwrap().restore = Some(status.clone());
        assert_eq!(
            source(&c, &n).map(|s| s.endpoint),
            Some("https://elsewhere.example.com".into())
        );
        // Once the data is restored, nothing is downloaded.
        status.data_restored = true;
        c.status.as_mut().unwrap().restore = Some(status);
        assert_eq!(source(&c, &n), None);
    }

    #[test]
    fn a_restoring_member_downloads_then_restores_as_itself_before_etcd_starts() {
        let pod = member(1);
        let flags = restore_flags(&pod);
        let s3: S3Destination = serde_json::from_value(json!({
            "endpoint": "https://s3.example.com",
            "bucket": "etcd",
            "prefix": "team-a/prod",
            "credentialsSecret": "s3",
            "caSecret": "s3-ca",
        }))
        .expect("s3");
        let status = RestoreStatus {
            snapshot: "20261127T120500Z-r12".into(),
            sha256: "ab".repeat(32),
            revision: 12,
            identity_restored: true,
            data_restored: false,
            cause: None,
            storage: None,
        };
        let pod = with_restore(pod, &s3, &status, "example.test/kok:1", flags);
        let spec = pod.spec.expect("spec");
        let init = spec.init_containers.expect("init containers");
        assert_eq!(
            init.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["fetch-snapshot", "restore-snapshot"]
        );
        let fetch = &init[0];
        assert_eq!(fetch.image.as_deref(), Some("example.test/kok:1"));
        let args = fetch.args.clone().expect("args");
        for wanted in [
            "restore-snapshot",
            "--bucket=etcd",
            "--prefix=team-a/prod",
            "--snapshot=20261127T120500Z-r12",
            &format!("--sha256={}", "ab".repeat(32)),
            "--clear-data-dir=/var/lib/etcd/data",
            &format!("--ca-file={CA_DIR}/ca.crt"),
        ] {
            assert!(args.iter().any(|a| a == wanted), "{wanted}: {args:?}");
        }
        // The keys come from the Secret, never from the Pod's spec.
        let env = fetch.env.clone().expect("env");
        assert!(env.iter().all(|e| e.value.is_none()));
        assert!(env.iter().all(|e| {
            e.value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.as_ref())
                .is_some_and(|r| r.name == "s3")
        }));
        let restore = init[1].command.clone().expect("command");
        assert_eq!(
            init[1].image.as_deref(),
            Some("registry.k8s.io/etcd:3.6.16-0")
        );
        assert_eq!(restore[..3], ["etcdutl", "snapshot", "restore"]);
        for wanted in [
            "--data-dir=/var/lib/etcd/data",
            "--name=prod-east-etcd-1",
            "--initial-advertise-peer-urls=https://prod-east-etcd-1.clusters.svc.cluster.local:2380",
            "--initial-cluster-token=clusters-prod-east",
            "--mark-compacted",
        ] {
            assert!(restore.iter().any(|a| a == wanted), "{wanted}: {restore:?}");
        }
        assert!(
            restore
                .iter()
                .any(|a| a.starts_with("--initial-cluster=prod-east-etcd-0="))
        );
        // Both see the member's data; the CA only where it is needed.
        let mounts = |c: &Container| -> Vec<String> {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| m.name.clone())
                .collect()
        };
        assert_eq!(mounts(&init[0]), ["data", "restore", "restore-ca"]);
        assert_eq!(mounts(&init[1]), ["data", "restore"]);
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert!(volumes.contains(&"restore") && volumes.contains(&"restore-ca"));
    }
}
