//! Scheduled etcd snapshots: a controller of its own over the Clusters that
//! set `spec.etcd.backup`. It takes a snapshot when one is due (by the
//! schedule, or asked for with the `kubeonkube.io/backup-requested`
//! annotation), deletes what retention no longer keeps, and writes
//! `status.backup` and the `BackupReady` condition under its own field
//! manager, so the Cluster controller's passes never wait on a snapshot and
//! neither writes over the other.
//!
//! A failed attempt deletes nothing, says why in `BackupReady` and an Event,
//! and is tried again after a backoff (30 s, doubling, at most 10 min, never
//! sooner than the schedule asks).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kok_common::conditions::{self, Desired, Status};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{
    BACKUP_REQUEST_ANNOTATION, BackupSchedule, BackupStatus, EtcdBackup, SnapshotRecord,
};
use serde_json::json;
use time::OffsetDateTime;

use super::failure::Failure;
use super::{Manifest, SnapshotStore, StoreConfig, StoreError, pki};
use crate::Error;
use crate::context::{Context, publish};
use crate::etcd::api::EtcdClient;
use crate::names::Names;
use crate::render::snapshot_gateway::{Storage, backup_storage};

/// The condition this controller owns.
pub const BACKUP_READY: &str = "BackupReady";
/// Its field manager.
pub const MANAGER: &str = "kube-on-kube-operator-backup";
/// Snapshots listed in `status.backup.snapshots` at most.
const LISTED: usize = 50;
/// First wait after a failed attempt; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(600);
/// How often a Cluster whose etcd does not serve yet is looked at.
const WAIT_FOR_ETCD: Duration = Duration::from_secs(5);
/// The longest wait before a Cluster is looked at again (a cron schedule's
/// next time may be far; the spec changing wakes it sooner anyway).
const LONGEST_WAIT: Duration = Duration::from_secs(3600);
/// The longest one attempt may take, snapshot, upload and retention.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1800);
/// Snapshots taken at once, across Clusters: each streams a whole
/// database through the operator.
const AT_ONCE: u16 = 4;
/// etcd requests other than the snapshot stream.
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// How soon a Cluster whose namespace holds all its snapshot slots is
/// looked at again.
const SLOT_WAIT: Duration = Duration::from_secs(2);

/// When snapshots are due.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// At this interval after the last one; the first at once.
    Every(Duration),
    /// At the times of a cron expression (UTC).
    Cron(Box<Cron>),
}

impl Schedule {
    /// The schedule `spec` asks for; an interval below `min` is taken as
    /// `min`. `Err` says what is wrong with it.
    pub fn parse(spec: &BackupSchedule, min: Duration) -> Result<Schedule, String> {
        match (&spec.every, &spec.cron) {
            (Some(every), None) => kok_common::duration::parse(every)
                .map(|d| Schedule::Every(d.max(min)))
                .map_err(|e| format!("schedule.every {every:?}: {e}")),
            (None, Some(cron)) => CronParser::builder()
                .seconds(Seconds::Disallowed)
                .year(Year::Disallowed)
                .build()
                .parse(cron)
                .map(|c| Schedule::Cron(Box::new(c)))
                .map_err(|e| {
                    format!("schedule.cron {cron:?} is not a five-field cron expression: {e}")
                }),
            _ => Err("set exactly one of schedule.every or schedule.cron".into()),
        }
    }

    /// When the next snapshot is due: after the last one taken, or, before
    /// any, from `created` (a cron schedule's first time after it; an
    /// interval's at once).
    pub fn next_due(&self, last: Option<Timestamp>, created: Timestamp) -> Option<Timestamp> {
        match self {
            Schedule::Every(every) => Some(match last {
                Some(last) => last
                    .checked_add(SignedDuration::try_from(*every).ok()?)
                    .ok()?,
                None => created,
            }),
            Schedule::Cron(cron) => {
                let from = last
                    .unwrap_or(created)
                    .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
                cron.find_next_occurrence(&from, false)
                    .ok()
                    .map(|z| z.timestamp())
            }
        }
    }
}

/// The wait after `failures` failed attempts in a row.
pub fn retry_after(failures: u32) -> Duration {
    let doubled = RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(10));
    doubled.min(RETRY_MAX)
}

/// Which of `kept` (newest first) retention deletes: all after the first
/// `count`, and those taken more than `max_age` before `now`; never the
/// newest. A manifest whose time cannot be read is only counted.
pub fn expired(
    kept: &[Manifest],
    count: u32,
    max_age: Option<Duration>,
    now: Timestamp,
) -> Vec<usize> {
    let oldest = max_age
        .and_then(|age| SignedDuration::try_from(age).ok())
        .and_then(|age| now.checked_sub(age).ok());
    kept.iter()
        .enumerate()
        .skip(1)
        .filter(|(i, m)| {
            *i >= count as usize
                || oldest.is_some_and(|oldest| {
                    m.taken_at
                        .parse::<Timestamp>()
                        .is_ok_and(|taken| taken < oldest)
                })
        })
        .map(|(i, _)| i)
        .collect()
}

/// A snapshot stored, and what retention did after it.
struct Taken {
    manifest: Manifest,
    /// What is in storage now, newest first, when listing it worked.
    kept: Vec<Manifest>,
    deleted: usize,
    /// Retention could not finish: the snapshot is stored all the same.
    retention_error: Option<StoreError>,
}

/// Run the backup controller until the process stops.
pub async fn run(client: Client, namespace: Option<&str>, ctx: Arc<Context>) {
    let api: Api<Cluster> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    // Woken by what it answers to: the backup spec and the request
    // annotation (its own status writes wake nothing); the schedule by
    // requeues.
    let clusters = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            |c: &Cluster| {
                Some(kok_common::watch::hash(&(
                    serde_json::to_string(&c.spec.etcd.backup).unwrap_or_default(),
                    c.annotations().get(BACKUP_REQUEST_ANNOTATION),
                    c.metadata.deletion_timestamp.is_some(),
                )))
            },
            Default::default(),
        );
    let controller = Controller::for_stream(clusters, store)
        .with_config(kube::runtime::controller::Config::default().concurrency(AT_ONCE));
    kok_common::controller::run(
        "backup",
        controller,
        reconcile,
        |_, _, _| Action::requeue(RETRY_FIRST),
        ctx,
        Error::category,
    )
    .await;
}

/// One look at a Cluster's snapshots: take one if due, then say when the
/// next is.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let names = Names::new(&cluster, &ctx.config.meta_domain);
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let status = cluster.status.as_ref();
    let conditions: Vec<Condition> = status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .filter(|c| c.type_ == BACKUP_READY)
        .cloned()
        .collect();
    let Some(spec) = cluster.spec.etcd.backup.as_ref() else {
        // Backups turned off: what this controller wrote goes (an apply
        // without the fields gives them up).
        if !conditions.is_empty() || status.is_some_and(|s| s.backup.is_some()) {
            kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &json!({})).await?;
        }
        return Ok(Action::await_change());
    };
    let now = Timestamp::now();
    let mut state = status.and_then(|s| s.backup.clone()).unwrap_or_default();
    let asked = cluster
        .annotations()
        .get(BACKUP_REQUEST_ANNOTATION)
        .filter(|value| Some(*value) != state.last_request.as_ref())
        .cloned();
    let write = async |state: &BackupStatus, conditions: &[Condition]| {
        kok_common::apply::apply_status(
            &clusters,
            MANAGER,
            &names.cluster,
            &json!({"backup": state, "conditions": conditions}),
        )
        .await
        .map(|_| ())
    };
    // What the status says now: a pass that would write the same skips
    // the write (a Cluster waiting for etcd is looked at every few seconds).
    let written = (state.clone(), conditions.clone());
    let write_changed = async |state: &BackupStatus, conditions: &[Condition]| {
        if (state, conditions) == (&written.0, written.1.as_slice()) {
            return Ok(());
        }
        write(state, conditions).await
    };
    let generation = cluster.metadata.generation;
    let condition = |conditions: &mut Vec<Condition>, ok: bool, reason: &str, message: String| {
        conditions::set(
            conditions,
            Desired {
                type_: BACKUP_READY,
                status: Status::from(ok),
                reason,
                message,
            },
            generation,
            Timestamp::now(),
        );
    };

    let schedule = match Schedule::parse(&spec.schedule, ctx.config.policy.backup_min_interval) {
        Ok(schedule) => schedule,
        Err(message) => {
            let mut conditions = conditions;
            condition(&mut conditions, false, "InvalidSchedule", message);
            state.next_due = None;
            write(&state, &conditions).await?;
            return Ok(Action::await_change());
        }
    };
    let created = cluster
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let last = state.last_snapshot.as_ref().map(|s| s.taken_at.0);
    let scheduled = (!spec.suspend)
        .then(|| schedule.next_due(last, created))
        .flatten();
    // After a failure, not before its backoff is over.
    let retry_at = state
        .last_attempt
        .as_ref()
        .filter(|_| state.consecutive_failures > 0)
        .and_then(|t| {
            t.0.checked_add(SignedDuration::try_from(retry_after(state.consecutive_failures)).ok()?)
                .ok()
        });
    let due = scheduled.map(|at| retry_at.map_or(at, |retry| at.max(retry)));
    let is_due = due.is_some_and(|at| at <= now);
    // A request is answered no sooner than the operator's minimum interval
    // after the last attempt: asking again and again costs the storage and
    // etcd no more than the shortest schedule would.
    let answer_at = asked.as_ref().map(|_| {
        state
            .last_attempt
            .as_ref()
            .and_then(|t| {
                let min = SignedDuration::try_from(ctx.config.policy.backup_min_interval).ok()?;
                t.0.checked_add(min).ok()
            })
            .map_or(now, |at| at.max(now))
    });
    if let Some(at) = answer_at.filter(|at| *at > now)
        && !is_due
    {
        publish(
            &ctx,
            &cluster,
            EventType::Normal,
            "RequestDeferred",
            "Backup",
            format!(
                "the snapshot asked for is taken at {at}: the operator takes at most one per {:?} (--backup-min-interval)",
                ctx.config.policy.backup_min_interval
            ),
        )
        .await;
        return Ok(wait_until(Some(at), now));
    }
    if !is_due && asked.is_none() {
        let mut conditions = conditions;
        let first = conditions.is_empty();
        if first {
            let message = if spec.suspend {
                "scheduled snapshots are suspended".to_string()
            } else {
                "no snapshot taken yet".to_string()
            };
            condition(&mut conditions, false, "NoSnapshotYet", message);
        }
        if state.next_due.as_ref().map(|t| t.0) != due || first {
            state.next_due = due.map(Time);
            write(&state, &conditions).await?;
        }
        return Ok(wait_until(due, now));
    }

    // A cluster whose etcd has never served has nothing to snapshot yet;
    // one that served before and does not now is a failure worth telling.
    let etcd_ready =
        status.is_some_and(|s| kok_common::conditions::is_true(&s.conditions, "EtcdReady"));
    if !etcd_ready && state.last_snapshot.is_none() && state.last_attempt.is_none() {
        let mut conditions = conditions;
        condition(
            &mut conditions,
            false,
            "WaitingForEtcd",
            "the first snapshot is taken once etcd serves".into(),
        );
        state.next_due = due.map(Time);
        write_changed(&state, &conditions).await?;
        return Ok(Action::requeue(WAIT_FOR_ETCD));
    }

    // A claim's gateway that is still starting is no failed attempt: the
    // snapshot waits for it (a claim that is missing or not allowed fails
    // the attempt below, with its reason).
    if let Some(claim) = backup_storage(&names, spec).and_then(|s| s.claim)
        && let Err(waiting) = super::gateway::usable(&ctx, &names, &claim).await
        && waiting.reason == super::gateway::WAITING
    {
        let mut conditions = conditions;
        condition(&mut conditions, false, &waiting.reason, waiting.message);
        state.next_due = due.map(Time);
        write_changed(&state, &conditions).await?;
        return Ok(Action::requeue(WAIT_FOR_ETCD));
    }

    // At most a share of the attempts at once are one namespace's.
    let Some(_slot) = ctx.backup_slots.try_take(&names.namespace) else {
        return Ok(Action::requeue(SLOT_WAIT));
    };
    let started = std::time::Instant::now();
    state.last_attempt = Some(Time(now));
    let answers = Answers {
        request: asked.as_deref(),
        due: if asked.is_none() { due } else { None },
        last: state.last_snapshot.as_ref().map(|s| s.name.as_str()),
    };
    let outcome = match tokio::time::timeout(
        ATTEMPT_TIMEOUT,
        attempt(&ctx, &cluster, &names, spec, &answers),
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(_) => Err(Failure::new(
            "BackupTimeout",
            format!("the snapshot took longer than {ATTEMPT_TIMEOUT:?}"),
        )),
    };
    let took = started.elapsed();
    if let Some(asked) = asked {
        state.last_request = Some(asked);
    }
    let mut conditions = conditions;
    let metrics = crate::metrics::domain();
    match outcome {
        Ok(taken) => {
            let record = record_of(&taken.manifest);
            state.consecutive_failures = 0;
            if !taken.kept.is_empty() {
                state.snapshots = taken.kept.iter().take(LISTED).map(record_of).collect();
            }
            let note = format!(
                "snapshot {} stored: {} bytes, revision {}, from {} in {:.1}s; {} kept, {} deleted",
                record.name,
                record.size,
                record.revision,
                taken.manifest.member,
                took.as_secs_f64(),
                taken.kept.len(),
                taken.deleted,
            );
            metrics.backup_taken(&names.namespace, &names.cluster, record.taken_at.0, took);
            state.last_snapshot = Some(record);
            match &taken.retention_error {
                None => condition(&mut conditions, true, "SnapshotTaken", note.clone()),
                Some(e) => condition(
                    &mut conditions,
                    false,
                    "RetentionFailed",
                    format!("{note}; deleting old snapshots failed: {e}"),
                ),
            }
            publish(
                &ctx,
                &cluster,
                EventType::Normal,
                "SnapshotTaken",
                "Backup",
                note,
            )
            .await;
        }
        Err(failure) => {
            state.consecutive_failures = state.consecutive_failures.saturating_add(1);
            metrics.backup_failed(&names.namespace, &names.cluster, &failure.reason);
            tracing::warn!(
                cluster = %names.cluster,
                reason = %failure.reason,
                message = %failure.message,
                "etcd snapshot failed"
            );
            publish(
                &ctx,
                &cluster,
                EventType::Warning,
                &failure.reason,
                "Backup",
                failure.message.clone(),
            )
            .await;
            condition(&mut conditions, false, &failure.reason, failure.message);
        }
    }
    let last = state.last_snapshot.as_ref().map(|s| s.taken_at.0);
    let scheduled = (!spec.suspend)
        .then(|| schedule.next_due(last, created))
        .flatten();
    let retry = (state.consecutive_failures > 0)
        .then(|| {
            now.checked_add(SignedDuration::try_from(retry_after(state.consecutive_failures)).ok()?)
                .ok()
        })
        .flatten();
    let due = match (scheduled, retry) {
        (Some(at), Some(retry)) => Some(at.max(retry)),
        (at, _) => at,
    };
    state.next_due = due.map(Time);
    write(&state, &conditions).await?;
    Ok(wait_until(due, Timestamp::now()))
}

/// The requeue for a snapshot due at `due` (none: until the spec changes,
/// looked at hourly all the same). One already due (an attempt that took
/// longer than the interval) is looked at again at once, not in an hour.
fn wait_until(due: Option<Timestamp>, now: Timestamp) -> Action {
    let wait = due.map_or(LONGEST_WAIT, |at| {
        Duration::try_from(now.duration_until(at)).unwrap_or(Duration::ZERO)
    });
    Action::requeue(wait.clamp(Duration::from_secs(1), LONGEST_WAIT))
}

fn record_of(m: &Manifest) -> SnapshotRecord {
    SnapshotRecord {
        name: m.name.clone(),
        taken_at: Time(m.taken_at.parse().unwrap_or(Timestamp::UNIX_EPOCH)),
        revision: m.etcd_revision,
        size: m.size,
        kubernetes_version: m.kubernetes_version.clone(),
    }
}

/// Reads `key` of Secret `name`, as text.
async fn secret_field(
    secrets: &Api<Secret>,
    name: &str,
    keys: &[&str],
    missing_reason: &str,
) -> Result<Vec<String>, Failure> {
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| Failure::new("BackupFailed", format!("reading Secret {name}: {e}")))?
        .ok_or_else(|| Failure::new(missing_reason, format!("Secret {name} does not exist")))?;
    let data = secret.data.unwrap_or_default();
    keys.iter()
        .map(|key| {
            let value = data.get(*key).ok_or_else(|| {
                Failure::new(missing_reason, format!("Secret {name} has no key {key}"))
            })?;
            String::from_utf8(value.0.clone())
                .map(|v| v.trim().to_string())
                .map_err(|_| {
                    Failure::new(
                        missing_reason,
                        format!("Secret {name} key {key} is not text"),
                    )
                })
        })
        .collect()
}

/// The storage `storage` names, with its Secrets from the Cluster's
/// namespace: S3 storage the operator's `--backup-endpoints` allows, or the
/// snapshot gateway on a claim once it serves.
async fn store_config(
    ctx: &Context,
    names: &Names,
    storage: &Storage,
) -> Result<StoreConfig, Failure> {
    let s3 = &storage.s3;
    if let Some(claim) = &storage.claim {
        super::gateway::usable(ctx, names, claim).await?;
    } else if !crate::policy::backup_endpoint_allowed(&ctx.config.policy, &s3.endpoint) {
        return Err(Failure::new(
            "EndpointNotAllowed",
            format!(
                "the operator's --backup-endpoints does not list {}: ask the meta-cluster's admin to allow it",
                s3.endpoint
            ),
        ));
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let credentials = secret_field(
        &secrets,
        &s3.credentials_secret,
        &["accessKeyID", "secretAccessKey"],
        "CredentialsMissing",
    )
    .await?;
    let ca_pem = match &s3.ca_secret {
        Some(name) => Some(
            secret_field(&secrets, name, &["ca.crt"], "CAMissing")
                .await?
                .remove(0),
        ),
        None => None,
    };
    let prefix = s3
        .prefix
        .clone()
        .unwrap_or_else(|| format!("{}/{}", names.namespace, names.cluster));
    let mut config = StoreConfig::new(
        s3.endpoint.clone(),
        s3.bucket.clone(),
        prefix,
        credentials[0].clone(),
        credentials[1].clone(),
    );
    if let Some(region) = &s3.region {
        config.region = region.clone();
    }
    config.ca_pem = ca_pem;
    config.allow_http = s3.endpoint.starts_with("http://");
    // A scheduled attempt is retried by the schedule: a store that does not
    // answer is said so soon, not after minutes of retries.
    config.max_retries = 1;
    config.retry_timeout = Duration::from_secs(20);
    Ok(config)
}

/// The store `storage` (from the spec's `field`) stands for, ready to use.
pub(super) async fn open_store(
    ctx: &Context,
    names: &Names,
    storage: Option<Storage>,
    field: &str,
) -> Result<SnapshotStore, Failure> {
    let storage = storage.ok_or_else(|| {
        Failure::new(
            "NoDestination",
            format!("set one of {field}.s3 or {field}.pvc"),
        )
    })?;
    let config = store_config(ctx, names, &storage).await?;
    SnapshotStore::new(&config).map_err(|e| Failure::categorized(e.category(), e.to_string()))
}

/// The Cluster's identity Secrets and the user's key to seal them with.
async fn identity(
    secrets: &Api<Secret>,
    names: &Names,
    spec: &EtcdBackup,
) -> Result<(pki::Bundle, pki::Key), Failure> {
    let key = read_key(secrets, &spec.encryption_key_secret).await?;
    let mut roles = BTreeMap::new();
    for role in pki::ROLES.into_iter().chain(pki::OPTIONAL_ROLES) {
        let secret_name = names.cert_secret(role);
        let secret = secrets.get_opt(&secret_name).await.map_err(|e| {
            Failure::new("BackupFailed", format!("reading Secret {secret_name}: {e}"))
        })?;
        if let Some(data) = secret.and_then(|s| s.data) {
            roles.insert(role.to_string(), data);
        }
    }
    let bundle = pki::Bundle::new(roles).map_err(|e| Failure::new("PKIMissing", e.to_string()))?;
    Ok((bundle, key))
}

/// The sealing key in Secret `name`.
pub(super) async fn read_key(secrets: &Api<Secret>, name: &str) -> Result<pki::Key, Failure> {
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| Failure::new("BackupFailed", format!("reading Secret {name}: {e}")))?
        .ok_or_else(|| {
            Failure::new(
                "EncryptionKeyMissing",
                format!("Secret {name} does not exist"),
            )
        })?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(pki::KEY_FIELD))
        .ok_or_else(|| {
            Failure::new(
                "EncryptionKeyMissing",
                format!("Secret {name} has no key {}", pki::KEY_FIELD),
            )
        })?;
    pki::Key::from_secret_value(&value.0).map_err(|e| {
        Failure::new(
            "EncryptionKeyInvalid",
            format!("Secret {name}, key {:?}: {e}", pki::KEY_FIELD),
        )
    })
}

/// What one attempt answers: a request, or the schedule.
struct Answers<'a> {
    /// The request annotation's value not answered yet.
    request: Option<&'a str>,
    /// When the scheduled snapshot came due (none for a request).
    due: Option<Timestamp>,
    /// The last snapshot the status records.
    last: Option<&'a str>,
}

/// A snapshot already stored that answers this attempt: one taken for its
/// request or, for the schedule, one taken once it came due and after the
/// last one the status records. It is there when the operator stopped
/// after storing a snapshot and before recording it; taking another would
/// store the same snapshot twice.
fn stored_answer<'m>(listed: &'m [Manifest], answers: &Answers<'_>) -> Option<&'m Manifest> {
    if let Some(request) = answers.request {
        return listed
            .iter()
            .find(|m| m.request.as_deref() == Some(request));
    }
    let due = answers.due?;
    let newest = listed.first()?;
    let taken_at: Timestamp = newest.taken_at.parse().ok()?;
    (taken_at >= due && answers.last.is_none_or(|last| newest.name.as_str() > last))
        .then_some(newest)
}

/// Take a snapshot of `cluster`'s etcd into its storage (unless one stored
/// already answers, see [`stored_answer`]), remove what uploads cut short
/// left, then apply retention.
async fn attempt(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    spec: &EtcdBackup,
    answers: &Answers<'_>,
) -> Result<Taken, Failure> {
    // Written only under the Cluster's own namespace in shared storage
    // (a claim is the namespace's own).
    let storage = backup_storage(names, spec);
    if let Some(prefix) = storage
        .as_ref()
        .filter(|s| s.claim.is_none())
        .and_then(|s| s.s3.prefix.as_deref())
        && let Some(why) =
            crate::policy::backup_prefix_refused(&ctx.config.policy, &names.namespace, prefix)
    {
        return Err(Failure::new("PrefixNotAllowed", why));
    }
    let store = open_store(ctx, names, storage, "etcd.backup").await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let client_secret = names.cert_secret("operator-etcd-client");
    let secret = secrets
        .get_opt(&client_secret)
        .await
        .map_err(|e| {
            Failure::new(
                "BackupFailed",
                format!("reading Secret {client_secret}: {e}"),
            )
        })?
        .ok_or_else(|| {
            Failure::new(
                "WaitingForEtcd",
                format!("the operator's etcd client Secret {client_secret} does not exist yet"),
            )
        })?;
    let endpoints = crate::render::control_plane::etcd_client_urls(cluster, names);
    let etcd = EtcdClient::from_secret(endpoints, &secret, ETCD_TIMEOUT)
        .map_err(|e| Failure::new("BackupFailed", format!("etcd client: {e}")))?;
    let (bundle, key) = identity(&secrets, names, spec).await?;
    let stored = store
        .list()
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))?;
    // What is stored after this attempt, newest first: the listing made
    // before it, with the new snapshot in front (no second listing).
    let answer = stored_answer(&stored, answers).cloned();
    let mut listed = stored;
    let manifest = match answer {
        Some(m) => {
            tracing::info!(snapshot = %m.name, "a snapshot stored before answers this attempt; none taken");
            m
        }
        None => super::take(
            &etcd,
            &store,
            Some(&cluster.spec.version),
            Some((&bundle, &key)),
            answers.request,
            after_the_newest(&listed, OffsetDateTime::now_utc()).await,
        )
        .await
        .map_err(|e| Failure::categorized(e.category(), e.to_string()))
        .inspect(|m| listed.insert(0, m.clone()))?,
    };
    let retention = &spec.retention;
    let max_age = retention
        .max_age
        .as_deref()
        .and_then(|age| kok_common::duration::parse(age).ok());
    let mut taken = Taken {
        manifest,
        kept: Vec::new(),
        deleted: 0,
        retention_error: None,
    };
    match store.remove_abandoned(&taken.manifest.name).await {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(objects = ?removed, "removed what uploads cut short left");
        }
        Ok(_) => {}
        Err(e) => {
            taken.retention_error = Some(e);
            return Ok(taken);
        }
    }
    let doomed = expired(&listed, retention.count, max_age, Timestamp::now());
    for (i, m) in listed.into_iter().enumerate() {
        if !doomed.contains(&i) {
            taken.kept.push(m);
            continue;
        }
        if taken.retention_error.is_some() {
            taken.kept.push(m);
            continue;
        }
        match store.delete(&m).await {
            Ok(()) => taken.deleted += 1,
            Err(e) => {
                taken.retention_error = Some(e);
                taken.kept.push(m);
            }
        }
    }
    Ok(taken)
}

/// `now`, or the start of the next second when the newest stored snapshot
/// was taken in this very second (after a short wait until then). Names are
/// to the second: two snapshots of an unchanged etcd asked for within one
/// second would otherwise have the same name, and the second be refused as
/// existing.
async fn after_the_newest(listed: &[Manifest], now: OffsetDateTime) -> OffsetDateTime {
    if listed
        .first()
        .is_none_or(|m| m.taken_at != super::manifest::rfc3339(now))
    {
        return now;
    }
    let next = now.replace_nanosecond(0).unwrap_or(now) + time::Duration::SECOND;
    let wait = (next - now).max(time::Duration::ZERO);
    tokio::time::sleep(wait.unsigned_abs()).await;
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn manifest(taken_at: &str) -> Manifest {
        Manifest {
            format: 1,
            name: taken_at.into(),
            object: format!("{taken_at}.db"),
            size: 1,
            sha256: "0".repeat(64),
            etcd_revision: 1,
            etcd_version: "3.6.16".into(),
            kubernetes_version: None,
            taken_at: taken_at.into(),
            member: "https://m0:2379".into(),
            pki: None,
            request: None,
        }
    }

    /// Two requests within one second of an unchanged etcd get two names.
    #[tokio::test]
    async fn a_snapshot_in_the_second_of_the_newest_waits_for_the_next() {
        let at = |s: &str| {
            OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
        };
        let now = at("2026-11-27T11:00:05.400Z");
        let newest = [manifest("2026-11-27T11:00:05Z")];
        assert_eq!(
            after_the_newest(&newest, now).await,
            at("2026-11-27T11:00:06Z")
        );
        let older = [manifest("2026-11-27T11:00:04Z")];
        assert_eq!(after_the_newest(&older, now).await, now);
        assert_eq!(after_the_newest(&[], now).await, now);
    }

    /// A snapshot stored just before the operator stopped (its status never
    /// written) answers the attempt after the restart: no second one.
    #[test]
    fn a_snapshot_stored_before_a_restart_answers_the_same_request_or_due_time() {
        let older = manifest("2026-11-27T10:00:00Z");
        let newest = Manifest {
            request: Some("r1".into()),
            ..manifest("2026-11-27T11:00:05Z")
        };
        let listed = [newest.clone(), older.clone()];
        let answers = |request, due: Option<&str>, last| Answers {
            request,
            due: due.map(ts),
            last,
        };
        // The same request: answered by the one taken for it.
        let a = answers(Some("r1"), None, Some(older.name.as_str()));
        assert_eq!(stored_answer(&listed, &a), Some(&newest));
        // Another request: a new snapshot.
        let a = answers(Some("r2"), None, Some(newest.name.as_str()));
        assert_eq!(stored_answer(&listed, &a), None);
        // The schedule, due at 11:00, the status still at 10:00: answered.
        let a = answers(
            None,
            Some("2026-11-27T11:00:00Z"),
            Some(older.name.as_str()),
        );
        assert_eq!(stored_answer(&listed, &a), Some(&newest));
        // Due after the newest was taken, or the status already records it:
        // a new snapshot.
        let a = answers(
            None,
            Some("2026-11-27T12:00:00Z"),
            Some(older.name.as_str()),
        );
        assert_eq!(stored_answer(&listed, &a), None);
        let a = answers(
            None,
            Some("2026-11-27T11:00:00Z"),
            Some(newest.name.as_str()),
        );
        assert_eq!(stored_answer(&listed, &a), None);
        // Nothing stored yet.
        assert_eq!(stored_answer(&[], &answers(Some("r1"), None, None)), None);
    }

    fn every(s: &str) -> BackupSchedule {
        BackupSchedule {
            every: Some(s.into()),
            cron: None,
        }
    }

    fn cron(s: &str) -> BackupSchedule {
        BackupSchedule {
            every: None,
            cron: Some(s.into()),
        }
    }

    #[test]
    fn an_interval_counts_from_the_last_snapshot_and_the_first_is_at_once() {
        let s = Schedule::parse(&every("1h"), Duration::from_secs(60)).unwrap();
        let created = ts("2026-11-27T10:00:00Z");
        assert_eq!(s.next_due(None, created), Some(created));
        assert_eq!(
            s.next_due(Some(ts("2026-11-27T10:20:00Z")), created),
            Some(ts("2026-11-27T11:20:00Z"))
        );
    }

    #[test]
    fn an_interval_below_the_operators_minimum_is_the_minimum() {
        let s = Schedule::parse(&every("1s"), Duration::from_secs(300)).unwrap();
        assert_eq!(
            s.next_due(Some(ts("2026-11-27T10:00:00Z")), ts("2026-11-27T09:00:00Z")),
            Some(ts("2026-11-27T10:05:00Z"))
        );
    }

    #[test]
    fn a_cron_schedule_is_due_at_its_next_time_after_the_last_snapshot() {
        let s = Schedule::parse(&cron("0 */6 * * *"), Duration::ZERO).unwrap();
        let created = ts("2026-11-27T01:30:00Z");
        assert_eq!(s.next_due(None, created), Some(ts("2026-11-27T06:00:00Z")));
        assert_eq!(
            s.next_due(Some(ts("2026-11-27T06:00:04Z")), created),
            Some(ts("2026-11-27T12:00:00Z"))
        );
    }

    #[test]
    fn a_schedule_that_is_not_one_says_why() {
        for bad in [cron("every day"), cron("* * * * * *"), every("soon")] {
            let e = Schedule::parse(&bad, Duration::ZERO).unwrap_err();
            assert!(e.contains("schedule."), "{e}");
        }
        let both = BackupSchedule {
            every: Some("1h".into()),
            cron: Some("0 * * * *".into()),
        };
        assert!(Schedule::parse(&both, Duration::ZERO).is_err());
    }

    #[test]
    fn retention_keeps_the_newest_count_and_drops_the_too_old_but_never_the_newest() {
        let kept: Vec<Manifest> = [
            "2026-11-27T10:00:00Z",
            "2026-11-27T09:00:00Z",
            "2026-11-27T08:00:00Z",
            "2026-11-20T08:00:00Z",
        ]
        .into_iter()
        .map(manifest)
        .collect();
        let now = ts("2026-11-27T10:00:01Z");
        assert_eq!(expired(&kept, 2, None, now), vec![2, 3]);
        assert_eq!(expired(&kept, 10, None, now), Vec::<usize>::new());
        let day = Some(Duration::from_secs(24 * 3600));
        assert_eq!(expired(&kept, 10, day, now), vec![3]);
        // Everything too old: the newest stays all the same.
        let later = ts("2026-12-30T00:00:00Z");
        assert_eq!(expired(&kept, 10, day, later), vec![1, 2, 3]);
    }

    #[test]
    fn a_snapshot_already_due_is_looked_at_again_at_once() {
        // An attempt that outlasts the interval ends with the next one due.
        let now = ts("2026-01-01T00:00:10Z");
        let requeue = |due: Option<&str>| wait_until(due.map(ts), now);
        assert_eq!(
            requeue(Some("2026-01-01T00:00:04Z")),
            Action::requeue(Duration::from_secs(1))
        );
        assert_eq!(
            requeue(Some("2026-01-01T00:00:40Z")),
            Action::requeue(Duration::from_secs(30))
        );
        assert_eq!(requeue(None), Action::requeue(LONGEST_WAIT));
    }

    #[test]
    fn failures_back_off_doubling_to_ten_minutes() {
        assert_eq!(retry_after(1), Duration::from_secs(30));
        assert_eq!(retry_after(2), Duration::from_secs(60));
        assert_eq!(retry_after(5), Duration::from_secs(480));
        assert_eq!(retry_after(6), RETRY_MAX);
        assert_eq!(retry_after(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn a_category_is_a_reason() {
        assert_eq!(
            Failure::categorized("backup-denied", "x").reason,
            "BackupDenied"
        );
        assert_eq!(
            Failure::categorized("snapshot-interrupted", "x").reason,
            "SnapshotInterrupted"
        );
    }
}
