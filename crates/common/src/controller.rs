//! Driving a `kube::runtime::Controller` the same way in every operator: time
//! and count every reconcile in the metrics, report the controller's cache in
//! `/readyz`, log each reconcile outcome and stop cleanly when shutdown is
//! requested (SIGTERM/SIGINT, see [`crate::shutdown`]).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Run `controller` until shutdown is requested, with `reconcile` and `error_policy`,
/// as controller `name` in metrics and logs. `category` names a failure for
/// the `kok_reconcile_failures_total` label (each crate's `Error::category`).
pub async fn run<K, Ctx, E, Fut>(
    name: &'static str,
    controller: Controller<K>,
    mut reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action,
    ctx: Arc<Ctx>,
    category: fn(&E) -> &'static str,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Debug + Eq + Hash + Clone + Unpin + Send + Sync + Default,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let store = controller.store();
    crate::health::global().track(name, store.clone());
    let metrics = crate::metrics::global();
    if K::kind(&K::DynamicType::default()) == "Cluster" {
        tokio::spawn(forget_deleted_clusters(store.clone()));
    }
    let timed = move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let reconciled = reconcile(obj, ctx);
        async move {
            let timer = metrics.reconcile(name);
            let result = reconciled.await;
            timer.finish(result.as_ref().map(|_| ()).map_err(category));
            result
        }
    };
    let stream = controller
        .graceful_shutdown_on(crate::shutdown::requested())
        .run(timed, error_policy, ctx);
    tokio::select! {
        () = drive(name, stream) => {}
        () = stopped_before_sync(&store) => {
            tracing::info!(controller = name, "controller stopped before its cache synced");
        }
    }
}

/// Resolves when shutdown is requested before `store` has been filled. The
/// controller has then reconciled nothing (it holds every reconcile until its
/// cache is filled), and its stream would never end: a graceful shutdown
/// stops the watches that fill the cache, and then waits for it.
async fn stopped_before_sync<K>(store: &Store<K>)
where
    K: Clone + Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    use futures::FutureExt;
    crate::shutdown::requested().await;
    if matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
        std::future::pending::<()>().await;
    }
}

/// Every minute, drop the per-cluster metric series of Clusters that are no
/// longer in the controller's cache (deleted ones are not reconciled again).
async fn forget_deleted_clusters<K>(store: Store<K>)
where
    K: Clone + Resource + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    if !crate::health::wait_until_ready(&store).await {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let live: BTreeSet<(String, String)> = store
            .state()
            .iter()
            .map(|o| (o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        crate::metrics::global().retain_clusters(&live);
    }
}

/// Consume a controller's result stream until it ends (on shutdown), logging
/// every reconcile at debug and every failure at warn.
pub async fn drive<K, E, Q>(
    name: &'static str,
    stream: impl futures::Stream<
        Item = Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, Q>>,
    >,
) where
    K: Resource + Debug,
    K::DynamicType: Debug + Clone + Eq + std::hash::Hash,
    E: std::error::Error + 'static,
    Q: std::error::Error + 'static,
{
    stream
        .for_each(|result| async move {
            match result {
                Ok((object, action)) => {
                    tracing::debug!(controller = name, %object, ?action, "reconciled")
                }
                // An owned object changed after its owner was deleted (the
                // garbage collector removing it, say): nothing to reconcile.
                Err(kube::runtime::controller::Error::ObjectNotFound(object)) => {
                    tracing::debug!(controller = name, %object, "owner gone; nothing to reconcile")
                }
                Err(error) => tracing::warn!(controller = name, %error, "reconcile failed"),
            }
        })
        .await;
    tracing::info!(controller = name, "controller stopped");
}
