//! Driving a `kube::runtime::Controller` the same way in every operator: time
//! and count every reconcile in the metrics, report the controller's cache in
//! `/readyz`, log each reconcile outcome and stop cleanly when shutdown is
//! requested (SIGTERM/SIGINT, see [`crate::shutdown`]). A reconcile that
//! panics fails like one that returns an error: the panic is caught, logged
//! and counted, and the process keeps running.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::Resource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
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
    E: std::error::Error + From<crate::Error> + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let store = controller.store();
    crate::health::global().track(name, store.clone());
    let metrics = crate::metrics::global();
    let timed = move |obj: Arc<K>, ctx: Arc<Ctx>| {
        let object = ObjectRef::from_obj(obj.as_ref()).to_string();
        let reconciled = std::panic::catch_unwind(AssertUnwindSafe(|| reconcile(obj, ctx)));
        async move {
            let timer = metrics.reconcile(name);
            let result = match reconciled {
                Ok(future) => caught(name, object, future).await,
                Err(payload) => Err(panicked(name, object, payload.as_ref())),
            };
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

/// Awaits one reconcile; a panic in it becomes [`crate::Error::Panicked`]
/// (logged, and counted under the `panic` failure category by the caller)
/// instead of unwinding through the controller and ending the process.
pub async fn caught<E, Fut>(name: &'static str, object: String, reconcile: Fut) -> Result<Action, E>
where
    E: From<crate::Error>,
    Fut: Future<Output = Result<Action, E>>,
{
    match AssertUnwindSafe(reconcile).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => Err(panicked(name, object, payload.as_ref())),
    }
}

fn panicked<E: From<crate::Error>>(
    name: &'static str,
    object: String,
    payload: &(dyn std::any::Any + Send),
) -> E {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    tracing::error!(controller = name, %object, panic = %message, "reconcile panicked");
    E::from(crate::Error::Panicked { object, message })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_not_the_end_of_the_process() {
        let result: Result<Action, crate::Error> = caught("test", "ns/obj".into(), async {
            // Slicing inside a multi-byte character, as a parser of host
            // output might.
            let text = String::from("İ");
            let _ = &text[..1];
            Ok(Action::await_change())
        })
        .await;
        let error = result.unwrap_err();
        assert_eq!(error.category(), "panic");
        assert!(error.to_string().contains("ns/obj"), "{error}");
        assert!(error.to_string().contains("char boundary"), "{error}");

        let fine: Result<Action, crate::Error> = caught("test", "ns/obj".into(), async {
            Ok(Action::await_change())
        })
        .await;
        assert!(fine.is_ok());
    }
}
