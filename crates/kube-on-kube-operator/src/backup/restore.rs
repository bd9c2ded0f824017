//! A new Cluster started from a snapshot (`spec.etcd.restoreFrom`).
//!
//! Before anything of the Cluster is made, [`prepare`] picks the snapshot
//! (`latest` is resolved once and recorded), refuses one of a newer
//! Kubernetes minor than the Cluster's, opens its sealed identity with the
//! user's key and writes the CA and service-account Secrets from it, as the
//! PKI step would have made them; the PKI step then finds and records them,
//! and issues every leaf certificate from them. Each etcd member of the
//! first bootstrap then starts on the snapshot's data: two init containers,
//! the operator's image downloading the snapshot (its size and sha256
//! checked) and etcd's image running `etcdutl snapshot restore` with the
//! member's name and the bootstrap's `--initial-cluster` (etcd's own
//! procedure for restoring a cluster). [`finish`] records when every member
//! serves. A failure at any point leaves a `Restored=False` reason and
//! creates nothing else: no member ever starts on an empty database in its
//! place.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, Pod, Secret, SecretKeySelector, SecretVolumeSource, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{RECOVER_ANNOTATION, RestoreFrom, RestoreStatus, S3Destination};
use serde_json::json;

use super::scheduled::{Failure, read_key, store_config};
use super::{Manifest, SnapshotStore, pki};
use crate::Error;
use crate::context::{Context, publish};
use crate::names::Names;

/// The condition the restore answers in.
pub const RESTORED: &str = "Restored";
/// Its field manager.
pub const MANAGER: &str = "kube-on-kube-operator-restore";
/// Where the snapshot is downloaded to inside a member's Pod.
const SCRATCH: &str = "/var/run/kok-restore";
/// Where the storage's CA is mounted for the download.
const CA_DIR: &str = "/etc/kok-restore-ca";

/// The Secret type the PKI step gives each identity Secret.
fn secret_type(role: &str) -> &'static str {
    if role == "sa" {
        "Opaque"
    } else {
        "kubernetes.io/tls"
    }
}

/// The minor version of `v1.35.4` or `1.35`.
fn minor(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .nth(1)?
        .parse()
        .ok()
}

/// Why a restore of a Cluster's own backups runs.
pub const QUORUM_LOST: &str = "quorumLost";
const RESTORE_FROM: &str = "restoreFrom";

/// The restore in progress, when `cluster`'s members have yet to start on a
/// snapshot: where the snapshot is (its prefix filled in) and what was
/// recorded.
pub fn pending(cluster: &Cluster) -> Option<(S3Destination, &RestoreStatus)> {
    let status = cluster.status.as_ref()?.restore.as_ref()?;
    if !status.identity_restored || status.data_restored {
        return None;
    }
    let etcd = &cluster.spec.etcd;
    if status.cause.as_deref() == Some(QUORUM_LOST) {
        let mut s3 = etcd.backup.as_ref()?.s3.clone();
        s3.prefix.get_or_insert_with(|| {
            format!(
                "{}/{}",
                cluster.metadata.namespace.as_deref().unwrap_or_default(),
                cluster.metadata.name.as_deref().unwrap_or_default()
            )
        });
        Some((s3, status))
    } else {
        Some((etcd.restore_from.as_ref()?.s3.clone(), status))
    }
}

async fn write(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    restore: Option<&RestoreStatus>,
    ok: bool,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let mut conditions: Vec<Condition> = cluster
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .filter(|c| c.type_ == RESTORED)
        .cloned()
        .collect();
    conditions::set(
        &mut conditions,
        Desired {
            type_: RESTORED,
            status: Status::from(ok),
            reason,
            message,
        },
        cluster.metadata.generation,
        Timestamp::now(),
    );
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let mut status = json!({"conditions": conditions});
    if let Some(restore) = restore {
        status["restore"] = serde_json::to_value(restore).unwrap_or_default();
    }
    kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &status).await?;
    Ok(())
}

/// What to say about a restore: the `Restored` condition and an Event with
/// the same message.
struct Said<'a> {
    ok: bool,
    reason: &'a str,
    event: EventType,
    event_reason: &'a str,
    action: &'a str,
}

/// Write the condition (and `restore`, when given) and publish the Event.
async fn say(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    restore: Option<&RestoreStatus>,
    said: Said<'_>,
    message: String,
) -> Result<(), Error> {
    write(
        ctx,
        cluster,
        names,
        restore,
        said.ok,
        said.reason,
        message.clone(),
    )
    .await?;
    publish(
        ctx,
        cluster,
        said.event,
        said.event_reason,
        said.action,
        message,
    )
    .await;
    Ok(())
}

/// For a Cluster that restores and has no identity yet: write it from the
/// snapshot. `Some(action)`: the pass stops here (it is written and the
/// next pass reads it, or it failed and is tried again).
pub async fn prepare(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
) -> Result<Option<Action>, Error> {
    let Some(from) = cluster.spec.etcd.restore_from.as_ref() else {
        return Ok(None);
    };
    let recorded = cluster.status.as_ref().and_then(|s| s.restore.as_ref());
    if recorded.is_some_and(|r| r.identity_restored) {
        return Ok(None);
    }
    match identity(ctx, cluster, names, from, recorded).await {
        Ok(restore) => {
            let message = format!(
                "identity restored from snapshot {} (revision {}); the members start on its data",
                restore.snapshot, restore.revision
            );
            say(
                ctx,
                cluster,
                names,
                Some(&restore),
                Said {
                    ok: false,
                    reason: "RestoringData",
                    event: EventType::Normal,
                    event_reason: "IdentityRestored",
                    action: "Restore",
                },
                message,
            )
            .await?;
            Ok(Some(Action::requeue(Duration::from_secs(1))))
        }
        Err(failure) => {
            tracing::warn!(cluster = %names.cluster, reason = %failure.reason, message = %failure.message, "restore refused");
            say(
                ctx,
                cluster,
                names,
                recorded,
                Said {
                    ok: false,
                    reason: &failure.reason,
                    event: EventType::Warning,
                    event_reason: &failure.reason,
                    action: "Restore",
                },
                failure.message,
            )
            .await?;
            Ok(Some(Action::requeue(Duration::from_secs(30))))
        }
    }
}

/// The snapshot to restore, checked, and the Cluster's identity Secrets
/// written from it.
async fn identity(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    from: &RestoreFrom,
    recorded: Option<&RestoreStatus>,
) -> Result<RestoreStatus, Failure> {
    let config = store_config(ctx, names, &from.s3).await?;
    let store = SnapshotStore::new(&config)
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
    // A snapshot chosen once stays chosen: `latest` moving on between
    // attempts would mix two snapshots' identity and data.
    let wanted = recorded.map_or(from.snapshot.as_str(), |r| r.snapshot.as_str());
    let manifest = choose(&store, wanted).await?;
    let ours = minor(&cluster.spec.version);
    let theirs = manifest.kubernetes_version.as_deref().and_then(minor);
    if let (Some(ours), Some(theirs)) = (ours, theirs)
        && theirs > ours
    {
        return Err(Failure::new(
            "SnapshotTooNew",
            format!(
                "snapshot {} was taken of Kubernetes {}, newer than this Cluster's {}: a kube-apiserver cannot serve what a newer minor version wrote; create the Cluster with version {} or later",
                manifest.name,
                manifest.kubernetes_version.as_deref().unwrap_or_default(),
                cluster.spec.version,
                manifest.kubernetes_version.as_deref().unwrap_or_default(),
            ),
        ));
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let key = read_key(&secrets, &from.encryption_key_secret).await?;
    let sealed = store
        .pki(&manifest)
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
    let bundle = pki::open(&sealed, &key, &manifest.name)
        .map_err(|e| Failure::new("IdentityNotOpened", e.to_string()))?;
    for role in pki::ROLES {
        let name = names.cert_secret(role);
        let data = bundle.secrets[role].clone();
        match secrets.get_opt(&name).await {
            Ok(Some(existing)) if existing.data.as_ref() == Some(&data) => {}
            Ok(Some(_)) => {
                return Err(Failure::new(
                    "IdentityConflict",
                    format!(
                        "Secret {name} exists and holds another key than snapshot {}: delete it, or restore into a Cluster of another name",
                        manifest.name
                    ),
                ));
            }
            Ok(None) => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(names.namespace.clone()),
                        labels: Some(
                            [(
                                kube_on_kube_api::shared::CLUSTER_LABEL.to_string(),
                                names.cluster.clone(),
                            )]
                            .into(),
                        ),
                        owner_references: Some(vec![crate::render::owner(cluster)]),
                        ..Default::default()
                    },
                    type_: Some(secret_type(role).into()),
                    data: Some(data),
                    ..Default::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|e| {
                        Failure::new("RestoreFailed", format!("creating Secret {name}: {e}"))
                    })?;
            }
            Err(e) => {
                return Err(Failure::new(
                    "RestoreFailed",
                    format!("reading Secret {name}: {e}"),
                ));
            }
        }
    }
    Ok(RestoreStatus {
        snapshot: manifest.name.clone(),
        sha256: manifest.sha256.clone(),
        revision: manifest.etcd_revision,
        identity_restored: true,
        data_restored: false,
        cause: Some(RESTORE_FROM.into()),
    })
}

/// For a Cluster with backups whose etcd lost a majority of its members'
/// data: say so and, when it allows it or is asked to, rebuild every member
/// from a snapshot. `lost` is how many of the `desired` members lost their
/// data (claim or emptyDir gone); `remaining` are the member Pods and claims
/// still there, deleted before the rebuild so no old data directory mixes
/// with the restored one. `Some(action)`: the pass stops here; no empty
/// etcd is ever bootstrapped in the lost one's place.
pub async fn recover(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    lost: usize,
    desired: usize,
    remaining: (&[String], &[String]),
) -> Result<Option<Action>, Error> {
    let Some(backup) = cluster.spec.etcd.backup.as_ref() else {
        return Ok(None);
    };
    let status = cluster.status.as_ref();
    let served = status.is_some_and(|s| !s.etcd_members.is_empty());
    if pending(cluster).is_some() || !served || lost * 2 <= desired {
        return Ok(None);
    }
    let recorded = status.and_then(|s| s.restore.as_ref());
    let asked = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECOVER_ANNOTATION));
    let lost_message = format!(
        "{lost} of {desired} etcd members lost their data: etcd has no quorum and cannot get it back"
    );
    if !backup.auto_recover && asked.is_none() {
        let message = format!(
            "{lost_message}; rebuild every member from a snapshot of its backups with `kubectl annotate cluster {} {RECOVER_ANNOTATION}=latest` (or a snapshot's name), or set spec.etcd.backup.autoRecover",
            names.cluster
        );
        say(
            ctx,
            cluster,
            names,
            recorded,
            Said {
                ok: false,
                reason: "QuorumLost",
                event: EventType::Warning,
                event_reason: "QuorumLost",
                action: "Recover",
            },
            message,
        )
        .await?;
        return Ok(Some(Action::requeue(Duration::from_secs(30))));
    }
    let wanted = asked.map_or("latest", String::as_str);
    let chosen = async {
        let config = store_config(ctx, names, &backup.s3).await?;
        let store = SnapshotStore::new(&config)
            .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
        choose(&store, wanted).await
    }
    .await;
    let manifest = match chosen {
        Ok(m) => m,
        Err(failure) => {
            let message = format!(
                "{lost_message}; no snapshot to rebuild it from: {}",
                failure.message
            );
            say(
                ctx,
                cluster,
                names,
                recorded,
                Said {
                    ok: false,
                    reason: &failure.reason,
                    event: EventType::Warning,
                    event_reason: &failure.reason,
                    action: "Recover",
                },
                message,
            )
            .await?;
            return Ok(Some(Action::requeue(Duration::from_secs(30))));
        }
    };
    let restore = RestoreStatus {
        snapshot: manifest.name.clone(),
        sha256: manifest.sha256.clone(),
        revision: manifest.etcd_revision,
        identity_restored: true,
        data_restored: false,
        cause: Some(QUORUM_LOST.into()),
    };
    // Recorded first: a pass that deletes and then stops still knows the
    // members it makes next start on the snapshot.
    let message = format!(
        "{lost_message}; rebuilding every member from snapshot {} (revision {})",
        manifest.name, manifest.etcd_revision
    );
    say(
        ctx,
        cluster,
        names,
        Some(&restore),
        Said {
            ok: false,
            reason: "RecoveringFromSnapshot",
            event: EventType::Warning,
            event_reason: "QuorumLost",
            action: "Recover",
        },
        message,
    )
    .await?;
    let owner = crate::render::owner(cluster);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &names.namespace);
    let (remaining_pods, remaining_claims) = remaining;
    for pod in remaining_pods {
        crate::ownership::delete_owned(&pods, pod, &owner, &Default::default()).await?;
    }
    for claim in remaining_claims {
        crate::ownership::delete_owned(&claims, claim, &owner, &Default::default()).await?;
    }
    Ok(Some(Action::requeue(Duration::from_secs(2))))
}

/// The complete snapshot `wanted` names (`latest`: the newest).
async fn choose(store: &SnapshotStore, wanted: &str) -> Result<Manifest, Failure> {
    let found = if wanted == "latest" {
        store
            .list()
            .await
            .map_err(|e| Failure::categorized(e.category(), e.to_string()))?
            .into_iter()
            .next()
    } else {
        match store.manifest(wanted).await {
            Ok(m) => Some(m),
            Err(super::StoreError::Missing { .. }) => None,
            Err(e) => return Err(Failure::categorized(e.category(), e.to_string())),
        }
    };
    let manifest = found.ok_or_else(|| {
        Failure::new(
            "SnapshotNotFound",
            format!("no complete snapshot {wanted:?} in the storage named by etcd.restoreFrom.s3"),
        )
    })?;
    // Read through once, before anything is made or given up for it: a
    // corrupt or cut-short snapshot is refused here, with its reason.
    store
        .verify(&manifest)
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
    if manifest.pki.is_none() {
        return Err(Failure::new(
            "NoIdentity",
            format!(
                "snapshot {} has no sealed identity beside it: a Cluster restored from it could not keep its CAs",
                manifest.name
            ),
        ));
    }
    Ok(manifest)
}

/// Once every member of a restoring Cluster serves: record that the data is
/// restored (no member started later restores again).
pub async fn finish(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    members_ready: bool,
) -> Result<(), Error> {
    let Some((_, status)) = pending(cluster) else {
        return Ok(());
    };
    if !members_ready {
        return Ok(());
    }
    let done = RestoreStatus {
        data_restored: true,
        ..status.clone()
    };
    let message = format!(
        "started from snapshot {} (revision {})",
        done.snapshot, done.revision
    );
    say(
        ctx,
        cluster,
        names,
        Some(&done),
        Said {
            ok: true,
            reason: "Restored",
            event: EventType::Normal,
            event_reason: "Restored",
            action: "Restore",
        },
        message,
    )
    .await?;
    Ok(())
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

/// What a restoring member's download step does: check that snapshot
/// `name` in `store` is the one recorded (`sha256`), remove what an earlier,
/// interrupted attempt left in `clear` (the member's data directory: the
/// restore writes it whole, or not at all), and download the snapshot to
/// `out`, its size and checksum checked.
pub async fn fetch(
    store: &SnapshotStore,
    name: &str,
    sha256: &str,
    out: &std::path::Path,
    clear: Option<&std::path::Path>,
) -> Result<Manifest, String> {
    let manifest = store
        .manifest(name)
        .await
        .map_err(|e| format!("reading snapshot {name}: {e}"))?;
    if manifest.sha256 != sha256 {
        return Err(format!(
            "snapshot {name} has sha256 {}, not the {sha256} this restore began with: it was replaced; the restore stops",
            manifest.sha256
        ));
    }
    if let Some(dir) = clear
        && dir.exists()
    {
        eprintln!("removing {} left by an interrupted restore", dir.display());
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    let started = std::time::Instant::now();
    store
        .download(&manifest, out)
        .await
        .map_err(|e| format!("downloading snapshot {name}: {e}"))?;
    eprintln!(
        "snapshot {name} ({} bytes, revision {}) downloaded to {} in {:.1}s, sha256 checked",
        manifest.size,
        manifest.etcd_revision,
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::render::etcd::Peer;
    use crate::render::etcd::{ClusterState, MemberPod, member_pod};

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

    #[test]
    fn minor_versions_are_read_with_or_without_the_v() {
        assert_eq!(minor("v1.35.4"), Some(35));
        assert_eq!(minor("1.36"), Some(36));
        assert_eq!(minor("garbage"), None);
    }
}
