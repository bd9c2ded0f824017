//! What every Cluster pass shares: the operator's settings
//! ([`Config`], from [`crate::config`]), the state kept between passes
//! ([`Context`]), and the helpers each step
//! reads and writes the meta-cluster with (bounded lists, applies that skip
//! unchanged objects, Events on the Cluster).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, Service};
use kok_common::backoff::{Backoff, Poll};
use kok_common::slots::KeySlots;
use kok_common::watch::OwnWrites;
use kube::api::{Api, ListParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::CLUSTER_LABEL;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::addon_retry::{self, AddonWaits};
use crate::applied::{Applied, Version, desired_hash};
use crate::config::{ADDON_RETRY_MAX, BACKUPS_PER_NAMESPACE, Config};
use crate::names::Names;
use crate::render::config_hash;
use crate::versions::Resolved;

/// A converging Cluster is looked at again this soon after its status
/// changed, doubling while it does not, up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_secs(5);
const POLL_MAX: Duration = Duration::from_secs(60);

/// Field manager of everything this operator applies.
pub const MANAGER: &str = "kube-on-kube-operator";

/// What every reconcile shares.
pub struct Context {
    /// Client of the meta-cluster.
    pub client: Client,
    /// Publishes Events on Clusters.
    pub recorder: Recorder,
    /// The operator's settings.
    pub config: Config,
    /// Clusters whose add-on step failed: it is retried with backoff, not on
    /// every reconcile (an unreachable business API would otherwise be dialled
    /// each time anything of the Cluster changes).
    pub addon_backoff: Backoff<addon_retry::Report>,
    /// How soon converging Clusters are looked at again (see [`Poll`]).
    pub polls: Poll,
    /// What the last applies returned, to skip unchanged ones.
    pub applied: Applied,
    /// Clusters that wait only for their add-on step's next attempt, which
    /// then needs no full pass (see [`crate::addon_retry`]).
    pub addon_waits: AddonWaits,
    /// Snapshot attempts under way, per namespace (see
    /// [`BACKUPS_PER_NAMESPACE`]).
    pub backup_slots: KeySlots,
    /// Clusters whose restore (or rebuild) from a snapshot was refused: the
    /// storage is asked again after a backoff, not on every wake-up.
    pub restore_backoff: Backoff<()>,
}

impl Context {
    /// A context with no failures recorded yet.
    pub fn new(client: Client, recorder: Recorder, config: Config) -> Self {
        let retry = config.addon_retry;
        Context {
            client,
            recorder,
            config,
            addon_backoff: Backoff::new(retry, retry.max(ADDON_RETRY_MAX)),
            polls: Poll::new(POLL_FIRST, POLL_MAX),
            applied: Applied::default(),
            addon_waits: AddonWaits::default(),
            backup_slots: KeySlots::new(BACKUPS_PER_NAMESPACE),
            restore_backoff: Backoff::new(RESTORE_RETRY_FIRST, RESTORE_RETRY_MAX),
        }
    }
}

/// The first wait after a refused restore; it doubles up to
/// [`RESTORE_RETRY_MAX`].
const RESTORE_RETRY_FIRST: Duration = Duration::from_secs(30);
const RESTORE_RETRY_MAX: Duration = Duration::from_secs(600);

/// What one pass of a Cluster has read and settled before its steps run,
/// handed to each step whole instead of part by part.
#[derive(Clone, Copy)]
pub struct Pass<'a> {
    pub ctx: &'a Context,
    pub cluster: &'a Cluster,
    pub names: &'a Names,
    /// The versions and images its spec asks for, resolved once.
    pub resolved: &'a Resolved,
    /// The Cluster's Secrets, as the PKI step left them.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// The Cluster's Services, as the pass read them.
    pub services: &'a BTreeMap<String, Service>,
    /// The Cluster's Deployments, as the pass read them.
    pub deployments: &'a BTreeMap<String, Deployment>,
    /// The Cluster's Pods: etcd members and control-plane replicas.
    pub pods: &'a [Pod],
}

/// The Cluster's objects of one kind, read within the operator's limits
/// (see [`crate::bounded`]).
pub(crate) async fn list<K>(ctx: &Context, api: &Api<K>, names: &Names) -> Result<Vec<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let params = ListParams::default().labels(&format!("{CLUSTER_LABEL}={}", names.cluster));
    Ok(crate::bounded::list(api, &names.namespace, &params, &ctx.config.limits).await?)
}

pub(crate) async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    apply_over(api, obj, None).await
}

/// [`apply`] with the live object when the caller has read it (see
/// [`crate::ownership::guard`]): an object another owner controls is not
/// written, and what the API server refuses is an [`Error::Rejected`].
pub(crate) async fn apply_over<K>(api: &Api<K>, obj: &K, live: Option<&K>) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    crate::ownership::guard(api, obj, live).await?;
    let name = obj.meta().name.clone().unwrap_or_default();
    let written = kok_common::apply::apply(api, MANAGER, &name, obj)
        .await
        .map_err(|e| match e {
            kok_common::Error::Api { source, .. } => Error::writing(&K::kind(&()), &name, source),
            other => Error::Common(other),
        })?;
    OwnWrites::global().record(&written);
    Ok(written)
}

/// Apply `desired` unless its live copy in `read` (the Cluster's objects of
/// its kind, by name) is still what its last apply returned (see
/// [`crate::applied`]); the live object, or what the apply returned.
pub(crate) async fn apply_if_changed<K>(
    ctx: &Context,
    names: &Names,
    api: &Api<K>,
    desired: &K,
    read: &BTreeMap<String, K>,
    version: Version<K>,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let key = names.key();
    let want = desired_hash(desired);
    let live = desired.meta().name.as_ref().and_then(|n| read.get(n));
    if let Some(live) = live
        && ctx.applied.unchanged(&key, want, live, version)
    {
        return Ok(live.clone());
    }
    let written = apply_over(api, desired, live).await?;
    ctx.applied.record(&key, want, &written, version);
    Ok(written)
}

fn secret_bytes<'a>(
    secrets: &'a BTreeMap<String, Secret>,
    names: &[String],
) -> Vec<(String, &'a [u8])> {
    let mut out = Vec::new();
    for name in names {
        if let Some(data) = secrets.get(name).and_then(|s| s.data.as_ref()) {
            for (k, v) in data {
                out.push((format!("{name}/{k}"), v.0.as_slice()));
            }
        }
    }
    out
}

pub(crate) fn hash_of(secrets: &BTreeMap<String, Secret>, names: &[String], extra: &str) -> String {
    let entries = secret_bytes(secrets, names);
    config_hash(
        entries
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .chain(std::iter::once(("spec", extra.as_bytes()))),
    )
}

pub(crate) async fn publish(
    ctx: &Context,
    cluster: &Cluster,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    publish_related(ctx, cluster, type_, reason, action, note, None).await;
}

/// [`publish`] with a related object (the Event's `related`). The recorder
/// counts Events of one reason and action as one series whatever their notes
/// say; Events about different related objects stay apart.
pub(crate) async fn publish_related(
    ctx: &Context,
    cluster: &Cluster,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    kok_common::events::publish(
        &ctx.recorder,
        &cluster.object_ref(&()),
        type_,
        reason,
        action,
        &note,
        related,
    )
    .await;
}
