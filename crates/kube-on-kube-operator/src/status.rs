//! The Cluster's status as a pure function of what was observed: component
//! readiness, conditions, phase, endpoint and certificate expiry.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube_on_kube_api::cluster::{
    Cluster, ClusterPhase, ClusterStatus, ComponentStatus, ComponentStatuses, EtcdMemberStatus,
};

use crate::names::{Component, Names};

/// Condition types (part of the API).
pub use kube_on_kube_api::cluster::{
    ADDONS_READY, APISERVER_READY, CERTIFICATES_READY, CONTROLLER_MANAGER_READY, ETCD_READY,
    ETCD_SPREAD, PROGRESSING, READY, SCHEDULER_READY,
};

/// What the reconcile saw and did.
pub struct Observed<'a> {
    pub etcd_pods: &'a [Pod],
    pub apiserver: Option<&'a Deployment>,
    pub controller_manager: Option<&'a Deployment>,
    pub scheduler: Option<&'a Deployment>,
    pub endpoint: String,
    pub certificates_expire_at: Option<Timestamp>,
    /// Why the PKI step could not finish, if it could not.
    pub certificates_error: Option<String>,
    /// A certificate authority or the service-account key is missing or
    /// changed and kept from being replaced: the reason and message (see
    /// [`crate::pki::authorities`]). The control plane runs on meanwhile.
    pub certificates_held: Option<(&'static str, String)>,
    /// The tenant's kube-apiserver files are missing or refused: the
    /// running kube-apiservers keep theirs (see [`crate::apiserver_files`]).
    pub apiserver_files_held: Option<&'a crate::apiserver_files::Held>,
    /// Add-ons: None while not attempted yet, else how applying them went.
    pub addons: Option<crate::addon_retry::Report>,
    pub version: &'a str,
    pub etcd_version: &'a str,
    /// The control-plane upgrade plan of this reconcile (None while paused):
    /// the versions that run, upgrade progress, a refused version change.
    pub upgrade: Option<&'a crate::control_plane::upgrade::Plan>,
    /// What the etcd step found (None while paused: then the Pods tell).
    pub etcd: Option<&'a crate::etcd::Report>,
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Ready" && c.status == Status::True)
        })
}

fn component(desired: i32, ready: i32, version: &str) -> ComponentStatus {
    ComponentStatus {
        version: (ready >= desired && desired > 0).then(|| version.to_string()),
        desired_replicas: desired,
        ready_replicas: ready,
        ready: format!("{ready}/{desired}"),
    }
}

fn etcd_component(observed: &Observed<'_>, desired: i32, pods_ready: i32) -> ComponentStatus {
    match observed.etcd {
        Some(r) => ComponentStatus {
            version: r.version.clone(),
            desired_replicas: r.desired,
            ready_replicas: r.ready,
            ready: format!("{}/{}", r.ready, r.desired),
        },
        None => component(desired, pods_ready, observed.etcd_version),
    }
}

fn deployment(d: Option<&Deployment>, desired: i32, version: &str) -> ComponentStatus {
    let status = d.and_then(|d| d.status.as_ref());
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(0);
    let mut c = component(desired, ready, version);
    // During a rollout older replicas still serve, at the old version.
    if updated < desired {
        c.version = None;
    }
    c
}

/// The Cluster's status with only the add-on step's outcome replaced, for a
/// retry of that step alone (see [`crate::addon_retry`]). Only for an outcome
/// that is not ready: the Cluster's last status then stays right in all
/// else, Ready false for the add-ons and the phase. None without a status.
pub fn with_addons(
    cluster: &Cluster,
    report: &crate::addon_retry::Report,
    now: Timestamp,
) -> Option<ClusterStatus> {
    if report.ready {
        return None;
    }
    let mut status = cluster.status.clone()?;
    // Owned by the PKI step's own field manager: written from a copy that
    // may be older, it could set back a record just made.
    status.certificate_authorities = None;
    conditions::set(
        &mut status.conditions,
        Desired {
            type_: ADDONS_READY,
            status: Status::False,
            reason: report.reason,
            message: report.message.clone(),
        },
        cluster.metadata.generation,
        now,
    );
    Some(status)
}

/// Build the status. `previous` supplies condition transition times.
pub fn build(
    cluster: &Cluster,
    names: &Names,
    observed: &Observed<'_>,
    now: Timestamp,
) -> ClusterStatus {
    let desired = cluster.spec.mode.replicas();
    let generation = cluster.metadata.generation;
    let etcd_ready = observed.etcd_pods.iter().filter(|p| pod_ready(p)).count() as i32;
    let components = ComponentStatuses {
        etcd: etcd_component(observed, desired, etcd_ready),
        api_server: deployment(observed.apiserver, desired, observed.version),
        controller_manager: deployment(observed.controller_manager, desired, observed.version),
        scheduler: deployment(observed.scheduler, desired, observed.version),
    };
    let mut components = components;
    if let Some(plan) = observed.upgrade {
        // What actually runs: the live template's version once every replica
        // runs it, nothing while a rollout mixes versions.
        for (c, slot) in [
            (Component::ApiServer, &mut components.api_server),
            (
                Component::ControllerManager,
                &mut components.controller_manager,
            ),
            (Component::Scheduler, &mut components.scheduler),
        ] {
            slot.version = plan.running(c).map(str::to_string);
        }
    }
    // The backup controller's condition is its own to write: a copy read
    // before its last write would put back what it replaced.
    let mut conditions: Vec<_> = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.type_ != crate::backup::scheduled::BACKUP_READY
                && c.type_ != crate::backup::restore::RESTORED
        })
        .collect();
    let mut set = |type_: &'static str,
                   ok: bool,
                   reason_ok: &'static str,
                   reason_bad: &'static str,
                   message: String| {
        conditions::set(
            &mut conditions,
            Desired {
                type_,
                status: ok.into(),
                reason: if ok { reason_ok } else { reason_bad },
                message,
            },
            generation,
            now,
        );
        ok
    };
    let ok_of =
        |c: &ComponentStatus| c.ready_replicas >= c.desired_replicas && c.desired_replicas > 0;
    let etcd_ok = match observed.etcd {
        Some(r) => set(
            ETCD_READY,
            r.condition.ready,
            r.condition.reason,
            r.condition.reason,
            r.condition.message.clone(),
        ),
        None => set(
            ETCD_READY,
            ok_of(&components.etcd),
            "MembersReady",
            "MembersNotReady",
            format!("{} etcd members ready", components.etcd.ready),
        ),
    };
    // Not part of readiness: members sharing a node still serve.
    if let Some(r) = observed.etcd {
        set(
            ETCD_SPREAD,
            r.spread.ready,
            r.spread.reason,
            r.spread.reason,
            r.spread.message.clone(),
        );
    }
    // The rollout's own rule, not a second reading of etcd's health.
    let api_waits = crate::control_plane::apiserver_waits(
        observed.apiserver,
        observed.etcd.map_or(0, |r| r.ready),
    );
    let api_ok = if let Some(held) = observed.apiserver_files_held {
        set(
            APISERVER_READY,
            false,
            held.reason,
            held.reason,
            format!(
                "{}; kube-apiserver runs on with the files it had",
                held.message
            ),
        )
    } else if api_waits {
        set(
            APISERVER_READY,
            false,
            "ReplicasReady",
            "WaitingForEtcd",
            "kube-apiserver is created once an etcd member serves".into(),
        )
    } else {
        set(
            APISERVER_READY,
            ok_of(&components.api_server),
            "ReplicasReady",
            "ReplicasNotReady",
            format!(
                "{} kube-apiserver replicas ready",
                components.api_server.ready
            ),
        )
    };
    let cm_ok = set(
        CONTROLLER_MANAGER_READY,
        ok_of(&components.controller_manager),
        "ReplicasReady",
        "ReplicasNotReady",
        format!(
            "{} kube-controller-manager replicas ready",
            components.controller_manager.ready
        ),
    );
    let sched_ok = set(
        SCHEDULER_READY,
        ok_of(&components.scheduler),
        "ReplicasReady",
        "ReplicasNotReady",
        format!(
            "{} kube-scheduler replicas ready",
            components.scheduler.ready
        ),
    );
    let certs_ok = match &observed.certificates_held {
        Some((reason, message)) if observed.certificates_error.is_none() => {
            set(CERTIFICATES_READY, false, reason, reason, message.clone())
        }
        _ => set(
            CERTIFICATES_READY,
            observed.certificates_error.is_none(),
            "Issued",
            "IssueFailed",
            observed
                .certificates_error
                .clone()
                .unwrap_or_else(|| "every certificate is issued and current".into()),
        ),
    };
    let addons_ok = match &observed.addons {
        Some(report) => set(
            ADDONS_READY,
            report.ready,
            report.reason,
            report.reason,
            report.message.clone(),
        ),
        None => set(
            ADDONS_READY,
            false,
            "Applied",
            "WaitingForAPIServer",
            "add-ons are applied once the API server is ready".into(),
        ),
    };
    let all = etcd_ok && api_ok && cm_ok && sched_ok && certs_ok && addons_ok;
    let not_ready: Vec<&str> = [
        (ETCD_READY, etcd_ok),
        (APISERVER_READY, api_ok),
        (CONTROLLER_MANAGER_READY, cm_ok),
        (SCHEDULER_READY, sched_ok),
        (CERTIFICATES_READY, certs_ok),
        (ADDONS_READY, addons_ok),
    ]
    .iter()
    .filter(|(_, ok)| !ok)
    .map(|(t, _)| *t)
    .collect();
    set(
        READY,
        all,
        "AllComponentsReady",
        "ComponentsNotReady",
        if all {
            "the control plane is ready".into()
        } else {
            format!("not ready: {}", not_ready.join(", "))
        },
    );

    if let Some(plan) = observed.upgrade {
        let (status, reason) = match (&plan.refused, plan.upgrading) {
            (Some(_), _) => (Status::False, "VersionChangeRefused"),
            (None, true) => (Status::True, crate::control_plane::upgrade::UPGRADING),
            (None, false) => (Status::False, "UpToDate"),
        };
        conditions::set(
            &mut conditions,
            Desired {
                type_: PROGRESSING,
                status,
                reason,
                message: plan.message.clone(),
            },
            generation,
            now,
        );
    }

    let previous_phase = cluster.status.as_ref().and_then(|s| s.phase);
    let ever_ready = matches!(
        previous_phase,
        Some(ClusterPhase::Running) | Some(ClusterPhase::Upgrading) | Some(ClusterPhase::Degraded)
    );
    let upgrading = match observed.upgrade {
        Some(plan) => plan.upgrading,
        None => [
            &components.api_server,
            &components.controller_manager,
            &components.scheduler,
        ]
        .iter()
        .any(|c| c.version.is_none() && c.ready_replicas > 0),
    };
    let refused = observed.upgrade.is_some_and(|p| p.refused.is_some());
    let phase = if cluster.spec.paused {
        ClusterPhase::Paused
    } else if observed.certificates_error.is_some() || refused {
        ClusterPhase::Failed
    } else if ever_ready && upgrading {
        ClusterPhase::Upgrading
    } else if all {
        ClusterPhase::Running
    } else if ever_ready {
        ClusterPhase::Degraded
    } else {
        ClusterPhase::Provisioning
    };
    let members = match observed.etcd {
        Some(r) => r.members.clone(),
        None => observed
            .etcd_pods
            .iter()
            .map(|p| {
                let name = p.metadata.name.clone().unwrap_or_default();
                EtcdMemberStatus {
                    peer_url: names.etcd_peer_url(&name),
                    name,
                    id: None,
                    healthy: pod_ready(p),
                    learner: false,
                }
            })
            .collect(),
    };
    ClusterStatus {
        observed_generation: generation,
        phase: Some(phase),
        conditions,
        components: Some(components),
        etcd_members: members,
        // Written by the etcd step under its own field manager.
        etcd_change: None,
        endpoint: Some(observed.endpoint.clone()),
        admin_kubeconfig_secret: Some(names.kubeconfig_secret("admin")),
        certificates_expire_at: observed.certificates_expire_at.map(Time),
        // Written by the PKI step under its own field manager.
        certificate_authorities: None,
        // Written by the key rotation under its own field manager.
        encryption_key_rotation: None,
        // Written by the backup controller under its own field manager.
        backup: None,
        // Written by the restore step under its own field manager.
        restore: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use kube_on_kube_api::cluster::ClusterMode;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.metadata.generation = Some(2);
        c.spec.mode = ClusterMode::Minimal;
        c
    }

    fn ready_pod(name: &str, ready: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    fn deployment(ready: i32) -> Deployment {
        Deployment {
            status: Some(DeploymentStatus {
                ready_replicas: Some(ready),
                updated_replicas: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn all_ready_is_running_and_ready() {
        let c = cluster();
        let n = Names::new(&c, "cluster.local");
        let pods = [ready_pod("ci-etcd-0", true)];
        let d = deployment(1);
        let s = build(
            &c,
            &n,
            &Observed {
                etcd_pods: &pods,
                apiserver: Some(&d),
                controller_manager: Some(&d),
                scheduler: Some(&d),
                endpoint: "https://x:6443".into(),
                certificates_expire_at: None,
                certificates_error: None,
                certificates_held: None,
                apiserver_files_held: None,
                addons: Some(crate::addon_retry::Report {
                    ready: true,
                    reason: "Applied",
                    message: "applied: bootstrap@0.1.0".into(),
                }),
                version: "1.35.4",
                etcd_version: "3.6.16",
                upgrade: None,
                etcd: None,
            },
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.phase, Some(ClusterPhase::Running));
        assert!(kok_common::conditions::is_true(&s.conditions, READY));
        assert_eq!(
            s.components
                .expect("components")
                .api_server
                .version
                .as_deref(),
            Some("1.35.4")
        );
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(
            s.admin_kubeconfig_secret.as_deref(),
            Some("ci-admin-kubeconfig")
        );
    }

    #[test]
    fn a_held_authority_is_the_certificates_condition_and_degrades_a_running_cluster() {
        let mut c = cluster();
        c.status = Some(ClusterStatus {
            phase: Some(ClusterPhase::Running),
            ..Default::default()
        });
        let n = Names::new(&c, "cluster.local");
        let pods = [ready_pod("ci-etcd-0", true)];
        let d = deployment(1);
        let s = build(
            &c,
            &n,
            &Observed {
                etcd_pods: &pods,
                apiserver: Some(&d),
                controller_manager: Some(&d),
                scheduler: Some(&d),
                endpoint: "https://x:6443".into(),
                certificates_expire_at: None,
                certificates_error: None,
                certificates_held: Some((
                    "CertificateAuthorityMissing",
                    "Secret ci-ca … is missing".into(),
                )),
                apiserver_files_held: None,
                addons: None,
                version: "1.35.4",
                etcd_version: "3.6.16",
                upgrade: None,
                etcd: None,
            },
            Timestamp::UNIX_EPOCH,
        );
        let certs = s
            .conditions
            .iter()
            .find(|c| c.type_ == CERTIFICATES_READY)
            .expect("CertificatesReady");
        assert_eq!(
            (certs.status.as_str(), certs.reason.as_str()),
            ("False", "CertificateAuthorityMissing")
        );
        assert_eq!(certs.message, "Secret ci-ca … is missing");
        assert_eq!(s.phase, Some(ClusterPhase::Degraded));
        assert!(!kok_common::conditions::is_true(&s.conditions, READY));
        assert!(kok_common::conditions::is_true(
            &s.conditions,
            APISERVER_READY
        ));
    }

    #[test]
    fn held_apiserver_files_are_the_apiserver_condition() {
        let c = cluster();
        let n = Names::new(&c, "cluster.local");
        let pods = [ready_pod("ci-etcd-0", true)];
        let d = deployment(1);
        let held = crate::apiserver_files::Held {
            reason: "AuditPolicyRefused",
            message: "ConfigMap policy key policy.yaml: not YAML".into(),
        };
        let s = build(
            &c,
            &n,
            &Observed {
                etcd_pods: &pods,
                apiserver: Some(&d),
                controller_manager: Some(&d),
                scheduler: Some(&d),
                endpoint: "https://x:6443".into(),
                certificates_expire_at: None,
                certificates_error: None,
                certificates_held: None,
                apiserver_files_held: Some(&held),
                addons: None,
                version: "1.35.4",
                etcd_version: "3.6.16",
                upgrade: None,
                etcd: None,
            },
            Timestamp::UNIX_EPOCH,
        );
        let api = s
            .conditions
            .iter()
            .find(|c| c.type_ == APISERVER_READY)
            .expect("APIServerReady");
        assert_eq!(
            (api.status.as_str(), api.reason.as_str()),
            ("False", "AuditPolicyRefused")
        );
        assert!(
            api.message
                .starts_with("ConfigMap policy key policy.yaml: not YAML; ")
        );
        assert!(!kok_common::conditions::is_true(&s.conditions, READY));
    }

    #[test]
    fn missing_parts_are_named_in_ready() {
        let c = cluster();
        let n = Names::new(&c, "cluster.local");
        let pods = [ready_pod("ci-etcd-0", false)];
        let s = build(
            &c,
            &n,
            &Observed {
                etcd_pods: &pods,
                apiserver: None,
                controller_manager: None,
                scheduler: None,
                endpoint: "https://x:6443".into(),
                certificates_expire_at: None,
                certificates_error: None,
                certificates_held: None,
                apiserver_files_held: None,
                addons: None,
                version: "1.35.4",
                etcd_version: "3.6.16",
                upgrade: None,
                etcd: None,
            },
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.phase, Some(ClusterPhase::Provisioning));
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
            .expect("ready");
        assert_eq!(ready.status, "False");
        assert!(
            ready.message.contains("EtcdReady") && ready.message.contains("AddonsReady"),
            "{}",
            ready.message
        );
        assert!(!s.etcd_members[0].healthy);
        let api = s
            .conditions
            .iter()
            .find(|c| c.type_ == APISERVER_READY)
            .expect("APIServerReady");
        assert_eq!(api.reason, "WaitingForEtcd", "{}", api.message);
    }
}
