//! The Cluster controller: its shared context, the reconcile entry point and the
//! error policy.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;

use crate::Error;

/// Field manager of everything this operator applies.
pub const MANAGER: &str = "kube-on-kube-operator";

/// What every reconcile shares.
pub struct Context {
    /// Client of the meta-cluster.
    pub client: Client,
}

/// Run the Cluster controller until SIGTERM/SIGINT. `namespace` limits it to one
/// namespace; `None` watches all.
pub async fn run(client: Client, namespace: Option<&str>, concurrency: u16) {
    let clusters: Api<Cluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Context { client });
    let config = kube::runtime::controller::Config::default().concurrency(concurrency);
    let stream = Controller::new(clusters, watcher::Config::default())
        .with_config(config)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx);
    kok_common::controller::drive("cluster", stream).await;
}

/// Converge one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, _ctx: Arc<Context>) -> Result<Action, Error> {
    tracing::info!(
        cluster = %cluster.name_any(),
        namespace = cluster.namespace().as_deref().unwrap_or_default(),
        version = %cluster.spec.version,
        paused = cluster.spec.paused,
        "observed cluster"
    );
    Ok(Action::await_change())
}

/// Transient failures are retried with a delay; the controller runtime adds its
/// own backoff on top for repeated failures.
pub fn error_policy(cluster: Arc<Cluster>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}
