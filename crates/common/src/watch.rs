//! Watches of owned objects that pass on only the changes a reconcile reads.
//!
//! A Pod or Deployment is written many times on its way to Ready (scheduled,
//! each condition, each replica count), and every write is a watch event.
//! Passed on as they are, each one that arrives on its own, as on a busy
//! meta-cluster, wakes one more reconcile that finds nothing new. [`changes`]
//! keeps, per object, a fingerprint of the fields the reconcile reads and
//! passes an event on only when it changes; deletions always pass.

use std::collections::HashMap;

use futures::{Stream, StreamExt as _};
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher as watch};
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

/// The fingerprint of an object: equal as long as nothing the reconcile
/// reads has changed.
pub type Fingerprint<K> = fn(&K) -> u64;

/// Hash `value` into a fingerprint.
pub fn hash<T: std::hash::Hash>(value: &T) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The resourceVersions this process's own writes of objects returned, by
/// object uid. A write's own watch event carries exactly what the write
/// returned, which the reconcile that wrote it has already seen: such an
/// event wakes nothing (each one would otherwise be one more reconcile that
/// finds nothing to do). At most one entry per object, dropped when its event
/// arrives or the object is deleted.
#[derive(Default)]
pub struct OwnWrites {
    versions: std::sync::Mutex<HashMap<String, String>>,
}

impl OwnWrites {
    /// The process's registry, shared by its writes and its watches.
    pub fn global() -> &'static OwnWrites {
        static GLOBAL: std::sync::OnceLock<OwnWrites> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(OwnWrites::default)
    }

    /// Remember `written`, as a write of this process returned it.
    pub fn record<K: Resource>(&self, written: &K) {
        let m = written.meta();
        if let (Some(uid), Some(version)) = (&m.uid, &m.resource_version) {
            self.lock().insert(uid.clone(), version.clone());
        }
    }

    /// Whether this watch event of `object` shows this process's own last
    /// write of it, and nothing since (forgotten then: it is seen once).
    pub fn own<K: Resource>(&self, object: &K) -> bool {
        let m = object.meta();
        let (Some(uid), Some(version)) = (&m.uid, &m.resource_version) else {
            return false;
        };
        let mut versions = self.lock();
        if versions.get(uid) == Some(version) {
            versions.remove(uid);
            true
        } else {
            false
        }
    }

    /// Forget a deleted object.
    pub fn forget<K: Resource>(&self, object: &K) {
        if let Some(uid) = &object.meta().uid {
            self.lock().remove(uid);
        }
    }

    /// Objects remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a watch event wakes a reconcile, judged by [`OwnWrites`]: not when
/// it only shows this process's own write. Deletions always do.
pub fn wakes<K: Resource>(own: &OwnWrites, event: &Event<K>) -> bool {
    match event {
        Event::Apply(k) | Event::InitApply(k) => !own.own(k),
        Event::Delete(k) => {
            own.forget(k);
            true
        }
        Event::Init | Event::InitDone => true,
    }
}

/// The objects of a watch's events that wake a reconcile, as
/// `touched_objects` gives them, but without this process's own writes (see
/// [`wakes`]).
pub fn touched<K, S>(events: S) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    events.filter_map(|event| {
        futures::future::ready(match event {
            Err(error) => Some(Err(error)),
            Ok(event) if !wakes(OwnWrites::global(), &event) => None,
            Ok(Event::Apply(k) | Event::InitApply(k) | Event::Delete(k)) => Some(Ok(k)),
            Ok(Event::Init | Event::InitDone) => None,
        })
    })
}

/// What a watch remembers of the objects it saw, and what it passes on.
#[derive(Default)]
pub struct Changes {
    seen: HashMap<String, u64>,
    /// The objects of a relist under way; they replace `seen` when it ends,
    /// so objects deleted while the watch was down are forgotten.
    relist: Option<HashMap<String, u64>>,
}

impl Changes {
    /// The object to pass on for `event`, if any: an object whose fingerprint
    /// differs from the last one seen (or that was not seen), or a deleted one.
    pub fn pass<K: Resource>(&mut self, event: Event<K>, fingerprint: Fingerprint<K>) -> Option<K> {
        let key = |k: &K| {
            let m = k.meta();
            m.uid.clone().unwrap_or_else(|| {
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or_default(),
                    m.name.as_deref().unwrap_or_default()
                )
            })
        };
        match event {
            Event::Init => {
                self.relist = Some(HashMap::new());
                None
            }
            Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.seen = relist;
                }
                None
            }
            Event::Apply(object) | Event::InitApply(object) => {
                let (key, print) = (key(&object), fingerprint(&object));
                let before = self.seen.get(&key).copied();
                if let Some(relist) = self.relist.as_mut() {
                    relist.insert(key.clone(), print);
                }
                self.seen.insert(key, print);
                (before != Some(print)).then_some(object)
            }
            Event::Delete(object) => {
                let key = key(&object);
                self.seen.remove(&key);
                if let Some(relist) = self.relist.as_mut() {
                    relist.remove(&key);
                }
                Some(object)
            }
        }
    }
}

/// Watch `api` with `config` and pass on only the objects a `Owner` owns
/// whose `fingerprint` changed, and deleted ones, unless the change is this
/// process's own write ([`OwnWrites`]); a trigger stream for
/// `Controller::owns_stream`. Objects owned by anything else (a ReplicaSet's
/// Pods, say) could not wake an `Owner` and are dropped unseen. Counted in
/// `kok_watch_events_total` by kind and whether the event was passed on.
pub fn changes<Owner, K>(
    api: Api<K>,
    config: watcher::Config,
    fingerprint: Fingerprint<K>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    Owner: Resource<DynamicType = ()>,
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let kind = K::kind(&()).to_string();
    let owner = Owner::kind(&()).to_string();
    let metrics = crate::metrics::global();
    let mut changes = Changes::default();
    watch(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let owned = |k: &K| k.owner_references().iter().any(|r| r.kind == owner);
            let passed = match event {
                Err(error) => Some(Err(error)),
                Ok(Event::Apply(k) | Event::InitApply(k) | Event::Delete(k)) if !owned(&k) => None,
                Ok(event) => {
                    let object_event = matches!(
                        event,
                        Event::Apply(_) | Event::InitApply(_) | Event::Delete(_)
                    );
                    // Remembered either way, so the next change compares
                    // with it.
                    let own = !wakes(OwnWrites::global(), &event);
                    let passed = changes.pass(event, fingerprint).filter(|_| !own);
                    if object_event {
                        metrics.watch_event(&kind, passed.is_some());
                    }
                    passed.map(Ok)
                }
            };
            futures::future::ready(passed)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(uid: &str, phase: &str, node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase}
        }))
        .expect("pod")
    }

    fn phase(p: &Pod) -> u64 {
        hash(&p.status.as_ref().and_then(|s| s.phase.clone()))
    }

    #[test]
    fn only_changes_of_the_fingerprint_and_deletions_pass() {
        let mut c = Changes::default();
        let name = |p: Option<Pod>| p.and_then(|p| p.metadata.name);
        assert_eq!(
            name(c.pass(Event::Apply(pod("a", "Pending", "")), phase)),
            Some("a".into())
        );
        // Scheduled: a change the fingerprint does not read.
        assert_eq!(
            name(c.pass(Event::Apply(pod("a", "Pending", "n1")), phase)),
            None
        );
        assert_eq!(
            name(c.pass(Event::Apply(pod("a", "Running", "n1")), phase)),
            Some("a".into())
        );
        assert_eq!(
            name(c.pass(Event::Delete(pod("a", "Running", "n1")), phase)),
            Some("a".into())
        );
        // Recreated under the same name: a new object.
        assert_eq!(
            name(c.pass(Event::Apply(pod("a", "Running", "n1")), phase)),
            Some("a".into())
        );
    }

    fn versioned(uid: &str, version: &str) -> Pod {
        let mut p = pod(uid, "Pending", "");
        p.metadata.resource_version = Some(version.into());
        p
    }

    #[test]
    fn an_own_write_wakes_nothing_once_and_later_changes_do() {
        let own = OwnWrites::default();
        own.record(&versioned("a", "5"));
        // Another object, and a write seen before this one: they wake.
        assert!(wakes(&own, &Event::Apply(versioned("b", "5"))));
        assert!(wakes(&own, &Event::Apply(versioned("a", "4"))));
        // The write's own event does not, and only once.
        assert!(!wakes(&own, &Event::Apply(versioned("a", "5"))));
        assert!(own.is_empty());
        assert!(wakes(&own, &Event::Apply(versioned("a", "5"))));
        assert!(wakes(&own, &Event::Apply(versioned("a", "6"))));
        // A relist showing an own write is one too; a deletion always wakes
        // and forgets the object.
        own.record(&versioned("a", "7"));
        assert!(!wakes(&own, &Event::InitApply(versioned("a", "7"))));
        own.record(&versioned("a", "8"));
        assert!(wakes(&own, &Event::Delete(versioned("a", "8"))));
        assert!(own.is_empty());
        // Objects without a uid or version are never taken for own writes.
        own.record(&pod("c", "Pending", ""));
        assert!(own.is_empty());
    }

    #[test]
    fn a_relist_passes_what_changed_meanwhile_and_forgets_what_is_gone() {
        let mut c = Changes::default();
        c.pass(Event::Apply(pod("a", "Pending", "")), phase);
        c.pass(Event::Apply(pod("b", "Pending", "")), phase);
        assert!(c.pass(Event::<Pod>::Init, phase).is_none());
        assert!(
            c.pass(Event::InitApply(pod("a", "Pending", "")), phase)
                .is_none()
        );
        assert!(
            c.pass(Event::InitApply(pod("b", "Running", "")), phase)
                .is_some()
        );
        assert!(c.pass(Event::<Pod>::InitDone, phase).is_none());
        assert_eq!(c.seen.len(), 2);
        // "b" was gone by the next relist: no longer remembered.
        c.pass(Event::<Pod>::Init, phase);
        c.pass(Event::InitApply(pod("a", "Pending", "")), phase);
        c.pass(Event::<Pod>::InitDone, phase);
        assert_eq!(c.seen.keys().collect::<Vec<_>>(), ["a"]);
    }
}
