//! The stateless control plane: the kube-apiserver Deployment with its
//! internal and external Services, and the kube-controller-manager and
//! kube-scheduler Deployments, each mounting exactly the certificates it needs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PodAffinityTerm,
    PodAntiAffinity, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements,
    Secret, SecretProjection, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume,
    VolumeMount, VolumeProjection, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_on_kube_api::cluster::{AuditSpec, Cluster, ComponentSpec, ExposureType};
use serde_json::Value;

use super::konnectivity::{KONNECTIVITY_AGENT_PORT, Konnectivity};
use super::{CONFIG_HASH_ANNOTATION, component_labels, owner};
use crate::names::{Component, Names};

/// Port kube-apiserver serves on inside its Pod and on the internal Service.
pub const API_PORT: i32 = 6443;
/// Name of the external Service's port for the advertised endpoint, when
/// `apiServer.external.port` is another (see [`apiserver_external_service`]).
const ADVERTISED_PORT_NAME: &str = "advertised";
pub(crate) const CONTROLLER_MANAGER_PORT: i32 = 10257;
pub(crate) const SCHEDULER_PORT: i32 = 10259;
const PKI: &str = "/etc/kubernetes/pki";
/// How long a stopping kube-apiserver keeps serving before it shuts down.
const SHUTDOWN_DELAY: &str = "5s";
pub(crate) const KUBECONFIG_DIR: &str = "/etc/kubernetes/kubeconfig";
/// Kubeconfig identity of the konnectivity-server (it reviews the agents'
/// tokens): `system:konnectivity-server`.
pub const KONNECTIVITY_IDENTITY: &str = "konnectivity-server";
/// The konnectivity-server's container in kube-apiserver's Pods.
const KONNECTIVITY_CONTAINER: &str = "konnectivity-server";
/// The external Service's port agents dial.
const KONNECTIVITY_PORT_NAME: &str = "konnectivity";
/// Where kube-apiserver and the konnectivity-server beside it share the
/// server's socket (an emptyDir of the Pod).
const KONNECTIVITY_SOCKET_DIR: &str = "/run/konnectivity";
/// Where kube-apiserver reads its egress selector configuration.
const EGRESS_DIR: &str = "/etc/kubernetes/egress";
/// Key of the egress selector configuration in its ConfigMap.
const EGRESS_KEY: &str = "egress-selector-configuration.yaml";
/// Where kube-apiserver reads its authentication configuration.
const AUTHENTICATION_DIR: &str = "/etc/kubernetes/authentication";
/// Key of the authentication configuration in its ConfigMap.
const AUTHENTICATION_KEY: &str = "authentication-configuration.yaml";
/// The TLS version every control-plane component accepts at least.
const TLS_MIN_VERSION: &str = "VersionTLS12";
/// The konnectivity-server's admin (loopback only) and health ports.
const KONNECTIVITY_ADMIN_PORT: i32 = 8133;
pub(crate) const KONNECTIVITY_HEALTH_PORT: i32 = 8134;
/// gRPC keepalive between agents and servers: well under the idle timeout
/// of common load balancers (350 s on AWS NLB), so an idle tunnel stays.
const KONNECTIVITY_KEEPALIVE: &str = "30s";

/// Images and the config hash of one component's Pods.
pub struct PodInputs<'a> {
    pub image: &'a str,
    pub config_hash: &'a str,
}

pub(crate) fn projection(secret: String, items: &[(&str, &str)]) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name: secret,
            items: Some(
                items
                    .iter()
                    .map(|(key, path)| KeyToPath {
                        key: key.to_string(),
                        path: path.to_string(),
                        mode: None,
                    })
                    .collect(),
            ),
            optional: None,
        }),
        ..Default::default()
    }
}

pub(crate) fn projected(name: &str, sources: Vec<VolumeProjection>) -> Volume {
    Volume {
        name: name.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(0o400),
        }),
        ..Default::default()
    }
}

pub(crate) fn https_probe(path: &str, port: i32, failure_threshold: i32, initial: i32) -> Probe {
    probe("HTTPS", path, port, failure_threshold, initial)
}

fn probe(scheme: &str, path: &str, port: i32, failure_threshold: i32, initial: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            scheme: Some(scheme.into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial),
        period_seconds: Some(2),
        timeout_seconds: Some(3),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}

fn flags(ours: Vec<(&str, String)>, user: &ComponentSpec) -> Vec<String> {
    let mut all: BTreeMap<String, String> =
        ours.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    // The user's flags win: they are the escape hatch for what we did not foresee.
    all.extend(user.extra_args.clone());
    all.into_iter().map(|(k, v)| format!("--{k}={v}")).collect()
}

/// One component's Deployment: replicas from the mode, spread across nodes,
/// placed by the Cluster, rolled only when a new Pod is ready first.
pub(crate) fn deployment(
    cluster: &Cluster,
    names: &Names,
    component: Component,
    container: Container,
    volumes: Vec<Volume>,
    hash: &str,
) -> Deployment {
    let labels = component_labels(names, component);
    let placement = cluster.spec.placement.clone().unwrap_or_default();
    Deployment {
        metadata: ObjectMeta {
            name: Some(names.deployment(component)),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(cluster.spec.mode.replicas()),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    annotations: Some(
                        [(CONFIG_HASH_ANNOTATION.to_string(), hash.to_string())].into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // Restricted and not root, unless the caller made it
                    // stricter. The Pod's group reads the certificates.
                    containers: vec![Container {
                        security_context: container
                            .security_context
                            .clone()
                            .or_else(|| Some(super::restricted_non_root())),
                        ..container
                    }],
                    security_context: Some(super::restricted_pod_non_root()),
                    volumes: Some(volumes),
                    node_selector: Some(placement.node_selector).filter(|s| !s.is_empty()),
                    tolerations: Some(placement.tolerations).filter(|t| !t.is_empty()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(30),
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            preferred_during_scheduling_ignored_during_execution: Some(vec![
                                WeightedPodAffinityTerm {
                                    weight: 100,
                                    pod_affinity_term: PodAffinityTerm {
                                        label_selector: Some(LabelSelector {
                                            match_labels: Some(labels),
                                            match_expressions: None,
                                        }),
                                        topology_key: "kubernetes.io/hostname".into(),
                                        ..Default::default()
                                    },
                                },
                            ]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn pod_ip_env() -> EnvVar {
    EnvVar {
        name: "POD_IP".into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                api_version: None,
            }),
            ..Default::default()
        }),
    }
}

pub(crate) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// Whether kube-apiserver advertises the external LoadBalancer Service's
/// address: the Service is a LoadBalancer and the spec names no address.
fn advertises_ingress(cluster: &Cluster) -> bool {
    let external = &cluster.spec.api_server.external;
    external.type_ == ExposureType::LoadBalancer && external.addresses.is_empty()
}

/// The address kube-apiserver advertises, the endpoint of the business
/// cluster's `kubernetes` Service: the first of `apiServer.external.addresses`,
/// else the external LoadBalancer Service's ingress IP once its load balancer
/// has given one. Business-cluster Pods (CoreDNS, the CNI add-on, any
/// in-cluster client) then reach the API where the kubelets do, as Kamaji
/// and HyperShift have them. None otherwise: a Pod address of the
/// meta-cluster is no address the business cluster reaches.
pub fn advertised_address(cluster: &Cluster, external: Option<&Service>) -> Option<String> {
    if let Some(address) = cluster.spec.api_server.external.addresses.first() {
        return Some(address.clone());
    }
    if !advertises_ingress(cluster) {
        return None;
    }
    external?
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .iter()
        .find_map(|i| i.ip.clone())
}

/// The kube-apiserver Deployment; `advertise` is [`advertised_address`].
/// With `konnectivity`, a konnectivity-server runs beside kube-apiserver in
/// each Pod and carries its traffic to nodes, Pods and Services.
pub fn apiserver(
    cluster: &Cluster,
    names: &Names,
    pod: &PodInputs<'_>,
    advertise: Option<&str>,
    konnectivity: Option<&Konnectivity>,
) -> Deployment {
    let spec = &cluster.spec;
    let etcd_servers = etcd_client_urls(cluster, names);
    // Business-cluster Pods reach the API through the `kubernetes` Service,
    // whose endpoint is `<advertise-address>:<secure-port>`, kept by the
    // replicas' leases. Without an address to advertise, no endpoint.
    let (advertise, reconciler) = match advertise {
        Some(address) => (address.to_string(), "lease"),
        None => ("$(POD_IP)".to_string(), "none"),
    };
    let args = flags(
        vec![
            ("advertise-address", advertise),
            ("endpoint-reconciler-type", reconciler.into()),
            ("bind-address", "0.0.0.0".into()),
            ("secure-port", API_PORT.to_string()),
            // A replica being replaced keeps serving (failing only /readyz)
            // until the Services have stopped sending it requests, well within
            // the termination grace period.
            ("shutdown-delay-duration", SHUTDOWN_DELAY.into()),
            ("etcd-servers", etcd_servers.join(",")),
            ("etcd-cafile", format!("{PKI}/etcd/ca.crt")),
            ("etcd-certfile", format!("{PKI}/apiserver-etcd-client.crt")),
            ("etcd-keyfile", format!("{PKI}/apiserver-etcd-client.key")),
            ("tls-cert-file", format!("{PKI}/apiserver.crt")),
            ("tls-private-key-file", format!("{PKI}/apiserver.key")),
            ("client-ca-file", format!("{PKI}/ca.crt")),
            (
                "kubelet-client-certificate",
                format!("{PKI}/apiserver-kubelet-client.crt"),
            ),
            (
                "kubelet-client-key",
                format!("{PKI}/apiserver-kubelet-client.key"),
            ),
            (
                "kubelet-preferred-address-types",
                "InternalIP,ExternalIP,Hostname".into(),
            ),
            (
                "proxy-client-cert-file",
                format!("{PKI}/front-proxy-client.crt"),
            ),
            (
                "proxy-client-key-file",
                format!("{PKI}/front-proxy-client.key"),
            ),
            (
                "requestheader-client-ca-file",
                format!("{PKI}/front-proxy-ca.crt"),
            ),
            ("requestheader-allowed-names", "front-proxy-client".into()),
            (
                "requestheader-extra-headers-prefix",
                "X-Remote-Extra-".into(),
            ),
            ("requestheader-group-headers", "X-Remote-Group".into()),
            ("requestheader-username-headers", "X-Remote-User".into()),
            (
                "service-account-issuer",
                format!("https://kubernetes.default.svc.{}", spec.network.dns_domain),
            ),
            ("service-account-key-file", format!("{PKI}/sa.pub")),
            ("service-account-signing-key-file", format!("{PKI}/sa.key")),
            (
                "service-cluster-ip-range",
                spec.network.service_cidr.clone(),
            ),
            ("authorization-mode", "Node,RBAC".into()),
            ("enable-admission-plugins", "NodeRestriction".into()),
            ("enable-bootstrap-token-auth", "true".into()),
            ("allow-privileged", "true".into()),
            // Anonymous requests only for the health endpoints.
            (
                "authentication-config",
                format!("{AUTHENTICATION_DIR}/{AUTHENTICATION_KEY}"),
            ),
            // Kubelets serve certificates of the cluster CA (approved only
            // for their own node's addresses): logs, exec and port-forward
            // reach the kubelet they name, or fail.
            ("kubelet-certificate-authority", format!("{PKI}/ca.crt")),
            ("profiling", "false".into()),
            ("tls-min-version", TLS_MIN_VERSION.into()),
            // Secrets encrypted at rest with the Cluster's own key: neither
            // etcd's data nor a snapshot holds one in clear.
            (
                "encryption-provider-config",
                format!("{PKI}/{}", crate::names::ENCRYPTION_CONFIG_KEY),
            ),
        ]
        .into_iter()
        .chain(konnectivity.map(|_| {
            (
                "egress-selector-config-file",
                format!("{EGRESS_DIR}/{EGRESS_KEY}"),
            )
        }))
        .chain(audit_flags(spec.api_server.audit.as_ref()))
        .collect(),
        &spec.api_server.component,
    );
    let ca = names.ca_secret();
    let pki = projected(
        "pki",
        vec![
            projection(ca, &[("tls.crt", "ca.crt")]),
            projection(
                names.cert_secret("apiserver-tls"),
                &[("tls.crt", "apiserver.crt"), ("tls.key", "apiserver.key")],
            ),
            projection(
                names.cert_secret("apiserver-etcd-client"),
                &[
                    ("tls.crt", "apiserver-etcd-client.crt"),
                    ("tls.key", "apiserver-etcd-client.key"),
                    ("ca.crt", "etcd/ca.crt"),
                ],
            ),
            projection(
                names.cert_secret("apiserver-kubelet-client"),
                &[
                    ("tls.crt", "apiserver-kubelet-client.crt"),
                    ("tls.key", "apiserver-kubelet-client.key"),
                ],
            ),
            projection(
                names.cert_secret("front-proxy-client"),
                &[
                    ("tls.crt", "front-proxy-client.crt"),
                    ("tls.key", "front-proxy-client.key"),
                    ("ca.crt", "front-proxy-ca.crt"),
                ],
            ),
            projection(
                names.service_account_secret(),
                &[("sa.key", "sa.key"), ("sa.pub", "sa.pub")],
            ),
            projection(
                names.encryption_secret(),
                &[(
                    crate::names::ENCRYPTION_CONFIG_KEY,
                    crate::names::ENCRYPTION_CONFIG_KEY,
                )],
            ),
        ],
    );
    let container = Container {
        name: "kube-apiserver".into(),
        image: Some(pod.image.into()),
        command: Some(vec!["kube-apiserver".into()]),
        args: Some(args),
        env: Some(vec![pod_ip_env()]),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: API_PORT,
            ..Default::default()
        }]),
        readiness_probe: Some(https_probe("/readyz", API_PORT, 3, 1)),
        liveness_probe: Some(https_probe("/livez", API_PORT, 8, 15)),
        resources: spec.api_server.component.resources.clone(),
        volume_mounts: Some(vec![
            mount("pki", PKI),
            mount("authentication", AUTHENTICATION_DIR),
        ]),
        ..Default::default()
    };
    let authentication = config_map_volume("authentication", names.authentication_config());
    let Some(konnectivity) = konnectivity else {
        let mut deployment = deployment(
            cluster,
            names,
            Component::ApiServer,
            container,
            vec![pki, authentication],
            pod.config_hash,
        );
        with_audit(&mut deployment, cluster, names);
        with_kms(&mut deployment, cluster, names);
        return deployment;
    };
    let mut container = container;
    container.volume_mounts = Some(vec![
        mount("pki", PKI),
        mount("authentication", AUTHENTICATION_DIR),
        mount("egress", EGRESS_DIR),
        VolumeMount {
            read_only: None,
            ..mount("konnectivity-socket", KONNECTIVITY_SOCKET_DIR)
        },
    ]);
    let mut deployment = deployment(
        cluster,
        names,
        Component::ApiServer,
        container,
        vec![
            pki,
            authentication,
            config_map_volume("egress", names.egress_selector_config()),
            Volume {
                name: "konnectivity-socket".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            kubeconfig_volume(names, KONNECTIVITY_IDENTITY),
        ],
        pod.config_hash,
    );
    if let Some(pod_spec) = pod_spec(&mut deployment) {
        pod_spec
            .containers
            .push(konnectivity_server(cluster, konnectivity));
    }
    with_audit(&mut deployment, cluster, names);
    with_kms(&mut deployment, cluster, names);
    deployment
}

/// The KMS v2 plugin's container in kube-apiserver's Pod.
pub const KMS_CONTAINER: &str = "kms-plugin";
/// Where the plugin finds the Secret `spec.apiServer.kms.configSecret`.
const KMS_CONFIG_DIR: &str = "/etc/kms";

/// The Pod template's spec of `deployment`.
fn pod_spec(deployment: &mut Deployment) -> Option<&mut PodSpec> {
    deployment
        .spec
        .as_mut()
        .and_then(|d| d.template.spec.as_mut())
}

/// Mount `mount` into kube-apiserver's container of `pod`.
fn mount_in_apiserver(pod: &mut PodSpec, mount: VolumeMount) {
    if let Some(apiserver) = pod
        .containers
        .iter_mut()
        .find(|c| c.name == "kube-apiserver")
    {
        apiserver
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount);
    }
}

/// The Cluster's KMS v2 plugin beside kube-apiserver: the socket they
/// share (an emptyDir), the plugin's container, and kube-apiserver's
/// encryption configuration read from the Secret that names the plugin
/// first ([`Names::encryption_kms_secret`]) instead of the one of the
/// operator's keys alone.
fn with_kms(deployment: &mut Deployment, cluster: &Cluster, names: &Names) {
    use crate::names::{KMS_SOCKET, KMS_SOCKET_DIR};
    let Some(kms) = &cluster.spec.api_server.kms else {
        return;
    };
    let Some(pod) = pod_spec(deployment) else {
        return;
    };
    let socket = || VolumeMount {
        read_only: None,
        ..mount("kms-socket", KMS_SOCKET_DIR)
    };
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: "kms-socket".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    let mut mounts = vec![socket()];
    if let Some(secret) = &kms.config_secret {
        volumes.push(Volume {
            name: "kms-config".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("kms-config", KMS_CONFIG_DIR));
    }
    // The encryption configuration from the Secret with the plugin first.
    for source in volumes
        .iter_mut()
        .filter(|v| v.name == "pki")
        .filter_map(|v| v.projected.as_mut())
        .flat_map(|p| p.sources.iter_mut().flatten())
        .filter_map(|s| s.secret.as_mut())
        .filter(|s| s.name == names.encryption_secret())
    {
        source.name = names.encryption_kms_secret();
    }
    mount_in_apiserver(pod, socket());
    pod.containers.push(Container {
        name: KMS_CONTAINER.into(),
        image: Some(kms.image.clone()),
        args: (!kms.args.is_empty()).then(|| kms.args.clone()),
        env: Some(vec![EnvVar {
            name: "KMS_SOCKET".into(),
            value: Some(KMS_SOCKET.into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), Quantity("10m".into())),
                    ("memory".to_string(), Quantity("32Mi".into())),
                ]
                .into(),
            ),
            ..Default::default()
        }),
        security_context: Some(super::restricted_non_root()),
        volume_mounts: Some(mounts),
        ..Default::default()
    });
}

/// Where each kube-apiserver Pod reads its audit policy and webhook
/// kubeconfig, and writes its audit log.
const AUDIT_POLICY_DIR: &str = "/etc/kubernetes/audit";
const AUDIT_WEBHOOK_DIR: &str = "/etc/kubernetes/audit-webhook";
pub const AUDIT_LOG_DIR: &str = "/var/log/kubernetes/audit";
/// How long the audit webhook's batches wait to fill (upstream: 30 s).
const AUDIT_WEBHOOK_MAX_WAIT: &str = "5s";

/// kube-apiserver's audit flags: the policy, and the log and/or webhook.
fn audit_flags(audit: Option<&AuditSpec>) -> Vec<(&'static str, String)> {
    use crate::render::apiserver_files::{POLICY_KEY, WEBHOOK_KEY};
    let Some(audit) = audit else {
        return Vec::new();
    };
    let mut flags = vec![(
        "audit-policy-file",
        format!("{AUDIT_POLICY_DIR}/{POLICY_KEY}"),
    )];
    if let Some(log) = &audit.log {
        flags.extend([
            ("audit-log-path", format!("{AUDIT_LOG_DIR}/audit.log")),
            ("audit-log-format", "json".into()),
            ("audit-log-maxsize", log.max_size_mb.to_string()),
            ("audit-log-maxbackup", log.max_backups.to_string()),
        ]);
    }
    if audit.webhook.is_some() {
        flags.extend([
            (
                "audit-webhook-config-file",
                format!("{AUDIT_WEBHOOK_DIR}/{WEBHOOK_KEY}"),
            ),
            ("audit-webhook-mode", "batch".into()),
            (
                "audit-webhook-batch-max-wait",
                AUDIT_WEBHOOK_MAX_WAIT.into(),
            ),
        ]);
    }
    flags
}

/// The audit policy, log and webhook volumes of kube-apiserver's Pod, when
/// the Cluster audits. The log's emptyDir holds the files kept, and a
/// file's size more while one rotates.
fn with_audit(deployment: &mut Deployment, cluster: &Cluster, names: &Names) {
    let Some(audit) = &cluster.spec.api_server.audit else {
        return;
    };
    let Some(pod) = pod_spec(deployment) else {
        return;
    };
    let mut volumes = vec![(
        config_map_volume("audit-policy", names.audit_policy()),
        AUDIT_POLICY_DIR,
        true,
    )];
    if let Some(log) = &audit.log {
        let mib = u64::from(log.max_size_mb) * (u64::from(log.max_backups) + 2);
        volumes.push((
            Volume {
                name: "audit-log".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity(format!("{mib}Mi"))),
                    ..Default::default()
                }),
                ..Default::default()
            },
            AUDIT_LOG_DIR,
            false,
        ));
    }
    if audit.webhook.is_some() {
        volumes.push((
            Volume {
                name: "audit-webhook".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(names.audit_webhook()),
                    default_mode: Some(0o400),
                    ..Default::default()
                }),
                ..Default::default()
            },
            AUDIT_WEBHOOK_DIR,
            true,
        ));
    }
    for (volume, path, read_only) in volumes {
        mount_in_apiserver(
            pod,
            VolumeMount {
                name: volume.name.clone(),
                mount_path: path.into(),
                read_only: read_only.then_some(true),
                ..Default::default()
            },
        );
        pod.volumes.get_or_insert_with(Vec::new).push(volume);
    }
}

/// The konnectivity server that runs now: the image of the
/// konnectivity-server container in kube-apiserver's Deployment and the
/// external Service's port for agents; None when the Deployment runs none.
pub fn running_konnectivity(
    apiserver: Option<&Deployment>,
    external: Option<&Service>,
) -> Option<Konnectivity> {
    let pod = apiserver?.spec.as_ref()?.template.spec.as_ref()?;
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == KONNECTIVITY_CONTAINER)?;
    let server_port = external
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(KONNECTIVITY_PORT_NAME))
        })
        .map_or(KONNECTIVITY_AGENT_PORT, |p| p.port);
    Some(Konnectivity {
        server_image: container.image.clone()?,
        server_port,
    })
}

/// The konnectivity-server beside kube-apiserver: it serves kube-apiserver
/// on the shared socket and the agents on the agent port, with the
/// apiserver's serving certificate (agents dial the same external address),
/// and admits an agent whose token the business API says is the
/// `kube-system/konnectivity-agent` ServiceAccount's for its audience.
fn konnectivity_server(cluster: &Cluster, konnectivity: &Konnectivity) -> Container {
    let replicas = cluster.spec.mode.replicas();
    let args = [
        (
            "uds-name",
            format!("{KONNECTIVITY_SOCKET_DIR}/konnectivity-server.sock"),
        ),
        ("delete-existing-uds-file", "true".into()),
        ("server-port", "0".into()),
        ("mode", "grpc".into()),
        ("agent-port", KONNECTIVITY_AGENT_PORT.to_string()),
        ("admin-port", KONNECTIVITY_ADMIN_PORT.to_string()),
        ("health-port", KONNECTIVITY_HEALTH_PORT.to_string()),
        ("cluster-cert", format!("{PKI}/apiserver.crt")),
        ("cluster-key", format!("{PKI}/apiserver.key")),
        ("kubeconfig", format!("{KUBECONFIG_DIR}/kubeconfig")),
        (
            "authentication-audience",
            "system:konnectivity-server".into(),
        ),
        ("agent-namespace", "kube-system".into()),
        ("agent-service-account", "konnectivity-agent".into()),
        // The agent on the node a connection is for (kubelets), else any.
        ("proxy-strategies", "destHost,default".into()),
        // Agents connect to every replica's server through the load
        // balancer until they have this many.
        ("server-count", replicas.to_string()),
        ("keepalive-time", KONNECTIVITY_KEEPALIVE.into()),
    ]
    .into_iter()
    .map(|(k, v)| format!("--{k}={v}"))
    .collect();
    Container {
        name: KONNECTIVITY_CONTAINER.into(),
        image: Some(konnectivity.server_image.clone()),
        command: Some(vec!["/proxy-server".into()]),
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some("konnectivity".into()),
            container_port: KONNECTIVITY_AGENT_PORT,
            ..Default::default()
        }]),
        // No readiness probe: the server's /readyz fails until an agent has
        // connected, and agents only come once the API (this Pod) serves.
        liveness_probe: Some(probe("HTTP", "/healthz", KONNECTIVITY_HEALTH_PORT, 8, 15)),
        security_context: Some(super::restricted_non_root()),
        volume_mounts: Some(vec![
            mount("pki", PKI),
            mount("kubeconfig", KUBECONFIG_DIR),
            VolumeMount {
                read_only: None,
                ..mount("konnectivity-socket", KONNECTIVITY_SOCKET_DIR)
            },
        ]),
        ..Default::default()
    }
}

fn config_map_volume(name: &str, config_map: String) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// kube-apiserver's authentication configuration: anonymous requests are
/// authenticated only on the health endpoints (probes, load balancers) and
/// `kube-public/cluster-info` (a joining kubelet reads it before it has
/// credentials, as kubeadm's token discovery does), so nothing else
/// (`/version`, discovery, what RBAC grants `system:unauthenticated`)
/// answers a caller without credentials; and the tenant's JWT issuers
/// ([`crate::render::apiserver_files::jwt_issuers`]), if any.
pub fn authentication_config(cluster: &Cluster, names: &Names, jwt: &[Value]) -> ConfigMap {
    apiserver_file(
        cluster,
        names,
        names.authentication_config(),
        AUTHENTICATION_KEY,
        crate::render::apiserver_files::authentication_configuration(jwt),
    )
}

/// kube-apiserver's audit policy: the tenant's, checked
/// ([`crate::render::apiserver_files::audit_policy`]), or the default one.
pub fn audit_policy_config(cluster: &Cluster, names: &Names, policy: String) -> ConfigMap {
    apiserver_file(
        cluster,
        names,
        names.audit_policy(),
        crate::render::apiserver_files::POLICY_KEY,
        policy,
    )
}

/// The audit webhook's kubeconfig, checked
/// ([`crate::render::apiserver_files::webhook_kubeconfig`]): the operator's
/// copy of the tenant's Secret, which is what kube-apiserver mounts.
pub fn audit_webhook_secret(cluster: &Cluster, names: &Names, kubeconfig: String) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(names.audit_webhook()),
            namespace: Some(names.namespace.clone()),
            labels: Some(component_labels(names, Component::ApiServer)),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        string_data: Some(
            [(
                crate::render::apiserver_files::WEBHOOK_KEY.to_string(),
                kubeconfig,
            )]
            .into(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// A ConfigMap holding one file kube-apiserver reads.
fn apiserver_file(
    cluster: &Cluster,
    names: &Names,
    name: String,
    key: &str,
    content: String,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(names.namespace.clone()),
            labels: Some(component_labels(names, Component::ApiServer)),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        data: Some([(key.to_string(), content)].into()),
        ..Default::default()
    }
}

/// The egress selector configuration kube-apiserver reads when a
/// konnectivity-server runs beside it: traffic to the business cluster
/// (nodes, Pods, Services) goes through the server's socket; etcd and the
/// control plane are dialled directly.
pub fn egress_selector_config(cluster: &Cluster, names: &Names) -> ConfigMap {
    let config = format!(
        "apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: {KONNECTIVITY_SOCKET_DIR}/konnectivity-server.sock
"
    );
    apiserver_file(
        cluster,
        names,
        names.egress_selector_config(),
        EGRESS_KEY,
        config,
    )
}

/// The internal Service of kube-apiserver (for the other components).
pub fn apiserver_internal_service(cluster: &Cluster, names: &Names) -> Service {
    apiserver_service(
        cluster,
        names,
        names.apiserver_service(),
        ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(vec![api_port(API_PORT, None)]),
            ..Default::default()
        },
    )
}

/// The external Service of kube-apiserver (for kubelets and users), and of
/// the konnectivity-server beside it (for the agents) with `konnectivity`.
pub fn apiserver_external_service(
    cluster: &Cluster,
    names: &Names,
    konnectivity: Option<&Konnectivity>,
) -> Service {
    let external = &cluster.spec.api_server.external;
    let type_ = match external.type_ {
        ExposureType::ClusterIP => "ClusterIP",
        ExposureType::NodePort => "NodePort",
        ExposureType::LoadBalancer => "LoadBalancer",
    };
    let mut ports = vec![api_port(external.port, external.node_port)];
    // The `kubernetes` Service's endpoint carries kube-apiserver's secure
    // port (no flag changes it): a load balancer on another port serves
    // that one too, so the advertised endpoint (its address, given or
    // requested) answers.
    if external.type_ == ExposureType::LoadBalancer && external.port != API_PORT {
        ports.push(ServicePort {
            name: Some(ADVERTISED_PORT_NAME.into()),
            ..api_port(API_PORT, None)
        });
    }
    if let Some(k) = konnectivity {
        ports.push(ServicePort {
            name: Some(KONNECTIVITY_PORT_NAME.into()),
            port: k.server_port,
            target_port: Some(IntOrString::Int(KONNECTIVITY_AGENT_PORT)),
            // Agents dial the same port on a node as on a load balancer.
            node_port: (external.type_ == ExposureType::NodePort
                && (30000..=32767).contains(&k.server_port))
            .then_some(k.server_port),
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    apiserver_service(
        cluster,
        names,
        names.apiserver_external_service(),
        ServiceSpec {
            type_: Some(type_.into()),
            ports: Some(ports),
            external_ips: None,
            // The address the spec names is the one the API is advertised
            // and certified at: ask the load balancer for it, as MetalLB,
            // kube-vip and most clouds honour. Without it, whatever address
            // the load balancer gives is advertised once it is known.
            load_balancer_ip: match external.type_ {
                ExposureType::LoadBalancer => external.addresses.first().cloned(),
                _ => None,
            },
            ..Default::default()
        },
    )
}

fn api_port(port: i32, node_port: Option<i32>) -> ServicePort {
    ServicePort {
        name: Some("https".into()),
        port,
        target_port: Some(IntOrString::Int(API_PORT)),
        node_port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn apiserver_service(
    cluster: &Cluster,
    names: &Names,
    name: String,
    mut spec: ServiceSpec,
) -> Service {
    let labels = component_labels(names, Component::ApiServer);
    spec.selector = Some(labels.clone());
    Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(names.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// URL the control-plane components use for the business API.
pub fn internal_api_url(names: &Names) -> String {
    format!(
        "https://{}.{}.svc:{API_PORT}",
        names.apiserver_service(),
        names.namespace
    )
}

pub(crate) fn kubeconfig_volume(names: &Names, identity: &str) -> Volume {
    projected(
        "kubeconfig",
        vec![projection(
            names.kubeconfig_secret(identity),
            &[("kubeconfig", "kubeconfig")],
        )],
    )
}

/// Flags of a component that talks to the API with its kubeconfig and serves
/// its health endpoints on `port`.
fn kubeconfig_flags(port: i32) -> Vec<(&'static str, String)> {
    let kubeconfig = format!("{KUBECONFIG_DIR}/kubeconfig");
    vec![
        ("kubeconfig", kubeconfig.clone()),
        ("authentication-kubeconfig", kubeconfig.clone()),
        ("authorization-kubeconfig", kubeconfig),
        ("bind-address", "0.0.0.0".into()),
        ("secure-port", port.to_string()),
        ("profiling", "false".into()),
        ("tls-min-version", TLS_MIN_VERSION.into()),
    ]
}

/// The kube-controller-manager Deployment: signs kubelet CSRs with the cluster
/// CA and runs the bootstrap-token controllers.
pub fn controller_manager(cluster: &Cluster, names: &Names, pod: &PodInputs<'_>) -> Deployment {
    let spec = &cluster.spec;
    let args = flags(
        [
            kubeconfig_flags(CONTROLLER_MANAGER_PORT),
            vec![
                ("cluster-name", names.cluster.clone()),
                ("cluster-signing-cert-file", format!("{PKI}/ca.crt")),
                ("cluster-signing-key-file", format!("{PKI}/ca.key")),
                ("root-ca-file", format!("{PKI}/ca.crt")),
                (
                    "requestheader-client-ca-file",
                    format!("{PKI}/front-proxy-ca.crt"),
                ),
                ("service-account-private-key-file", format!("{PKI}/sa.key")),
                ("use-service-account-credentials", "true".into()),
                ("controllers", "*,bootstrapsigner,tokencleaner".into()),
                ("allocate-node-cidrs", "true".into()),
                ("cluster-cidr", spec.network.pod_cidr.clone()),
                (
                    "service-cluster-ip-range",
                    spec.network.service_cidr.clone(),
                ),
                ("leader-elect", (spec.mode.replicas() > 1).to_string()),
            ],
        ]
        .concat(),
        &spec.controller_manager,
    );
    let pki = projected(
        "pki",
        vec![
            projection(
                names.ca_secret(),
                &[("tls.crt", "ca.crt"), ("tls.key", "ca.key")],
            ),
            projection(
                names.front_proxy_ca_secret(),
                &[("tls.crt", "front-proxy-ca.crt")],
            ),
            projection(names.service_account_secret(), &[("sa.key", "sa.key")]),
        ],
    );
    let container = Container {
        name: "kube-controller-manager".into(),
        image: Some(pod.image.into()),
        command: Some(vec!["kube-controller-manager".into()]),
        args: Some(args),
        readiness_probe: Some(https_probe("/healthz", CONTROLLER_MANAGER_PORT, 3, 1)),
        liveness_probe: Some(https_probe("/healthz", CONTROLLER_MANAGER_PORT, 8, 15)),
        resources: spec.controller_manager.resources.clone(),
        volume_mounts: Some(vec![mount("pki", PKI), mount("kubeconfig", KUBECONFIG_DIR)]),
        ..Default::default()
    };
    deployment(
        cluster,
        names,
        Component::ControllerManager,
        container,
        vec![pki, kubeconfig_volume(names, "controller-manager")],
        pod.config_hash,
    )
}

/// The kube-scheduler Deployment.
pub fn scheduler(cluster: &Cluster, names: &Names, pod: &PodInputs<'_>) -> Deployment {
    let spec = &cluster.spec;
    let mut ours = kubeconfig_flags(SCHEDULER_PORT);
    ours.push(("leader-elect", (spec.mode.replicas() > 1).to_string()));
    let args = flags(ours, &spec.scheduler);
    let container = Container {
        name: "kube-scheduler".into(),
        image: Some(pod.image.into()),
        command: Some(vec!["kube-scheduler".into()]),
        args: Some(args),
        readiness_probe: Some(https_probe("/healthz", SCHEDULER_PORT, 3, 1)),
        liveness_probe: Some(https_probe("/healthz", SCHEDULER_PORT, 8, 15)),
        resources: spec.scheduler.resources.clone(),
        volume_mounts: Some(vec![mount("kubeconfig", KUBECONFIG_DIR)]),
        ..Default::default()
    };
    deployment(
        cluster,
        names,
        Component::Scheduler,
        container,
        vec![kubeconfig_volume(names, "scheduler")],
        pod.config_hash,
    )
}

/// Every etcd member's client URL: kube-apiserver balances across them, so one
/// member being replaced does not interrupt it.
pub fn etcd_client_urls(cluster: &Cluster, names: &Names) -> Vec<String> {
    (0..cluster.spec.mode.replicas() as usize)
        .map(|i| names.etcd_client_url(&names.etcd_member(i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::cluster::ClusterMode;

    fn cluster(mode: ClusterMode) -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
                .expect("example");
        c.metadata.uid = Some("uid-1".into());
        c.spec.mode = mode;
        c
    }

    fn args_of(d: &Deployment) -> Vec<String> {
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].args.clone().unwrap_or_default())
            .unwrap_or_default()
    }

    /// The kube-apiserver Deployment with a fixed image and config hash.
    fn apiserver_with(
        c: &Cluster,
        n: &Names,
        advertise: Option<&str>,
        konnectivity: Option<&Konnectivity>,
    ) -> Deployment {
        let inputs = PodInputs {
            image: "kube-apiserver:v1.35.4",
            config_hash: "h",
        };
        apiserver(c, n, &inputs, advertise, konnectivity)
    }

    #[test]
    fn a_kms_plugin_runs_beside_kube_apiserver_on_a_shared_socket() {
        let mut c = cluster(ClusterMode::Production);
        c.spec.api_server.kms = Some(
            serde_json::from_value(serde_json::json!({
                "name": "vault",
                "image": "example.test/kms:v1",
                "args": ["--listen=$(KMS_SOCKET)"],
                "configSecret": "vault-token",
            }))
            .expect("kms"),
        );
        let n = Names::new(&c, "cluster.local");
        let konnectivity = Konnectivity {
            server_image: "konnectivity-server:v0.34.0".into(),
            server_port: 8132,
        };
        for d in [
            apiserver_with(&c, &n, None, None),
            apiserver_with(&c, &n, None, Some(&konnectivity)),
        ] {
            let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
            let plugin = pod
                .containers
                .iter()
                .find(|c| c.name == KMS_CONTAINER)
                .expect("the plugin's container");
            assert_eq!(plugin.image.as_deref(), Some("example.test/kms:v1"));
            assert_eq!(
                plugin.args,
                Some(vec!["--listen=$(KMS_SOCKET)".to_string()])
            );
            let mounts = |c: &Container| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .map(|m| (m.name.clone(), m.mount_path.clone()))
                    .collect::<Vec<_>>()
            };
            let socket = ("kms-socket".to_string(), "/var/run/kmsplugin".to_string());
            assert!(mounts(plugin).contains(&socket));
            assert!(mounts(plugin).contains(&("kms-config".into(), "/etc/kms".into())));
            assert!(
                mounts(&pod.containers[0]).contains(&socket),
                "kube-apiserver shares it"
            );
            assert!(
                plugin
                    .security_context
                    .as_ref()
                    .is_some_and(|s| s.allow_privilege_escalation == Some(false))
            );
            // The encryption configuration from the Secret naming the plugin.
            let projected: Vec<String> = pod
                .volumes
                .iter()
                .flatten()
                .filter(|v| v.name == "pki")
                .filter_map(|v| v.projected.clone())
                .flat_map(|p| p.sources.into_iter().flatten())
                .filter_map(|s| s.secret.map(|s| s.name))
                .collect();
            assert!(
                projected.contains(&n.encryption_kms_secret()),
                "{projected:?}"
            );
            assert!(!projected.contains(&n.encryption_secret()), "{projected:?}");
        }
        // Without a plugin: none of it.
        c.spec.api_server.kms = None;
        let pod = apiserver_with(&c, &n, None, None)
            .spec
            .and_then(|s| s.template.spec)
            .expect("pod");
        assert!(pod.containers.iter().all(|c| c.name != KMS_CONTAINER));
    }

    #[test]
    fn apiserver_talks_to_every_member_and_advertises_the_external_address() {
        let c = cluster(ClusterMode::Production);
        let n = Names::new(&c, "cluster.local");
        let advertise = advertised_address(&c, None);
        let d = apiserver_with(&c, &n, advertise.as_deref(), None);
        let args = args_of(&d);
        assert!(args.contains(&"--etcd-servers=https://prod-east-etcd-0.clusters.svc.cluster.local:2379,https://prod-east-etcd-1.clusters.svc.cluster.local:2379,https://prod-east-etcd-2.clusters.svc.cluster.local:2379".to_string()));
        assert!(args.contains(&"--advertise-address=192.0.2.10".to_string()));
        assert!(
            args.contains(&"--max-requests-inflight=800".to_string()),
            "user flags are applied"
        );
        assert_eq!(d.spec.as_ref().and_then(|s| s.replicas), Some(3));
        let hash = d
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .expect("annotations");
        assert_eq!(hash[CONFIG_HASH_ANNOTATION], "h");
    }

    #[test]
    fn konnectivity_runs_beside_the_apiserver_and_is_exposed_to_agents() {
        let c = cluster(ClusterMode::Production);
        let n = Names::new(&c, "cluster.local");
        let k = crate::render::addons::konnectivity(&c, "registry.k8s.io")
            .expect("valid")
            .expect("on by default");
        assert_eq!(
            k.server_image,
            "registry.k8s.io/kas-network-proxy/proxy-server:v0.34.0"
        );
        let d = apiserver_with(&c, &n, None, Some(&k));
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        assert_eq!(
            pod.containers[0].name, "kube-apiserver",
            "the upgrade reads the first"
        );
        let server = &pod.containers[1];
        let server_args = server.args.clone().unwrap_or_default();
        for want in [
            "--uds-name=/run/konnectivity/konnectivity-server.sock",
            "--server-count=3",
            "--agent-port=8132",
            "--authentication-audience=system:konnectivity-server",
        ] {
            assert!(
                server_args.contains(&want.to_string()),
                "{want}: {server_args:?}"
            );
        }
        assert!(args_of(&d).contains(
            &"--egress-selector-config-file=/etc/kubernetes/egress/egress-selector-configuration.yaml"
                .to_string()
        ));
        let config = egress_selector_config(&c, &n);
        assert!(
            config.data.expect("data")[EGRESS_KEY]
                .contains("udsName: /run/konnectivity/konnectivity-server.sock")
        );
        let ports = apiserver_external_service(&c, &n, Some(&k))
            .spec
            .and_then(|s| s.ports)
            .expect("ports");
        assert!(
            ports
                .iter()
                .any(|p| p.name.as_deref() == Some("konnectivity") && p.port == 8132)
        );
        // Disabled: kube-apiserver dials the business cluster directly.
        let mut off = c.clone();
        off.spec.addons.push(kube_on_kube_api::cluster::Addon {
            name: "konnectivity".into(),
            version: "0.34.0".into(),
            values: None,
            enabled: false,
        });
        assert_eq!(
            crate::render::addons::konnectivity(&off, "registry.k8s.io"),
            Ok(None)
        );
    }

    #[test]
    fn the_running_konnectivity_server_is_read_back_from_what_was_applied() {
        let c = cluster(ClusterMode::Production);
        let n = Names::new(&c, "cluster.local");
        let k = Konnectivity {
            server_image: "example.org/proxy-server:v1".into(),
            server_port: 9000,
        };
        let d = apiserver_with(&c, &n, None, Some(&k));
        let svc = apiserver_external_service(&c, &n, Some(&k));
        assert_eq!(running_konnectivity(Some(&d), Some(&svc)), Some(k));
        let without = apiserver_with(&c, &n, None, None);
        assert_eq!(running_konnectivity(Some(&without), Some(&svc)), None);
        assert_eq!(running_konnectivity(None, None), None);
    }

    /// The Minimal example behind an external Service of `type_` on `port`,
    /// with `ingress` in its status.
    fn exposed(type_: ExposureType, port: i32, ingress: Option<&str>) -> (Cluster, Service) {
        let mut c = cluster(ClusterMode::Minimal);
        c.spec.api_server.external.type_ = type_;
        c.spec.api_server.external.addresses.clear();
        c.spec.api_server.external.port = port;
        let n = Names::new(&c, "cluster.local");
        let mut svc = apiserver_external_service(&c, &n, None);
        svc.status = ingress.map(|ip| {
            serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": [
                {"hostname": "lb.example.com"}, {"ip": ip}
            ]}}))
            .expect("status")
        });
        (c, svc)
    }

    fn advertised_args(c: &Cluster, svc: &Service) -> Vec<String> {
        let n = Names::new(c, "cluster.local");
        let inputs = PodInputs {
            image: "x",
            config_hash: "h",
        };
        let advertise = advertised_address(c, Some(svc));
        args_of(&apiserver(c, &n, &inputs, advertise.as_deref(), None))
            .into_iter()
            .filter(|a| {
                a.starts_with("--advertise-address") || a.starts_with("--endpoint-reconciler")
            })
            .collect()
    }

    #[test]
    fn the_load_balancers_address_is_advertised_once_it_is_given() {
        let (c, waiting) = exposed(ExposureType::LoadBalancer, 6443, None);
        assert_eq!(
            advertised_args(&c, &waiting),
            [
                "--advertise-address=$(POD_IP)",
                "--endpoint-reconciler-type=none"
            ]
        );
        let (c, given) = exposed(ExposureType::LoadBalancer, 6443, Some("198.51.100.7"));
        assert_eq!(
            advertised_args(&c, &given),
            [
                "--advertise-address=198.51.100.7",
                "--endpoint-reconciler-type=lease"
            ]
        );
        // An address the spec gives comes first.
        let mut explicit = c.clone();
        explicit.spec.api_server.external.addresses = vec!["192.0.2.10".into()];
        assert_eq!(
            advertised_address(&explicit, Some(&given)).as_deref(),
            Some("192.0.2.10")
        );
        // Only a LoadBalancer's ingress counts.
        let (c, node_port) = exposed(ExposureType::NodePort, 6443, Some("198.51.100.7"));
        assert_eq!(advertised_address(&c, Some(&node_port)), None);
    }

    #[test]
    fn a_load_balancer_on_another_port_also_serves_the_secure_port() {
        let ports = |type_, port, addresses: &[&str]| {
            let (mut c, _) = exposed(type_, port, None);
            c.spec.api_server.external.addresses =
                addresses.iter().map(|a| a.to_string()).collect();
            let n = Names::new(&c, "cluster.local");
            apiserver_external_service(&c, &n, None)
                .spec
                .and_then(|s| s.ports)
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.name.unwrap_or_default(), p.port, p.target_port))
                .collect::<Vec<_>>()
        };
        let to_api = Some(IntOrString::Int(API_PORT));
        // Given or requested, the load balancer's address is advertised.
        for addresses in [&[][..], &["192.0.2.10"][..]] {
            assert_eq!(
                ports(ExposureType::LoadBalancer, 443, addresses),
                [
                    ("https".to_string(), 443, to_api.clone()),
                    ("advertised".to_string(), API_PORT, to_api.clone())
                ],
                "{addresses:?}"
            );
        }
        for (type_, port, addresses) in [
            (ExposureType::LoadBalancer, API_PORT, &[][..]),
            (ExposureType::NodePort, 443, &[][..]),
        ] {
            assert_eq!(
                ports(type_, port, addresses),
                [("https".to_string(), port, to_api.clone())],
                "{type_:?} {port} {addresses:?}"
            );
        }
    }

    /// The flags of the CIS Kubernetes Benchmark's control-plane section
    /// that docs/security.md lists as met, on every component and in both
    /// kube-apiserver layouts (with and without a konnectivity-server); the
    /// authentication configuration they point at is mounted where they
    /// say.
    #[test]
    fn control_plane_flags_are_hardened() {
        let c = cluster(ClusterMode::Production);
        let n = Names::new(&c, "cluster.local");
        let inputs = PodInputs {
            image: "x",
            config_hash: "h",
        };
        let with = |flags: &[&str], d: &Deployment| {
            let args = args_of(d);
            for flag in flags {
                assert!(args.contains(&flag.to_string()), "{flag} not in {args:?}");
            }
        };
        let both = ["--profiling=false", "--tls-min-version=VersionTLS12"];
        with(&both, &controller_manager(&c, &n, &inputs));
        with(&both, &scheduler(&c, &n, &inputs));
        let konnectivity = Konnectivity {
            server_image: "konnectivity-server:v0.34.0".into(),
            server_port: 8132,
        };
        for d in [
            apiserver_with(&c, &n, None, None),
            apiserver_with(&c, &n, None, Some(&konnectivity)),
        ] {
            with(&both, &d);
            with(
                &[
                    "--authentication-config=/etc/kubernetes/authentication/authentication-configuration.yaml",
                    "--kubelet-certificate-authority=/etc/kubernetes/pki/ca.crt",
                    "--encryption-provider-config=/etc/kubernetes/pki/encryption-config.yaml",
                ],
                &d,
            );
            assert!(
                !args_of(&d)
                    .iter()
                    .any(|a| a.starts_with("--anonymous-auth")),
                "the flag and the configuration's anonymous section exclude each other"
            );
            let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
            let mounted = pod.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "authentication" && m.mount_path == AUTHENTICATION_DIR);
            assert!(mounted, "{:?}", pod.containers[0].volume_mounts);
            let volume = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "authentication")
                .and_then(|v| v.config_map.clone())
                .expect("the authentication volume");
            assert_eq!(volume.name, n.authentication_config());
            // Secrets encrypted at rest (the flag above): the configuration
            // from the Cluster's encryption Secret, in the projected pki
            // volume.
            let pki = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "pki")
                .and_then(|v| v.projected.clone())
                .expect("the pki volume");
            assert!(
                pki.sources.iter().flatten().any(|p| p
                    .secret
                    .as_ref()
                    .is_some_and(|s| s.name == n.encryption_secret())),
                "{pki:?}"
            );
        }
        let config =
            authentication_config(&c, &n, &[]).data.expect("data")[AUTHENTICATION_KEY].clone();
        let config: serde_json::Value = serde_norway::from_str(&config).expect("yaml");
        let paths: Vec<&str> = config["anonymous"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .filter_map(|c| c["path"].as_str())
            .collect();
        assert_eq!(config["anonymous"]["enabled"], true);
        assert_eq!(
            paths,
            [
                "/livez",
                "/readyz",
                "/healthz",
                "/api/v1/namespaces/kube-public/configmaps/cluster-info"
            ]
        );
    }

    #[test]
    fn minimal_mode_disables_leader_election() {
        let c = cluster(ClusterMode::Minimal);
        let n = Names::new(&c, "cluster.local");
        let inputs = PodInputs {
            image: "x",
            config_hash: "h",
        };
        assert!(
            args_of(&controller_manager(&c, &n, &inputs))
                .contains(&"--leader-elect=false".to_string())
        );
        assert!(args_of(&scheduler(&c, &n, &inputs)).contains(&"--leader-elect=false".to_string()));
        let prod = cluster(ClusterMode::Production);
        assert!(
            args_of(&scheduler(
                &prod,
                &Names::new(&prod, "cluster.local"),
                &inputs
            ))
            .contains(&"--leader-elect=true".to_string())
        );
    }

    #[test]
    fn external_service_follows_the_spec() {
        let c = cluster(ClusterMode::Production);
        let n = Names::new(&c, "cluster.local");
        let svc = apiserver_external_service(&c, &n, None).spec.expect("spec");
        assert_eq!(svc.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            svc.load_balancer_ip,
            c.spec.api_server.external.addresses.first().cloned(),
            "the load balancer is asked for the address the API is advertised at"
        );
        assert_eq!(
            svc.ports.expect("ports")[0].target_port,
            Some(IntOrString::Int(API_PORT))
        );
        let internal = apiserver_internal_service(&c, &n).spec.expect("spec");
        assert_eq!(internal.type_.as_deref(), Some("ClusterIP"));
        assert_eq!(
            internal_api_url(&n),
            "https://prod-east-apiserver.clusters.svc:6443"
        );
    }
}
