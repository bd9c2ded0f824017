//! The Machine reconcile: fetch (the Machine's target PackageVersions, its
//! Node, its SSH key) → plan (pure, in [`plan`]: package order, whether the
//! host needs a visit) → act on the host over SSH (bootstrap files, sysctls,
//! each package) and on the Node (labels, taints, cordon) → status.
//!
//! Every step reads state back before changing it, so a crash or a retry
//! anywhere converges; a Ready Machine whose spec, versions and Node did not
//! change gets no SSH session until its periodic re-check.
//!
//! A deleted Machine is offboarded instead ([`offboard`]). The reads both
//! start from are in [`fetch`].

pub mod checks;
pub mod fetch;
pub mod offboard;
pub mod plan;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::{InstalledPackage, MachinePhase, MachineStatus};
use serde_json::json;

use crate::Error;
use crate::bootstrap;
use crate::context::Context;
use crate::drain;
use crate::host::{BOOTSTRAP_KUBECONFIG, CLUSTER_CA, Host, KUBELET_KUBECONFIG, Probe};
use crate::install::Installer;
use crate::repair::{Refusal, Remedy};
use crate::rollout;
use crate::ssh::Session;
use fetch::{get_node, ssh_target, wanted};
use kok_common::finalizer;
use offboard::FINALIZER;
use plan::{ClusterValues, Visit, VisitInput, Wanted};
use status::{NODE_READY, PACKAGES_INSTALLED, REACHABLE};

/// How long after a failure that only a change can fix the Machine is looked
/// at again anyway.
const WAIT_FOR_CHANGE: Duration = Duration::from_secs(600);

/// Reconciles one Machine.
pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = machine.name_any();
    let Some(machine) = ctx.fresh(machine).await? else {
        return Ok(Action::await_change());
    };
    if machine.metadata.deletion_timestamp.is_some() {
        return offboard::offboard(&machine, &ctx).await;
    }
    if !finalizer::has(&*machine, FINALIZER) {
        let machines = Api::<Machine>::all(ctx.client.clone());
        let patched = finalizer::add(&machines, &machine, FINALIZER)
            .await
            .map_err(Error::kube(format!("add finalizer to Machine {name}")))?;
        ctx.wrote(&patched);
    }
    let generation = machine.metadata.generation;
    let mut st = machine.status.clone().unwrap_or_default();
    // A failed Machine is tried again when its backoff is over, not on every
    // update that wakes it (its own failed status, Node heartbeats); a change
    // of its spec is tried at once.
    if status::failed(&st)
        && st.observed_generation == generation
        && let Some(wait) = ctx.backing_off(&name, generation)
    {
        tracing::debug!(machine = %name, ?wait, "backing off after a failure");
        return Ok(Action::requeue(wait));
    }
    st.canary = rollout::canary_claim(&machine).map(str::to_string);
    if st.phase.is_none() {
        st.phase = Some(MachinePhase::Pending);
    }
    let result = converge(&machine, &ctx, &mut st).await;
    match result {
        Ok(action) => {
            st.observed_generation = generation;
            status::write(&ctx, &machine, &st).await?;
            ctx.succeeded(&name);
            Ok(action)
        }
        Err(error) => {
            fail(&machine, &ctx, &mut st, &error).await;
            st.observed_generation = generation;
            if let Err(e) = status::write(&ctx, &machine, &st).await {
                tracing::warn!(machine = %name, error = %e, "writing the failed status");
            }
            if error.needs_change() {
                ctx.park(&name);
                tracing::warn!(machine = %name, category = error.category(), %error, "waiting for a change");
                Ok(Action::requeue(WAIT_FOR_CHANGE))
            } else {
                Err(error)
            }
        }
    }
}

/// Records a failure in status and as a Warning Event.
async fn fail(machine: &Machine, ctx: &Context, st: &mut MachineStatus, error: &Error) {
    let generation = machine.metadata.generation;
    let (condition, reason) = match error {
        Error::HostKeyMismatch { .. } => (REACHABLE, "HostKeyMismatch"),
        Error::Unreachable { .. } => (REACHABLE, "Unreachable"),
        Error::Ssh { .. } => (REACHABLE, "LoginFailed"),
        Error::MissingSecret { .. } => (REACHABLE, "SecretMissing"),
        Error::MissingPackageVersion(_) => (PACKAGES_INSTALLED, "MissingPackageVersion"),
        Error::ChecksumMismatch { .. } => (PACKAGES_INSTALLED, "ChecksumMismatch"),
        Error::ArtifactHttp { .. } | Error::Download { .. } => {
            (PACKAGES_INSTALLED, "DownloadFailed")
        }
        Error::HealthCheck { .. } => (PACKAGES_INSTALLED, "HealthCheckFailed"),
        Error::UnsafePath { .. } => (PACKAGES_INSTALLED, "UnsafePath"),
        Error::UnsafeArchive { .. } => (PACKAGES_INSTALLED, "UnsafeArchive"),
        Error::TooLarge { .. } => (PACKAGES_INSTALLED, "ArtifactTooLarge"),
        Error::OutputTooLarge { .. } => (PACKAGES_INSTALLED, "OutputTooLarge"),
        Error::DrainTimeout { .. } => (NODE_READY, "DrainTimeout"),
        Error::ClusterInfo(_) => (NODE_READY, "BootstrapUnavailable"),
        Error::InvalidSpec { .. } => (PACKAGES_INSTALLED, "InvalidSpec"),
        e if e.rejected() => (PACKAGES_INSTALLED, "ObjectRejected"),
        _ => (PACKAGES_INSTALLED, "InstallFailed"),
    };
    status::set(st, generation, condition, false, reason, error.to_string());
    st.phase = Some(MachinePhase::Failed);
    let step = st
        .last_operation
        .as_ref()
        .filter(|op| op.finished_at.is_none())
        .map(|op| op.step.clone())
        .unwrap_or_else(|| reason.to_string());
    let tail = match error {
        Error::Step { tail, .. } | Error::HealthCheck { detail: tail, .. } => Some(tail.clone()),
        _ => None,
    };
    status::finish(st, step, false, error.to_string(), tail);
    ctx.event(
        machine,
        EventType::Warning,
        reason,
        "Reconcile",
        error.to_string(),
    )
    .await;
    // A join that failed leaves no live token behind (the next attempt
    // makes another); a Machine whose Node is Ready has none to delete.
    let joined = get_node(&ctx.client, &plan::node_name(machine))
        .await
        .is_ok_and(|node| plan::ready(node.as_ref()));
    if !joined && let Err(e) = bootstrap::delete_tokens(&ctx.client, &machine.name_any()).await {
        tracing::warn!(machine = %machine.name_any(), error = %e, "deleting the bootstrap tokens of a failed join");
    }
}

async fn converge(
    machine: &Machine,
    ctx: &Context,
    st: &mut MachineStatus,
) -> Result<Action, Error> {
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    // Nothing runs on the host while a value that would reach it is unsafe.
    if let Some(detail) = checks::unsafe_value(machine) {
        return Err(Error::InvalidSpec {
            machine: name,
            detail,
        });
    }
    let (wanted, cpv) = wanted(ctx, machine).await?;
    // A failure only a change can fix (a checksum mismatch, a host-key
    // mismatch) is not retried on every Node or status update: only once the
    // Machine or its package versions change, or after WAIT_FOR_CHANGE.
    let inputs = attempt_inputs(machine, &wanted);
    if status::failed(st) && ctx.parked(&name, inputs) {
        return Ok(Action::requeue(WAIT_FOR_CHANGE));
    }
    ctx.attempt(&name, inputs);
    let node_name = plan::node_name(machine);
    let node = get_node(&ctx.client, &node_name).await?;
    let node_ready = plan::ready(node.as_ref());
    let remedy = node
        .as_ref()
        .and_then(|n| crate::repair::due(&ctx.remediations.rules, n))
        .cloned();

    // A Machine that status says is Ready, with its Node Ready and nothing
    // changed, is not visited just because this process started: its next
    // check is one interval after the last one its status records. Without
    // such a record, or when that check is overdue (the operator was down),
    // the check comes at a point of the interval spread by name, so a
    // restart does not open a session to every host at once.
    if ctx.since_check(&name).is_none()
        && st.phase == Some(MachinePhase::Ready)
        && node_ready
        && st.observed_generation == generation
    {
        let recheck = ctx.settings.recheck;
        let ago = st
            .last_checked_at
            .as_ref()
            .map(status::age)
            .filter(|ago| *ago < recheck)
            .unwrap_or_else(|| plan::spread(&name, recheck));
        ctx.assume_checked(&name, ago);
    }
    let visit = plan::visit(&VisitInput {
        generation,
        observed_generation: st.observed_generation,
        wanted: &wanted,
        installed: &st.installed,
        node_ready,
        since_check: ctx.since_check(&name),
        recheck: ctx.settings.recheck,
        node_wait: ctx.settings.node_wait,
        remediation_due: remedy.is_some(),
        failed: status::failed(st),
    });
    if let Visit::NotNow(after) = visit {
        tracing::debug!(machine = %name, next_check_in = ?after, "nothing to do on the host now");
        finish_node(machine, ctx, st, node.as_ref()).await?;
        return Ok(Action::requeue(after));
    }
    let Visit::Go(why) = visit else {
        return Ok(Action::await_change());
    };
    tracing::debug!(machine = %name, why, "visiting the host");

    // A Machine that is up only goes down for a change within the budget.
    let changing: Vec<&Wanted> = wanted
        .iter()
        .filter(|w| {
            st.installed
                .get(&w.package)
                .is_none_or(|i| i.package_version != w.package_version)
        })
        .collect();
    let up = status::was_ready(st) && node_ready;
    let _permit = if up && !changing.is_empty() {
        let machines = rollout::list_machines(&ctx.client)
            .await
            .map_err(Error::kube("list Machines"))?;
        let nodes = rollout::list_nodes(&ctx.client)
            .await
            .map_err(Error::kube("list Nodes"))?;
        let unavailable = rollout::unavailable(&machines, &nodes);
        let budget = rollout::budget(cpv.as_ref(), machines.len());
        match ctx.gate.try_admit(&name, &unavailable, budget) {
            Some(permit) => Some(permit),
            None => {
                tracing::info!(machine = %name, ?unavailable, budget, "upgrade waits for the rollout budget");
                status::set(
                    st,
                    generation,
                    PACKAGES_INSTALLED,
                    false,
                    "WaitingForBudget",
                    format!(
                        "{} wait: {} of at most {budget} Machines unavailable",
                        changing
                            .iter()
                            .map(|w| w.package_version.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        unavailable.len()
                    ),
                );
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
    } else {
        None
    };

    let target = ssh_target(ctx, machine).await?;
    let _slot = ctx.ssh_slot().await?;
    let session = match ctx
        .sessions
        .get(&name, &target, ctx.settings.ssh_timeouts)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            ctx.sessions.forget(&name).await;
            return Err(e);
        }
    };
    let result = on_host(machine, ctx, st, &session, &wanted, node.as_ref(), remedy).await;
    if let Err(e) = &result
        && matches!(e, Error::Unreachable { .. } | Error::Ssh { .. })
    {
        ctx.sessions.forget(&name).await;
    }
    result?;
    ctx.mark_checked(&name);
    status::checked(st);
    let node = get_node(&ctx.client, &node_name).await?;
    finish_node(machine, ctx, st, node.as_ref()).await?;
    if plan::ready(node.as_ref()) {
        Ok(Action::requeue(ctx.settings.recheck))
    } else {
        Ok(Action::requeue(Duration::from_secs(3)))
    }
}

/// A hash of what an attempt on the Machine depends on: its spec and the
/// PackageVersions it should run.
fn attempt_inputs(machine: &Machine, wanted: &[Wanted]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&machine.spec)
        .unwrap_or_default()
        .hash(&mut h);
    for w in wanted {
        w.package_version.hash(&mut h);
        serde_json::to_string(&w.spec)
            .unwrap_or_default()
            .hash(&mut h);
    }
    h.finish()
}

/// What kind of change a package needs.
fn change_kind(
    st: &MachineStatus,
    w: &Wanted,
    current: &str,
    active: bool,
) -> Option<&'static str> {
    let known = st
        .installed
        .get(&w.package)
        .is_some_and(|i| i.package_version == w.package_version && i.healthy);
    if current.is_empty() {
        Some("Installed")
    } else if current != w.spec.version {
        if st
            .installed
            .get(&w.package)
            .is_some_and(|i| i.version == current && i.package_version != w.package_version)
        {
            Some("Upgraded")
        } else {
            Some("DriftCorrected")
        }
    } else if !active {
        Some("Restarted")
    } else if !known {
        // At the version and running, but not verified by this operator.
        Some("Verified")
    } else {
        None
    }
}

#[allow(clippy::too_many_arguments)]
async fn on_host(
    machine: &Machine,
    ctx: &Context,
    st: &mut MachineStatus,
    session: &Session,
    wanted: &[Wanted],
    node: Option<&Node>,
    remedy: Option<crate::repair::Rule>,
) -> Result<(), Error> {
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    let host = Host::new(session);
    let probes: Vec<Probe> = wanted
        .iter()
        .map(|w| Probe {
            package: w.package.clone(),
            unit: w.spec.install.systemd_unit.as_ref().map(|u| u.name.clone()),
        })
        .collect();
    let state = host.state(&probes).await?;
    st.host = Some(state.facts.clone());
    status::set(
        st,
        generation,
        REACHABLE,
        true,
        "Connected",
        format!("logged in to {}", session.host()),
    );

    let todo: Vec<(&Wanted, &'static str)> = wanted
        .iter()
        .filter_map(|w| {
            let s = state.packages.get(&w.package).cloned().unwrap_or_default();
            change_kind(st, w, &s.current, s.active).map(|k| (w, k))
        })
        .collect();
    let up = status::was_ready(st) && plan::ready(node);
    let disruptive = todo.iter().any(|(_, k)| *k != "Verified");
    if disruptive {
        st.phase = Some(if !up {
            MachinePhase::Provisioning
        } else if todo.iter().any(|(_, k)| *k == "Upgraded") {
            MachinePhase::Upgrading
        } else {
            MachinePhase::Repairing
        });
        let step = todo
            .iter()
            .map(|(w, _)| format!("{} {}", w.package, w.spec.version))
            .collect::<Vec<_>>()
            .join(", ");
        status::begin(st, format!("install {step}"));
        status::write(ctx, machine, st).await?;
    }

    // The kubelet reads its bootstrap kubeconfig when it starts, so it is
    // there before the kubelet package is. Whether it joins is the API's to
    // say, not the host's: a host whose Node is Ready has a kubelet with
    // credentials, whatever it claims, and gets no token. (One whose Node is
    // not Ready, reinstalled say, does; the token gets a client certificate
    // for this Machine's Node only, see serving_certs.rs.)
    let kubelet_wanted = wanted.iter().any(|w| w.package == "kubelet");
    let joins = kubelet_wanted && !state.kubelet_joined && !plan::ready(node);
    if kubelet_wanted && !state.kubelet_joined && plan::ready(node) {
        ctx.event(
            machine,
            EventType::Warning,
            "CredentialsClaimedMissing",
            "Bootstrap",
            format!(
                "the host says its kubelet has no credentials ({KUBELET_KUBECONFIG} is empty) \
                 while its Node {} is Ready: no bootstrap token is given",
                plan::node_name(machine)
            ),
        )
        .await;
    }
    let cluster = match bootstrap::cluster_info(&ctx.client).await {
        Ok(c) => Some(c),
        Err(e) if joins => return Err(e),
        Err(_) => None,
    };
    if let (true, Some(info)) = (joins, &cluster) {
        let token = bootstrap::ensure_token(&ctx.client, &name).await?;
        let kubeconfig = bootstrap::bootstrap_kubeconfig(info, &token);
        let ca = bootstrap::ca_pem(info)?;
        if host
            .files(&[
                (BOOTSTRAP_KUBECONFIG, "0600", &kubeconfig),
                (CLUSTER_CA, "0644", &ca),
            ])
            .await?
        {
            ctx.event(
                machine,
                EventType::Normal,
                "BootstrapConfigured",
                "Bootstrap",
                format!(
                    "wrote the kubelet bootstrap kubeconfig with token {} (expires {})",
                    token.id, token.expires
                ),
            )
            .await;
        }
    }
    if host.sysctls(&machine.spec.sysctls).await? {
        ctx.event(
            machine,
            EventType::Normal,
            "SysctlsApplied",
            "Sysctl",
            format!("applied {} kernel parameter(s)", machine.spec.sysctls.len()),
        )
        .await;
    }

    // Node-condition remediation, within cool-down and cap.
    if let Some(rule) = remedy {
        remediate(machine, ctx, st, &host, node, &rule).await?;
    }

    let needs_drain = up
        && todo
            .iter()
            .any(|(w, k)| w.spec.install.requires_drain && *k == "Upgraded");
    if let (true, Some(node)) = (needs_drain, node) {
        drain::cordon(&ctx.client, node, "package upgrade").await?;
        let evicted = drain::drain(
            &ctx.client,
            &plan::node_name(machine),
            ctx.settings.drain_timeout,
        )
        .await?;
        ctx.event(
            machine,
            EventType::Normal,
            "Drained",
            "Drain",
            format!(
                "cordoned and drained Node {} ({evicted} Pod(s) evicted)",
                plan::node_name(machine)
            ),
        )
        .await;
    }

    let values = plan::template_values(
        machine,
        &ClusterValues {
            cluster_dns: ctx.settings.cluster_dns.clone(),
            cluster_domain: ctx.settings.cluster_domain.clone(),
            api_server: cluster.map(|c| c.server).unwrap_or_default(),
        },
    );
    let installer = Installer::new(session).with_limits(ctx.settings.limits);
    for w in wanted {
        let kind = todo
            .iter()
            .find(|(t, _)| t.package == w.package)
            .map(|(_, k)| *k);
        let Some(kind) = kind else { continue };
        let step = format!("install {} {}", w.package, w.spec.version);
        let started = Instant::now();
        let result = match installer.install(&w.spec, &values).await {
            Ok(r) => r,
            Err(e) => {
                if let (Error::HealthCheck { .. }, Some(i)) = (&e, st.installed.get_mut(&w.package))
                {
                    i.healthy = false;
                }
                status::begin(st, step);
                return Err(e);
            }
        };
        let tail = result
            .steps
            .iter()
            .filter(|s| s.changed)
            .map(|s| s.tail.clone())
            .collect::<Vec<_>>()
            .join("\n");
        st.installed.insert(
            w.package.clone(),
            InstalledPackage {
                version: result.version.clone(),
                package_version: w.package_version.clone(),
                previous: result.previous.clone(),
                healthy: true,
            },
        );
        status::finish(
            st,
            step,
            true,
            format!("{} {} current and healthy", w.package, result.version),
            Some(tail),
        );
        if result.changed {
            ctx.event(
                machine,
                EventType::Normal,
                kind,
                "Install",
                format!(
                    "{} {} ({}) in {:.1}s",
                    w.package,
                    result.version,
                    w.package_version,
                    started.elapsed().as_secs_f64()
                ),
            )
            .await;
        }
    }
    status::set(
        st,
        generation,
        PACKAGES_INSTALLED,
        true,
        "Installed",
        wanted
            .iter()
            .map(|w| format!("{} {}", w.package, w.spec.version))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Ok(())
}

async fn remediate(
    machine: &Machine,
    ctx: &Context,
    st: &mut MachineStatus,
    host: &Host<'_>,
    node: Option<&Node>,
    rule: &crate::repair::Rule,
) -> Result<(), Error> {
    let name = machine.name_any();
    let _slot = match ctx.remediations.try_start(&name, Instant::now()) {
        Ok(slot) => slot,
        Err(Refusal::CoolingDown(left)) => {
            tracing::debug!(machine = %name, condition = %rule.condition, ?left, "remediation cooling down");
            return Ok(());
        }
        Err(Refusal::AtCap(cap)) => {
            ctx.event(
                machine,
                EventType::Warning,
                "RemediationDeferred",
                "Remediate",
                format!(
                    "{} is True but {cap} remediation(s) already run in the cluster",
                    rule.condition
                ),
            )
            .await;
            return Ok(());
        }
    };
    st.phase = Some(MachinePhase::Repairing);
    let step = format!("remediate {}: {}", rule.condition, rule.remedy.describe());
    status::begin(st, step.clone());
    status::write(ctx, machine, st).await?;
    let tail = match &rule.remedy {
        Remedy::Restart(unit) => {
            host.restart(unit).await?;
            None
        }
        Remedy::Command(command) => Some(host.command(command).await?),
        Remedy::Reprovision => {
            // Everything is installed again below.
            st.installed.clear();
            None
        }
        Remedy::Cordon => {
            if let Some(node) = node {
                drain::cordon(
                    &ctx.client,
                    node,
                    &format!("remediation of {}", rule.condition),
                )
                .await?;
            }
            None
        }
    };
    status::finish(st, step.clone(), true, "done", tail);
    ctx.event(machine, EventType::Normal, "Remediated", "Remediate", step)
        .await;
    Ok(())
}

/// API-only upkeep: the Node's labels and taints, undoing our cordon once
/// the Machine is up, and the phase and Node conditions.
async fn finish_node(
    machine: &Machine,
    ctx: &Context,
    st: &mut MachineStatus,
    node: Option<&Node>,
) -> Result<(), Error> {
    let generation = machine.metadata.generation;
    let name = machine.name_any();
    let Some(node) = node else {
        st.node_name = None;
        status::set(
            st,
            generation,
            NODE_READY,
            false,
            "NodeNotRegistered",
            format!("waiting for Node {} to register", plan::node_name(machine)),
        );
        if st.phase != Some(MachinePhase::Failed) {
            st.phase = Some(MachinePhase::Provisioning);
        }
        return Ok(());
    };
    st.node_name = Some(node.name_any());
    let labels = plan::missing_labels(node, &plan::node_labels(machine));
    let taints = plan::taints_with(node, &machine.spec.kubelet.taints);
    if !labels.is_empty() || taints.is_some() {
        let mut patch = json!({"metadata": {"labels": labels}});
        if let Some(taints) = taints {
            patch["spec"] = json!({"taints": taints});
        }
        Api::<Node>::all(ctx.client.clone())
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(Error::kube(format!(
                "patch Node {} labels and taints",
                node.name_any()
            )))?;
        ctx.event(
            machine,
            EventType::Normal,
            "NodeLabeled",
            "Label",
            format!(
                "labels and taints of Node {} set from the Machine",
                node.name_any()
            ),
        )
        .await;
    }
    if plan::ready(Some(node)) {
        let problem = crate::repair::due(&ctx.remediations.rules, node);
        let wants_cordon = problem.is_some_and(|r| r.remedy == Remedy::Cordon);
        if !wants_cordon && drain::uncordon(&ctx.client, node).await? {
            ctx.event(
                machine,
                EventType::Normal,
                "Uncordoned",
                "Drain",
                format!("Node {} schedulable again", node.name_any()),
            )
            .await;
        }
        status::set(
            st,
            generation,
            NODE_READY,
            true,
            "NodeReady",
            format!("Node {} is Ready", node.name_any()),
        );
        if status::is_true(st, PACKAGES_INSTALLED) {
            if st.phase != Some(MachinePhase::Ready) {
                ctx.event(
                    machine,
                    EventType::Normal,
                    "Ready",
                    "Reconcile",
                    format!(
                        "Node {} Ready with every package at its declared version",
                        node.name_any()
                    ),
                )
                .await;
                // The kubelet has its own credentials now. (Before the phase
                // is written: a failure here is retried with the reconcile.)
                bootstrap::delete_tokens(&ctx.client, &name).await?;
            }
            st.phase = Some(MachinePhase::Ready);
        }
    } else {
        status::set(
            st,
            generation,
            NODE_READY,
            false,
            "NodeNotReady",
            format!("Node {} is not Ready", node.name_any()),
        );
        if st.phase == Some(MachinePhase::Ready) {
            st.phase = Some(MachinePhase::Repairing);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::package::PackageVersionSpec;

    fn wanted(version: &str) -> Wanted {
        Wanted {
            package: "kubelet".into(),
            package_version: format!("kubelet-{version}"),
            spec: PackageVersionSpec {
                package: "kubelet".into(),
                version: version.into(),
                artifacts: vec![],
                install: Default::default(),
                health_check: None,
                depends_on: vec![],
            },
        }
    }

    #[test]
    fn changes_are_named_by_what_the_host_has() {
        let mut st = MachineStatus::default();
        let w = wanted("2.0.0");
        assert_eq!(change_kind(&st, &w, "", false), Some("Installed"));
        assert_eq!(change_kind(&st, &w, "2.0.0", true), Some("Verified"));
        st.installed.insert(
            "kubelet".into(),
            InstalledPackage {
                version: "1.0.0".into(),
                package_version: "kubelet-1.0.0".into(),
                previous: None,
                healthy: true,
            },
        );
        assert_eq!(change_kind(&st, &w, "1.0.0", true), Some("Upgraded"));
        assert_eq!(
            change_kind(&st, &wanted("1.0.0"), "0.9.0", true),
            Some("DriftCorrected")
        );
        assert_eq!(
            change_kind(&st, &wanted("1.0.0"), "1.0.0", false),
            Some("Restarted")
        );
        assert_eq!(change_kind(&st, &wanted("1.0.0"), "1.0.0", true), None);
    }
}
