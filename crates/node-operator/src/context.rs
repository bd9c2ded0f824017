//! What every Machine reconcile shares: the operator's settings
//! ([`Settings`]), the state kept between reconciles ([`Context`]: SSH
//! sessions and slots, the rollout gate, backoff, own-write tracking, the
//! watched copies of the cluster defaults and PackageVersions) and how a
//! Machine's Events are published. The controllers that fill and use it are
//! wired in [`crate::controller`], which depends on this module, never the
//! other way round.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use kok_common::backoff::Backoff;
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};
use tokio::sync::Semaphore;

use crate::Error;
use crate::repair::Remediations;
use crate::rollout;
use crate::sessions::Pool;
use crate::ssh::Timeouts;

/// Where SSH keys are read from unless `--ssh-key-namespaces` says
/// otherwise: the namespace the operator keeps its Lease in.
pub const DEFAULT_SSH_KEY_NAMESPACE: &str = "kube-system";

/// Field manager of everything this operator applies.
pub const MANAGER: &str = "node-operator";

/// Operator settings, from flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Hosts worked on over SSH at the same time.
    pub ssh_concurrency: usize,
    /// SSH connect and per-script timeouts.
    pub ssh_timeouts: Timeouts,
    /// How often a Ready Machine's host is re-checked (services active,
    /// versions as declared).
    pub recheck: Duration,
    /// How long to wait for a Node to turn Ready after installing before the
    /// host is looked at again.
    pub node_wait: Duration,
    /// Longest a drain may take.
    pub drain_timeout: Duration,
    /// First wait before a failed Machine is tried again; it doubles with
    /// each failure in a row.
    pub retry_backoff: Duration,
    /// How long a deleted Machine's host may stay unreachable before the
    /// Machine is released without cleaning it.
    pub offboard_timeout: Duration,
    /// `clusterDNS` of kubelet configs.
    pub cluster_dns: String,
    /// `clusterDomain` of kubelet configs.
    pub cluster_domain: String,
    /// Largest artifact downloaded and largest size it unpacks to.
    pub limits: crate::install::Limits,
    /// Namespaces a Machine's `privateKeySecretRef` may name.
    pub ssh_key_namespaces: Vec<String>,
    /// Networks no Machine's address may be in (`--refused-machine-networks`).
    pub refused_networks: Vec<kok_common::network::Network>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ssh_concurrency: 16,
            ssh_timeouts: Timeouts::default(),
            recheck: Duration::from_secs(300),
            node_wait: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(300),
            retry_backoff: Duration::from_secs(2),
            offboard_timeout: Duration::from_secs(600),
            cluster_dns: "10.96.0.10".into(),
            cluster_domain: "cluster.local".into(),
            limits: crate::install::Limits::default(),
            ssh_key_namespaces: vec![DEFAULT_SSH_KEY_NAMESPACE.into()],
            refused_networks: Vec::new(),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// Client of the business cluster.
    pub client: Client,
    /// Publishes Events on Machines.
    pub recorder: Recorder,
    /// Admission of Machines into disruption within the rollout budget.
    pub gate: rollout::Gate,
    /// Flags.
    pub settings: Settings,
    /// Bounds the hosts worked on at once.
    pub ssh_slots: Semaphore,
    /// SSH sessions reused between reconciles.
    pub sessions: Pool,
    /// Node-condition remediations, their cool-down and cap.
    pub remediations: Remediations,
    /// When each Machine's host was last checked by this process.
    checked: Mutex<HashMap<String, Instant>>,
    /// Per Machine, its failures in a row at its generation (the count is
    /// the last attempt's outcome) and when its next attempt is due.
    backoff: Backoff<u32>,
    /// Per Machine, the inputs of the last attempt (`.0`) and of the last
    /// failure that only a change can fix (`.1`).
    attempts: Mutex<HashMap<String, (u64, Option<u64>)>>,
    /// Per Machine, its resourceVersion as this process last wrote or read it
    /// from the API server (not the informer).
    versions: Mutex<HashMap<String, String>>,
    /// Watched copies of the cluster defaults and PackageVersions, once the
    /// controllers run (without them, reads go to the API server).
    caches: OnceLock<Caches>,
}

/// Watched copies of what every Machine reconcile reads: at thousands of
/// Machines, a read of each from the API server per reconcile is most of the
/// requests a pass makes.
pub struct Caches {
    /// ClusterPackageVersions (the cluster default is `default`).
    pub defaults: Store<ClusterPackageVersion>,
    /// PackageVersions by name.
    pub package_versions: Store<PackageVersion>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Context {
    /// One of the SSH slots that bound how many hosts are worked on at
    /// once; held for as long as the visit lasts.
    pub async fn ssh_slot(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Error> {
        self.ssh_slots
            .acquire()
            .await
            .map_err(|_| Error::LocalIo(std::io::Error::other("SSH slots closed")))
    }

    /// A context for `client`.
    pub fn new(client: Client, settings: Settings, remediations: Remediations) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            gate: rollout::Gate::default(),
            ssh_slots: Semaphore::new(settings.ssh_concurrency.max(1)),
            backoff: Backoff::new(settings.retry_backoff, backoff_max(settings.retry_backoff)),
            settings,
            sessions: Pool::default(),
            remediations,
            checked: Mutex::default(),
            attempts: Mutex::default(),
            versions: Mutex::default(),
            caches: OnceLock::new(),
        }
    }

    /// The cluster default `name`: from the watched copy once it has been
    /// listed, else from the API server.
    pub async fn cluster_default(
        &self,
        name: &str,
    ) -> Result<Option<ClusterPackageVersion>, Error> {
        // Not awaited: the store's ready signal wakes only one of several
        // waiters, and a reconcile left waiting would hold its Machine.
        if let Some(c) = self.caches.get()
            && c.defaults
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok())
        {
            return Ok(c.defaults.get(&ObjectRef::new(name)).map(|d| (*d).clone()));
        }
        Api::<ClusterPackageVersion>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("get ClusterPackageVersion {name}")))
    }

    /// The PackageVersion `name`: from the watched copy when it has it, else
    /// (not listed yet, or created a moment ago) from the API server.
    pub async fn package_version(&self, name: &str) -> Result<Option<PackageVersion>, Error> {
        if let Some(pv) = self
            .caches
            .get()
            .and_then(|c| c.package_versions.get(&ObjectRef::new(name)))
        {
            return Ok(Some((*pv).clone()));
        }
        Api::<PackageVersion>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("get PackageVersion {name}")))
    }

    /// Time since the Machine's host was last checked, if it was.
    pub fn since_check(&self, machine: &str) -> Option<Duration> {
        lock(&self.checked).get(machine).map(Instant::elapsed)
    }

    /// Records that the Machine's host was just checked.
    pub fn mark_checked(&self, machine: &str) {
        lock(&self.checked).insert(machine.to_string(), Instant::now());
    }

    /// Records that the Machine's host counts as checked `ago`, unless this
    /// process has checked it already.
    pub fn assume_checked(&self, machine: &str, ago: Duration) {
        let at = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        lock(&self.checked).entry(machine.to_string()).or_insert(at);
    }

    /// Forgets a Machine (deleted).
    pub fn forget(&self, machine: &str) {
        lock(&self.checked).remove(machine);
        self.backoff.succeeded(machine);
        lock(&self.attempts).remove(machine);
        lock(&self.versions).remove(machine);
    }

    /// Records the Machine as the API server returned it after a write.
    pub fn wrote(&self, machine: &Machine) {
        if let Some(rv) = machine.resource_version() {
            lock(&self.versions).insert(machine.name_any(), rv);
        }
    }

    /// `machine` as reconciles must see it. The informer's copy lags behind
    /// this process's own writes: a reconcile queued by one status write may
    /// start before the watch delivers the next, and would then decide (and
    /// write status back) from a phase and installed versions that are no
    /// longer true. When the cached copy is not the version this process
    /// last wrote, the Machine is read from the API server. `None`: it is
    /// gone.
    pub async fn fresh(&self, machine: Arc<Machine>) -> Result<Option<Arc<Machine>>, Error> {
        let name = machine.name_any();
        let known = lock(&self.versions).get(&name).cloned();
        if known.is_none() || known == machine.resource_version() {
            return Ok(Some(machine));
        }
        tracing::debug!(machine = %name, cached = ?machine.resource_version(), ?known, "reading the Machine from the API server: the informer's copy is not the last one written");
        let Some(current) = Api::<Machine>::all(self.client.clone())
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("get Machine {name}")))?
        else {
            return Ok(None);
        };
        self.wrote(&current);
        Ok(Some(Arc::new(current)))
    }

    /// Records the inputs (a hash) the Machine is about to be worked on with.
    pub fn attempt(&self, machine: &str, inputs: u64) {
        lock(&self.attempts)
            .entry(machine.to_string())
            .or_insert((inputs, None))
            .0 = inputs;
    }

    /// The last attempt failed in a way only a change can fix: the same
    /// inputs are not tried again.
    pub fn park(&self, machine: &str) {
        if let Some(entry) = lock(&self.attempts).get_mut(machine) {
            entry.1 = Some(entry.0);
        }
    }

    /// Whether the Machine failed with exactly these inputs and needs a
    /// change before it is worth trying again.
    pub fn parked(&self, machine: &str, inputs: u64) -> bool {
        lock(&self.attempts)
            .get(machine)
            .is_some_and(|(_, parked)| *parked == Some(inputs))
    }

    /// Publishes an Event on `machine`; a failure to publish is only logged.
    pub async fn event(
        &self,
        machine: &Machine,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // Notes often carry what a host printed, so they are redacted here,
        // whoever built them.
        kok_common::events::publish(
            &self.recorder,
            &machine.object_ref(&()),
            type_,
            reason,
            action,
            &crate::redact::text(&note),
            None,
        )
        .await;
    }

    /// Clears the failure count of `machine` after a success.
    pub fn succeeded(&self, machine: &str) {
        self.backoff.succeeded(machine);
    }

    /// How long the Machine's backoff after its last failure at
    /// `generation` still runs, if it does (a changed spec is tried at once).
    pub fn backing_off(&self, machine: &str, generation: Option<i64>) -> Option<Duration> {
        self.backoff
            .waiting(machine, generation)
            .map(|(wait, _)| wait)
    }

    /// Counts a failed reconcile of `machine` at `generation`: its failures
    /// in a row and how long until it is tried again.
    pub fn failed(&self, machine: &str, generation: Option<i64>) -> (u32, Duration) {
        self.backoff.failed(machine, generation, |n, _| n)
    }

    /// Hands reconciles the watched copies once the controllers run; only
    /// the first call counts.
    pub fn set_caches(&self, caches: Caches) {
        let _ = self.caches.set(caches);
    }
}

/// The longest wait between two attempts of a failing Machine, unless the
/// first one (`--retry-backoff`) is longer.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

fn backoff_max(first: Duration) -> Duration {
    BACKOFF_MAX.max(first)
}

/// Backoff for a Machine after `failures` consecutive failures: `first`
/// doubling up to 5 minutes (or `first`, when longer).
pub fn backoff(first: Duration, failures: u32) -> Duration {
    kok_common::backoff::delay(failures, first, backoff_max(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let first = Duration::from_secs(2);
        assert_eq!(backoff(first, 1), Duration::from_secs(2));
        assert_eq!(backoff(first, 2), Duration::from_secs(4));
        assert_eq!(backoff(first, 5), Duration::from_secs(32));
        assert_eq!(backoff(first, 30), Duration::from_secs(300));
    }

    #[test]
    fn a_first_wait_longer_than_five_minutes_is_kept() {
        let first = Duration::from_secs(600);
        assert_eq!(backoff(first, 1), first);
        assert_eq!(backoff(first, 4), first);
    }
}
