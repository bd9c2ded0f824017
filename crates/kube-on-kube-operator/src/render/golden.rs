//! Golden files of rendered objects: every object the operator would apply
//! for the examples, compared with what is committed under
//! `src/render/golden/` and `src/render/addons/golden/`, so any change to a
//! rendered manifest shows up in review. `KOK_UPDATE_GOLDEN=1` rewrites them.

use std::path::Path;

use k8s_openapi::api::core::v1::Service;
use kube_on_kube_api::cluster::{Cluster, ExposureType};

use super::control_plane::{self, PodInputs};
use super::etcd::{self, MemberPod};
use crate::etcd::membership::{ClusterState, Peer};
use crate::names::Names;

/// Compares each `(file, text)` with `dir/file`, or writes it when
/// `KOK_UPDATE_GOLDEN` is set; panics naming every file that differs.
pub(crate) fn check(dir: &Path, outputs: Vec<(String, String)>) {
    let update = std::env::var_os("KOK_UPDATE_GOLDEN").is_some();
    let mut mismatched = Vec::new();
    for (file, text) in outputs {
        let path = dir.join(&file);
        if update {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("golden dir");
            }
            std::fs::write(&path, &text).expect("write golden");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            mismatched.push(file);
        }
    }
    assert!(
        mismatched.is_empty(),
        "rendered objects differ from {}: {mismatched:?} (KOK_UPDATE_GOLDEN=1 rewrites them)",
        dir.display()
    );
}

/// Documents joined as one multi-document YAML text.
pub(crate) fn yaml<T: serde::Serialize>(objects: &[T]) -> String {
    objects
        .iter()
        .map(|o| serde_norway::to_string(o).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Every control-plane object of `cluster` as the first reconcile of a new
/// Cluster renders it (etcd bootstrapping with all members, images from the
/// default registry, a fixed config hash), one file per component; `ingress`
/// is the address a load balancer gave the external Service, if any.
fn control_plane(prefix: &str, cluster: &Cluster, ingress: Option<&str>) -> Vec<(String, String)> {
    let names = Names::new(cluster, "cluster.local");
    let config = crate::config::Config::default();
    let konnectivity =
        crate::render::addons::konnectivity(cluster, &config.registry).expect("valid");
    let mut external =
        control_plane::apiserver_external_service(cluster, &names, konnectivity.as_ref());
    external.status = ingress.map(|ip| {
        serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": [{"ip": ip}]}}))
            .expect("status")
    });
    let advertise = control_plane::advertised_address(cluster, Some(&external));
    let members = cluster.spec.mode.replicas() as usize;
    let peers: Vec<Peer> = (0..members)
        .map(|i| {
            let name = names.etcd_member(i);
            Peer {
                peer_url: names.etcd_peer_url(&name),
                name,
            }
        })
        .collect();
    // Images and versions as the operator picks them with its default flags.
    let etcd_version = crate::versions::etcd_version(cluster, &config);
    let etcd_image = crate::versions::etcd_image(cluster, &config);
    let mut etcd_pods = Vec::new();
    let mut etcd_services: Vec<Service> = Vec::new();
    let mut claims = Vec::new();
    for index in 0..members {
        let pod = etcd::member_pod(
            cluster,
            &names,
            &MemberPod {
                index,
                initial_cluster: &peers,
                state: ClusterState::New,
                version: &etcd_version,
                image: &etcd_image,
                config_hash: "hash",
            },
        );
        // As created with a node for each member.
        etcd_pods.push(if members > 1 {
            etcd::spread(pod, &names, etcd::Spread::Required)
        } else {
            pod
        });
        etcd_services.push(etcd::member_service(cluster, &names, index));
        claims.extend(etcd::member_claim(cluster, &names, index));
    }
    etcd_services.push(etcd::client_service(cluster, &names));
    let spec = &cluster.spec;
    let image = |name: &str, component| {
        crate::versions::component_image(&config.registry, name, component, &spec.version)
    };
    let (apiserver, controller_manager, scheduler) = (
        image("kube-apiserver", &spec.api_server.component),
        image("kube-controller-manager", &spec.controller_manager),
        image("kube-scheduler", &spec.scheduler),
    );
    let inputs = |image| PodInputs {
        image,
        config_hash: "hash",
    };
    let mut files = vec![
        (format!("{prefix}/etcd-pods.yaml"), yaml(&etcd_pods)),
        (format!("{prefix}/etcd-services.yaml"), yaml(&etcd_services)),
        (
            format!("{prefix}/etcd-disruption-budget.yaml"),
            yaml(&[etcd::disruption_budget(cluster, &names)]),
        ),
        (
            format!("{prefix}/kube-apiserver.yaml"),
            yaml(&[control_plane::apiserver(
                cluster,
                &names,
                &inputs(&apiserver),
                advertise.as_deref(),
                konnectivity.as_ref(),
            )]),
        ),
        (
            format!("{prefix}/kube-apiserver-services.yaml"),
            yaml(&[
                control_plane::apiserver_internal_service(cluster, &names),
                control_plane::apiserver_external_service(cluster, &names, konnectivity.as_ref()),
            ]),
        ),
        (
            format!("{prefix}/kube-controller-manager.yaml"),
            yaml(&[control_plane::controller_manager(
                cluster,
                &names,
                &inputs(&controller_manager),
            )]),
        ),
        (
            format!("{prefix}/kube-scheduler.yaml"),
            yaml(&[control_plane::scheduler(
                cluster,
                &names,
                &inputs(&scheduler),
            )]),
        ),
    ];
    files.push((
        format!("{prefix}/kube-apiserver-authentication.yaml"),
        yaml(&[control_plane::authentication_config(cluster, &names, &[])]),
    ));
    if konnectivity.is_some() {
        files.push((
            format!("{prefix}/kube-apiserver-egress.yaml"),
            yaml(&[control_plane::egress_selector_config(cluster, &names)]),
        ));
    }
    // A volume source instead of a claim template means no claims.
    if !claims.is_empty() {
        files.push((format!("{prefix}/etcd-claims.yaml"), yaml(&claims)));
    }
    files
}

fn example(text: &str) -> Cluster {
    serde_norway::from_str(text).expect("example Cluster")
}

/// The examples' control planes: a Minimal one (one of everything, an
/// emptyDir for etcd) and a Production one (three of everything, claims,
/// placement, an external Service with its address given), and the Minimal
/// one behind a load balancer on port 443 that has given it an address.
#[test]
fn control_plane_golden_files() {
    let minimal = example(include_str!("../../../../examples/cluster-minimal.yaml"));
    let mut outputs = control_plane("minimal", &minimal, None);
    outputs.extend(control_plane(
        "production",
        &example(include_str!("../../../../examples/cluster-production.yaml")),
        None,
    ));
    let mut behind_lb = minimal;
    behind_lb.spec.api_server.external.type_ = ExposureType::LoadBalancer;
    behind_lb.spec.api_server.external.port = 443;
    outputs.extend(control_plane(
        "load-balancer",
        &behind_lb,
        Some("198.51.100.7"),
    ));
    check(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/render/golden"),
        outputs,
    );
}

/// Every container of every control-plane Pod the examples render (etcd
/// members, kube-apiserver with konnectivity-server, controller-manager,
/// scheduler) runs without privilege escalation or capabilities, under
/// the runtime's default seccomp profile.
#[test]
fn control_plane_containers_run_restricted() {
    let mut outputs = control_plane(
        "minimal",
        &example(include_str!("../../../../examples/cluster-minimal.yaml")),
        None,
    );
    outputs.extend(control_plane(
        "production",
        &example(include_str!("../../../../examples/cluster-production.yaml")),
        None,
    ));
    let mut pods = 0;
    for (file, text) in outputs {
        for document in text.split("---\n") {
            let object: serde_json::Value = serde_norway::from_str(document).expect("yaml");
            let pod = match object["kind"].as_str() {
                Some("Pod") => &object["spec"],
                Some("Deployment") => &object["spec"]["template"]["spec"],
                _ => continue,
            };
            pods += 1;
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{file}"
            );
            let containers = pod["containers"].as_array().into_iter().flatten();
            let init = pod["initContainers"].as_array().into_iter().flatten();
            for c in containers.chain(init) {
                let security = &c["securityContext"];
                assert_eq!(
                    security["allowPrivilegeEscalation"], false,
                    "{file} {}",
                    c["name"]
                );
                assert_eq!(
                    security["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{file}"
                );
                assert_eq!(
                    security["seccompProfile"]["type"], "RuntimeDefault",
                    "{file}"
                );
            }
        }
    }
    assert!(pods >= 3 + 3 + 3, "{pods} Pods and Deployments");
}
