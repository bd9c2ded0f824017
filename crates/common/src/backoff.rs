//! Exponential backoff for work that keeps failing: a delay that doubles with
//! each consecutive failure up to a ceiling, and a per-key record of it for
//! controllers that must not retry a failing object on every wake-up; and
//! [`Poll`], a look-again interval that slows down while nothing changes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The delay after `failures` consecutive failures: `first`, doubling each
/// time, never more than `max`. No failures means no delay.
pub fn delay(failures: u32, first: Duration, max: Duration) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    first.saturating_mul(factor).min(max)
}

/// One key's failures so far, when the next attempt is due, and what the
/// last attempt reported (shown again while waiting).
#[derive(Debug, Clone)]
struct Entry<T> {
    failures: u32,
    due: Instant,
    generation: Option<i64>,
    last: T,
}

/// Consecutive failures per key (a Cluster, a Machine), with the outcome of
/// the last attempt. A success, or a change of the object's generation (its
/// spec), clears the key: a user's fix is tried at once.
#[derive(Debug)]
pub struct Backoff<T> {
    first: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry<T>>>,
}

impl<T: Clone> Backoff<T> {
    /// First retry after `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            entries: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry<T>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a failed attempt at generation `generation`. `describe` is
    /// given how many failures in a row that makes and the wait before the
    /// next attempt, and says what to show until then; returns that and the
    /// wait.
    pub fn failed(
        &self,
        key: &str,
        generation: Option<i64>,
        describe: impl FnOnce(u32, Duration) -> T,
    ) -> (T, Duration) {
        let mut entries = self.lock();
        let failures = entries
            .get(key)
            .filter(|e| e.generation == generation)
            .map_or(0, |e| e.failures)
            .saturating_add(1);
        let wait = delay(failures, self.first, self.max);
        let last = describe(failures, wait);
        entries.insert(
            key.to_string(),
            Entry {
                failures,
                due: Instant::now() + wait,
                generation,
                last: last.clone(),
            },
        );
        (last, wait)
    }

    /// Forgets the key's failures.
    pub fn succeeded(&self, key: &str) {
        self.lock().remove(key);
    }

    /// While the key waits out its backoff at this generation: how long it
    /// still waits, and the last attempt's outcome.
    pub fn waiting(&self, key: &str, generation: Option<i64>) -> Option<(Duration, T)> {
        let entries = self.lock();
        let entry = entries.get(key).filter(|e| e.generation == generation)?;
        let left = entry.due.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then(|| (left, entry.last.clone()))
    }
}

/// How soon to look again at an object that is still converging, when part of
/// its progress reaches the controller through no watch (an etcd member
/// starting to answer, say): `first` after a reconcile that saw its observed
/// state change, doubling with each reconcile in a row that saw the same
/// state, up to `max`. Watched changes wake the controller sooner anyway, so
/// an object that waits a long time on something slow (a scheduler with a
/// queue, an image pull) costs a few looks rather than one every `first`.
#[derive(Debug)]
pub struct Poll {
    first: Duration,
    max: Duration,
    /// Per key: the last state seen and how many reconciles in a row saw it.
    entries: Mutex<HashMap<String, (u64, u32)>>,
}

impl Poll {
    /// Look again after `first`, doubling while nothing changes, up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Poll {
            first,
            max,
            entries: Mutex::default(),
        }
    }

    /// Records that a reconcile of `key` observed the state `seen` (a hash of
    /// what it reports) and returns the wait before the next look.
    pub fn next(&self, key: &str, seen: u64) -> Duration {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let repeats = match entries.get(key) {
            Some(&(last, repeats)) if last == seen => repeats.saturating_add(1),
            _ => 0,
        };
        entries.insert(key.to_string(), (seen, repeats));
        delay(repeats.saturating_add(1), self.first, self.max)
    }

    /// Forgets the key: it converged, or is gone.
    pub fn forget(&self, key: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Keys tracked (for tests and metrics).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_up_to_the_ceiling() {
        let (first, max) = (Duration::from_secs(2), Duration::from_secs(300));
        assert_eq!(delay(0, first, max), Duration::ZERO);
        assert_eq!(delay(1, first, max), Duration::from_secs(2));
        assert_eq!(delay(2, first, max), Duration::from_secs(4));
        assert_eq!(delay(5, first, max), Duration::from_secs(32));
        assert_eq!(delay(30, first, max), Duration::from_secs(300));
        assert_eq!(delay(u32::MAX, first, max), Duration::from_secs(300));
    }

    #[test]
    fn failures_accumulate_until_success_or_a_new_generation() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        assert!(b.waiting("a", Some(1)).is_none());
        let counted = |n: u32, wait: Duration| format!("{n} {}", wait.as_secs());
        assert_eq!(b.failed("a", Some(1), counted).0, "1 10");
        let (last, wait) = b.failed("a", Some(1), counted);
        assert_eq!((last.as_str(), wait), ("2 20", Duration::from_secs(20)));
        let (left, shown) = b.waiting("a", Some(1)).expect("waiting");
        assert!(left > Duration::from_secs(15) && left <= Duration::from_secs(20));
        assert_eq!(shown, "2 20");
        // Another key is independent.
        assert!(b.waiting("b", Some(1)).is_none());
        // A changed spec is tried at once, and counts from one again.
        assert!(b.waiting("a", Some(2)).is_none());
        assert_eq!(b.failed("a", Some(2), counted).0, "1 10");
        b.succeeded("a");
        assert!(b.waiting("a", Some(2)).is_none());
        assert_eq!(b.failed("a", Some(2), counted).0, "1 10");
    }

    #[test]
    fn a_poll_slows_while_nothing_changes_and_restarts_on_a_change() {
        let p = Poll::new(Duration::from_secs(5), Duration::from_secs(60));
        let secs = |d: Duration| d.as_secs();
        assert_eq!(secs(p.next("a", 1)), 5);
        assert_eq!(secs(p.next("a", 1)), 10);
        assert_eq!(secs(p.next("a", 1)), 20);
        // Another key is counted on its own.
        assert_eq!(secs(p.next("b", 1)), 5);
        assert_eq!(secs(p.next("a", 1)), 40);
        assert_eq!(secs(p.next("a", 1)), 60);
        assert_eq!(secs(p.next("a", 1)), 60);
        // Progress: back to the first interval.
        assert_eq!(secs(p.next("a", 2)), 5);
        assert_eq!(secs(p.next("a", 2)), 10);
        p.forget("a");
        assert_eq!(p.len(), 1);
        assert_eq!(secs(p.next("a", 2)), 5);
    }
}
