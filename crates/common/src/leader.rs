//! Leader election with a `coordination.k8s.io/v1` Lease, so several replicas
//! of an operator can run and only one of them writes.
//!
//! The algorithm is client-go's: a candidate takes the Lease when it has no
//! holder, or when its record has not changed for the lease duration as seen
//! by this process's own clock (so clocks of different machines need not
//! agree). Every write carries the resourceVersion that was read, so two
//! candidates cannot both win: the API server refuses the second write. The
//! leader renews every retry period and gives up when it could not renew
//! within the renew deadline, which is shorter than the lease duration, so it
//! stops before anybody else may take over. On shutdown the leader clears the
//! holder, and a standby takes over at its next retry.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::duration::parse as parse_duration;

/// Leader-election flags shared by the operators.
#[derive(clap::Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Take part in leader election, so only one of several replicas runs the
    /// controllers. `--leader-elect=false` runs them right away (one replica
    /// only!).
    #[arg(
        long,
        env = "KOK_LEADER_ELECT",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "KOK_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "KOK_LEADER_ELECTION_ID")]
    pub leader_election_id: Option<String>,
    /// How long a Lease that is not renewed keeps other replicas waiting: the
    /// longest a takeover takes after the leader dies.
    #[arg(long, env = "KOK_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up and
    /// exits (must be shorter than the lease duration).
    #[arg(long, env = "KOK_LEADER_ELECTION_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,
    /// How often the leader renews and standbys try to take the Lease.
    #[arg(long, env = "KOK_LEADER_ELECTION_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,
}

impl LeaderArgs {
    /// The elector these flags describe; `namespace` and `name` are used when
    /// the flags do not set them.
    pub fn elector(&self, client: Client, namespace: &str, name: &str) -> Result<Elector, String> {
        if self.leader_election_renew_deadline >= self.leader_election_lease_duration {
            return Err(format!(
                "--leader-election-renew-deadline ({:?}) must be shorter than --leader-election-lease-duration ({:?})",
                self.leader_election_renew_deadline, self.leader_election_lease_duration
            ));
        }
        if self.leader_election_retry_period >= self.leader_election_renew_deadline {
            return Err(format!(
                "--leader-election-retry-period ({:?}) must be shorter than --leader-election-renew-deadline ({:?})",
                self.leader_election_retry_period, self.leader_election_renew_deadline
            ));
        }
        let namespace = self
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| namespace.to_string());
        let name = self
            .leader_election_id
            .clone()
            .unwrap_or_else(|| name.to_string());
        Ok(Elector {
            api: Api::namespaced(client, &namespace),
            namespace,
            name,
            identity: identity(),
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
            observed: None,
        })
    }
}

/// The namespace this process runs in: `$POD_NAMESPACE`, else the
/// service-account namespace file of a Pod, else `default`.
pub fn pod_namespace() -> String {
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.trim().is_empty()
    {
        return ns.trim().to_string();
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// Who this replica is in the Lease: `$POD_NAME`, else `<hostname>_<pid>`.
pub fn identity() -> String {
    if let Ok(name) = std::env::var("POD_NAME")
        && !name.trim().is_empty()
    {
        return name.trim().to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{host}_{}", std::process::id())
}

/// What a candidate may do with a Lease it has read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: write a new renew time.
    Renew,
    /// Nobody holds it, or the holder stopped renewing: take it.
    Take,
    /// Another replica holds it and renews it.
    Wait { holder: String },
}

/// Decide from a Lease's spec and how long its record has stayed unchanged
/// as seen by this process (`unchanged_for`).
pub fn decide(spec: &LeaseSpec, me: &str, unchanged_for: Duration, default: Duration) -> Decision {
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
    match holder {
        None => Decision::Take,
        Some(h) if h == me => Decision::Renew,
        Some(h) => {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(default);
            if unchanged_for >= duration {
                Decision::Take
            } else {
                Decision::Wait {
                    holder: h.to_string(),
                }
            }
        }
    }
}

/// Outcome of one attempt to take or renew the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease now.
    Held,
    /// Another replica holds it.
    HeldBy(String),
    /// Somebody wrote the Lease between our read and our write.
    Conflict,
}

/// Why a leader stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    /// Another replica holds the Lease now.
    #[error("the Lease is held by {0} now")]
    TakenBy(String),
    /// The Lease could not be renewed within the renew deadline.
    #[error("could not renew the Lease within {0:?}")]
    Deadline(Duration),
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's holder identity.
    pub identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    /// The resourceVersion last read and when it was first seen.
    observed: Option<(String, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    fn spec(&self, previous: &LeaseSpec, renew: bool) -> LeaseSpec {
        let seconds = i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if renew {
                previous.acquire_time.clone().or_else(|| Some(now()))
            } else {
                Some(now())
            },
            renew_time: Some(now()),
            lease_transitions: Some(if renew {
                previous.lease_transitions.unwrap_or(0)
            } else {
                previous
                    .lease_transitions
                    .map_or(0, |t| t.saturating_add(1))
            }),
            ..LeaseSpec::default()
        }
    }

    /// Read the Lease once and take or renew it if this replica may.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(&LeaseSpec::default(), false)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let first_seen = match &self.observed {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((version, at));
                at
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let renew = match decide(
            &spec,
            &self.identity,
            first_seen.elapsed(),
            self.lease_duration,
        ) {
            Decision::Wait { holder } => return Ok(Attempt::HeldBy(holder)),
            Decision::Renew => true,
            Decision::Take => false,
        };
        lease.spec = Some(self.spec(&spec, renew));
        // The read resourceVersion stays in the object: a write in between
        // makes this replace fail with 409 instead of overwriting it.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if let Some(v) = written.metadata.resource_version {
                    self.observed = Some((v, Instant::now()));
                }
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Wait until this replica holds the Lease.
    pub async fn acquire(&mut self) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), identity = %self.identity, "became the leader");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), %holder, "standing by: another replica leads");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(error) => {
                    tracing::warn!(%error, "cannot read or write the leader-election Lease")
                }
            }
            tokio::time::sleep(self.retry_period).await;
        }
    }

    /// Keep renewing the Lease; returns when leadership is lost.
    pub async fn hold(&mut self) -> Lost {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.retry_period).await;
            let left = self.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => renewed = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => return Lost::TakenBy(holder),
                Ok(Ok(Attempt::Conflict)) => tracing::warn!("the Lease changed while renewing it"),
                Ok(Err(error)) => tracing::warn!(%error, "cannot renew the leader-election Lease"),
                Err(_) => {}
            }
            if renewed.elapsed() >= self.renew_deadline {
                return Lost::Deadline(self.renew_deadline);
            }
        }
    }

    /// Give the Lease up so a standby takes over at once (on shutdown).
    pub async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let mut spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now());
            lease.spec = Some(spec);
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        }
        .await;
        match result {
            Ok(true) => {
                tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), "released the leader-election Lease")
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "cannot release the leader-election Lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn a_free_lease_is_taken() {
        assert_eq!(
            decide(&LeaseSpec::default(), "a", Duration::ZERO, D),
            Decision::Take
        );
        assert_eq!(
            decide(&held_by("", 15), "a", Duration::ZERO, D),
            Decision::Take
        );
    }

    #[test]
    fn our_own_lease_is_renewed_even_when_old() {
        assert_eq!(
            decide(&held_by("a", 15), "a", Duration::from_secs(60), D),
            Decision::Renew
        );
    }

    #[test]
    fn another_holder_is_waited_for_until_its_lease_runs_out_on_our_clock() {
        let spec = held_by("b", 15);
        assert_eq!(
            decide(&spec, "a", Duration::from_secs(14), D),
            Decision::Wait { holder: "b".into() }
        );
        assert_eq!(
            decide(&spec, "a", Duration::from_secs(15), D),
            Decision::Take
        );
        // The holder's own duration counts, not ours.
        assert_eq!(
            decide(&held_by("b", 1), "a", Duration::from_secs(2), D),
            Decision::Take
        );
        let no_duration = LeaseSpec {
            holder_identity: Some("b".into()),
            ..LeaseSpec::default()
        };
        assert_eq!(
            decide(&no_duration, "a", Duration::from_secs(10), D),
            Decision::Wait { holder: "b".into() }
        );
    }
}
