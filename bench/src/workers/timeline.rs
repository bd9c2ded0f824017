//! When each worker got where: a watch of the business cluster's Nodes and
//! Pods, kept for the whole benchmark, noting for every Node name the first
//! moment the benchmark saw it Ready, saw a Pod bound to it Running, and saw
//! the workload's Pod on it Ready. Watches, not polls: the API server under
//! measurement is not asked more often the more workers there are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use super::site::PROBE_LABEL;

/// What was seen of one Node.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Its Ready condition True.
    pub ready: Option<Instant>,
    /// A Pod bound to it Running, and which (its name without the
    /// generated suffix).
    pub first_running: Option<(Instant, String)>,
    /// The workload's Pod on it Ready.
    pub workload_ready: Option<Instant>,
}

type Book = Arc<Mutex<BTreeMap<String, Seen>>>;

/// The running watches. Dropping it stops them.
pub struct Timeline {
    book: Book,
    tasks: Vec<JoinHandle<()>>,
}

impl Timeline {
    pub fn start(client: &Client) -> Timeline {
        let book: Book = Arc::default();
        let tasks = vec![
            follow(Api::<Node>::all(client.clone()), book.clone(), note_node),
            follow(Api::<Pod>::all(client.clone()), book.clone(), note_pod),
        ];
        Timeline { book, tasks }
    }

    /// What has been seen of Node `name` so far.
    pub fn get(&self, name: &str) -> Seen {
        lock(&self.book).get(name).cloned().unwrap_or_default()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Watches `api`, noting every object seen (at the moment it arrives) with
/// `note`.
fn follow<K>(api: Api<K>, book: Book, note: fn(&Book, &K, Instant)) -> JoinHandle<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(object) = event {
                note(&book, &object, Instant::now());
            }
        }
    })
}

fn lock(book: &Book) -> MutexGuard<'_, BTreeMap<String, Seen>> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn note_node(book: &Book, node: &Node, now: Instant) {
    if node_ready(node) {
        lock(book)
            .entry(node.name_any())
            .or_default()
            .ready
            .get_or_insert(now);
    }
}

fn note_pod(book: &Book, pod: &Pod, now: Instant) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return;
    };
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Running");
    if !running {
        return;
    }
    let mut book = lock(book);
    let seen = book.entry(node).or_default();
    if seen.first_running.is_none() {
        let name = pod
            .metadata
            .generate_name
            .clone()
            .map(|g| g.trim_end_matches('-').to_string())
            .unwrap_or_else(|| pod.name_any());
        seen.first_running = Some((now, name));
    }
    let probe = pod.labels().get(PROBE_LABEL.0).map(String::as_str) == Some(PROBE_LABEL.1);
    if probe && pod_ready(pod) {
        seen.workload_ready.get_or_insert(now);
    }
}
