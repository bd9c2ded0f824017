//! What a Cluster spec may ask of the meta-cluster's nodes, against the real
//! API server with the operator's binary started with its flags: a hostPath
//! outside the allowed prefixes (a prefix trick, `..`, another namespace) or
//! an image outside the allowed ones gets `Allowed=False` with the flag to
//! change, a Warning Event, and no Pod or Deployment at all; an allowed one
//! runs with exactly that path and image; a running Cluster whose spec turns
//! to a refused image keeps every Pod and Deployment as they were.

use kok_test_support as common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{OperatorProcess, condition_of, event_notes, kwok_minimal_cluster, wait_cluster};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::{Cluster, ClusterStatus};
use serde_json::json;

const PREFIX: &str = "/var/lib/kok-etcd";
const REGISTRY: &str = "registry.example.com/kube/";
const CONVERGE: Duration = Duration::from_secs(180);

fn flags(ns: &str) -> Vec<String> {
    vec![
        format!("--namespace={ns}"),
        format!("--etcd-host-path-prefixes={PREFIX}"),
        format!("--allowed-image-prefixes={REGISTRY}"),
    ]
}

fn on_host_path(mut c: Cluster, path: &str) -> Cluster {
    c.spec.etcd.storage =
        serde_json::from_value(json!({"volumeSource": {"hostPath": {"path": path}}}))
            .expect("storage");
    c
}

fn refused(c: &Cluster, reason: &str) -> bool {
    condition_of(c, "Allowed").is_some_and(|(s, r, _)| s == "False" && r == reason)
}

fn control_plane_ready(c: &Cluster) -> bool {
    c.status
        .as_ref()
        .is_some_and(ClusterStatus::control_plane_ready)
}

/// The Cluster's Pods and Deployments, by name.
async fn owned(client: &kube::Client, ns: &str, name: &str) -> (Vec<Pod>, Vec<Deployment>) {
    let params = ListParams::default().labels(&format!("kubeonkube.io/cluster={name}"));
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&params)
        .await
        .expect("pods")
        .items;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&params)
        .await
        .expect("deployments")
        .items;
    (pods, deployments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disallowed_host_path_or_image_gets_the_condition_and_no_pod() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("policy-refuse").await;
    let mut operator = OperatorProcess::start(&ns, &flags(&ns));
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);

    // What a tenant might try, and what the flags allow.
    let refused_paths = [
        ("prefix-trick", format!("/var/lib/kok-etcd-evil/{ns}/data")),
        ("dot-dot", format!("{PREFIX}/{ns}/../../../../etc")),
        ("other-tenant", format!("{PREFIX}/kube-system/data")),
        ("relative", format!("var/lib/kok-etcd/{ns}/data")),
        ("bare-prefix", PREFIX.to_string()),
    ];
    for (name, path) in &refused_paths {
        api.create(
            &PostParams::default(),
            &on_host_path(kwok_minimal_cluster(&ns, name), path),
        )
        .await
        .expect("create");
    }
    let mut evil_image = kwok_minimal_cluster(&ns, "evil-image");
    evil_image.spec.api_server.component.image =
        Some("evil.example.com/kube-apiserver:v1.35.4".into());
    api.create(&PostParams::default(), &evil_image)
        .await
        .expect("create");
    let mut evil_addon = kwok_minimal_cluster(&ns, "evil-addon");
    evil_addon.spec.addons = serde_json::from_value(json!([
        {"name": "node-operator", "version": "0.1.0", "values": {"image": "registry.example.com/kubex/no:1"}}
    ]))
    .expect("addons");
    api.create(&PostParams::default(), &evil_addon)
        .await
        .expect("create");
    let good_path = format!("{PREFIX}/{ns}/good");
    let mut good = on_host_path(kwok_minimal_cluster(&ns, "good"), &format!("{good_path}/"));
    good.spec.etcd.component.image = Some(format!("{REGISTRY}etcd:3.6.16-0"));
    api.create(&PostParams::default(), &good)
        .await
        .expect("create");

    // The allowed one runs, with exactly what it asked for.
    let c = wait_cluster(
        &api,
        "good",
        "the allowed Cluster's control plane",
        CONVERGE,
        control_plane_ready,
    )
    .await;
    assert_eq!(
        condition_of(&c, "Allowed").map(|(s, r, _)| (s, r)),
        Some(("True".into(), "Allowed".into()))
    );
    let (pods, _) = owned(&client, &ns, "good").await;
    let member = pods
        .iter()
        .find(|p| p.labels().contains_key("kubeonkube.io/etcd-member"))
        .expect("an etcd member");
    let spec = member.spec.as_ref().expect("spec");
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.example.com/kube/etcd:3.6.16-0")
    );
    let data = spec
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.host_path.as_ref())
        .expect("the data hostPath");
    assert_eq!(data.path, format!("{good_path}/{}", member.name_any()));

    // The refused ones: the condition names the field and the flag, an
    // Event says the same, and nothing of them exists.
    for (name, path) in &refused_paths {
        let c = wait_cluster(&api, name, "the hostPath refusal", CONVERGE, |c| {
            refused(c, "HostPathNotAllowed")
        })
        .await;
        let (_, _, message) = condition_of(&c, "Allowed").expect("condition");
        assert!(
            message.contains("spec.etcd.storage.volumeSource.hostPath.path")
                && message.contains(path.as_str())
                && message.contains("--etcd-host-path-prefixes"),
            "{name}: {message}"
        );
        assert_eq!(
            c.status.as_ref().and_then(|s| s.phase),
            Some(kube_on_kube_api::cluster::ClusterPhase::Failed)
        );
    }
    for (name, field) in [
        ("evil-image", "spec.apiServer.image"),
        ("evil-addon", "spec.addons[node-operator].values.image"),
    ] {
        let c = wait_cluster(&api, name, "the image refusal", CONVERGE, |c| {
            refused(c, "ImageNotAllowed")
        })
        .await;
        let (_, _, message) = condition_of(&c, "Allowed").expect("condition");
        assert!(
            message.contains(field) && message.contains("--allowed-image-prefixes"),
            "{name}: {message}"
        );
    }
    wait_for("the refusals' Events", CONVERGE, async || {
        let path = event_notes(&client, &ns, "dot-dot", "HostPathNotAllowed").await;
        let image = event_notes(&client, &ns, "evil-image", "ImageNotAllowed").await;
        (path.iter().any(|m| m.contains("--etcd-host-path-prefixes"))
            && image.iter().any(|m| m.contains("evil.example.com")))
        .then_some(())
    })
    .await;
    let refused_names: Vec<&str> = refused_paths
        .iter()
        .map(|(n, _)| *n)
        .chain(["evil-image", "evil-addon"])
        .collect();
    for name in &refused_names {
        let (pods, deployments) = owned(&client, &ns, name).await;
        assert!(
            pods.is_empty() && deployments.is_empty(),
            "{name}: {} Pods, {} Deployments",
            pods.len(),
            deployments.len()
        );
    }
    // No Pod in the namespace mounts a node path outside the tenant's
    // directory, or runs an image the flags do not allow.
    for pod in Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("pods")
    {
        let spec = pod.spec.as_ref().expect("spec");
        for v in spec.volumes.iter().flatten() {
            if let Some(h) = &v.host_path {
                assert!(
                    h.path.starts_with(&format!("{PREFIX}/{ns}/")),
                    "{}: {}",
                    pod.name_any(),
                    h.path
                );
            }
        }
        for c in &spec.containers {
            let image = c.image.as_deref().unwrap_or_default();
            assert!(
                image.starts_with(REGISTRY) || image.starts_with("registry.k8s.io/"),
                "{}: {image}",
                pod.name_any()
            );
        }
    }
    operator.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_cluster_whose_image_turns_disallowed_is_left_as_it_runs() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("policy-running").await;
    let mut operator = OperatorProcess::start(&ns, &flags(&ns));
    let api: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &kwok_minimal_cluster(&ns, "live"))
        .await
        .expect("create");
    wait_cluster(
        &api,
        "live",
        "the control plane",
        CONVERGE,
        control_plane_ready,
    )
    .await;
    let snapshot = async || {
        let (pods, deployments) = owned(&client, &ns, "live").await;
        let pods: BTreeMap<String, (Option<String>, Vec<Option<String>>)> = pods
            .into_iter()
            .map(|p| {
                let images = p
                    .spec
                    .iter()
                    .flat_map(|s| s.containers.iter())
                    .map(|c| c.image.clone())
                    .collect();
                (p.name_any(), (p.uid(), images))
            })
            .collect();
        let deployments: BTreeMap<String, (Option<i64>, Option<String>)> = deployments
            .into_iter()
            .map(|d| {
                let image = d
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone());
                (d.name_any(), (d.metadata.generation, image))
            })
            .collect();
        (pods, deployments)
    };
    let before = snapshot().await;
    assert!(!before.0.is_empty() && before.1.len() == 3, "{before:?}");

    // The tenant turns the scheduler to an image of its own.
    api.patch(
        "live",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"scheduler": {"image": "evil.example.com/sched:1"}}})),
    )
    .await
    .expect("patch");
    let c = wait_cluster(&api, "live", "the image refusal", CONVERGE, |c| {
        refused(c, "ImageNotAllowed")
    })
    .await;
    let (_, _, message) = condition_of(&c, "Allowed").expect("condition");
    assert!(message.contains("spec.scheduler.image"), "{message}");
    // Passes after the refusal change nothing either.
    api.patch(
        "live",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"wake": "1"}}})),
    )
    .await
    .expect("annotate");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        snapshot().await,
        before,
        "the refused spec changed what runs"
    );

    // Taken back, the Cluster is allowed and converges again.
    api.patch(
        "live",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"scheduler": {"image": null}}})),
    )
    .await
    .expect("patch");
    wait_cluster(&api, "live", "the Cluster allowed again", CONVERGE, |c| {
        condition_of(c, "Allowed").is_some_and(|(s, _, _)| s == "True") && control_plane_ready(c)
    })
    .await;
    operator.assert_running();
}
