//! What `/readyz` answers: whether this replica can do its work. A replica that
//! leads (or runs without leader election) is ready once every controller's
//! cache has been filled from the API server; a standby replica waiting for
//! the Lease is ready as it is, since being ready to take over is its job.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kube::runtime::reflector::{Lookup, Store};

/// Readiness of the process.
#[derive(Default)]
pub struct Health {
    /// Leader election is on and this replica does not hold the Lease.
    standby: AtomicBool,
    /// The caches of the controllers started so far, by controller name.
    caches: Mutex<Vec<(&'static str, Arc<AtomicBool>)>>,
}

impl Health {
    /// Mark this replica a standby (`true`) or the one doing the work.
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::SeqCst);
    }

    /// Count `controller` ready once `store` (its main cache) has been filled.
    pub fn track<K>(&'static self, controller: &'static str, store: Store<K>)
    where
        K: Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let synced = Arc::new(AtomicBool::new(false));
        self.lock().push((controller, synced.clone()));
        tokio::spawn(async move {
            if wait_until_ready(&store).await {
                synced.store(true, Ordering::SeqCst);
                tracing::info!(controller, "cache synced");
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Arc<AtomicBool>)>> {
        self.caches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok(why)` when ready, `Err(why not)` otherwise.
    pub fn readiness(&self) -> Result<String, String> {
        if self.standby.load(Ordering::SeqCst) {
            return Ok("ok: standby, waiting for the leader-election Lease".into());
        }
        let caches = self.lock();
        if caches.is_empty() {
            return Err("controllers not started yet".into());
        }
        let waiting: Vec<&str> = caches
            .iter()
            .filter(|(_, synced)| !synced.load(Ordering::SeqCst))
            .map(|(name, _)| *name)
            .collect();
        if waiting.is_empty() {
            Ok("ok: caches synced".into())
        } else {
            Err(format!("caches not synced yet: {}", waiting.join(", ")))
        }
    }
}

/// Wait until `store` has been filled; `false` if its writer went away first.
///
/// The store's readiness signal wakes only the last of several waiters (the
/// controller itself waits on it too), so it is polled again every second
/// rather than awaited once.
pub async fn wait_until_ready<K>(store: &Store<K>) -> bool
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(1), store.wait_until_ready()).await {
            Ok(ready) => return ready.is_ok(),
            Err(_) => continue,
        }
    }
}

/// The process's readiness.
pub fn global() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(Health::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_is_ready_and_a_leader_waits_for_its_caches() {
        let health = Health::default();
        assert!(health.readiness().is_err(), "nothing started");
        health.set_standby(true);
        assert!(health.readiness().is_ok());
        health.set_standby(false);
        let flag = Arc::new(AtomicBool::new(false));
        health.lock().push(("machine", flag.clone()));
        let err = health.readiness().unwrap_err();
        assert!(err.contains("machine"), "{err}");
        flag.store(true, Ordering::SeqCst);
        assert!(health.readiness().is_ok());
    }
}
