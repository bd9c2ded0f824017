//! The etcd step of the Cluster reconcile: observe etcd's member list (over
//! mutual TLS with the operator's etcd client certificate, through each
//! member's Service name), the member Pods and claims; ask the membership
//! planner for the one next change; record it in the Cluster's status before
//! carrying it out; and report members, health and the running version.
//!
//! The operator reaches members by their Service DNS names, so it must run in
//! the meta-cluster (as it does in production). Where it cannot reach them
//! (run from outside, or with simulated Pods) it still bootstraps the
//! members and reports their Pods, but makes no membership change.

pub mod api;
pub mod health;
pub mod membership;
pub mod spread;
pub mod stranded;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodCondition, Secret,
    Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kok_common::watch::OwnWrites;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::EtcdMemberStatus;
use serde_json::json;

use self::api::{EtcdClient, EtcdError, Member, Status};
pub use self::health::Health;
use self::membership::{ClaimState, ClusterState, Observed, PodState, Slot, Step};
use self::stranded::Home;
use crate::Error;
use crate::applied::resource_version;
use crate::config::Config;
use crate::context::{Context, Pass, apply_if_changed, hash_of, list, publish};
use crate::names::Names;
use crate::render::CONFIG_HASH_ANNOTATION;
use crate::render::etcd::{self as render, MemberPod};
use crate::versions::{Resolved, check_etcd_version_change};

/// Field manager of the recorded change (`status.etcdChange`), apart from the
/// one of the rest of the status, so each write leaves the other's fields be.
pub const RECORD_MANAGER: &str = "kube-on-kube-operator-etcd";

/// How long one request to one member may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// A member Pod that has restarted this often and has not been ready for
/// the operator's `--etcd-failed-after` ([`Config::etcd_failed_after`]) is
/// judged failed, and its member replaced.
pub const FAILED_RESTARTS: i32 = 5;

/// Slots looked at: the most members any mode asks for.
pub const MAX_MEMBERS: usize = 3;

/// How long a member restarted by a roll must have been ready before the
/// next member restarts. kube-apiserver's etcd client retries a member it
/// lost after 1 s, then 1.6 times longer after each failure (±20 %); a
/// member's restart keeps it away about 10 s (etcd gives its watch streams
/// 7 s to end), so the client may next try it up to ~8 s after it is back.
/// Until then the member serves etcd but not that client, and restarting
/// another member would leave the client one of three, or none when its
/// retry of the third is also pending: its requests then hang.
pub const ROLL_SETTLE: Duration = Duration::from_secs(15);

/// The version and image the members are to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub version: String,
    pub image: String,
    /// Why the version the Cluster asks for was refused; the members keep
    /// `version` and `image`, the ones they run.
    pub refused: Option<String>,
}

/// The version and image the members are to run: the ones the Cluster asks
/// for, unless moving there from `settled` (the version every member ran
/// when etcd last settled) skips or goes back a minor version; then the ones
/// the members run.
pub fn target(resolved: &Resolved, config: &Config, settled: Option<&str>, pods: &[Pod]) -> Target {
    let version = resolved.etcd.version.clone();
    let refused = settled.and_then(|from| {
        check_etcd_version_change(from, &version)
            .err()
            .map(|e| (from, e))
    });
    match refused {
        None => Target {
            image: resolved.etcd.image.clone(),
            version,
            refused: None,
        },
        Some((from, reason)) => {
            let running = pods
                .iter()
                .filter(|p| annotation(p, render::VERSION_ANNOTATION) == Some(from))
                .find_map(|p| p.spec.as_ref()?.containers.first()?.image.clone());
            Target {
                image: running.unwrap_or_else(|| format!("{}/etcd:{from}-0", config.registry)),
                version: from.to_string(),
                refused: Some(reason),
            }
        }
    }
}

/// What the etcd step saw and did, for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Members as etcd lists them (or, when etcd cannot be reached, as their
    /// Pods show them).
    pub members: Vec<EtcdMemberStatus>,
    pub desired: i32,
    /// Members serving: healthy voters (or ready Pods when unreachable).
    pub ready: i32,
    /// The version every serving member runs; `None` while versions differ.
    pub version: Option<String>,
    /// EtcdReady.
    pub condition: Health,
    /// EtcdSpread: whether the member Pods require a node each.
    pub spread: Health,
    /// True when every wanted member is a healthy voter at the desired
    /// version and template and no change is under way: see [`settled`].
    pub settled: bool,
    /// The member Pods after this step.
    pub pods: Vec<Pod>,
    /// When to look again while a membership change or roll is under way;
    /// `None` otherwise (the Cluster's own poll covers an unsettled etcd).
    pub requeue: Option<Duration>,
}

/// Whether etcd is fully rolled to the desired version and template, every
/// wanted member is a healthy voter and no membership change is under way.
/// The control-plane upgrade waits for this before rolling kube-apiserver.
pub fn settled(report: &Report) -> bool {
    report.settled
}

/// Restarts of a Pod's containers, all together.
pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// Whether a member Pod is [`PodState::Ready`]: Ready, not finished and not
/// going away. No threshold changes that.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !finished(pod)
        && ready_condition(pod).is_some_and(|c| c.status == kok_common::conditions::Status::True)
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

/// The planner's view of a member Pod: one that has restarted
/// [`FAILED_RESTARTS`] times and has not been ready for `failed_after` is
/// failed.
pub fn pod_state(pod: Option<&Pod>, now: Timestamp, failed_after: Duration) -> PodState {
    let Some(pod) = pod else {
        return PodState::Absent;
    };
    if pod_ready(pod) {
        return PodState::Ready;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Terminating;
    }
    if finished(pod) {
        return PodState::Failed;
    }
    let ready = ready_condition(pod);
    let restarts = restarts(pod);
    let since = ready
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let long = since.is_some_and(|t| {
        u64::try_from(now.as_second() - t.as_second())
            .is_ok_and(|down| down >= failed_after.as_secs())
    });
    if restarts >= FAILED_RESTARTS && long {
        PodState::Failed
    } else {
        PodState::NotReady
    }
}

fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
}

/// Whether a ready member Pod became ready less than [`ROLL_SETTLE`] ago.
pub fn settling(pod: Option<&Pod>, now: Timestamp) -> bool {
    pod.and_then(ready_condition)
        .filter(|c| c.status == kok_common::conditions::Status::True)
        .and_then(|c| c.last_transition_time.as_ref())
        .is_some_and(|t| now.as_second() - t.0.as_second() < ROLL_SETTLE.as_secs() as i64)
}

/// The planner's view of a member's data. Without claims the data lives in
/// the Pod (emptyDir, or a node directory the next Pod may not land on): it
/// is there exactly while the Pod is; [`slots`] adds that a hostPath member
/// pinned to its node keeps it past its Pod.
pub fn claim_state(
    uses_claims: bool,
    claim: Option<&PersistentVolumeClaim>,
    pod: PodState,
) -> ClaimState {
    if !uses_claims {
        return if pod == PodState::Absent {
            ClaimState::Absent
        } else {
            ClaimState::Present
        };
    }
    match claim {
        None => ClaimState::Absent,
        Some(c) if c.metadata.deletion_timestamp.is_some() => ClaimState::Terminating,
        Some(_) => ClaimState::Present,
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The slot index of a member Pod or claim by its name.
fn index_of(names: &Names, name: &str) -> Option<usize> {
    (0..MAX_MEMBERS).find(|&i| names.etcd_member(i) == name)
}

/// Everything observed about one member slot.
#[derive(Debug, Clone, Default)]
pub struct SlotView<'a> {
    pub pod: Option<&'a Pod>,
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The config hash a Pod of this slot must carry now.
    pub hash: String,
    /// A hostPath member pinned to the node that holds its data: its data
    /// outlives its Pod, as a claim's does.
    pub pinned: bool,
    /// The Pod was restarted by a version roll that is not over.
    pub rolled: bool,
    /// Its data is kept on a node that is gone or takes no more of the
    /// Cluster's Pods ([`stranded`]).
    pub stranded: bool,
}

/// The planner's slots from what was observed.
pub fn slots(
    names: &Names,
    views: &[SlotView<'_>],
    uses_claims: bool,
    now: Timestamp,
    failed_after: Duration,
) -> Vec<Slot> {
    views
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let pod = pod_state(v.pod, now, failed_after);
            let outdated = v
                .pod
                .is_some_and(|p| annotation(p, CONFIG_HASH_ANNOTATION) != Some(v.hash.as_str()));
            let claim = match claim_state(uses_claims, v.claim, pod) {
                ClaimState::Absent if v.pinned => ClaimState::Present,
                ClaimState::Present if v.stranded && pod != PodState::Ready => ClaimState::Stranded,
                claim => claim,
            };
            Slot::new(names, index, pod, claim)
                .outdated(outdated)
                .settling(pod == PodState::Ready && settling(v.pod, now))
                .rolled(v.rolled)
        })
        .collect()
}

/// Whether `pod` was made by a version roll that is not over: it runs
/// another version than `settled`, the one every member ran when etcd last
/// settled (the status keeps it until the roll is over).
pub fn rolled(pod: Option<&Pod>, settled: Option<&str>) -> bool {
    match (
        pod.and_then(|p| annotation(p, render::VERSION_ANNOTATION)),
        settled,
    ) {
        (Some(runs), Some(settled)) => runs != settled,
        _ => false,
    }
}

/// A member's health as its own endpoint reports it.
fn healthy(status: Option<&Status>) -> bool {
    status.is_some_and(|s| s.leader != 0 && s.errors.is_empty())
}

/// Member statuses from the live list and each member's own answer.
pub fn member_statuses(
    slots: &[Slot],
    live: &[Member],
    answers: &BTreeMap<u64, Status>,
) -> Vec<EtcdMemberStatus> {
    let mut out: Vec<EtcdMemberStatus> = live
        .iter()
        .map(|m| {
            let slot = slots.iter().find(|s| m.peer_urls.contains(&s.peer_url));
            EtcdMemberStatus {
                name: if m.name.is_empty() {
                    slot.map(|s| s.name.clone()).unwrap_or_default()
                } else {
                    m.name.clone()
                },
                id: Some(format!("{:x}", m.id)),
                peer_url: m.peer_urls.first().cloned().unwrap_or_default(),
                healthy: healthy(answers.get(&m.id)),
                learner: m.is_learner,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The one version every healthy member reports, if they agree.
pub fn running_version(answers: &BTreeMap<u64, Status>) -> Option<String> {
    let mut versions = answers
        .values()
        .filter(|s| healthy(Some(s)))
        .map(|s| s.version.as_str());
    let first = versions.next()?;
    versions.all(|v| v == first).then(|| first.to_string())
}

/// EtcdReady and whether etcd is settled, from the plan and the members.
pub fn health(
    desired: usize,
    step: &Step,
    statuses: &[EtcdMemberStatus],
    version: Option<&str>,
    desired_version: &str,
) -> (Health, bool) {
    let voters = statuses.iter().filter(|m| !m.learner).count();
    let serving = statuses.iter().filter(|m| !m.learner && m.healthy).count();
    let all_serving = serving == voters && voters == desired && statuses.len() == desired;
    let settled = *step == Step::Done && all_serving && version == Some(desired_version);
    let summary = format!("{serving} of {desired} etcd members healthy");
    let (ready, reason, message) = match step {
        Step::Done if all_serving => match version {
            Some(v) if v == desired_version => {
                (true, "MembersHealthy", format!("{summary}, version {v}"))
            }
            Some(v) => (
                true,
                "MembersHealthy",
                format!("{summary}, version {v} (want {desired_version})"),
            ),
            None => (
                true,
                "MembersHealthy",
                format!("{summary}, versions differ"),
            ),
        },
        Step::Done => (false, "MembersNotReady", summary),
        Step::Bootstrap { .. } => (
            false,
            "Bootstrapping",
            format!("creating {desired} etcd members"),
        ),
        Step::RollMember { .. } => (
            serving > desired / 2 && serving > 0,
            "Upgrading",
            format!("{summary}; restarting members one at a time onto version {desired_version}"),
        ),
        Step::Wait { reason } => (
            serving > desired / 2 && serving > 0 && serving == voters,
            "Waiting",
            format!("{summary}; {reason}"),
        ),
        Step::RollFailed { reason, .. } => (
            serving > desired / 2 && serving > 0,
            ROLL_FAILED,
            format!("{summary}; {reason}"),
        ),
        change => (
            serving > desired / 2 && serving > 0,
            "MembershipChanging",
            format!("{summary}; membership change under way: {}", change.kind()),
        ),
    };
    (
        Health {
            ready,
            reason,
            message,
        },
        settled,
    )
}

/// Health from the Pods alone, when no member answers the operator.
pub fn health_from_pods(desired: usize, step: &Step, slots: &[Slot]) -> (Health, bool, i32) {
    let wanted = &slots[..desired.min(slots.len())];
    let ready = wanted.iter().filter(|s| s.pod == PodState::Ready).count();
    let surplus = slots[desired.min(slots.len())..]
        .iter()
        .any(|s| s.pod != PodState::Absent);
    let all = ready == desired && !surplus;
    let settled = all && wanted.iter().all(|s| !s.outdated);
    let health = if all {
        Health {
            ready: true,
            reason: "PodsReady",
            message: format!(
                "{ready} of {desired} etcd member Pods ready; the member list is not reachable from the operator"
            ),
        }
    } else {
        let why = match step {
            Step::Wait { reason } | Step::RollFailed { reason, .. } => reason.clone(),
            other => other.kind().to_string(),
        };
        Health {
            ready: false,
            reason: "Unreachable",
            message: format!(
                "{ready} of {desired} etcd member Pods ready; no member answers ({why})"
            ),
        }
    };
    (health, settled, ready as i32)
}

/// Member statuses from the Pods alone.
fn statuses_from_pods(names: &Names, slots: &[Slot]) -> Vec<EtcdMemberStatus> {
    slots
        .iter()
        .filter(|s| s.pod != PodState::Absent)
        .map(|s| EtcdMemberStatus {
            name: s.name.clone(),
            id: None,
            peer_url: names.etcd_peer_url(&s.name),
            healthy: s.pod == PodState::Ready,
            learner: false,
        })
        .collect()
}

/// What carrying out a step came to.
enum Outcome {
    /// Done; look again soon.
    Acted,
    /// etcd asked to try later (or refused for a reason worth reporting).
    Deferred(String),
}

/// The etcd step of the reconcile. Not called while the Cluster is paused.
/// `services` and `pods` are the Cluster's Services and Pods as the
/// reconcile read them.
pub async fn reconcile(pass: &Pass<'_>) -> Result<Report, Error> {
    let Pass {
        ctx,
        cluster,
        names,
        secrets,
        services,
        pods,
        ..
    } = *pass;
    let client = &ctx.client;
    let ns = &names.namespace;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let services_api: Api<Service> = Api::namespaced(client.clone(), ns);
    let desired = cluster.spec.mode.replicas() as usize;
    let uses_claims = cluster.spec.etcd.storage.claim_template.is_some();
    let on_host_path = render::on_host_path(cluster);
    let now = Timestamp::now();
    // The version every member ran when etcd last settled.
    let previous_version = cluster
        .status
        .as_ref()
        .and_then(|s| s.components.as_ref())
        .and_then(|c| c.etcd.version.clone());

    // Fetch.
    let pods: Vec<Pod> = pods.iter().filter(|p| is_member(p)).cloned().collect();
    // A version change etcd cannot take is refused: the members keep the
    // version and image they run, so nothing rolls.
    let target = target(
        pass.resolved,
        &ctx.config,
        previous_version.as_deref(),
        &pods,
    );
    let (version, image) = (target.version.clone(), target.image.clone());
    let claims: Vec<PersistentVolumeClaim> = if uses_claims {
        list(ctx, &claims_api, names).await?
    } else {
        Vec::new()
    };
    let member_pod = |i: usize| {
        pods.iter()
            .find(|p| index_of(names, &p.name_any()) == Some(i))
    };
    // Where each hostPath member's data is: its scheduled Pod's node and
    // directory, else what its Service recorded.
    let pins: Vec<Option<render::Pin>> = (0..MAX_MEMBERS)
        .map(|i| {
            on_host_path
                .then(|| {
                    member_pod(i).and_then(render::pod_pin).or_else(|| {
                        services
                            .get(&names.etcd_member(i))
                            .and_then(render::service_pin)
                    })
                })
                .flatten()
        })
        .collect();
    let claim_of = |i: usize| {
        claims
            .iter()
            .find(|c| index_of(names, &c.name_any()) == Some(i))
    };
    let stranded = stranded_slots(ctx, cluster, &member_pod, &claim_of, &pins).await;
    let views: Vec<SlotView<'_>> = (0..MAX_MEMBERS)
        .map(|i| SlotView {
            pod: member_pod(i),
            claim: claim_of(i),
            hash: member_hash(names, secrets, i, &image),
            pinned: pins[i].is_some(),
            rolled: rolled(member_pod(i), previous_version.as_deref()),
            stranded: stranded[i],
        })
        .collect();
    let slots = slots(
        names,
        &views,
        uses_claims,
        now,
        ctx.config.etcd_failed_after,
    );

    // Services first: a member's name must resolve before it starts. Kept
    // for every slot that is wanted or still holds something.
    let service = async |desired: Service| {
        apply_if_changed(
            ctx,
            names,
            &services_api,
            &desired,
            services,
            resource_version,
        )
        .await
    };
    service(render::client_service(cluster, names)).await?;
    for (index, slot) in slots.iter().enumerate() {
        if index < desired || slot.pod != PodState::Absent || slot.claim != ClaimState::Absent {
            let svc = render::member_service(cluster, names, index);
            service(match &pins[index] {
                Some(pin) => render::pinned(svc, pin),
                None => svc,
            })
            .await?;
        }
    }

    // At most one member away at a time, whoever drains the nodes.
    let budgets_api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let budgets: BTreeMap<String, PodDisruptionBudget> = list(ctx, &budgets_api, names)
        .await?
        .into_iter()
        .map(|b| (b.name_any(), b))
        .collect();
    apply_if_changed(
        ctx,
        names,
        &budgets_api,
        &render::disruption_budget(cluster, names),
        &budgets,
        resource_version,
    )
    .await?;

    // Only this Cluster's Pods and the operator reach the members, the
    // controller-manager and the scheduler; the API stays open to clients.
    // Both fences go up with the members, before anything of the control
    // plane listens.
    if let Some(operator_namespace) = &ctx.config.operator_namespace {
        let policies_api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
        let policies: BTreeMap<String, NetworkPolicy> = list(ctx, &policies_api, names)
            .await?
            .into_iter()
            .map(|p| (p.name_any(), p))
            .collect();
        use crate::render::network_policy as fence;
        for policy in [
            fence::etcd(cluster, names, operator_namespace),
            fence::control_plane(cluster, names, operator_namespace),
        ] {
            apply_if_changed(
                ctx,
                names,
                &policies_api,
                &policy,
                &policies,
                resource_version,
            )
            .await?;
        }
    }

    let etcd = match client_for(names, secrets, &slots) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::debug!(error = %e, "no etcd client");
            None
        }
    };
    // Nothing exists yet: no member can answer, so do not wait for one.
    let nothing = slots.iter().all(|s| s.pod == PodState::Absent);
    let live = match (&etcd, nothing) {
        (Some(etcd), false) => match etcd.member_list().await {
            Ok(list) => Some(list),
            Err(e) => {
                tracing::debug!(error = %e, "etcd member list");
                None
            }
        },
        _ => None,
    };
    // Each member's own answer: who leads, for the planner, and the report
    // unless a step changes things first.
    let answers = match (&etcd, &live) {
        (Some(etcd), Some(live)) => Some(member_answers(etcd, names, live, &slots).await),
        _ => None,
    };
    let recorded = recorded_step(client, names).await?;
    let step = membership::plan(&Observed {
        desired,
        slots: &slots,
        live: live.as_deref(),
        recorded: recorded.as_ref(),
        data_outlives_pod: uses_claims || on_host_path,
        leader: answers.as_ref().and_then(leader),
        from_snapshot: crate::render::restore::pending(cluster).is_some(),
    });
    tracing::debug!(step = ?step, "etcd plan");

    // Members created now are spread over the nodes that can take them.
    let spread = match &step {
        Step::Bootstrap { .. } | Step::StartMember { .. } if desired > 1 => Some(
            crate::etcd::spread::for_new_pods(client, cluster.spec.placement.as_ref(), desired)
                .await,
        ),
        _ => None,
    };

    // Record, then act.
    let mut deferred = None;
    let mut acted = false;
    match &step {
        Step::Done => {
            if recorded.is_some() {
                record(client, names, None).await?;
            }
        }
        Step::Wait { .. } => {}
        Step::RollFailed { index, reason } => {
            // Once, as the roll stops.
            if etcd_ready_reason(cluster) != Some(ROLL_FAILED) {
                crate::context::publish_related(
                    ctx,
                    cluster,
                    EventType::Warning,
                    "EtcdRollFailed",
                    "RollMember",
                    reason.clone(),
                    Some(pod_ref(names, *index)),
                )
                .await;
            }
        }
        change => {
            if recorded.as_ref() != Some(change) {
                record(client, names, Some(change)).await?;
            }
            let act = Act {
                ctx,
                cluster,
                names,
                pods: &pods_api,
                claims: &claims_api,
                slots: &slots,
                etcd: etcd.as_ref(),
                live: live.as_deref(),
                pins: on_host_path.then_some(pins.as_slice()),
                spread,
                image: &image,
                version: &version,
                secrets,
                desired,
            };
            match act.step(change).await? {
                Outcome::Acted => acted = true,
                Outcome::Deferred(why) => deferred = Some(why),
            }
        }
    }

    // Report.
    let pods = if acted {
        member_pods(ctx, &pods_api, names).await?
    } else {
        pods
    };
    let shown_step = match &deferred {
        Some(why) => Step::Wait {
            reason: why.clone(),
        },
        None => step.clone(),
    };
    let mut report = match (&etcd, &live) {
        (Some(etcd), Some(live)) => {
            let answers = match answers {
                Some(answers) if !acted => answers,
                _ => member_answers(etcd, names, live, &slots).await,
            };
            let members = member_statuses(&slots, live, &answers);
            let running = running_version(&answers);
            let (condition, settled) =
                health(desired, &shown_step, &members, running.as_deref(), &version);
            let ready = members.iter().filter(|m| m.healthy && !m.learner).count() as i32;
            Report {
                members,
                desired: desired as i32,
                ready,
                version: running,
                condition,
                spread: crate::etcd::spread::condition(desired, &pods),
                settled: settled && slots[..desired].iter().all(|s| !s.outdated),
                pods,
                requeue: None,
            }
        }
        _ => {
            let (condition, settled, ready) = health_from_pods(desired, &shown_step, &slots);
            let running = pods
                .iter()
                .filter_map(|p| annotation(p, render::VERSION_ANNOTATION))
                .collect::<std::collections::BTreeSet<_>>();
            let running = (running.len() == 1)
                .then(|| running.into_iter().next().map(str::to_string))
                .flatten();
            Report {
                members: statuses_from_pods(names, &slots),
                desired: desired as i32,
                ready,
                version: running,
                condition,
                spread: crate::etcd::spread::condition(desired, &pods),
                settled,
                pods,
                requeue: None,
            }
        }
    };
    // What the scheduler says of a member it cannot place (no node for it
    // under the members' spread, its volume's node gone) is what the user
    // must act on; the plan's own words only say that it waits.
    if let Some(why) = unschedulable(&report.pods) {
        report.condition.message = format!("{}; {why}", report.condition.message);
    }
    if let Some(refused) = &target.refused {
        if etcd_ready_reason(cluster) != Some(VERSION_REFUSED) {
            publish(
                ctx,
                cluster,
                EventType::Warning,
                "EtcdUpgradeRefused",
                "UpgradeEtcd",
                refused.clone(),
            )
            .await;
        }
        report.condition.reason = VERSION_REFUSED;
        report.condition.message = format!(
            "{}; etcd version change refused: {refused}",
            report.condition.message
        );
    }
    // Until a roll is over (every member healthy on the desired version), the
    // status keeps the version etcd ran before it: a half-rolled cluster does
    // not run the new version yet, and the end of the roll is then seen as a
    // change of version, once.
    if !report.settled && previous_version.is_some() {
        report.version = previous_version.clone();
    }
    if let (Some(before), Some(now)) = (&previous_version, &report.version)
        && before != now
        && report.settled
    {
        publish(
            ctx,
            cluster,
            EventType::Normal,
            "EtcdUpgraded",
            "UpgradeEtcd",
            format!("every etcd member runs {now} (was {before})"),
        )
        .await;
    }
    // While a change is under way the members are asked again soon; an
    // unsettled etcd that waits on nothing the operator does is looked at
    // with the rest of the converging Cluster.
    let requeue =
        (acted || deferred.is_some() || matches!(step, Step::Wait { .. }) && live.is_some())
            .then_some(Duration::from_secs(2));
    Ok(Report { requeue, ..report })
}

/// Per slot, whether a member that is not serving keeps its data where it
/// can never start again ([`stranded`]). The meta-cluster's Nodes and the
/// claims' volumes are read only when some member is not ready and its data
/// is tied to a node; without the right to read them (an operator bound to
/// one namespace) no member is judged stranded.
async fn stranded_slots<'a>(
    ctx: &Context,
    cluster: &Cluster,
    member_pod: &impl Fn(usize) -> Option<&'a Pod>,
    claim_of: &impl Fn(usize) -> Option<&'a PersistentVolumeClaim>,
    pins: &[Option<render::Pin>],
) -> [bool; MAX_MEMBERS] {
    let mut out = [false; MAX_MEMBERS];
    let volume_of = |i: usize| {
        claim_of(i)
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())
    };
    let suspects: Vec<usize> = (0..MAX_MEMBERS)
        .filter(|&i| !member_pod(i).is_some_and(pod_ready))
        .filter(|&i| volume_of(i).is_some() || pins[i].as_ref().is_some_and(|p| p.node.is_some()))
        .collect();
    if suspects.is_empty() {
        return out;
    }
    let client = &ctx.client;
    let nodes = match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(nodes) => nodes.items,
        Err(e) => {
            tracing::debug!(error = %e, "cannot list Nodes; no etcd member is judged stranded");
            return out;
        }
    };
    let placement = cluster.spec.placement.as_ref();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for i in suspects {
        let pod = member_pod(i);
        out[i] = match (
            volume_of(i),
            pins[i].as_ref().and_then(|p| p.node.as_deref()),
        ) {
            (Some(volume), _) => match volumes.get_opt(&volume).await {
                Ok(Some(pv)) => stranded::stranded(pod, Home::Volume(&pv), &nodes, placement),
                Ok(None) => false,
                Err(e) => {
                    tracing::debug!(error = %e, volume, "cannot read an etcd member's volume");
                    false
                }
            },
            (None, Some(node)) => stranded::stranded(pod, Home::Node(node), &nodes, placement),
            (None, None) => false,
        };
    }
    out
}

/// The longest part of the scheduler's message kept in a condition.
const SCHEDULER_MESSAGE_MAX: usize = 300;

/// The first member Pod the scheduler cannot place, with its reason.
pub fn unschedulable(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| {
            let c = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (c.status == kok_common::conditions::Status::False
                && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| {
                let message = c.message.as_deref().unwrap_or_default();
                format!(
                    "Pod {} cannot be scheduled: {}",
                    p.name_any(),
                    kok_common::events::clip(message, SCHEDULER_MESSAGE_MAX)
                )
            })
        })
}

fn is_member(pod: &Pod) -> bool {
    pod.labels().contains_key(render::MEMBER_LABEL)
}

async fn member_pods(ctx: &Context, api: &Api<Pod>, names: &Names) -> Result<Vec<Pod>, Error> {
    Ok(list(ctx, api, names)
        .await?
        .into_iter()
        .filter(is_member)
        .collect())
}

/// The config hash of member `index`'s Pod: its certificates and the image.
pub fn member_hash(
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
    index: usize,
    image: &str,
) -> String {
    let suffix = format!("etcd-{index}");
    hash_of(
        secrets,
        &[
            names.cert_secret(&format!("{suffix}-server")),
            names.cert_secret(&format!("{suffix}-peer")),
        ],
        image,
    )
}

/// A client over every member's client URL, those with a ready Pod first so
/// a member that is down costs nothing while another answers.
fn client_for(
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
    slots: &[Slot],
) -> Result<EtcdClient, EtcdError> {
    let secret = secrets
        .get(&names.cert_secret("operator-etcd-client"))
        .ok_or_else(|| EtcdError::Tls {
            message: "the operator's etcd client Secret does not exist yet".into(),
        })?;
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_by_key(|&i| match slots[i].pod {
        PodState::Ready => 0,
        PodState::NotReady => 1,
        PodState::Absent => 3,
        _ => 2,
    });
    let endpoints = order
        .into_iter()
        .filter(|&i| slots[i].pod != PodState::Absent)
        .map(|i| names.etcd_client_url(&slots[i].name))
        .collect();
    EtcdClient::from_secret(endpoints, secret, REQUEST_TIMEOUT)
}

/// Each member's own status, asked of the members whose Pods exist, at once.
async fn member_answers(
    etcd: &EtcdClient,
    names: &Names,
    live: &[Member],
    slots: &[Slot],
) -> BTreeMap<u64, Status> {
    let asks = live.iter().filter_map(|m| {
        let slot = slots.iter().find(|s| m.peer_urls.contains(&s.peer_url))?;
        if slot.pod == PodState::Absent {
            return None;
        }
        let url = m
            .client_urls
            .first()
            .cloned()
            .unwrap_or_else(|| names.etcd_client_url(&slot.name));
        Some(async move { (m.id, etcd.status(&url).await) })
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .filter_map(|(id, answer)| answer.ok().map(|s| (id, s)))
        .collect()
}

/// The leader most members that answered follow.
pub fn leader(answers: &BTreeMap<u64, Status>) -> Option<u64> {
    let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
    for s in answers.values().filter(|s| s.leader != 0) {
        *votes.entry(s.leader).or_default() += 1;
    }
    votes
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map(|(leader, _)| leader)
}

/// The change recorded in the Cluster's status, read fresh: the Cluster the
/// reconcile was handed may predate the last record.
async fn recorded_step(client: &Client, names: &Names) -> Result<Option<Step>, Error> {
    let api: Api<Cluster> = Api::namespaced(client.clone(), &names.namespace);
    let cluster = api
        .get_status(&names.cluster)
        .await
        .map_err(Error::kube(format!(
            "reading the status of Cluster {}",
            names.cluster
        )))?;
    let raw = cluster.status.and_then(|s| s.etcd_change);
    Ok(raw.and_then(|v| match serde_json::from_value(v) {
        Ok(step) => Some(step),
        Err(e) => {
            // Not ours to interpret; planning from the world alone is safe.
            tracing::warn!(error = %e, "ignoring an unreadable recorded etcd change");
            None
        }
    }))
}

/// Record `step` (or clear the record) in `status.etcdChange`.
async fn record(client: &Client, names: &Names, step: Option<&Step>) -> Result<(), Error> {
    let api: Api<Cluster> = Api::namespaced(client.clone(), &names.namespace);
    let status = match step {
        Some(step) => json!({ "etcdChange": step }),
        None => json!({}),
    };
    kok_common::apply::apply_status(&api, RECORD_MANAGER, &names.cluster, &status).await?;
    Ok(())
}

/// Where a hostPath member's Pod keeps its data: a member etcd lists but
/// that never started (just added) gets a directory of its own, named after
/// its member ID, on any node; a member that ran before comes back to its
/// pinned node and directory; the members a new cluster starts with use the
/// first directory.
pub fn start_pin(live: Option<&[Member]>, slot: &Slot, pin: Option<&render::Pin>) -> render::Pin {
    let added = live
        .into_iter()
        .flatten()
        .find(|m| m.peer_urls.contains(&slot.peer_url) && m.name.is_empty());
    match (added, pin) {
        (Some(m), _) => render::Pin {
            node: None,
            data_dir: render::added_data_dir(m.id),
        },
        (None, Some(pin)) => pin.clone(),
        (None, None) => render::Pin {
            node: None,
            data_dir: render::FIRST_DATA_DIR.into(),
        },
    }
}

/// EtcdReady's reason while a version change is refused.
pub const VERSION_REFUSED: &str = "VersionRefused";

/// EtcdReady's reason while a failed roll holds.
pub const ROLL_FAILED: &str = "RollFailed";

/// The reason of the Cluster's EtcdReady condition, as last reported.
fn etcd_ready_reason(cluster: &Cluster) -> Option<&str> {
    cluster
        .status
        .as_ref()?
        .condition(kube_on_kube_api::cluster::ETCD_READY)
        .map(|c| c.reason.as_str())
}

/// The Pod of member `index`, as an Event's related object.
fn pod_ref(names: &Names, index: usize) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(names.namespace.clone()),
        name: Some(names.etcd_member(index)),
        ..Default::default()
    }
}

/// Carrying out one step.
struct Act<'a> {
    ctx: &'a Context,
    cluster: &'a Cluster,
    names: &'a Names,
    pods: &'a Api<Pod>,
    claims: &'a Api<PersistentVolumeClaim>,
    slots: &'a [Slot],
    etcd: Option<&'a EtcdClient>,
    /// etcd's member list, when it answered.
    live: Option<&'a [Member]>,
    /// Per slot, where a hostPath member's data is; `None` off hostPath.
    pins: Option<&'a [Option<render::Pin>]>,
    /// How new member Pods keep off each other's nodes (Production).
    spread: Option<render::Spread>,
    image: &'a str,
    version: &'a str,
    secrets: &'a BTreeMap<String, Secret>,
    desired: usize,
}

impl Act<'_> {
    async fn step(&self, step: &Step) -> Result<Outcome, Error> {
        let name = |i: usize| self.names.etcd_member(i);
        match step {
            Step::Bootstrap { initial_cluster } => {
                let mut created = Vec::new();
                for peer in initial_cluster {
                    let Some(index) = index_of(self.names, &peer.name) else {
                        continue;
                    };
                    if self.slots[index].pod == PodState::Absent {
                        self.start(index, initial_cluster, ClusterState::New)
                            .await?;
                        created.push(peer.name.clone());
                    }
                }
                if !created.is_empty() {
                    let note = match crate::render::restore::pending(self.cluster) {
                        Some(restore) if self.desired > created.len() => format!(
                            "started {} as a new etcd cluster on snapshot {}; the other members join it as learners",
                            created.join(", "),
                            restore.snapshot
                        ),
                        Some(restore) => format!(
                            "started {} as a new etcd cluster on snapshot {}",
                            created.join(", "),
                            restore.snapshot
                        ),
                        None => format!("started {} as a new etcd cluster", created.join(", ")),
                    };
                    self.event("EtcdBootstrapped", "CreateEtcd", note).await;
                }
            }
            Step::StartMember {
                index,
                initial_cluster,
                state,
            } => {
                self.start(*index, initial_cluster, *state).await?;
            }
            Step::AddLearner { index } => {
                let peer = self.slots[*index].peer_url.clone();
                match async { self.client()?.add_learner(&[peer]).await }.await {
                    Ok((member, _)) => {
                        self.member_event(
                            Some(*index),
                            "MemberAdded",
                            "AddMember",
                            format!("added {} as a learner (id {:x})", name(*index), member.id),
                        )
                        .await;
                    }
                    Err(e) => return Ok(self.refused("add", e).await),
                }
            }
            Step::Promote { id, index } => {
                match async { self.client()?.promote_member(*id).await }.await {
                    Ok(_) => {
                        self.member_event(
                            Some(*index),
                            "MemberPromoted",
                            "PromoteMember",
                            format!("promoted {} (id {id:x}) to a voting member", name(*index)),
                        )
                        .await;
                    }
                    Err(e) if e.is_learner_not_ready() => {
                        return Ok(Outcome::Deferred(format!(
                            "learner {} is catching up with the leader",
                            name(*index)
                        )));
                    }
                    Err(e) => return Ok(self.refused("promote", e).await),
                }
            }
            Step::RemoveMember { id, index } => {
                match async { self.client()?.remove_member(*id).await }.await {
                    Ok(_) => {
                        let (reason, note) = match index {
                            Some(i) if *i < self.desired => (
                                "MemberReplaced",
                                format!(
                                    "removed {} (id {id:x}) to replace it with a fresh member on empty data",
                                    name(*i)
                                ),
                            ),
                            Some(i) => {
                                ("MemberRemoved", format!("removed {} (id {id:x})", name(*i)))
                            }
                            None => (
                                "MemberRemoved",
                                format!("removed member {id:x}, which belongs to no member slot"),
                            ),
                        };
                        self.member_event(*index, reason, "RemoveMember", note)
                            .await;
                    }
                    Err(e) => return Ok(self.refused("remove", e).await),
                }
            }
            Step::DeletePod { index } => self.delete_pod(*index).await?,
            Step::RollMember { index } => {
                self.delete_pod(*index).await?;
                self.member_event(
                    Some(*index),
                    "MemberRestarting",
                    "RollMember",
                    format!(
                        "restarting {} on its data with etcd {} and the current certificates",
                        name(*index),
                        self.version
                    ),
                )
                .await;
            }
            Step::DeleteClaim { index } if self.pins.is_some() => {
                // A removed hostPath member's directory stays where it is;
                // forgetting the pin lets its slot's next member start in a
                // directory of its own, on any node.
                let api: Api<Service> =
                    Api::namespaced(self.ctx.client.clone(), &self.names.namespace);
                let unpinned = render::member_service(self.cluster, self.names, *index);
                crate::context::apply(&api, &unpinned).await?;
            }
            Step::DeleteClaim { index } => {
                if self.cluster.spec.etcd.storage.claim_template.is_some() {
                    crate::ownership::delete_owned(
                        self.claims,
                        &name(*index),
                        &self.owner(),
                        &DeleteParams::default(),
                    )
                    .await?;
                }
            }
            Step::Wait { .. } | Step::RollFailed { .. } | Step::Done => {}
        }
        Ok(Outcome::Acted)
    }

    /// The client; the planner only asks for etcd calls when it has a
    /// member list, which only comes from a client.
    fn client(&self) -> Result<&EtcdClient, EtcdError> {
        self.etcd.ok_or(EtcdError::NoEndpoints)
    }

    async fn refused(&self, what: &str, e: EtcdError) -> Outcome {
        if !e.is_transient() {
            self.ctx_event(EventType::Warning, "EtcdChangeRefused", what, e.to_string())
                .await;
        }
        Outcome::Deferred(format!("etcd did not {what} yet: {e}"))
    }

    async fn start(
        &self,
        index: usize,
        initial_cluster: &[membership::Peer],
        state: ClusterState,
    ) -> Result<(), Error> {
        if let Some(claim) = render::member_claim(self.cluster, self.names, index)
            && self.slots[index].claim == ClaimState::Absent
        {
            let claim_name = claim.name_any();
            match self.claims.create(&PostParams::default(), &claim).await {
                Ok(created) => OwnWrites::global().record(&created),
                // Made by an earlier attempt of this very step, or another's.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    crate::ownership::existing(self.claims, &claim_name, &self.owner()).await?
                }
                Err(e) => return Err(Error::writing("PersistentVolumeClaim", &claim_name, e)),
            }
        }
        let hash = member_hash(self.names, self.secrets, index, self.image);
        let pod = render::member_pod(
            self.cluster,
            self.names,
            &MemberPod {
                index,
                initial_cluster,
                state,
                version: self.version,
                image: self.image,
                config_hash: &hash,
            },
        );
        let pod = match self.pins {
            Some(pins) => render::on_data(
                pod,
                &start_pin(self.live, &self.slots[index], pins[index].as_ref()),
            ),
            None => pod,
        };
        let pod = match self.spread {
            Some(spread) => render::spread(pod, self.names, spread),
            None => pod,
        };
        // The first bootstrap of a Cluster started from a snapshot: each
        // member starts on the snapshot's data.
        let restoring = crate::render::restore::pending(self.cluster)
            .zip(crate::render::restore::source(self.cluster, self.names));
        let pod = match restoring {
            Some((status, s3)) if state == ClusterState::New => {
                let flags = crate::render::restore::restore_flags(&pod);
                crate::render::restore::with_restore(
                    pod,
                    &s3,
                    status,
                    &self.ctx.config.operator_image(),
                    flags,
                )
            }
            _ => pod,
        };
        let pod_name = pod.name_any();
        match self.pods.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                OwnWrites::global().record(&created);
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                crate::ownership::existing(self.pods, &pod_name, &self.owner()).await
            }
            Err(e) => Err(Error::writing("Pod", &pod_name, e)),
        }
    }

    async fn delete_pod(&self, index: usize) -> Result<(), Error> {
        crate::ownership::delete_owned(
            self.pods,
            &self.names.etcd_member(index),
            &self.owner(),
            &DeleteParams::default(),
        )
        .await
        .map(drop)
    }

    /// The Cluster as the controller of every object the step writes.
    fn owner(&self) -> OwnerReference {
        crate::render::owner(self.cluster)
    }

    async fn event(&self, reason: &str, action: &str, note: String) {
        self.ctx_event(EventType::Normal, reason, action, note)
            .await;
    }

    /// An Event about member `index` (its Pod is the related object), so
    /// the same change to different members is not folded into one series.
    async fn member_event(&self, index: Option<usize>, reason: &str, action: &str, note: String) {
        let related = index.map(|i| pod_ref(self.names, i));
        crate::context::publish_related(
            self.ctx,
            self.cluster,
            EventType::Normal,
            reason,
            action,
            note,
            related,
        )
        .await;
    }

    async fn ctx_event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        publish(self.ctx, self.cluster, type_, reason, action, note).await;
    }
}

#[cfg(test)]
mod tests;
