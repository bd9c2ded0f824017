//! The node-operator's controllers (Machine, ClusterPackageVersion,
//! CanaryRelease), their shared context and error policy.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::{CanaryRelease, Machine};
use serde::de::DeserializeOwned;

use crate::Error;

/// Field manager of everything this operator applies.
pub const MANAGER: &str = "node-operator";

/// What every reconcile shares.
pub struct Context {
    /// Client of the business cluster.
    pub client: Client,
}

/// Run every controller until SIGTERM/SIGINT.
pub async fn run(client: Client, concurrency: u16) {
    let ctx = Arc::new(Context {
        client: client.clone(),
    });
    futures::join!(
        controller::<Machine>("machine", &client, concurrency, &ctx),
        crate::cpv::run(client.clone()),
        controller::<CanaryRelease>("canaryrelease", &client, concurrency, &ctx),
    );
}

async fn controller<K>(name: &'static str, client: &Client, concurrency: u16, ctx: &Arc<Context>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let config = kube::runtime::controller::Config::default().concurrency(concurrency);
    let stream = Controller::new(Api::<K>::all(client.clone()), watcher::Config::default())
        .with_config(config)
        .shutdown_on_signal()
        .run(observe::<K>, error_policy::<K>, ctx.clone());
    kok_common::controller::drive(name, stream).await;
}

/// Observe one object of any of the watched kinds.
pub async fn observe<K>(obj: Arc<K>, _ctx: Arc<Context>) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
{
    tracing::info!(kind = %K::kind(&()), name = %obj.name_any(), generation = ?obj.meta().generation, "observed");
    Ok(Action::await_change())
}

/// Transient failures are retried with a delay; the controller runtime adds its
/// own backoff on top for repeated failures.
pub fn error_policy<K>(obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}
