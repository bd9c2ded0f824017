//! Driving a `kube::runtime::Controller` the same way in every operator: log
//! each reconcile outcome and stop cleanly on SIGTERM/SIGINT.

use std::fmt::Debug;

use futures::StreamExt;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

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
                Err(error) => tracing::warn!(controller = name, %error, "reconcile failed"),
            }
        })
        .await;
    tracing::info!(controller = name, "controller stopped");
}
