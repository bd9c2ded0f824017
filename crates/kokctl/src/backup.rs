//! `kubectl kok cluster backup` and `snapshots`: asking the operator for an
//! etcd snapshot now and waiting for its answer, and listing the snapshots
//! it keeps.

use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{BACKUP_REQUEST_ANNOTATION, SnapshotRecord};
use serde_json::json;

use crate::cluster::call;
use crate::error::Error;
use crate::output::{self, Output, or_dash};

const POLL: Duration = Duration::from_millis(500);
/// The condition the operator answers in.
const BACKUP_READY: &str = "BackupReady";

async fn get(api: &Api<Cluster>, name: &str, namespace: &str) -> Result<Cluster, Error> {
    api.get(name)
        .await
        .map_err(|e| call("get", Some(name), namespace).error(e))
}

/// Ask for a snapshot of Cluster `name` now and wait up to `timeout` for the
/// operator to take it (or say why it could not).
pub async fn backup(
    client: Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let api: Api<Cluster> = Api::namespaced(client, namespace);
    let cluster = get(&api, name, namespace).await?;
    if cluster.spec.etcd.backup.is_none() {
        return Err(Error::Usage(format!(
            "Cluster {name} has no spec.etcd.backup: set its schedule, retention and storage first (see docs/backup.md)"
        )));
    }
    // A value of its own: the time, and the Cluster's resourceVersion so two
    // requests within a second differ.
    let token = format!(
        "{}/{}",
        k8s_openapi::jiff::Timestamp::now(),
        cluster.resource_version().unwrap_or_default()
    );
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {BACKUP_REQUEST_ANNOTATION: token}}})),
    )
    .await
    .map_err(|e| call("patch", Some(name), namespace).error(e))?;
    let started = Instant::now();
    println!("asked for a snapshot of Cluster {name}; waiting up to {timeout:?} for the operator");
    // What the Cluster says holds snapshots up, shown as it changes.
    let mut shown: Option<String> = None;
    loop {
        let cluster = get(&api, name, namespace).await?;
        let held = holding(&cluster);
        if held.is_some() && held != shown {
            println!("  waiting: {}", held.as_deref().unwrap_or_default());
            shown = held.clone();
        }
        let status = cluster.status.unwrap_or_default();
        let backup = status.backup.unwrap_or_default();
        if backup.last_request.as_deref() == Some(token.as_str()) {
            let condition = status.conditions.iter().find(|c| c.type_ == BACKUP_READY);
            let last = backup
                .last_snapshot
                .filter(|s| s.taken_at.0 >= started_at(&token));
            return match (last, condition) {
                (Some(s), Some(c)) if c.status == "True" || c.reason == "RetentionFailed" => {
                    println!(
                        "snapshot {} stored after {:.1}s: {} bytes, etcd revision {}{}",
                        s.name,
                        started.elapsed().as_secs_f64(),
                        s.size,
                        s.revision,
                        if c.status == "True" {
                            String::new()
                        } else {
                            format!("; {}", c.message)
                        }
                    );
                    Ok(())
                }
                (_, c) => Err(Error::Failed(format!(
                    "the snapshot of Cluster {name} failed: {}; see `kubectl describe cluster {name} -n {namespace}` and its Events",
                    c.map_or("no reason given".into(), |c| format!(
                        "{}: {}",
                        c.reason, c.message
                    ))
                ))),
            };
        }
        if started.elapsed() >= timeout {
            return Err(Error::Timeout(match held {
                // The operator answers; the Cluster says why there is none.
                Some(why) => format!(
                    "no snapshot of Cluster {name} within {timeout:?}: {why}; see `kubectl describe cluster {name} -n {namespace}`"
                ),
                None => format!(
                    "the operator did not answer the snapshot request of Cluster {name} within {timeout:?}: is the kube-on-kube-operator running and watching namespace {namespace}?"
                ),
            }));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Why the Cluster says it takes no snapshot now: its `BackupReady`
/// condition when not True (`WaitingForGateway: ...`), as the operator
/// wrote it for the Cluster's current spec.
fn holding(cluster: &Cluster) -> Option<String> {
    let status = cluster.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == BACKUP_READY)?;
    (c.status != "True").then(|| crate::progress::condition_text(c))
}

/// The time a request token was made (its first part).
fn started_at(token: &str) -> k8s_openapi::jiff::Timestamp {
    token
        .split('/')
        .next()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        // Whole seconds: the snapshot's time is.
        .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.as_second()).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// List the snapshots the operator keeps for Cluster `name`, newest first.
pub async fn snapshots(
    client: Client,
    namespace: &str,
    name: &str,
    output: Output,
) -> Result<(), Error> {
    let api: Api<Cluster> = Api::namespaced(client, namespace);
    let cluster = get(&api, name, namespace).await?;
    let backup = cluster.status.and_then(|s| s.backup).unwrap_or_default();
    if backup.snapshots.is_empty() && output == Output::Table {
        let why = match cluster.spec.etcd.backup {
            None => "it has no spec.etcd.backup",
            Some(_) => "none taken yet (see the BackupReady condition)",
        };
        println!("no snapshots of Cluster {name}: {why}");
        return Ok(());
    }
    output::list(output, &backup.snapshots, row, &HEADER)
}

const HEADER: [&str; 5] = ["NAME", "TAKEN", "REVISION", "SIZE", "KUBERNETES"];

fn row(s: &SnapshotRecord) -> Vec<String> {
    vec![
        s.name.clone(),
        s.taken_at.0.to_string(),
        s.revision.to_string(),
        s.size.to_string(),
        or_dash(s.kubernetes_version.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_condition(status: &str, reason: &str) -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.status = Some(
            serde_json::from_value(json!({"conditions": [{
                "type": BACKUP_READY, "status": status, "reason": reason,
                "message": "the snapshot gateway ci-snapshots is not ready",
                "lastTransitionTime": "2026-11-29T10:00:00Z",
            }]}))
            .expect("status"),
        );
        c
    }

    #[test]
    fn a_wait_shows_what_the_cluster_says_holds_its_snapshots_up() {
        assert_eq!(
            holding(&with_condition("False", "WaitingForGateway")).as_deref(),
            Some(
                "BackupReady=False WaitingForGateway: the snapshot gateway ci-snapshots is not ready"
            )
        );
        assert_eq!(holding(&with_condition("True", "Taken")), None);
        let mut none = with_condition("True", "Taken");
        none.status = None;
        assert_eq!(
            holding(&none),
            None,
            "no status: the operator is asked about"
        );
    }

    #[test]
    fn a_request_token_starts_with_its_time_in_whole_seconds() {
        let t = started_at("2026-11-27T10:00:00.75Z/123");
        assert_eq!(t.to_string(), "2026-11-27T10:00:00Z");
        assert_eq!(
            started_at("garbage"),
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH
        );
    }
}
