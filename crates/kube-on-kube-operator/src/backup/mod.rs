//! etcd snapshots of a business cluster, taken from a healthy member over
//! its mutual-TLS client URL and streamed into S3-compatible storage.
//!
//! `snapshot` reads etcd's snapshot stream and checks it, `store` uploads,
//! lists and downloads snapshots (`manifest` names them and records what
//! they hold), `transport` carries the storage requests over the operator's
//! own TLS stack. [`take`] puts them together.

pub mod failure;
pub mod gateway;
pub mod manifest;
pub mod pki;
pub mod restore;
pub mod scheduled;
pub mod snapshot;
pub mod store;
pub mod transport;

use std::time::Duration;

use time::OffsetDateTime;

use crate::etcd::api::{EtcdClient, EtcdError, Status};

pub use manifest::Manifest;
pub use snapshot::SnapshotError;
pub use store::{SnapshotInfo, SnapshotStore, StoreConfig, StoreError};

/// The longest etcd may pause in the middle of sending a snapshot.
pub const SNAPSHOT_IDLE: Duration = Duration::from_secs(60);

/// Why a snapshot was not taken.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// No member could give a consistent snapshot.
    #[error("no healthy etcd voter to take the snapshot from: {}", summary(.tried))]
    NoHealthyMember {
        /// Each endpoint tried, and why it was passed over.
        tried: Vec<(String, String)>,
    },
    /// Reading the snapshot from etcd failed.
    #[error(transparent)]
    Snapshot(SnapshotError),
    /// Storing it failed.
    #[error(transparent)]
    Store(StoreError),
}

impl BackupError {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            BackupError::NoHealthyMember { .. } => "backup-no-member",
            BackupError::Snapshot(e) => e.category(),
            // An upload that failed because its source did is the source's
            // failure.
            BackupError::Store(StoreError::Source(source)) => source
                .downcast_ref::<SnapshotError>()
                .map_or("backup-source", SnapshotError::category),
            BackupError::Store(e) => e.category(),
        }
    }
}

fn summary(tried: &[(String, String)]) -> String {
    if tried.is_empty() {
        return "no endpoints".into();
    }
    tried
        .iter()
        .map(|(endpoint, why)| format!("{endpoint}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What one endpoint answered when asked whether it can give a snapshot.
#[derive(Debug)]
pub struct Candidate {
    /// The endpoint's client URL.
    pub endpoint: String,
    /// Whether it serves linearizable reads (it has a leader and quorum).
    pub healthy: Result<bool, EtcdError>,
    /// What it says about itself.
    pub status: Result<Status, EtcdError>,
}

/// The member to take a snapshot from: a healthy voter without alarms,
/// a follower when there is one (the leader has the most to do), else the
/// first in order. `Err` says why each was passed over.
pub fn choose_member(candidates: &[Candidate]) -> Result<usize, Vec<(String, String)>> {
    let mut usable = Vec::new();
    let mut tried = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        let why = match (&c.healthy, &c.status) {
            (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
            (Ok(false), _) => Some("not healthy".to_string()),
            (Ok(true), Ok(s)) if s.is_learner => Some("a learner".to_string()),
            (Ok(true), Ok(s)) if !s.errors.is_empty() => {
                Some(format!("reports {}", s.errors.join(", ")))
            }
            (Ok(true), Ok(s)) => {
                usable.push((i, s.leader == s.member_id));
                None
            }
        };
        if let Some(why) = why {
            tried.push((c.endpoint.clone(), why));
        }
    }
    usable
        .iter()
        .find(|(_, leader)| !leader)
        .or(usable.first())
        .map(|(i, _)| *i)
        .ok_or(tried)
}

/// Takes a snapshot of the etcd cluster `etcd` reaches from a member
/// [`choose_member`] picks and stores it in `store`, named for `now` and the
/// member's revision, with `pki` (the Cluster's identity and the key to
/// seal it with) sealed beside it, and `request` (the request it answers)
/// in its manifest. The whole database passes through in
/// pieces; nothing holds more than a couple of upload parts.
pub async fn take(
    etcd: &EtcdClient,
    store: &SnapshotStore,
    kubernetes_version: Option<&str>,
    pki: Option<(&pki::Bundle, &pki::Key)>,
    request: Option<&str>,
    now: OffsetDateTime,
) -> Result<Manifest, BackupError> {
    // All at once: a member that does not answer costs one timeout, not one
    // per member after it.
    let candidates: Vec<Candidate> =
        futures::future::join_all(etcd.endpoints().iter().map(|endpoint| async move {
            let (healthy, status) = futures::join!(etcd.healthy(endpoint), etcd.status(endpoint));
            Candidate {
                endpoint: endpoint.clone(),
                healthy,
                status,
            }
        }))
        .await;
    let chosen =
        choose_member(&candidates).map_err(|tried| BackupError::NoHealthyMember { tried })?;
    let member = &candidates[chosen];
    let (revision, version) = match &member.status {
        Ok(s) => (s.revision, s.version.clone()),
        Err(_) => (0, String::new()),
    };
    let name = manifest::snapshot_name(now, revision);
    let info = SnapshotInfo {
        name,
        etcd_revision: revision,
        etcd_version: version,
        kubernetes_version: kubernetes_version.map(str::to_owned),
        taken_at: manifest::rfc3339(now),
        member: member.endpoint.clone(),
        request: request.map(str::to_owned),
    };
    let data = snapshot::stream(etcd, &member.endpoint, SNAPSHOT_IDLE)
        .await
        .map_err(BackupError::Snapshot)?;
    let manifest = store
        .upload(&info, data, pki)
        .await
        .map_err(BackupError::Store)?;
    tracing::info!(
        snapshot = %manifest.name,
        member = %manifest.member,
        size = manifest.size,
        revision = manifest.etcd_revision,
        "etcd snapshot stored"
    );
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(member_id: u64, leader: u64) -> Status {
        Status {
            member_id,
            leader,
            version: "3.6.16".into(),
            is_learner: false,
            raft_index: 10,
            raft_applied_index: 10,
            revision: 7,
            errors: vec![],
        }
    }

    fn candidate(endpoint: &str, healthy: bool, status: Status) -> Candidate {
        Candidate {
            endpoint: endpoint.into(),
            healthy: Ok(healthy),
            status: Ok(status),
        }
    }

    #[test]
    fn an_upload_that_failed_on_its_source_is_the_sources_failure() {
        let idle = SnapshotError::Idle {
            endpoint: "https://m0:2379".into(),
            idle: Duration::from_secs(60),
        };
        let e = BackupError::Store(StoreError::Source(Box::new(idle)));
        assert_eq!(e.category(), "snapshot-interrupted");
        assert!(e.to_string().contains("https://m0:2379"), "{e}");
        let other = BackupError::Store(StoreError::Source(Box::new(std::io::Error::other("x"))));
        assert_eq!(other.category(), "backup-source");
        assert_eq!(
            BackupError::Store(StoreError::Empty).category(),
            "backup-source"
        );
    }

    #[test]
    fn a_healthy_follower_is_preferred_to_the_leader() {
        let c = vec![
            candidate("a", true, status(1, 1)),
            candidate("b", true, status(2, 1)),
        ];
        assert_eq!(choose_member(&c), Ok(1));
        // Only the leader is usable: the leader it is.
        let c = vec![
            candidate("a", true, status(1, 1)),
            candidate("b", false, status(2, 1)),
        ];
        assert_eq!(choose_member(&c), Ok(0));
    }

    #[test]
    fn learners_alarms_and_unreachable_members_are_passed_over() {
        let mut learner = status(3, 1);
        learner.is_learner = true;
        let mut alarmed = status(4, 1);
        alarmed.errors = vec!["memberID:4 alarm:CORRUPT".into()];
        let c = vec![
            Candidate {
                endpoint: "down".into(),
                healthy: Err(EtcdError::NoEndpoints),
                status: Err(EtcdError::NoEndpoints),
            },
            candidate("learner", true, learner),
            candidate("alarmed", true, alarmed),
            candidate("unhealthy", false, status(5, 0)),
        ];
        let tried = choose_member(&c).unwrap_err();
        let names: Vec<&str> = tried.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(names, ["down", "learner", "alarmed", "unhealthy"]);
        assert!(tried[2].1.contains("CORRUPT"), "{tried:?}");
        let e = BackupError::NoHealthyMember { tried };
        assert!(e.to_string().contains("learner: a learner"), "{e}");
        assert_eq!(e.category(), "backup-no-member");
        assert!(choose_member(&[]).is_err());
    }
}
