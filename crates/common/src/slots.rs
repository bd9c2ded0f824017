//! Slots shared fairly between keys: at most `per_key` holders of one key
//! at a time, so that one key (a tenant's namespace) cannot take every slot
//! of a pool that many keys share.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Holders per key, at most `per_key` each.
#[derive(Debug)]
pub struct KeySlots {
    per_key: usize,
    held: Arc<Mutex<BTreeMap<String, usize>>>,
}

/// A slot of one key, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    key: String,
    held: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl KeySlots {
    /// Slots of which one key holds at most `per_key` (at least one).
    pub fn new(per_key: usize) -> Self {
        KeySlots {
            per_key: per_key.max(1),
            held: Arc::default(),
        }
    }

    /// A slot of `key`, or None while `key` holds all it may.
    pub fn try_take(&self, key: &str) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(key.to_string()).or_default();
        if *count >= self.per_key {
            return None;
        }
        *count += 1;
        Some(Slot {
            key: key.to_string(),
            held: self.held.clone(),
        })
    }

    /// How many slots `key` holds now.
    pub fn held(&self, key: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_holds_at_most_its_share_and_others_are_not_held_back() {
        let slots = KeySlots::new(2);
        let a1 = slots.try_take("team-a").expect("first");
        let a2 = slots.try_take("team-a").expect("second");
        assert!(slots.try_take("team-a").is_none(), "a third of team-a");
        let b = slots.try_take("team-b").expect("another key");
        assert_eq!((slots.held("team-a"), slots.held("team-b")), (2, 1));
        drop(a1);
        let a3 = slots.try_take("team-a").expect("given back");
        drop((a2, a3, b));
        assert_eq!((slots.held("team-a"), slots.held("team-b")), (0, 0));
    }
}
