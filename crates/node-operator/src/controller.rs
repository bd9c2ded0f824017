//! The node-operator's controllers (Machine, ClusterPackageVersion,
//! CanaryRelease, serving certificates) wired together: the shared Machine
//! watch, what wakes a Machine, and the Machine error policy. What their
//! reconciles share is in [`crate::context`].

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, predicates, watcher};
use kube::{Client, ResourceExt};
use kube_on_kube_api::{ClusterPackageVersion, Machine, PackageVersion};

use crate::Error;
use crate::bootstrap::MACHINE_LABEL;
use crate::context::{Caches, Context, Settings};
use crate::repair::Remediations;

/// Run every controller with default settings until SIGTERM/SIGINT.
pub async fn run(client: Client, concurrency: u16) {
    run_with(
        client,
        concurrency,
        Settings::default(),
        Remediations::new(Vec::new(), Duration::from_secs(600), 1),
    )
    .await;
}

/// Run every controller until SIGTERM/SIGINT.
pub async fn run_with(
    client: Client,
    concurrency: u16,
    settings: Settings,
    remediations: Remediations,
) {
    let ctx = Arc::new(Context::new(client.clone(), settings, remediations));
    // One watch of the Machines feeds all three controllers, and one cache
    // keeps them (without managed fields: a map of every field each writer
    // owns, most of a Machine's size and never read). Each change goes to
    // the controllers once the cache has it (senders: Machine controller,
    // summary, CanaryRelease).
    let (store, writer) = reflector::store();
    let (senders, mut receivers): (Vec<_>, Vec<_>) = (0..3)
        .map(|_| tokio::sync::mpsc::channel::<Arc<Machine>>(SHARED_BUFFER))
        .unzip();
    let mut changes = || {
        let rx = receivers.remove(0);
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
    };
    let (for_machines, for_cpv, for_canary) = (changes(), changes(), changes());
    let watch = watcher(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|m: &mut Machine| m.metadata.managed_fields = None)
    .reflect(writer)
    .for_each(|event| {
        let senders = senders.clone();
        async move {
            // A deleted Machine wakes the summary and its CanaryRelease; the
            // Machine controller, which has nothing left to reconcile, is
            // not told.
            let (machine, to) = match event {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => (m, &senders[..]),
                Ok(watcher::Event::Delete(m)) => (m, &senders[1..]),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => return,
                Err(error) => return tracing::warn!(%error, "watching Machines"),
            };
            let machine = Arc::new(machine);
            for tx in to {
                let _ = tx.send(machine.clone()).await;
            }
        }
    });
    let controllers = async {
        futures::join!(
            machines(&client, concurrency, &ctx, store.clone(), for_machines),
            crate::cpv::run(client.clone(), store.clone(), for_cpv),
            crate::canary::run(client.clone(), for_canary),
            crate::serving_certs::run(client.clone(), store),
        );
    };
    // The watch runs for as long as the controllers do: they stop on
    // SIGTERM/SIGINT, and the process with them.
    tokio::select! {
        () = controllers => {}
        () = watch => {}
    }
}

/// Machine changes a controller may fall behind on before the watch waits.
const SHARED_BUFFER: usize = 1024;

/// The Machine controller: Machines, their Nodes (by the Machine label the
/// Node carries, else by name) and the cluster default versions.
async fn machines(
    client: &Client,
    concurrency: u16,
    ctx: &Arc<Context>,
    store: Store<Machine>,
    changes: impl Stream<Item = Arc<Machine>> + Send + 'static,
) {
    let config = kube::runtime::controller::Config::default().concurrency(concurrency);
    let controller = Controller::for_shared_stream(changes, store.clone());
    let (defaults, defaults_writer) = reflector::store();
    let (package_versions, pv_writer) = reflector::store();
    // PackageVersions only fill the cache (one not in it yet is read from
    // the API server); their changes wake no Machine.
    let pv_cache = watcher(
        Api::<PackageVersion>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(pv_writer)
    .touched_objects();
    crate::metrics::count_by_phase(store.clone(), |m: &Machine| {
        Some(format!("{:?}", m.status.as_ref()?.phase.as_ref()?))
    });
    let controller = controller
        .with_config(config)
        .watches_stream(node_changes(client), |node: Node| {
            let machine = node
                .labels()
                .get(MACHINE_LABEL)
                .cloned()
                .unwrap_or_else(|| node.name_any());
            Some(ObjectRef::<Machine>::new(&machine))
        })
        // Only a change of the cluster default's spec concerns every Machine;
        // its status (counts of Machines up to date, unavailable) changes
        // as they move and must not wake them all again. (Its deletion may
        // pass unseen too: Machines then keep what they run.) The cache is
        // updated before the change wakes them, so they read the new one.
        .watches_stream(
            watcher(
                Api::<ClusterPackageVersion>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(defaults_writer)
            .touched_objects()
            .predicate_filter(predicates::generation, Default::default()),
            move |_cpv| {
                store
                    .state()
                    .iter()
                    .map(|m| ObjectRef::from_obj(m.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .watches_stream(pv_cache, |_pv| None::<ObjectRef<Machine>>);
    ctx.set_caches(Caches {
        defaults,
        package_versions,
    });
    kok_common::controller::run(
        "machine",
        controller,
        crate::machine::reconcile,
        machine_error_policy,
        ctx.clone(),
        Error::category,
    )
    .await;
}

/// Node updates that can matter to a Machine: the Node appears or is
/// deleted, or its labels, taints, schedulability or conditions (type,
/// status, reason) change. Updates that only renew heartbeat times are
/// dropped: a kubelet reports its status every few minutes even when
/// nothing changed, and with thousands of Nodes each round of those reports
/// would wake every Machine.
fn node_changes(
    client: &Client,
) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    let mut changes = kok_common::watch::Changes::default();
    watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            futures::future::ready(match event {
                Ok(event) => changes.pass(event, node_state).map(Ok),
                Err(e) => Some(Err(e)),
            })
        })
}

/// A hash of what a Machine reconcile reads from its Node.
fn node_state(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    node.metadata.annotations.hash(&mut h);
    if let Some(spec) = &node.spec {
        spec.unschedulable.hash(&mut h);
        serde_json::to_string(&spec.taints)
            .unwrap_or_default()
            .hash(&mut h);
    }
    let mut conditions: Vec<(&str, &str, Option<&str>)> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
                .collect()
        })
        .unwrap_or_default();
    conditions.sort_unstable();
    conditions.hash(&mut h);
    h.finish()
}

fn machine_error_policy(machine: Arc<Machine>, error: &Error, ctx: Arc<Context>) -> Action {
    let (n, delay) = ctx.failed(&machine.name_any(), machine.metadata.generation);
    tracing::warn!(machine = %machine.name_any(), category = error.category(), %error, failures = n, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(heartbeat: &str, ready: &str, labels: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "n1",
                "resourceVersion": heartbeat,
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            },
            "status": {"conditions": [
                {"type": "Ready", "status": ready, "reason": "KubeletReady",
                 "lastHeartbeatTime": format!("2026-01-01T00:00:{heartbeat}Z")},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                 "lastHeartbeatTime": format!("2026-01-01T00:00:{heartbeat}Z")},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn heartbeats_alone_are_not_a_node_change() {
        let base = node_state(&node("10", "True", &[("a", "1")]));
        assert_eq!(base, node_state(&node("40", "True", &[("a", "1")])));
        assert_ne!(base, node_state(&node("10", "False", &[("a", "1")])));
        assert_ne!(base, node_state(&node("10", "True", &[("a", "2")])));
        let mut cordoned = node("10", "True", &[("a", "1")]);
        cordoned.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        assert_ne!(base, node_state(&cordoned));
    }
}
