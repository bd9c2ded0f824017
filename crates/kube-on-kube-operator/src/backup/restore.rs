//! A new Cluster started from a snapshot (`spec.etcd.restoreFrom`).
//!
//! Before anything of the Cluster is made, [`prepare`] picks the snapshot
//! (`latest` is resolved once and recorded), refuses one of a newer
//! Kubernetes minor than the Cluster's, opens its sealed identity with the
//! user's key and writes the CA and service-account Secrets from it, as the
//! PKI step would have made them; the PKI step then finds and records them,
//! and issues every leaf certificate from them. The first etcd member then
//! bootstraps alone on the snapshot's data: two init containers, the
//! operator's image downloading the snapshot (its size and sha256 checked)
//! and etcd's image running `etcdutl snapshot restore` with the member's
//! name and a one-member `--initial-cluster`. The others join it as
//! learners on empty data, one at a time, and are promoted once they have
//! caught up (the etcd step's membership planner), so no member's data is
//! ever made apart from the cluster's. [`finish`] records when the restored member
//! serves. A failure at any point leaves a `Restored=False` reason and
//! creates nothing else: no member ever starts on an empty database in its
//! place.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{RECOVER_ANNOTATION, RestoreFrom, RestoreStatus};
use serde_json::json;

use super::failure::Failure;
use super::scheduled::{open_store, read_key};
use super::{Manifest, SnapshotStore, pki};
use crate::Error;
use crate::context::{Context, publish};
use crate::names::Names;
use crate::render::snapshot_gateway::{backup_storage, restore_storage};

/// The condition the restore answers in.
pub const RESTORED: &str = "Restored";
/// Its field manager.
pub const MANAGER: &str = "kube-on-kube-operator-restore";

/// The Secret type the PKI step gives each identity Secret.
fn secret_type(role: &str) -> &'static str {
    use crate::pki::authorities::Which;
    crate::pki::secrets::authority_secret_type(match role {
        "sa" => Which::ServiceAccount,
        "encryption" => Which::Encryption,
        _ => Which::Cluster,
    })
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

pub use crate::render::restore::{QUORUM_LOST, pending};

const RESTORE_FROM: &str = "restoreFrom";

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

/// Publish the Event, then write the condition (and `restore`, when given).
async fn say(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    restore: Option<&RestoreStatus>,
    said: Said<'_>,
    message: String,
) -> Result<(), Error> {
    // The Event first: whoever sees the condition finds the Event too.
    publish(
        ctx,
        cluster,
        said.event,
        said.event_reason,
        said.action,
        message.clone(),
    )
    .await;
    write(ctx, cluster, names, restore, said.ok, said.reason, message).await
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
    // A refusal is asked about again after its backoff, whatever wakes the
    // Cluster before (its own condition written, say); a change of its spec
    // is tried at once.
    let key = names.key();
    let generation = cluster.metadata.generation;
    if let Some((wait, ())) = ctx.restore_backoff.waiting(&key, generation) {
        return Ok(Some(Action::requeue(wait)));
    }
    match identity(ctx, cluster, names, from, recorded).await {
        Ok(restore) => {
            ctx.restore_backoff.succeeded(&key);
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
        Err(failure) if failure.reason == super::gateway::WAITING => {
            // Nothing wrong: the gateway on the claim is starting, and its
            // Deployment turning ready wakes the Cluster.
            write(
                ctx,
                cluster,
                names,
                recorded,
                false,
                &failure.reason,
                failure.message,
            )
            .await?;
            Ok(Some(Action::requeue(Duration::from_secs(5))))
        }
        Err(failure) => {
            let ((), wait) = ctx.restore_backoff.failed(&key, generation, |_, _| ());
            tracing::warn!(cluster = %names.cluster, reason = %failure.reason, message = %failure.message, retry_in = ?wait, "restore refused");
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
            Ok(Some(Action::requeue(wait)))
        }
    }
}

/// The identity of the snapshot `manifest` describes, opened with `key`,
/// and checked to vouch for the data the manifest describes. Only small
/// objects are read: a wrong key, or data that is not the snapshot's,
/// costs no download of the data.
async fn open_identity(
    ctx: &Context,
    cluster: &Cluster,
    store: &SnapshotStore,
    key: &pki::Key,
    manifest: &Manifest,
) -> Result<pki::Bundle, Failure> {
    if manifest.pki.is_none() {
        return Err(Failure::new(
            "NoIdentity",
            format!(
                "snapshot {} has no sealed identity beside it: a Cluster restored from it could not keep its CAs",
                manifest.name
            ),
        ));
    }
    let sealed = store
        .pki(manifest)
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
    let bundle = pki::open(&sealed, key, &manifest.name)
        .map_err(|e| Failure::new("IdentityNotOpened", e.to_string()))?;
    let data = pki::Data {
        sha256: manifest.sha256.clone(),
        size: manifest.size,
        revision: manifest.etcd_revision,
    };
    match pki::check_data(&bundle, &manifest.name, &data) {
        Ok(true) => {}
        Ok(false) => {
            // Sealed by an operator before identities named their data.
            publish(
                ctx,
                cluster,
                EventType::Warning,
                "DataNotVouchedFor",
                "Restore",
                format!(
                    "snapshot {}'s identity was sealed before identities named their data: its data is trusted as the storage holds it",
                    manifest.name
                ),
            )
            .await;
        }
        Err(e) => return Err(Failure::new("SnapshotDataMismatch", e.to_string())),
    }
    Ok(bundle)
}

/// Reads the snapshot `manifest` describes through once, before anything
/// is made or given up for it: a corrupt or cut-short snapshot is refused
/// here, with its reason.
async fn verify(store: &SnapshotStore, manifest: &Manifest) -> Result<(), Failure> {
    store
        .verify(manifest)
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))
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
    // The key first: a restore that cannot open the identity reads nothing
    // from the storage but its listing and small objects.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let key = read_key(&secrets, &from.encryption_key_secret).await?;
    let store = open_store(ctx, names, restore_storage(names, from), "etcd.restoreFrom").await?;
    // A snapshot chosen once stays chosen: `latest` moving on between
    // attempts would mix two snapshots' identity and data.
    let wanted = recorded.map_or(from.snapshot.as_str(), |r| r.snapshot.as_str());
    let manifest = choose(&store, wanted, "etcd.restoreFrom").await?;
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
    let bundle = open_identity(ctx, cluster, &store, &key, &manifest).await?;
    verify(&store, &manifest).await?;
    for role in pki::roles_of(&bundle) {
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
                let secret = crate::pki::secrets::owned_secret(
                    cluster,
                    names,
                    &name,
                    secret_type(role),
                    data,
                );
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
        storage: crate::render::restore::storage(cluster, names, Some(RESTORE_FROM)),
    })
}

/// For a Cluster with backups whose etcd lost a majority of its members'
/// data: say so and, when it allows it or is asked to, rebuild every member
/// from a snapshot. `lost` is how many of the `desired` members lost their
/// data (claim or emptyDir gone); `remaining` are the member Pods (those
/// already being deleted too: their stop is cut short) and claims still
/// there, deleted before the rebuild so no old data directory mixes with
/// the restored one. `Some(action)`: the pass stops here; no empty
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
    // A snapshot refused is asked about again after its backoff (its data
    // may have been read through to find it damaged); another snapshot
    // named, or another spec, at once.
    let backoff_key = format!("{}#rebuild:{wanted}", names.key());
    let generation = cluster.metadata.generation;
    if let Some((wait, ())) = ctx.restore_backoff.waiting(&backoff_key, generation) {
        return Ok(Some(Action::requeue(wait)));
    }
    // Only from a snapshot whose identity opens with the Cluster's key and
    // vouches for its data, and whose data reads through.
    let chosen = async {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
        let key = read_key(&secrets, &backup.encryption_key_secret).await?;
        let store = open_store(ctx, names, backup_storage(names, backup), "etcd.backup").await?;
        let manifest = choose(&store, wanted, "etcd.backup").await?;
        open_identity(ctx, cluster, &store, &key, &manifest).await?;
        verify(&store, &manifest).await?;
        Ok::<_, Failure>(manifest)
    }
    .await;
    let manifest = match chosen {
        Ok(m) => {
            ctx.restore_backoff.succeeded(&backoff_key);
            m
        }
        Err(failure) => {
            let ((), wait) = ctx
                .restore_backoff
                .failed(&backoff_key, generation, |_, _| ());
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
            return Ok(Some(Action::requeue(wait)));
        }
    };
    let restore = RestoreStatus {
        snapshot: manifest.name.clone(),
        sha256: manifest.sha256.clone(),
        revision: manifest.etcd_revision,
        identity_restored: true,
        data_restored: false,
        cause: Some(QUORUM_LOST.into()),
        storage: crate::render::restore::storage(cluster, names, Some(QUORUM_LOST)),
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
    // Their data is thrown away: no point in a graceful stop, which etcd
    // without a quorum cannot finish anyway and would hold the rebuild for
    // the whole grace period. One second, not zero: the Pod is gone from
    // the API only once its processes are, so its successor of the same
    // name never runs beside it.
    let now = DeleteParams {
        grace_period_seconds: Some(1),
        ..Default::default()
    };
    for pod in remaining_pods {
        crate::ownership::delete_owned(&pods, pod, &owner, &now).await?;
    }
    for claim in remaining_claims {
        crate::ownership::delete_owned(&claims, claim, &owner, &Default::default()).await?;
    }
    Ok(Some(Action::requeue(Duration::from_secs(2))))
}

/// The complete snapshot `wanted` names (`latest`: the newest), its
/// manifest only.
async fn choose(store: &SnapshotStore, wanted: &str, field: &str) -> Result<Manifest, Failure> {
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
            format!("no complete snapshot {wanted:?} in the storage {field} names"),
        )
    })?;
    Ok(manifest)
}

/// Once the member restored from the snapshot serves: record that the data
/// is restored, before anything has written to it (kube-apiserver of a new
/// Cluster is made after this, in the same pass). A member Pod made later,
/// that one again included, starts on its own data or joins as a learner;
/// none restores again over what was written since.
pub async fn finish(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    restored_serves: bool,
) -> Result<(), Error> {
    let Some(status) = pending(cluster) else {
        return Ok(());
    };
    if !restored_serves {
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

    #[test]
    fn minor_versions_are_read_with_or_without_the_v() {
        assert_eq!(minor("v1.35.4"), Some(35));
        assert_eq!(minor("1.36"), Some(36));
        assert_eq!(minor("garbage"), None);
    }
}
