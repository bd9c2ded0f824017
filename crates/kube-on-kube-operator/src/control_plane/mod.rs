//! The rollout of the stateless control plane, a step of the reconcile: reads
//! the live kube-apiserver, kube-controller-manager and kube-scheduler
//! Deployments and etcd's state, asks the upgrade plan which image each template gets, and
//! applies the three Deployments (each with the hash of the Secrets it mounts,
//! so rotated certificates roll its Pods), publishing the upgrade's Events.

pub mod upgrade;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kok_common::conditions::Status;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::COMPONENT_LABEL;

use self::upgrade::{Live, Plan, Step};
use crate::Error;
use crate::applied::generation;
use crate::context::{Pass, apply_if_changed, hash_of, publish};
use crate::names::{Component, Names};
use crate::render::addons::Konnectivity;
use crate::render::control_plane::{self as render, PodInputs};
use crate::versions::Resolved;
use kube_on_kube_api::cluster::PROGRESSING;

/// What the step applied, and the plan behind it.
pub struct Outcome {
    /// None while kube-apiserver waits for etcd (see [`apiserver_waits`]).
    pub apiserver: Option<Deployment>,
    pub controller_manager: Deployment,
    pub scheduler: Deployment,
    pub plan: Plan,
}

/// The config hash a Deployment's Pods were made with.
fn live_hash(deployment: Option<&Deployment>) -> Option<String> {
    deployment?
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(crate::render::CONFIG_HASH_ANNOTATION)
        .cloned()
}

/// Secrets each component mounts (their content goes into its config hash);
/// `konnectivity` whether a konnectivity-server runs beside kube-apiserver.
fn mounted_secrets(names: &Names, component: Component, konnectivity: bool) -> Vec<String> {
    let mut secrets = match component {
        Component::ControllerManager => vec![
            names.ca_secret(),
            names.front_proxy_ca_secret(),
            names.service_account_secret(),
            names.kubeconfig_secret("controller-manager"),
        ],
        Component::Scheduler => vec![names.kubeconfig_secret("scheduler")],
        _ => vec![
            names.ca_secret(),
            names.cert_secret("apiserver-tls"),
            names.cert_secret("apiserver-etcd-client"),
            names.cert_secret("apiserver-kubelet-client"),
            names.cert_secret("front-proxy-client"),
            names.service_account_secret(),
        ],
    };
    if konnectivity && component == Component::ApiServer {
        secrets.push(names.kubeconfig_secret(render::KONNECTIVITY_IDENTITY));
    }
    secrets
}

/// kube-apiserver's encryption configuration, once it holds other keys
/// than the one every Cluster starts with (`key1`):
/// kube-apiserver reads the configuration at start only, so a rotation
/// (see [`crate::key_rotation`]) rolls it with each step, while a Cluster
/// never rotated keeps its Pods' hash.
fn rotated_keys(names: &Names, secrets: &BTreeMap<String, Secret>) -> Option<String> {
    use crate::pki::encryption::{CONFIG, KEY, Ring};
    let data = secrets.get(&names.encryption_secret())?.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let ring = Ring::parse(&text(KEY)?, &text(CONFIG)?).ok()?;
    let keys: Vec<&str> = ring.keys.iter().map(|k| k.name.as_str()).collect();
    (keys != ["key1"]).then(|| ring.config())
}

fn desired(
    cluster: &Cluster,
    names: &Names,
    component: Component,
    pod: &PodInputs<'_>,
    advertise: Option<&str>,
    konnectivity: Option<&Konnectivity>,
) -> Deployment {
    match component {
        Component::ControllerManager => render::controller_manager(cluster, names, pod),
        Component::Scheduler => render::scheduler(cluster, names, pod),
        _ => render::apiserver(cluster, names, pod, advertise, konnectivity),
    }
}

/// Whether kube-apiserver is not created yet: a new Cluster's kube-apiserver
/// is created once an etcd member serves. Started beside a member that does
/// not listen yet, its etcd client backs off between dials (1 s, 1.6 s,
/// 2.6 s, …), and a Minimal Cluster's business API answered 5-8 s after
/// etcd served; created after, it connects at its first dial (a Minimal
/// Cluster is Ready in about 6 s instead of 12). Only the first creation
/// waits: a running kube-apiserver is never taken away when etcd stops
/// serving.
pub fn apiserver_waits(live: Option<&Deployment>, etcd_serving: i32) -> bool {
    live.is_none() && etcd_serving == 0
}

/// Whether the last status said an upgrade was in progress.
fn was_upgrading(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.condition(PROGRESSING))
        .is_some_and(|c| c.status == Status::True && c.reason == upgrade::UPGRADING)
}

/// The component versions the last status reported, in [`upgrade::ORDER`].
fn previous_versions(cluster: &Cluster) -> Vec<Option<String>> {
    let components = cluster.status.as_ref().and_then(|s| s.components.as_ref());
    upgrade::ORDER
        .iter()
        .map(|c| {
            components.and_then(|cs| match c {
                Component::ControllerManager => cs.controller_manager.version.clone(),
                Component::Scheduler => cs.scheduler.version.clone(),
                _ => cs.api_server.version.clone(),
            })
        })
        .collect()
}

/// The upgrade plan's inputs from what was read.
pub fn inputs(
    cluster: &Cluster,
    names: &Names,
    resolved: &Resolved,
    deployments: &BTreeMap<String, Deployment>,
    pods: &[Pod],
    etcd_settled: bool,
) -> upgrade::Inputs {
    upgrade::Inputs {
        etcd_settled,
        etcd_version: resolved.etcd.version.clone(),
        steps: steps(resolved, pods, |c| deployments.get(&names.deployment(c))),
        was_upgrading: was_upgrading(cluster),
    }
}

/// How many of `component`'s Pods are shutting down.
fn terminating(pods: &[Pod], component: Component) -> usize {
    pods.iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_some()
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(COMPONENT_LABEL))
                    .map(String::as_str)
                    == Some(component.as_str())
        })
        .count()
}

/// Whether `deployment` of `component` has rolled out its template: every
/// replica runs it and is ready, and no Pod of an older one is left.
pub fn settled(component: Component, deployment: &Deployment, pods: &[Pod]) -> bool {
    upgrade::rollout(deployment, terminating(pods, component)).settled
}

/// Each component's step, with its live Deployment as `deployment` gives it.
fn steps<'a>(
    resolved: &Resolved,
    pods: &[Pod],
    deployment: impl Fn(Component) -> Option<&'a Deployment>,
) -> Vec<Step> {
    upgrade::ORDER
        .iter()
        .map(|&component| {
            let wanted = resolved.component(component);
            let terminating = terminating(pods, component);
            Step {
                component,
                desired_image: wanted.image.clone(),
                desired_version: wanted.version.clone(),
                live: deployment(component).and_then(|d| Live::of(d, terminating)),
            }
        })
        .collect()
}

/// What the steps before the control plane found that it depends on.
#[derive(Debug, Clone, Copy)]
pub struct Prior<'a> {
    /// etcd runs its desired version healthy on every member.
    pub etcd_settled: bool,
    /// How many etcd members serve.
    pub etcd_serving: i32,
    /// A certificate authority or the service-account key is held (see
    /// [`crate::pki::authorities`]).
    pub pki_held: bool,
    /// The tenant's kube-apiserver files are missing or refused
    /// ([`crate::apiserver_files`]): kube-apiserver's Pods keep theirs.
    pub files_held: bool,
    /// The hash of the tenant's kube-apiserver files, if it has any.
    pub files_hash: Option<&'a str>,
    /// The address kube-apiserver advertises ([`render::advertised_address`]).
    pub advertise: Option<&'a str>,
    /// The konnectivity server beside kube-apiserver, if any.
    pub konnectivity: Option<&'a Konnectivity>,
    /// etcd is being restored from a snapshot and no restored member serves
    /// yet: kube-apiserver is held at zero replicas.
    pub restoring: bool,
}

/// Plan and apply the three Deployments.
pub async fn reconcile(pass: &Pass<'_>, prior: &Prior<'_>) -> Result<Outcome, Error> {
    let Pass {
        ctx,
        cluster,
        names,
        resolved,
        secrets,
        deployments,
        pods,
        ..
    } = *pass;
    let Prior {
        etcd_settled,
        etcd_serving,
        pki_held,
        files_held,
        files_hash,
        advertise,
        konnectivity,
        restoring,
    } = *prior;
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let inputs = inputs(cluster, names, resolved, deployments, pods, etcd_settled);
    let plan = upgrade::plan(&inputs);
    let apply_one = async |component: Component| -> Result<Deployment, Error> {
        let image = plan.image(component).unwrap_or_default();
        let mut mounted = mounted_secrets(names, component, konnectivity.is_some());
        if component == Component::ApiServer && cluster.spec.api_server.kms.is_some() {
            mounted.push(names.encryption_kms_secret());
        }
        let mut hash = hash_of(secrets, &mounted, image);
        // A CA or key Secret that is held (missing or changed) would change
        // the hash and roll the component onto it: the running Pods keep
        // what they mounted instead.
        if component == Component::ApiServer
            && let Some(files) = files_hash
        {
            hash = crate::render::config_hash([
                ("mounted", hash.as_bytes()),
                ("files", files.as_bytes()),
            ]);
        }
        if component == Component::ApiServer
            && let Some(keys) = rotated_keys(names, secrets)
        {
            hash = crate::render::config_hash([
                ("mounted", hash.as_bytes()),
                ("encryption", keys.as_bytes()),
            ]);
        }
        let held = pki_held || (files_held && component == Component::ApiServer);
        if held && let Some(live) = live_hash(deployments.get(&names.deployment(component))) {
            hash = live;
        }
        let mut desired = desired(
            cluster,
            names,
            component,
            &PodInputs {
                image,
                config_hash: &hash,
            },
            advertise,
            konnectivity,
        );
        if restoring
            && component == Component::ApiServer
            && let Some(spec) = desired.spec.as_mut()
        {
            spec.replicas = Some(0);
        }
        apply_if_changed(ctx, names, &api, &desired, deployments, generation).await
    };
    let apiserver = if apiserver_waits(
        deployments.get(&names.deployment(Component::ApiServer)),
        etcd_serving,
    ) {
        None
    } else {
        Some(apply_one(Component::ApiServer).await?)
    };
    let controller_manager = apply_one(Component::ControllerManager).await?;
    let scheduler = apply_one(Component::Scheduler).await?;
    let after = steps_after_apply(
        resolved,
        names,
        deployments,
        &[
            apiserver.as_ref(),
            Some(&controller_manager),
            Some(&scheduler),
        ],
        pods,
    );
    for note in upgrade::events(&inputs, &after, &plan, &previous_versions(cluster)) {
        let type_ = if note.reason == "UpgradeRefused" {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(ctx, cluster, type_, note.reason, note.action, note.note).await;
    }
    let mut plan = plan;
    plan.running = upgrade::running(&after);
    Ok(Outcome {
        apiserver,
        controller_manager,
        scheduler,
        plan,
    })
}

/// Each component's step as the applies left it: from the Deployments they
/// returned (over those read before). The status reports readiness from the
/// applied ones, so the running versions and the Events that announce them are
/// judged from them too: a version read before the applies could lag the
/// readiness shown beside it.
fn steps_after_apply(
    resolved: &Resolved,
    names: &Names,
    read: &BTreeMap<String, Deployment>,
    applied: &[Option<&Deployment>],
    pods: &[Pod],
) -> Vec<Step> {
    let latest = |c: Component| {
        let name = names.deployment(c);
        applied
            .iter()
            .flatten()
            .find(|d| d.metadata.name.as_deref() == Some(name.as_str()))
            .copied()
            .or_else(|| read.get(&name))
    };
    steps(resolved, pods, latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::display_name;

    #[test]
    fn only_a_new_apiserver_waits_for_etcd() {
        let live = Deployment::default();
        assert!(apiserver_waits(None, 0));
        assert!(!apiserver_waits(None, 1));
        // A running kube-apiserver stays when etcd stops serving.
        assert!(!apiserver_waits(Some(&live), 0));
        assert!(!apiserver_waits(Some(&live), 3));
    }

    /// A Deployment of `component` at `version`, `ready` of 3 replicas ready.
    fn deployment(names: &Names, component: Component, version: &str, ready: i32) -> Deployment {
        use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
        use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
        let mut d = Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(3),
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            image: Some(format!(
                                "registry.k8s.io/{}:v{version}",
                                display_name(component)
                            )),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                observed_generation: Some(1),
                replicas: Some(3),
                updated_replicas: Some(3),
                ready_replicas: Some(ready),
                available_replicas: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        };
        d.metadata.name = Some(names.deployment(component));
        d.metadata.generation = Some(1);
        d
    }

    #[test]
    fn running_versions_come_from_the_applied_deployments() {
        let cluster: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        let names = Names::new(&cluster, "cluster.local");
        let version = cluster.spec.version.clone();
        // Read before the applies: kube-apiserver 2 of 3 ready, the others settled.
        let read: BTreeMap<String, Deployment> = upgrade::ORDER
            .iter()
            .map(|&c| {
                let ready = if c == Component::ApiServer { 2 } else { 3 };
                (names.deployment(c), deployment(&names, c, &version, ready))
            })
            .collect();
        let version_of = |running: &[(Component, Option<String>)], c: Component| {
            running
                .iter()
                .find(|(x, _)| *x == c)
                .and_then(|(_, v)| v.clone())
        };
        let resolved = Resolved::of(&cluster, &crate::config::Config::default());
        let before = upgrade::running(&steps_after_apply(&resolved, &names, &read, &[], &[]));
        assert_eq!(version_of(&before, Component::ApiServer), None);
        assert_eq!(
            version_of(&before, Component::Scheduler).as_deref(),
            Some(version.as_str())
        );
        // Its apply answered with all 3 ready: that is what the status shows.
        let applied = deployment(&names, Component::ApiServer, &version, 3);
        let after = upgrade::running(&steps_after_apply(
            &resolved,
            &names,
            &read,
            &[Some(&applied), None],
            &[],
        ));
        assert_eq!(
            version_of(&after, Component::ApiServer).as_deref(),
            Some(version.as_str())
        );
    }
}
