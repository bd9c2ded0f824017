//! What is kept from one pass to the next about the add-on step: the
//! outcome it last reported ([`Report`], the AddonsReady condition's content,
//! which the context's backoff holds while the step waits to be retried),
//! and the Clusters waiting for nothing but that retry ([`AddonWaits`]).
//!
//! A Cluster waits so when its control plane is settled and its only
//! pending work is the next attempt of a failed add-on step (a business API
//! that does not answer, say). That attempt needs none of what a full pass reads (the Cluster's Secrets,
//! Services, Deployments and Pods, and etcd's health) as long as none of it
//! changed since the pass that found the control plane settled. Every such
//! change arrives as a watch event, and each event ends the wait
//! ([`AddonWaits::touch`]); so does any write to the Cluster, and the time a
//! full pass is due anyway (a certificate's renewal, the hourly re-check).
//! While the wait holds, a retry dials the business API and updates the
//! AddonsReady condition: a few requests, instead of a full pass for every
//! retry of every Cluster whose business API is down.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;

/// The outcome for the AddonsReady condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Report {
    /// Whether the step went wrong (as opposed to done, or waiting for the
    /// node-operator to come up): such a step is retried with backoff.
    pub fn failed(&self) -> bool {
        !self.ready && self.reason != "NodeOperatorNotReady"
    }

    pub(crate) fn failure(reason: &'static str, message: String) -> Self {
        Report {
            ready: false,
            reason,
            message,
        }
    }
}

/// What a retry of the add-on step takes from the full pass that recorded it.
#[derive(Debug, Clone)]
pub struct Wait {
    /// Watch events of the Cluster counted when that pass began.
    epoch: u64,
    /// The Cluster's resourceVersion its status write returned.
    status_version: String,
    /// A full pass is due by then.
    full_by: Instant,
    /// URL kubelets and users reach the business API at.
    pub endpoint: String,
    /// The Secrets the add-on step reads ([`crate::addons::secrets_read`]).
    pub secrets: BTreeMap<String, Secret>,
}

impl Wait {
    /// A wait recorded by a pass that began at `epoch`, wrote the status
    /// that returned `status_version`, and is due to be followed by a full
    /// pass at `full_by`.
    pub fn new(
        epoch: u64,
        status_version: String,
        full_by: Instant,
        endpoint: String,
        secrets: BTreeMap<String, Secret>,
    ) -> Self {
        Wait {
            epoch,
            status_version,
            full_by,
            endpoint,
            secrets,
        }
    }

    /// The same wait after a retry that wrote the status again.
    pub fn after_write(self, status_version: String) -> Self {
        Wait {
            status_version,
            ..self
        }
    }

    /// When the full pass is due.
    pub fn full_by(&self) -> Instant {
        self.full_by
    }
}

/// Per Cluster (`namespace/name`): how many watch events concerned it so
/// far, and its wait, if it has one.
#[derive(Debug, Default)]
pub struct AddonWaits {
    clusters: Mutex<HashMap<String, (u64, Option<Wait>)>>,
}

impl AddonWaits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Option<Wait>)>> {
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watch event concerned the Cluster: what a full pass would read may
    /// have changed, so its wait ends. Clusters no reconcile has begun for
    /// are not kept (there is nothing to end, and a deleted Cluster's late
    /// events must not bring it back).
    pub fn touch(&self, key: &str) {
        if let Some((epoch, wait)) = self.lock().get_mut(key) {
            *epoch += 1;
            *wait = None;
        }
    }

    /// The Cluster's count of watch events, read when a pass begins.
    pub fn epoch(&self, key: &str) -> u64 {
        self.lock().entry(key.to_string()).or_default().0
    }

    /// Keep the Cluster's wait, unless an event came since its pass began.
    pub fn record(&self, key: &str, wait: Wait) {
        if let Some((epoch, slot)) = self.lock().get_mut(key)
            && *epoch == wait.epoch
        {
            *slot = Some(wait);
        }
    }

    /// The Cluster's wait, if it still holds for the Cluster as read now
    /// (`resource_version`): no event since, no write but its own status
    /// write, no full pass due yet. Taken either way: a retry records it
    /// again.
    pub fn take(&self, key: &str, resource_version: Option<&str>) -> Option<Wait> {
        let mut clusters = self.lock();
        let (epoch, slot) = clusters.get_mut(key)?;
        let wait = slot.take()?;
        (wait.epoch == *epoch
            && Some(wait.status_version.as_str()) == resource_version
            && Instant::now() < wait.full_by)
            .then_some(wait)
    }

    /// The Cluster is gone.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn wait(waits: &AddonWaits, key: &str, version: &str) -> Wait {
        Wait::new(
            waits.epoch(key),
            version.into(),
            Instant::now() + Duration::from_secs(60),
            "https://api".into(),
            BTreeMap::new(),
        )
    }

    #[test]
    fn a_wait_holds_until_an_event_or_a_write() {
        let waits = AddonWaits::default();
        let w = wait(&waits, "ns/a", "10");
        waits.record("ns/a", w.clone());
        let taken = waits.take("ns/a", Some("10")).expect("nothing changed");
        assert_eq!(taken.endpoint, "https://api");
        assert!(
            waits.take("ns/a", Some("10")).is_none(),
            "taken until recorded again"
        );

        waits.record("ns/a", taken.after_write("11".into()));
        assert!(
            waits.take("ns/a", Some("12")).is_none(),
            "someone else wrote the Cluster"
        );

        let w = wait(&waits, "ns/a", "12");
        waits.record("ns/a", w);
        waits.touch("ns/a");
        assert!(
            waits.take("ns/a", Some("12")).is_none(),
            "an event ended it"
        );
    }

    #[test]
    fn an_event_during_the_pass_keeps_its_wait_from_being_recorded() {
        let waits = AddonWaits::default();
        let w = wait(&waits, "ns/a", "10");
        waits.touch("ns/a");
        waits.record("ns/a", w);
        assert!(waits.take("ns/a", Some("10")).is_none());
        // The next pass begins after the event and may record its own.
        let w = wait(&waits, "ns/a", "10");
        waits.record("ns/a", w);
        assert!(waits.take("ns/a", Some("10")).is_some());
    }

    #[test]
    fn a_due_full_pass_ends_the_wait_and_a_forgotten_cluster_is_not_kept() {
        let waits = AddonWaits::default();
        let epoch = waits.epoch("ns/a");
        waits.record(
            "ns/a",
            Wait::new(
                epoch,
                "10".into(),
                Instant::now(),
                String::new(),
                BTreeMap::new(),
            ),
        );
        assert!(waits.take("ns/a", Some("10")).is_none());

        waits.forget("ns/a");
        waits.touch("ns/a");
        assert!(waits.lock().is_empty(), "late events of a deleted Cluster");
    }
}
