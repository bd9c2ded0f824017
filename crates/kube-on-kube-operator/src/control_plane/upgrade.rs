//! Ordered, gated control-plane upgrades, as pure planning: given what runs
//! (the live Deployments and whether etcd is settled) and what the spec asks
//! for, which image each stateless component's template gets now. etcd goes
//! first, then kube-apiserver, kube-controller-manager and kube-scheduler, then
//! the add-ons; each only once everything before it is fully rolled out at its
//! desired version and healthy. A component that must wait keeps the image it
//! runs, and a version change that skips a Kubernetes minor version is refused
//! with nothing rolled.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kok_common::conditions::Status;

use crate::names::{Component, display_name};
use crate::versions::{check_version_change, image_version};

/// The stateless components, in the order they are upgraded.
pub const ORDER: [Component; 3] = [
    Component::ApiServer,
    Component::ControllerManager,
    Component::Scheduler,
];

/// Reason of the `Progressing` condition while an upgrade runs; a Cluster whose
/// condition has it is upgrading (it survives operator restarts).
pub const UPGRADING: &str = "Upgrading";

/// How far a Deployment's rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Replicas the spec asks for.
    pub desired: i32,
    /// Replicas of the current template.
    pub updated: i32,
    /// Ready replicas (of any template).
    pub ready: i32,
    /// Whether the rollout is complete: the controller saw the latest spec,
    /// every replica runs the current template and is ready, and no Pod of an
    /// older template is left (not even one shutting down).
    pub settled: bool,
}

/// The rollout state of a live Deployment; `terminating` counts its Pods that
/// are shutting down (old replicas still draining).
pub fn rollout(deployment: &Deployment, terminating: usize) -> Rollout {
    let desired = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let status = deployment.status.clone().unwrap_or_default();
    let updated = status.updated_replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let observed = status.observed_generation.is_some()
        && status.observed_generation == deployment.metadata.generation;
    let settled = observed
        && updated == desired
        && ready == desired
        && available == desired
        && total == desired
        && terminating == 0;
    Rollout {
        desired,
        updated,
        ready,
        settled,
    }
}

/// The image of a Deployment's first container.
pub fn template_image(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

/// What runs of one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    /// Image of the live Deployment's template.
    pub image: String,
    pub rollout: Rollout,
}

impl Live {
    /// Read a live Deployment; None when it has no image (not ours).
    pub fn of(deployment: &Deployment, terminating: usize) -> Option<Live> {
        Some(Live {
            image: template_image(deployment)?,
            rollout: rollout(deployment, terminating),
        })
    }
}

/// One component's part of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub component: Component,
    /// Image and version the spec asks for.
    pub desired_image: String,
    pub desired_version: String,
    /// What runs now; None before the component was ever created.
    pub live: Option<Live>,
}

impl Step {
    /// The version the live template runs: from its image tag, or the desired
    /// version when the live image is the desired one (custom images).
    pub fn live_version(&self) -> Option<String> {
        let live = self.live.as_ref()?;
        image_version(&live.image)
            .or_else(|| (live.image == self.desired_image).then(|| self.desired_version.clone()))
    }

    fn at_desired(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|l| l.image == self.desired_image)
    }

    fn settled_at_desired(&self) -> bool {
        self.live
            .as_ref()
            .is_some_and(|l| l.image == self.desired_image && l.rollout.settled)
    }
}

/// What happens to one component's template in this reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It does not exist yet: created at the desired version, no gate (a new
    /// cluster starts everything together).
    Create,
    /// Its template already has the desired image.
    Keep,
    /// Everything before it is settled: it rolls to the desired image now.
    Roll,
    /// Something before it is not settled yet (or the change was refused): it
    /// keeps the image it runs.
    Hold,
}

/// Inputs of the plan.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// Whether etcd runs its desired version on every member, all healthy.
    pub etcd_settled: bool,
    /// The etcd version asked for, for messages.
    pub etcd_version: String,
    /// The stateless components in [`ORDER`].
    pub steps: Vec<Step>,
    /// Whether the previous reconcile reported an upgrade in progress.
    pub was_upgrading: bool,
}

/// The decision for every component and what status and Events should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Per component in [`ORDER`]: the decision and the image its template gets.
    pub templates: Vec<(Component, Decision, String)>,
    /// An upgrade is in progress (some component is not yet settled at its
    /// desired version, and it was or is being moved from another one).
    pub upgrading: bool,
    /// What the upgrade is doing, for the `Progressing` condition.
    pub message: String,
    /// Why the version change was refused; nothing is rolled then.
    pub refused: Option<String>,
    /// Per component in [`ORDER`]: the version every replica runs, None while
    /// a rollout mixes templates (or before it exists).
    pub running: Vec<(Component, Option<String>)>,
    /// Whether the add-ons may be applied now (no upgrade or refusal pending:
    /// they follow the control plane).
    pub addons: bool,
}

impl Plan {
    /// The image the template of `component` gets.
    pub fn image(&self, component: Component) -> Option<&str> {
        self.templates
            .iter()
            .find(|(c, _, _)| *c == component)
            .map(|(_, _, image)| image.as_str())
    }

    /// The version `component` runs on every replica, if one does.
    pub fn running(&self, component: Component) -> Option<&str> {
        self.running
            .iter()
            .find(|(c, _)| *c == component)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// The refusal of a version change, if any component's desired version skips
/// a minor version from (or goes back behind) the version it runs.
pub fn refusal(steps: &[Step]) -> Option<String> {
    steps.iter().find_map(|step| {
        let from = step.live_version()?;
        check_version_change(&from, &step.desired_version)
            .err()
            .map(|e| format!("{}: {e}", display_name(step.component)))
    })
}

/// Decide every component's template.
pub fn plan(inputs: &Inputs) -> Plan {
    let refused = refusal(&inputs.steps);
    let mut gate = inputs.etcd_settled && refused.is_none();
    let mut templates = Vec::new();
    for step in &inputs.steps {
        let (decision, image) = match &step.live {
            None => (Decision::Create, step.desired_image.clone()),
            Some(live) if live.image == step.desired_image => {
                (Decision::Keep, step.desired_image.clone())
            }
            Some(_) if gate => (Decision::Roll, step.desired_image.clone()),
            Some(live) => (Decision::Hold, live.image.clone()),
        };
        gate = gate && decision == Decision::Keep && step.settled_at_desired();
        templates.push((step.component, decision, image));
    }
    let moving = templates
        .iter()
        .any(|(_, d, _)| matches!(d, Decision::Roll | Decision::Hold));
    let all_settled = inputs.etcd_settled && inputs.steps.iter().all(Step::settled_at_desired);
    let upgrading = refused.is_none() && (moving || (inputs.was_upgrading && !all_settled));
    let message = match &refused {
        Some(reason) => format!("version change refused: {reason}"),
        None if upgrading => progress_message(inputs, &templates),
        None => "every component runs its desired version".to_string(),
    };
    let running = running(&inputs.steps);
    Plan {
        templates,
        upgrading,
        message,
        addons: refused.is_none() && !upgrading,
        refused,
        running,
    }
}

/// Per component: the version every replica of its live Deployment runs,
/// None while a rollout mixes templates (or before it exists).
pub fn running(steps: &[Step]) -> Vec<(Component, Option<String>)> {
    steps
        .iter()
        .map(|s| {
            let version = s
                .live
                .as_ref()
                .filter(|l| l.rollout.settled)
                .and_then(|_| s.live_version());
            (s.component, version)
        })
        .collect()
}

fn progress_message(inputs: &Inputs, templates: &[(Component, Decision, String)]) -> String {
    for (step, (_, decision, _)) in inputs.steps.iter().zip(templates) {
        let name = display_name(step.component);
        let version = &step.desired_version;
        let rollout = step.live.as_ref().map(|l| l.rollout);
        match decision {
            Decision::Hold if !inputs.etcd_settled => {
                return format!(
                    "upgrading etcd to {} (waiting for every member to run it and be healthy) before {name}",
                    inputs.etcd_version
                );
            }
            Decision::Hold | Decision::Create => {
                return format!("waiting for {name} to be created before upgrading");
            }
            Decision::Roll => {
                let desired = rollout.map_or(0, |r| r.desired);
                return format!("upgrading {name} to v{version} (0/{desired} updated)");
            }
            Decision::Keep if !step.settled_at_desired() => {
                let (updated, desired) = rollout.map_or((0, 0), |r| (r.updated, r.desired));
                return format!("upgrading {name} to v{version} ({updated}/{desired} updated)");
            }
            Decision::Keep => {}
        }
    }
    if !inputs.etcd_settled {
        return format!(
            "upgrading etcd to {} (waiting for every member to run it and be healthy)",
            inputs.etcd_version
        );
    }
    "upgrade rolled out; waiting for every component to be healthy".to_string()
}

/// Whether etcd is settled, judged from its member Pods alone: `members` Pods,
/// every one Ready, running `image`, none shutting down.
pub fn etcd_settled_by_pods(pods: &[Pod], image: &str, members: usize) -> bool {
    let current: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    current.len() == members
        && current.len() == pods.len()
        && current.iter().all(|p| {
            let spec_image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.as_deref());
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Ready" && c.status == Status::True)
                });
            spec_image == Some(image) && ready
        })
}

/// An Event to publish: reason, action and note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub reason: &'static str,
    /// Events of one reason and action are counted as one series (the note
    /// of the first is kept), so what differs per component is in it.
    pub action: &'static str,
    pub note: String,
}

/// The action of a component's own upgrade Events.
pub fn upgrade_action(component: Component) -> &'static str {
    match component {
        Component::Etcd => "UpgradeEtcd",
        Component::ApiServer => "UpgradeKubeAPIServer",
        Component::ControllerManager => "UpgradeKubeControllerManager",
        Component::Scheduler => "UpgradeKubeScheduler",
        Component::NodeOperator => "UpgradeNodeOperator",
        Component::SnapshotGateway => "UpgradeSnapshotGateway",
    }
}

/// The Events a plan calls for, given the versions the previous status
/// reported per component (in [`ORDER`]).
pub fn events(
    inputs: &Inputs,
    after: &[Step],
    plan: &Plan,
    previous: &[Option<String>],
) -> Vec<Note> {
    let mut out = Vec::new();
    if plan.upgrading && !inputs.was_upgrading {
        let from: Vec<String> = inputs
            .steps
            .iter()
            .filter(|s| s.live.is_some() && !s.at_desired())
            .filter_map(|s| {
                s.live_version()
                    .map(|v| format!("{} v{v}", display_name(s.component)))
            })
            .collect();
        let to = inputs
            .steps
            .first()
            .map(|s| s.desired_version.clone())
            .unwrap_or_default();
        out.push(Note {
            reason: "UpgradeStarted",
            action: "Upgrade",
            note: format!(
                "upgrading the control plane to v{to} (from {})",
                if from.is_empty() {
                    "the running versions".to_string()
                } else {
                    from.join(", ")
                }
            ),
        });
    }
    if inputs.was_upgrading {
        // The status reports a component's version from the Deployments as
        // the applies left them: a component is announced by the same
        // reading, or its announcement could be missed.
        for (i, step) in after.iter().enumerate() {
            let before = previous.get(i).cloned().flatten();
            if step.settled_at_desired() && before.as_deref() != Some(&step.desired_version) {
                let replicas = step.live.as_ref().map_or(0, |l| l.rollout.desired);
                out.push(Note {
                    reason: "ComponentUpgraded",
                    action: upgrade_action(step.component),
                    note: format!(
                        "{} runs v{} on {replicas}/{replicas} replicas",
                        display_name(step.component),
                        step.desired_version
                    ),
                });
            }
        }
        if !plan.upgrading && plan.refused.is_none() {
            out.push(Note {
                reason: "UpgradeCompleted",
                action: "Upgrade",
                note: format!(
                    "the control plane runs v{}",
                    inputs
                        .steps
                        .first()
                        .map(|s| s.desired_version.as_str())
                        .unwrap_or_default()
                ),
            });
        }
    }
    if let Some(reason) = &plan.refused {
        out.push(Note {
            reason: "UpgradeRefused",
            action: "Upgrade",
            note: reason.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const OLD: &str = "registry.k8s.io/kube-apiserver:v1.35.3";

    fn image(component: Component, version: &str) -> String {
        format!("registry.k8s.io/{}:v{version}", display_name(component))
    }

    fn settled(desired: i32) -> Rollout {
        Rollout {
            desired,
            updated: desired,
            ready: desired,
            settled: true,
        }
    }

    fn rolling(desired: i32, updated: i32) -> Rollout {
        Rollout {
            desired,
            updated,
            ready: desired,
            settled: false,
        }
    }

    /// Every component live at `live` with `rollouts`, the spec asking for `to`.
    fn inputs(live: &[(&str, Rollout)], to: &str, etcd_settled: bool) -> Inputs {
        Inputs {
            etcd_settled,
            etcd_version: "3.6.16".into(),
            steps: ORDER
                .iter()
                .zip(live)
                .map(|(c, (version, rollout))| Step {
                    component: *c,
                    desired_image: image(*c, to),
                    desired_version: to.into(),
                    live: Some(Live {
                        image: image(*c, version),
                        rollout: *rollout,
                    }),
                })
                .collect(),
            was_upgrading: false,
        }
    }

    fn decisions(plan: &Plan) -> Vec<Decision> {
        plan.templates.iter().map(|(_, d, _)| *d).collect()
    }

    #[test]
    fn nothing_to_do_when_everything_runs_the_desired_version() {
        let i = inputs(&[("1.35.4", settled(3)); 3], "1.35.4", true);
        let p = plan(&i);
        assert_eq!(decisions(&p), vec![Decision::Keep; 3]);
        assert!(!p.upgrading && p.addons && p.refused.is_none());
        assert_eq!(p.running(Component::Scheduler), Some("1.35.4"));
        assert!(events(&i, &i.steps, &p, &[None, None, None]).is_empty());
    }

    #[test]
    fn a_new_cluster_creates_everything_at_once_without_gates() {
        let mut i = inputs(&[("1.35.4", settled(3)); 3], "1.35.4", false);
        for s in &mut i.steps {
            s.live = None;
        }
        let p = plan(&i);
        assert_eq!(decisions(&p), vec![Decision::Create; 3]);
        assert!(!p.upgrading);
        assert_eq!(
            p.image(Component::Scheduler),
            Some(image(Component::Scheduler, "1.35.4").as_str())
        );
        assert_eq!(p.running(Component::ApiServer), None);
    }

    #[test]
    fn the_apiserver_waits_for_etcd() {
        let i = inputs(&[("1.35.3", settled(3)); 3], "1.35.4", false);
        let p = plan(&i);
        assert_eq!(decisions(&p), vec![Decision::Hold; 3]);
        assert_eq!(p.image(Component::ApiServer), Some(OLD));
        assert!(p.upgrading && !p.addons);
        assert!(p.message.contains("etcd"), "{}", p.message);
    }

    #[test]
    fn components_roll_strictly_in_order() {
        // etcd settled: the apiserver rolls, the rest keep their images.
        let i = inputs(&[("1.35.3", settled(3)); 3], "1.35.4", true);
        let p = plan(&i);
        assert_eq!(
            decisions(&p),
            vec![Decision::Roll, Decision::Hold, Decision::Hold]
        );
        assert_eq!(
            p.image(Component::ControllerManager),
            Some(image(Component::ControllerManager, "1.35.3").as_str())
        );
        assert_eq!(
            p.message,
            "upgrading kube-apiserver to v1.35.4 (0/3 updated)"
        );
        // The apiserver is half way: still nobody else moves.
        let mut i = inputs(
            &[
                ("1.35.4", rolling(3, 2)),
                ("1.35.3", settled(3)),
                ("1.35.3", settled(3)),
            ],
            "1.35.4",
            true,
        );
        i.was_upgrading = true;
        let p = plan(&i);
        assert_eq!(
            decisions(&p),
            vec![Decision::Keep, Decision::Hold, Decision::Hold]
        );
        assert_eq!(
            p.message,
            "upgrading kube-apiserver to v1.35.4 (2/3 updated)"
        );
        assert_eq!(p.running(Component::ApiServer), None, "mixed versions");
        assert_eq!(p.running(Component::Scheduler), Some("1.35.3"));
        // The apiserver settled: the controller-manager rolls, the scheduler waits.
        let mut i = inputs(
            &[
                ("1.35.4", settled(3)),
                ("1.35.3", settled(3)),
                ("1.35.3", settled(3)),
            ],
            "1.35.4",
            true,
        );
        i.was_upgrading = true;
        let p = plan(&i);
        assert_eq!(
            decisions(&p),
            vec![Decision::Keep, Decision::Roll, Decision::Hold]
        );
        let notes = events(
            &i,
            &i.steps,
            &p,
            &[None, Some("1.35.3".into()), Some("1.35.3".into())],
        );
        assert_eq!(
            notes,
            vec![Note {
                reason: "ComponentUpgraded",
                action: "UpgradeKubeAPIServer",
                note: "kube-apiserver runs v1.35.4 on 3/3 replicas".into()
            }]
        );
        // The controller-manager rolled but is not settled: the scheduler waits.
        let mut i = inputs(
            &[
                ("1.35.4", settled(3)),
                ("1.35.4", rolling(3, 3)),
                ("1.35.3", settled(3)),
            ],
            "1.35.4",
            true,
        );
        i.was_upgrading = true;
        assert_eq!(
            decisions(&plan(&i)),
            vec![Decision::Keep, Decision::Keep, Decision::Hold]
        );
    }

    #[test]
    fn the_upgrade_ends_when_the_last_component_settles() {
        // The scheduler has the new template but is still rolling: upgrading,
        // add-ons wait.
        let mut i = inputs(
            &[
                ("1.35.4", settled(3)),
                ("1.35.4", settled(3)),
                ("1.35.4", rolling(3, 1)),
            ],
            "1.35.4",
            true,
        );
        i.was_upgrading = true;
        let p = plan(&i);
        assert!(p.upgrading && !p.addons);
        assert_eq!(
            p.message,
            "upgrading kube-scheduler to v1.35.4 (1/3 updated)"
        );
        // Settled: done, add-ons follow.
        let mut i = inputs(&[("1.35.4", settled(3)); 3], "1.35.4", true);
        i.was_upgrading = true;
        let p = plan(&i);
        assert!(!p.upgrading && p.addons);
        let reasons: Vec<_> = events(
            &i,
            &i.steps,
            &p,
            &[Some("1.35.4".into()), Some("1.35.4".into()), None],
        )
        .into_iter()
        .map(|n| n.reason)
        .collect();
        assert_eq!(reasons, vec!["ComponentUpgraded", "UpgradeCompleted"]);
    }

    #[test]
    fn a_component_is_announced_when_its_applied_deployment_settles() {
        // Read before the applies, the scheduler still rolled; its apply
        // answered settled, and that is the version the status reports: the
        // announcement goes with it, or the next pass would find the status
        // already at the new version and never make it.
        let mut i = inputs(
            &[
                ("1.35.4", settled(3)),
                ("1.35.4", settled(3)),
                ("1.35.4", rolling(3, 3)),
            ],
            "1.35.4",
            true,
        );
        i.was_upgrading = true;
        let p = plan(&i);
        let previous = [Some("1.35.4".into()), Some("1.35.4".into()), None];
        assert!(events(&i, &i.steps, &p, &previous).is_empty());
        let mut after = i.steps.clone();
        after[2].live.as_mut().expect("live").rollout = settled(3);
        let notes = events(&i, &after, &p, &previous);
        assert_eq!(
            notes.iter().map(|n| n.note.as_str()).collect::<Vec<_>>(),
            ["kube-scheduler runs v1.35.4 on 3/3 replicas"]
        );
    }

    #[test]
    fn starting_an_upgrade_is_announced_once() {
        let i = inputs(&[("1.35.3", settled(3)); 3], "1.35.4", true);
        let p = plan(&i);
        let notes = events(&i, &i.steps, &p, &vec![Some("1.35.3".into()); 3]);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].reason, "UpgradeStarted");
        assert!(notes[0].note.contains("to v1.35.4"), "{}", notes[0].note);
        assert!(
            notes[0].note.contains("kube-apiserver v1.35.3"),
            "{}",
            notes[0].note
        );
        let mut again = i.clone();
        again.was_upgrading = true;
        assert!(
            events(
                &again,
                &again.steps,
                &plan(&again),
                &vec![Some("1.35.3".into()); 3]
            )
            .is_empty()
        );
    }

    #[test]
    fn a_skipped_minor_version_is_refused_and_nothing_rolls() {
        let i = inputs(&[("1.34.2", settled(3)); 3], "1.36.0", true);
        let p = plan(&i);
        assert_eq!(decisions(&p), vec![Decision::Hold; 3]);
        assert_eq!(
            p.image(Component::ApiServer),
            Some(image(Component::ApiServer, "1.34.2").as_str())
        );
        let reason = p.refused.clone().expect("refused");
        assert!(reason.starts_with("kube-apiserver: "), "{reason}");
        assert!(!p.upgrading && !p.addons);
        assert_eq!(
            events(&i, &i.steps, &p, &[None, None, None])
                .iter()
                .map(|n| n.reason)
                .collect::<Vec<_>>(),
            vec!["UpgradeRefused"]
        );
    }

    #[test]
    fn a_configuration_rollout_is_not_an_upgrade() {
        // Certificates rotated: every component rolls its pods at the same
        // image; no gate holds anything back and nothing calls it an upgrade.
        let i = inputs(&[("1.35.4", rolling(3, 1)); 3], "1.35.4", true);
        let p = plan(&i);
        assert_eq!(decisions(&p), vec![Decision::Keep; 3]);
        assert!(!p.upgrading && p.addons);
    }

    fn deployment(
        generation: i64,
        observed: i64,
        replicas: i32,
        updated: i32,
        ready: i32,
    ) -> Deployment {
        Deployment {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(3),
                template: k8s_openapi::api::core::v1::PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            image: Some(OLD.into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(observed),
                replicas: Some(replicas),
                updated_replicas: Some(updated),
                ready_replicas: Some(ready),
                available_replicas: Some(ready),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_rollout_is_settled_only_when_complete_and_clean() {
        assert!(rollout(&deployment(2, 2, 3, 3, 3), 0).settled);
        assert!(
            !rollout(&deployment(3, 2, 3, 3, 3), 0).settled,
            "spec not seen yet"
        );
        assert!(
            !rollout(&deployment(2, 2, 4, 3, 4), 0).settled,
            "an old replica is left"
        );
        assert!(
            !rollout(&deployment(2, 2, 3, 2, 3), 0).settled,
            "one not updated"
        );
        assert!(
            !rollout(&deployment(2, 2, 3, 3, 2), 0).settled,
            "one not ready"
        );
        assert!(
            !rollout(&deployment(2, 2, 3, 3, 3), 1).settled,
            "an old pod drains"
        );
        let live = Live::of(&deployment(2, 2, 3, 3, 3), 0).expect("live");
        assert_eq!(live.image, OLD);
    }

    fn etcd_pod(image: &str, ready: bool, deleting: bool) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                deletion_timestamp: deleting
                    .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn etcd_is_settled_when_every_member_is_ready_at_the_image() {
        let new = "r/etcd:3.6.16-0";
        let old = "r/etcd:3.6.15-0";
        let ok = vec![etcd_pod(new, true, false); 3];
        assert!(etcd_settled_by_pods(&ok, new, 3));
        assert!(!etcd_settled_by_pods(&ok[..2], new, 3), "a member missing");
        let mut one_old = ok.clone();
        one_old[1] = etcd_pod(old, true, false);
        assert!(!etcd_settled_by_pods(&one_old, new, 3));
        let mut unready = ok.clone();
        unready[2] = etcd_pod(new, false, false);
        assert!(!etcd_settled_by_pods(&unready, new, 3));
        let mut deleting = ok.clone();
        deleting.push(etcd_pod(old, true, true));
        assert!(!etcd_settled_by_pods(&deleting, new, 3));
    }
}
