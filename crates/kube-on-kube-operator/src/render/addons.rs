//! Add-ons of a business cluster as versioned templates rendered with the
//! Cluster's values: the built-in ones (`bootstrap`, `node-operator`,
//! `kube-proxy`, `kube-router`, `konnectivity`, `coredns`) and those users
//! register as labelled ConfigMaps.
//! Which add-ons a Cluster gets, at which version and with which values, and
//! the objects they render to, are pure functions of the spec; the apply step
//! is in [`crate::addons`].

pub mod template;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container};
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube_on_kube_api::cluster::Cluster;
use serde_json::{Map, Value, json};

use crate::names::{Component, Names};
use crate::network::{dns_service_ip, kubernetes_service_ip};
use crate::render::config_hash;
use crate::render::control_plane::{self, KUBECONFIG_DIR};
pub use crate::render::konnectivity::{
    KONNECTIVITY, KONNECTIVITY_AGENT_PORT, KONNECTIVITY_VERSION, Konnectivity, konnectivity,
};
use crate::render::konnectivity::{konnectivity_image, konnectivity_values};

/// Label of a ConfigMap that registers an add-on template; its value is the
/// add-on's name.
pub const TEMPLATE_LABEL: &str = "kubeonkube.io/addon-template";
/// Key of a template ConfigMap holding the template's version.
pub const VERSION_KEY: &str = "version";
/// Key of a template ConfigMap holding the multi-document YAML template.
pub const TEMPLATE_KEY: &str = "template.yaml";
/// Key of a template ConfigMap holding the default values (a YAML object).
pub const VALUES_KEY: &str = "values.yaml";
/// Label on every object an add-on put into the business cluster.
pub const ADDON_LABEL: &str = "kubeonkube.io/addon";

/// Built-in add-on: what a kubelet needs to join with a bootstrap token.
pub const BOOTSTRAP: &str = "bootstrap";
/// Built-in add-on: the node-operator's CRDs and rights in the business
/// cluster, and its Deployment in the meta-cluster.
pub const NODE_OPERATOR: &str = "node-operator";
/// Built-in add-on: kube-proxy on every node.
pub const KUBE_PROXY: &str = "kube-proxy";
/// Built-in add-on: the pod network, kube-router routing each Node's podCIDR
/// to the other nodes.
pub const KUBE_ROUTER: &str = "kube-router";
/// kube-router version used unless the Cluster asks for another.
pub const KUBE_ROUTER_VERSION: &str = "2.1.0";
/// Repository of kube-router's image: where upstream publishes it, not
/// under the operator's registry, which serves Kubernetes' own images.
pub const KUBE_ROUTER_REPOSITORY: &str = "docker.io/cloudnativelabs/kube-router";
/// Built-in add-on: cluster DNS.
pub const COREDNS: &str = "coredns";
/// CoreDNS version used unless the Cluster asks for another.
pub const COREDNS_VERSION: &str = "1.12.1";
/// Built-in add-ons in the order they are applied (before the users' own).
pub const BUILTIN: [&str; 6] = [
    BOOTSTRAP,
    NODE_OPERATOR,
    KUBE_PROXY,
    KUBE_ROUTER,
    KONNECTIVITY,
    COREDNS,
];

/// Operator-wide inputs of the add-ons.
#[derive(Debug, Clone)]
pub struct Settings<'a> {
    /// Registry of the default images.
    pub registry: &'a str,
    /// The operator's own version: the default version of `bootstrap` and
    /// `node-operator`.
    pub operator_version: &'a str,
    /// Image of the node-operator at `operator_version`.
    pub node_operator_image: &'a str,
}

/// One version of one add-on's template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub name: String,
    pub version: String,
    /// Multi-document YAML template (see `docs/addons.md`).
    pub text: String,
    /// Values used where the Cluster gives none.
    pub defaults: Map<String, Value>,
    /// Where the template comes from, for messages.
    pub source: String,
}

/// A template ConfigMap that cannot be used, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Broken {
    pub name: String,
    pub source: String,
    pub reason: String,
}

/// The template a ConfigMap labelled [`TEMPLATE_LABEL`] registers.
pub fn registered(cm: &ConfigMap) -> Result<Template, Broken> {
    let name = cm.labels().get(TEMPLATE_LABEL).cloned().unwrap_or_default();
    let source = format!(
        "ConfigMap {}/{}",
        cm.namespace().unwrap_or_default(),
        cm.name_any()
    );
    let broken = |reason: String| Broken {
        name: name.clone(),
        source: source.clone(),
        reason,
    };
    let data = cm.data.clone().unwrap_or_default();
    let version = data
        .get(VERSION_KEY)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| broken(format!("{source} has no {VERSION_KEY:?} key")))?;
    let text = data
        .get(TEMPLATE_KEY)
        .cloned()
        .ok_or_else(|| broken(format!("{source} has no {TEMPLATE_KEY:?} key")))?;
    let defaults = match data.get(VALUES_KEY) {
        None => Map::new(),
        Some(text) => match serde_norway::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(Value::Null) => Map::new(),
            Ok(_) => return Err(broken(format!("{source}: {VALUES_KEY} is not a map"))),
            Err(e) => return Err(broken(format!("{source}: {VALUES_KEY}: {e}"))),
        },
    };
    Ok(Template {
        name,
        version,
        text,
        defaults,
        source,
    })
}

/// Bytes of a ConfigMap's data: its keys and values, text and binary.
pub fn data_bytes(cm: &ConfigMap) -> usize {
    let text = cm.data.iter().flatten().map(|(k, v)| k.len() + v.len());
    let binary = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len());
    text.chain(binary).sum()
}

/// Whether a ConfigMap's data fits in `max` bytes; the reason it is
/// unusable if not (it is then not parsed, see [`registered`]).
pub fn within(cm: &ConfigMap, max: usize) -> Result<(), Broken> {
    let bytes = data_bytes(cm);
    if bytes <= max {
        return Ok(());
    }
    let source = format!(
        "ConfigMap {}/{}",
        cm.namespace().unwrap_or_default(),
        cm.name_any()
    );
    Err(Broken {
        name: cm.labels().get(TEMPLATE_LABEL).cloned().unwrap_or_default(),
        reason: format!(
            "it holds {bytes} bytes of data, more than the operator's {} ({max}), so it is not read",
            crate::bounded::MAX_TEMPLATE_BYTES_FLAG
        ),
        source,
    })
}

/// The label selector of the template ConfigMaps a Cluster can use: those
/// registering a built-in add-on or one its spec names, unless disabled.
/// None when it uses no add-on at all.
pub fn template_selector(cluster: &Cluster) -> Option<String> {
    let entries = &cluster.spec.addons;
    let mut names: Vec<&str> = BUILTIN.to_vec();
    for addon in entries {
        if !names.contains(&addon.name.as_str()) {
            names.push(&addon.name);
        }
    }
    names.retain(|n| !entries.iter().any(|e| e.name == *n && !e.enabled));
    (!names.is_empty()).then(|| format!("{TEMPLATE_LABEL} in ({})", names.join(",")))
}

/// An add-on to apply: its template and the values it is rendered with.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub name: String,
    pub version: String,
    pub template: Template,
    /// The template's defaults with the Cluster's values merged over them.
    pub values: Map<String, Value>,
}

/// What to do about one add-on.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Apply(Planned),
    /// `enabled: false`: whatever it applied before is removed.
    Disabled {
        name: String,
    },
    /// The Cluster names a template that does not exist (or cannot be used);
    /// whatever it applied before stays.
    Invalid {
        name: String,
        version: String,
        reason: String,
    },
}

impl Plan {
    /// The add-on's name.
    pub fn name(&self) -> &str {
        match self {
            Plan::Apply(p) => &p.name,
            Plan::Disabled { name } | Plan::Invalid { name, .. } => name,
        }
    }
}

/// The image reference `image` with its tag (or digest) replaced by `tag`.
fn retag(image: &str, tag: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    let slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match without_digest[slash..].find(':') {
        Some(colon) => &without_digest[..slash + colon],
        None => without_digest,
    };
    format!("{repo}:{tag}")
}

/// Default version of a built-in add-on.
fn builtin_version(name: &str, cluster: &Cluster, settings: &Settings<'_>) -> String {
    match name {
        KUBE_PROXY => cluster.spec.version.clone(),
        KUBE_ROUTER => KUBE_ROUTER_VERSION.to_string(),
        KONNECTIVITY => KONNECTIVITY_VERSION.to_string(),
        COREDNS => COREDNS_VERSION.to_string(),
        _ => settings.operator_version.to_string(),
    }
}

/// A built-in add-on's template at `version` (every version is accepted: it
/// selects the image tag).
fn builtin(
    name: &str,
    version: &str,
    cluster: &Cluster,
    settings: &Settings<'_>,
) -> Option<Template> {
    let registry = settings.registry;
    let (text, defaults) = match name {
        BOOTSTRAP => (include_str!("addons/bootstrap.yaml"), json!({})),
        NODE_OPERATOR => {
            let image = if version == settings.operator_version {
                settings.node_operator_image.to_string()
            } else {
                retag(settings.node_operator_image, version)
            };
            (
                include_str!("addons/node-operator.yaml"),
                json!({"image": image, "replicas": 1, "logLevel": "info"}),
            )
        }
        KUBE_PROXY => (
            include_str!("addons/kube-proxy.yaml"),
            json!({
                "image": format!("{registry}/kube-proxy:v{version}"),
                "mode": "iptables",
                "clusterCIDR": cluster.spec.network.pod_cidr,
                "conntrackMaxPerCore": 0,
            }),
        ),
        KUBE_ROUTER => (
            include_str!("addons/kube-router.yaml"),
            json!({
                "image": format!("{KUBE_ROUTER_REPOSITORY}:v{version}"),
                "extraArgs": [],
            }),
        ),
        KONNECTIVITY => (
            include_str!("addons/konnectivity.yaml"),
            json!({
                "image": konnectivity_image(registry, "proxy-agent", version),
                "serverImage": konnectivity_image(registry, "proxy-server", version),
                "serverPort": KONNECTIVITY_AGENT_PORT,
                "adminPort": 8133,
                "healthPort": 8134,
            }),
        ),
        COREDNS => (
            include_str!("addons/coredns.yaml"),
            json!({
                "image": format!("{registry}/coredns/coredns:v{version}"),
                "replicas": 2,
                "upstream": "/etc/resolv.conf",
                "cache": 30,
            }),
        ),
        _ => return None,
    };
    Some(Template {
        name: name.to_string(),
        version: version.to_string(),
        text: text.to_string(),
        defaults: defaults.as_object().cloned().unwrap_or_default(),
        source: "built-in".into(),
    })
}

/// Which add-ons the Cluster gets: the built-ins (unless disabled) in
/// [`BUILTIN`] order, then the ones `spec.addons` adds, in its order. A
/// registered template with a built-in's name and the asked version replaces
/// the built-in one; templates earlier in `registered` win over later ones.
pub fn plan(
    cluster: &Cluster,
    settings: &Settings<'_>,
    registered: &[Template],
    broken: &[Broken],
) -> Vec<Plan> {
    let entries = &cluster.spec.addons;
    let mut names: Vec<&str> = BUILTIN.to_vec();
    for entry in entries {
        if !names.contains(&entry.name.as_str()) {
            names.push(&entry.name);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let entry = entries.iter().find(|e| e.name == name);
            if entry.is_some_and(|e| !e.enabled) {
                return Plan::Disabled { name: name.into() };
            }
            let version = entry
                .map(|e| e.version.clone())
                .unwrap_or_else(|| builtin_version(name, cluster, settings));
            let template = registered
                .iter()
                .find(|t| t.name == name && t.version == version)
                .cloned()
                .or_else(|| builtin(name, &version, cluster, settings));
            let Some(template) = template else {
                return Plan::Invalid {
                    name: name.into(),
                    reason: unknown(name, &version, registered, broken),
                    version,
                };
            };
            let mut values = template.defaults.clone();
            if let Some(Value::Object(given)) = entry.and_then(|e| e.values.as_ref()) {
                template::merge(&mut values, given);
            }
            Plan::Apply(Planned {
                name: name.into(),
                version,
                template,
                values,
            })
        })
        .collect()
}

/// Why no template matches `name` at `version`, with what would.
fn unknown(name: &str, version: &str, registered: &[Template], broken: &[Broken]) -> String {
    let mut versions: Vec<&str> = registered
        .iter()
        .filter(|t| t.name == name)
        .map(|t| t.version.as_str())
        .collect();
    versions.sort();
    versions.dedup();
    let mut reason = if versions.is_empty() {
        format!(
            "no add-on template named {name:?}: register one with a ConfigMap labelled {TEMPLATE_LABEL}={name}"
        )
    } else {
        format!(
            "add-on {name:?} has no version {version} (registered: {})",
            versions.join(", ")
        )
    };
    for b in broken.iter().filter(|b| b.name == name) {
        reason.push_str(&format!("; {} is unusable: {}", b.source, b.reason));
    }
    reason
}

/// What the placeholders of one cluster's templates can refer to, besides
/// `values.*`.
pub struct Facts<'a> {
    pub names: &'a Names,
    /// URL kubelets and users reach the business API at.
    pub endpoint: &'a str,
    /// PEM of the cluster CA.
    pub ca_pem: &'a str,
}

/// The placeholder values of one add-on (see `docs/addons.md`).
pub fn context(
    planned: &Planned,
    cluster: &Cluster,
    facts: &Facts<'_>,
    settings: &Settings<'_>,
) -> Result<Value, String> {
    use base64::Engine;
    let network = &cluster.spec.network;
    let service_cidr = &network.service_cidr;
    let dns = dns_service_ip(service_cidr)
        .ok_or_else(|| format!("network.serviceCIDR {service_cidr:?} has no tenth address"))?;
    let kubernetes = kubernetes_service_ip(service_cidr)
        .ok_or_else(|| format!("network.serviceCIDR {service_cidr:?} is not a CIDR"))?;
    let (host, port) = facts
        .endpoint
        .trim_start_matches("https://")
        .rsplit_once(':')
        .unwrap_or((facts.endpoint, "443"));
    Ok(json!({
        "cluster": {
            "name": facts.names.cluster,
            "namespace": facts.names.namespace,
            "version": cluster.spec.version,
            "endpoint": facts.endpoint,
            "endpointHost": host.trim_start_matches('[').trim_end_matches(']'),
            "endpointPort": port,
            "caData": base64::engine::general_purpose::STANDARD.encode(facts.ca_pem),
        },
        "network": {
            "serviceCIDR": network.service_cidr,
            "podCIDR": network.pod_cidr,
            "dnsDomain": network.dns_domain,
            "dnsIP": dns.to_string(),
            "kubernetesIP": kubernetes.to_string(),
        },
        "registry": settings.registry,
        "addon": {"name": planned.name, "version": planned.version},
        "values": planned.values,
    }))
}

/// The objects of one add-on in the business cluster and a hash of them.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub objects: Vec<DynamicObject>,
    pub hash: String,
}

/// Render one add-on: render the template, parse, check every object names its kind
/// and itself, label it as the add-on's. The node-operator's CRDs are added to
/// its objects from the API types.
pub fn render(
    planned: &Planned,
    cluster: &Cluster,
    facts: &Facts<'_>,
    settings: &Settings<'_>,
) -> Result<Rendered, String> {
    let from = &planned.template.source;
    if planned.name == KONNECTIVITY {
        konnectivity_values(&planned.values)?;
    }
    if planned.name == NODE_OPERATOR {
        node_wait(&planned.values)?;
    }
    let values = context(planned, cluster, facts, settings)?;
    let name = format!("{} {} ({from})", planned.name, planned.version);
    let text = template::substitute(&name, &planned.template.text, &values)?;
    let mut docs = template::documents(&text).map_err(|e| format!("template ({from}): {e}"))?;
    if planned.name == NODE_OPERATOR {
        for (_, crd) in kube_on_kube_api::crds()
            .into_iter()
            .filter(|(file, _)| *file != "cluster.yaml")
        {
            docs.push(serde_json::to_value(&crd).map_err(|e| e.to_string())?);
        }
    }
    let mut objects = Vec::with_capacity(docs.len());
    for (index, mut doc) in docs.into_iter().enumerate() {
        let at = || format!("template ({from}), object {}", index + 1);
        for field in ["apiVersion", "kind"] {
            if !doc.get(field).is_some_and(Value::is_string) {
                return Err(format!("{}: no {field}", at()));
            }
        }
        if !doc.pointer("/metadata/name").is_some_and(Value::is_string) {
            return Err(format!("{}: no metadata.name", at()));
        }
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta
                .entry("labels")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(labels) = labels.as_object_mut() {
                labels.insert(
                    "app.kubernetes.io/managed-by".into(),
                    "kube-on-kube-operator".into(),
                );
                labels.insert(ADDON_LABEL.into(), planned.name.clone().into());
            }
        }
        let object: DynamicObject =
            serde_json::from_value(doc).map_err(|e| format!("{}: {e}", at()))?;
        objects.push(object);
    }
    let bytes = serde_json::to_vec(&objects).map_err(|e| e.to_string())?;
    let hash = config_hash([
        ("version", planned.version.as_bytes()),
        ("objects", bytes.as_slice()),
    ]);
    Ok(Rendered { objects, hash })
}

fn string_value<'a>(values: &'a Map<String, Value>, key: &str, default: &'a str) -> &'a str {
    values.get(key).and_then(Value::as_str).unwrap_or(default)
}

/// The image the node-operator's Deployment runs with these values.
pub fn node_operator_image(values: &Map<String, Value>) -> &str {
    string_value(values, "image", "node-operator")
}

/// The node-operator's flags: its kubeconfig, and the cluster DNS address
/// and domain it renders into every kubelet configuration, from the
/// Cluster's network (the node-operator's defaults only fit the default
/// Service CIDR).
fn node_operator_args(
    cluster: &Cluster,
    values: &Map<String, Value>,
    refused: &[kok_common::network::Network],
) -> Vec<String> {
    let network = &cluster.spec.network;
    let mut args = vec![
        format!("--kubeconfig={KUBECONFIG_DIR}/kubeconfig"),
        format!("--log-level={}", string_value(values, "logLevel", "info")),
        format!("--cluster-domain={}", network.dns_domain),
    ];
    // A Service CIDR without a tenth address fails the add-ons earlier
    // (`context`), so this Deployment is never applied without the flag.
    if let Some(dns) = dns_service_ip(&network.service_cidr) {
        args.push(format!("--cluster-dns={dns}"));
    }
    // Refused before anything is applied (`render`), so never wrong here.
    if let Ok(Some(wait)) = node_wait(values) {
        args.push(format!("--node-wait={wait}"));
    }
    // The meta-cluster's own networks: no Machine may be in them.
    if !refused.is_empty() {
        let networks: Vec<String> = refused.iter().map(ToString::to_string).collect();
        args.push(format!("--refused-machine-networks={}", networks.join(",")));
    }
    args
}

/// The node-operator's `values.nodeWait` (its `--node-wait`, 2 minutes by
/// default): how long after the last check of a host its Node may be not
/// Ready before the host is checked again (and a stopped kubelet or
/// runtime restarted). Whole seconds or minutes, from 1 s to 1 h.
fn node_wait(values: &Map<String, Value>) -> Result<Option<String>, String> {
    let Some(value) = values.get("nodeWait") else {
        return Ok(None);
    };
    let refused = || {
        format!(
            "node-operator: values.nodeWait must be whole seconds or minutes from 1s to 1h (as 30s or 2m), not {value}"
        )
    };
    let text = value.as_str().ok_or_else(refused)?;
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let seconds = match (number.parse::<u32>(), unit) {
        (Ok(n), "s") if !number.starts_with('+') => n,
        (Ok(n), "m") if !number.starts_with('+') => n.saturating_mul(60),
        _ => return Err(refused()),
    };
    if !(1..=3600).contains(&seconds) {
        return Err(refused());
    }
    Ok(Some(text.to_string()))
}

/// The node-operator's Deployment in the Cluster's namespace of the
/// meta-cluster, pointed at the business API with its kubeconfig Secret.
/// `config_hash` covers that Secret, so a renewed certificate restarts it.
/// Its resources (`--node-operator-resources`) and the networks its
/// Machines may not be in (`--meta-cluster-networks`) are the operator's,
/// not the tenant's to set.
pub fn node_operator(
    cluster: &Cluster,
    names: &Names,
    values: &Map<String, Value>,
    config: &crate::config::Config,
    config_hash: &str,
) -> Deployment {
    let container = Container {
        name: "node-operator".into(),
        image: Some(node_operator_image(values).into()),
        args: Some(node_operator_args(cluster, values, &config.meta_networks)),
        resources: Some(config.node_operator_resources.clone()),
        volume_mounts: Some(vec![control_plane::mount("kubeconfig", KUBECONFIG_DIR)]),
        ..Default::default()
    };
    let mut deployment = control_plane::deployment(
        cluster,
        names,
        Component::NodeOperator,
        container,
        vec![control_plane::kubeconfig_volume(names, "node-operator")],
        config_hash,
    );
    let replicas = values
        .get("replicas")
        .and_then(Value::as_i64)
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(1);
    if let Some(spec) = deployment.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
    deployment
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::cluster::Addon;

    const SETTINGS: Settings<'static> = Settings {
        registry: "registry.k8s.io",
        operator_version: "0.1.0",
        node_operator_image: "ghcr.io/kube-on-kube/node-operator:0.1.0",
    };

    fn production() -> Cluster {
        serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
            .expect("example")
    }

    fn example_template() -> Template {
        let cm: ConfigMap = serde_norway::from_str(include_str!(
            "../../../../examples/addon-template-metrics-server.yaml"
        ))
        .expect("example template");
        registered(&cm).expect("usable")
    }

    fn names(c: &Cluster) -> Names {
        Names::new(c, "cluster.local")
    }

    fn applied(plans: &[Plan]) -> Vec<(String, String)> {
        plans
            .iter()
            .filter_map(|p| match p {
                Plan::Apply(p) => Some((p.name.clone(), p.version.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn builtins_follow_the_cluster_and_the_operator() {
        let c = production();
        let plans = plan(&c, &SETTINGS, &[example_template()], &[]);
        assert_eq!(
            applied(&plans),
            vec![
                ("bootstrap".into(), "0.1.0".into()),
                ("node-operator".into(), "0.1.0".into()),
                ("kube-proxy".into(), "1.35.4".into()),
                ("kube-router".into(), KUBE_ROUTER_VERSION.into()),
                ("konnectivity".into(), KONNECTIVITY_VERSION.into()),
                ("coredns".into(), COREDNS_VERSION.into()),
                ("metrics-server".into(), "0.7.2".into()),
            ]
        );
        let Plan::Apply(proxy) = &plans[2] else {
            panic!("kube-proxy applied")
        };
        assert_eq!(proxy.values["image"], "registry.k8s.io/kube-proxy:v1.35.4");
        // Where upstream publishes it, whatever the operator's registry.
        let Plan::Apply(router) = &plans[3] else {
            panic!("kube-router applied")
        };
        assert_eq!(
            router.values["image"],
            "docker.io/cloudnativelabs/kube-router:v2.1.0"
        );
        let Plan::Apply(konnectivity) = &plans[4] else {
            panic!("konnectivity applied")
        };
        assert_eq!(
            konnectivity.values["image"],
            "registry.k8s.io/kas-network-proxy/proxy-agent:v0.34.0"
        );
        let Plan::Apply(metrics) = &plans[6] else {
            panic!("metrics-server applied")
        };
        // The Cluster's value wins over the template's default.
        assert_eq!(metrics.values["replicas"], 2);
    }

    #[test]
    fn konnectivity_values_are_read_and_refused_alike_by_both_ends() {
        let with = |values: Value| {
            let mut c = production();
            c.spec.addons = vec![Addon {
                name: KONNECTIVITY.into(),
                version: "0.33.0".into(),
                values: Some(values),
                enabled: true,
            }];
            konnectivity(&c, "mirror.local")
        };
        assert_eq!(
            with(json!({})),
            Ok(Some(Konnectivity {
                server_image: "mirror.local/kas-network-proxy/proxy-server:v0.33.0".into(),
                server_port: KONNECTIVITY_AGENT_PORT,
            }))
        );
        assert_eq!(
            with(json!({"serverPort": 9000, "serverImage": "mirror.local/ps:x"})),
            Ok(Some(Konnectivity {
                server_image: "mirror.local/ps:x".into(),
                server_port: 9000,
            }))
        );
        for (values, field) in [
            (json!({"serverPort": 70000}), "values.serverPort"),
            (json!({"serverPort": "8132"}), "values.serverPort"),
            (json!({"healthPort": 0}), "values.healthPort"),
            (json!({"serverImage": ""}), "values.serverImage"),
            (json!({"serverImage": 3}), "values.serverImage"),
        ] {
            let server = with(values.clone()).expect_err("refused");
            let addon =
                konnectivity_values(values.as_object().expect("object")).expect_err("refused");
            assert!(server.contains(field), "{server}");
            assert_eq!(server, addon);
        }
    }

    #[test]
    fn versions_and_values_override_and_disabled_is_removed() {
        let mut c = production();
        c.spec.addons = vec![
            Addon {
                name: COREDNS.into(),
                version: "1.11.3".into(),
                values: Some(json!({"replicas": 3, "image": "mirror.local/coredns:x"})),
                enabled: true,
            },
            Addon {
                name: KUBE_PROXY.into(),
                version: "1.35.4".into(),
                values: None,
                enabled: false,
            },
            Addon {
                name: NODE_OPERATOR.into(),
                version: "0.2.0".into(),
                values: None,
                enabled: true,
            },
        ];
        let plans = plan(&c, &SETTINGS, &[], &[]);
        assert_eq!(
            plans[2],
            Plan::Disabled {
                name: KUBE_PROXY.into()
            }
        );
        let Plan::Apply(dns) = &plans[5] else {
            panic!("coredns applied")
        };
        assert_eq!(dns.version, "1.11.3");
        assert_eq!(dns.values["image"], "mirror.local/coredns:x");
        assert_eq!(dns.values["replicas"], 3);
        assert_eq!(dns.values["upstream"], "/etc/resolv.conf");
        let Plan::Apply(no) = &plans[1] else {
            panic!("node-operator applied")
        };
        assert_eq!(
            no.values["image"],
            "ghcr.io/kube-on-kube/node-operator:0.2.0"
        );
    }

    #[test]
    fn unknown_names_and_versions_say_what_exists() {
        let mut c = production();
        c.spec.addons[0].version = "0.7.3".into();
        c.spec.addons.push(Addon {
            name: "nothing".into(),
            version: "1.0.0".into(),
            values: None,
            enabled: true,
        });
        let broken = Broken {
            name: "nothing".into(),
            source: "ConfigMap a/b".into(),
            reason: "ConfigMap a/b has no \"version\" key".into(),
        };
        let plans = plan(&c, &SETTINGS, &[example_template()], &[broken]);
        let reasons: Vec<String> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Invalid { reason, .. } => Some(reason.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(reasons.len(), 2, "{plans:?}");
        assert_eq!(
            reasons[0],
            "add-on \"metrics-server\" has no version 0.7.3 (registered: 0.7.2)"
        );
        assert!(
            reasons[1].starts_with("no add-on template named \"nothing\"")
                && reasons[1].contains("ConfigMap a/b is unusable"),
            "{}",
            reasons[1]
        );
    }

    #[test]
    fn registered_templates_need_a_version_and_a_template() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("x".into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.labels = Some([(TEMPLATE_LABEL.to_string(), "x".to_string())].into());
        cm.data = Some([(TEMPLATE_KEY.to_string(), "a: 1".to_string())].into());
        let err = registered(&cm).expect_err("no version");
        assert_eq!(err.reason, "ConfigMap ns/x has no \"version\" key");
        cm.data = Some(
            [
                (VERSION_KEY.to_string(), "1.0.0".to_string()),
                (TEMPLATE_KEY.to_string(), "a: 1".to_string()),
                (VALUES_KEY.to_string(), "[1]".to_string()),
            ]
            .into(),
        );
        let err = registered(&cm).expect_err("values not a map");
        assert!(err.reason.contains("not a map"), "{}", err.reason);
    }

    #[test]
    fn images_are_retagged() {
        assert_eq!(retag("r.io/a/b:1.0", "2.0"), "r.io/a/b:2.0");
        assert_eq!(retag("localhost:5000/b", "2.0"), "localhost:5000/b:2.0");
        assert_eq!(retag("b@sha256:00", "2.0"), "b:2.0");
    }

    fn render_all(c: &Cluster) -> Vec<(String, Rendered)> {
        let n = names(c);
        let facts = Facts {
            names: &n,
            endpoint: "https://api.prod-east.example.com:6443",
            ca_pem: "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        };
        plan(c, &SETTINGS, &[example_template()], &[])
            .iter()
            .filter_map(|p| match p {
                Plan::Apply(p) => Some((
                    p.name.clone(),
                    render(p, c, &facts, &SETTINGS).expect("renders"),
                )),
                _ => None,
            })
            .collect()
    }

    fn find<'a>(objects: &'a [DynamicObject], kind: &str, name: &str) -> &'a DynamicObject {
        objects
            .iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == kind) && o.name_any() == name)
            .unwrap_or_else(|| panic!("{kind} {name}"))
    }

    #[test]
    fn rendered_objects_carry_the_clusters_values() {
        let mut c = production();
        c.spec.network.dns_domain = "prod.internal".into();
        c.spec.network.service_cidr = "172.20.0.0/16".into();
        let all = render_all(&c);
        let objects = |name: &str| &all.iter().find(|(n, _)| n == name).expect(name).1.objects;

        let dns = objects(COREDNS);
        let service = find(dns, "Service", "kube-dns");
        assert_eq!(service.data["spec"]["clusterIP"], "172.20.0.10");
        let corefile = find(dns, "ConfigMap", "coredns").data["data"]["Corefile"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            corefile.contains("kubernetes prod.internal in-addr.arpa"),
            "{corefile}"
        );
        let deployment = find(dns, "Deployment", "coredns");
        assert_eq!(deployment.data["spec"]["replicas"], 2);
        assert_eq!(
            deployment.data["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.k8s.io/coredns/coredns:v1.12.1"
        );

        let proxy = objects(KUBE_PROXY);
        let kubeconfig = find(proxy, "ConfigMap", "kube-proxy").data["data"]["kubeconfig.conf"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            kubeconfig.contains("server: \"https://api.prod-east.example.com:6443\""),
            "{kubeconfig}"
        );
        find(proxy, "DaemonSet", "kube-proxy");

        let bootstrap = objects(BOOTSTRAP);
        let info = find(bootstrap, "ConfigMap", "cluster-info").data["data"]["kubeconfig"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let parsed = kube::config::Kubeconfig::from_yaml(&info).expect("kubeconfig");
        assert!(parsed.auth_infos.is_empty());
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(
            cluster.server.as_deref(),
            Some("https://api.prod-east.example.com:6443")
        );
        assert!(cluster.certificate_authority_data.is_some());

        let crds = objects(NODE_OPERATOR)
            .iter()
            .filter(|o| {
                o.types
                    .as_ref()
                    .is_some_and(|t| t.kind == "CustomResourceDefinition")
            })
            .count();
        assert_eq!(crds, kube_on_kube_api::crds().len() - 1);
        for (name, rendered) in &all {
            for o in &rendered.objects {
                assert_eq!(o.labels().get(ADDON_LABEL), Some(name), "{o:?}");
            }
        }
    }

    /// A key of an add-on's ConfigMap, parsed as YAML (JSON included).
    fn config_file(objects: &[DynamicObject], map: &str, key: &str) -> Value {
        let text = find(objects, "ConfigMap", map).data["data"][key]
            .as_str()
            .unwrap_or_default()
            .to_string();
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{map} {key}: {e}: {text}"))
    }

    #[test]
    fn kube_router_routes_the_pod_network_and_leaves_services_to_kube_proxy() {
        let mut c = production();
        c.spec.addons.push(Addon {
            name: KUBE_ROUTER.into(),
            version: KUBE_ROUTER_VERSION.into(),
            values: Some(json!({"extraArgs": ["--run-firewall=true"]})),
            enabled: true,
        });
        let all = render_all(&c);
        let router = &all
            .iter()
            .find(|(n, _)| n == KUBE_ROUTER)
            .expect("kube-router")
            .1
            .objects;

        // The API at the external endpoint with the ServiceAccount token.
        let kubeconfig = config_file(router, "kube-router-cfg", "kubeconfig.conf");
        assert_eq!(
            kubeconfig["clusters"][0]["cluster"]["server"],
            "https://api.prod-east.example.com:6443"
        );
        assert_eq!(
            kubeconfig["users"][0]["user"]["tokenFile"],
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        );
        // The plugins the node-operator installs; no subnet: kube-router
        // writes in its Node's podCIDR.
        let cni = config_file(router, "kube-router-cfg", "cni-conf.json");
        let plugins: Vec<&str> = cni["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .filter_map(|p| p["type"].as_str())
            .collect();
        assert_eq!(plugins, ["bridge", "portmap"]);
        assert_eq!(cni["plugins"][0]["ipam"], json!({"type": "host-local"}));

        let pod = &find(router, "DaemonSet", "kube-router").data["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        let container = &pod["containers"][0];
        assert_eq!(
            container["image"],
            "docker.io/cloudnativelabs/kube-router:v2.1.0"
        );
        assert_eq!(container["securityContext"]["privileged"], true);
        assert_eq!(
            container["args"],
            json!([
                "--kubeconfig=/etc/kube-router/kubeconfig.conf",
                "--run-router=true",
                "--run-firewall=false",
                "--run-service-proxy=false",
                "--bgp-graceful-restart=true",
                // The Cluster's, last, so they win.
                "--run-firewall=true",
            ])
        );
        assert_eq!(pod["initContainers"][0]["image"], container["image"]);
        // No hostPath into /opt: the CNI plugins are the node-operator's.
        let host_paths: Vec<&str> = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["hostPath"]["path"].as_str())
            .collect();
        assert_eq!(
            host_paths,
            ["/lib/modules", "/etc/cni/net.d", "/run/xtables.lock"]
        );

        let rules = &find(router, "ClusterRole", "kube-router").data["rules"];
        assert!(
            rules
                .as_array()
                .expect("rules")
                .iter()
                .all(|r| r["verbs"] == json!(["list", "get", "watch"])),
            "read-only: {rules}"
        );

        // kube-proxy is the service proxy and leaves the global conntrack
        // table size alone unless asked.
        let proxy = &all.iter().find(|(n, _)| n == KUBE_PROXY).expect("proxy").1;
        let config = config_file(&proxy.objects, "kube-proxy", "config.conf");
        assert_eq!(config["conntrack"], json!({"maxPerCore": 0}));
        assert_eq!(config["clusterCIDR"], "10.244.0.0/16");
        c.spec.addons.push(Addon {
            name: KUBE_PROXY.into(),
            version: "1.35.4".into(),
            values: Some(json!({"conntrackMaxPerCore": 32768})),
            enabled: true,
        });
        let all = render_all(&c);
        let proxy = &all.iter().find(|(n, _)| n == KUBE_PROXY).expect("proxy").1;
        let config = config_file(&proxy.objects, "kube-proxy", "config.conf");
        assert_eq!(config["conntrack"]["maxPerCore"], 32768);
    }

    #[test]
    fn a_cluster_bringing_its_own_pod_network_disables_kube_router() {
        let mut c = production();
        c.spec.addons.push(Addon {
            name: KUBE_ROUTER.into(),
            version: KUBE_ROUTER_VERSION.into(),
            values: None,
            enabled: false,
        });
        let plans = plan(&c, &SETTINGS, &[], &[]);
        assert!(plans.contains(&Plan::Disabled {
            name: KUBE_ROUTER.into()
        }));
        assert!(
            !template_selector(&c)
                .unwrap_or_default()
                .contains(KUBE_ROUTER)
        );
    }

    #[test]
    fn the_hash_follows_content_and_version() {
        let c = production();
        let a = render_all(&c);
        let b = render_all(&c);
        let mut changed = c.clone();
        changed.spec.network.dns_domain = "other.local".into();
        let d = render_all(&changed);
        let hash = |all: &[(String, Rendered)], name: &str| {
            all.iter()
                .find(|(n, _)| n == name)
                .expect(name)
                .1
                .hash
                .clone()
        };
        assert_eq!(hash(&a, COREDNS), hash(&b, COREDNS));
        assert_ne!(hash(&a, COREDNS), hash(&d, COREDNS));
        assert_eq!(hash(&a, KUBE_PROXY), hash(&d, KUBE_PROXY));
    }

    #[test]
    fn template_errors_name_the_template() {
        let c = production();
        let n = names(&c);
        let facts = Facts {
            names: &n,
            endpoint: "https://x:6443",
            ca_pem: "",
        };
        let mut t = example_template();
        t.text =
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {x: '{{values.nope}}'}\n"
                .into();
        let planned = Planned {
            name: t.name.clone(),
            version: t.version.clone(),
            template: t.clone(),
            values: Map::new(),
        };
        let err = render(&planned, &c, &facts, &SETTINGS).expect_err("missing value");
        assert!(err.contains("`values.nope` is undefined"), "{err}");
        assert!(err.contains("ConfigMap clusters/"), "{err}");
        let mut no_kind = planned.clone();
        no_kind.template.text = "apiVersion: v1\nmetadata: {name: a}\n".into();
        let err = render(&no_kind, &c, &facts, &SETTINGS).expect_err("no kind");
        assert!(err.ends_with("object 1: no kind"), "{err}");
    }

    #[test]
    fn node_operator_runs_with_its_kubeconfig_next_to_the_control_plane() {
        let c = production();
        let n = names(&c);
        // A tenant's values do not set its resources; the operator's flag does.
        let values = json!({"image": "img:1", "replicas": 1, "logLevel": "debug",
            "resources": {"limits": {"memory": "64Gi"}}});
        let resources =
            crate::resources::parse(r#"{"limits":{"memory":"300Mi"}}"#).expect("parses");
        // The meta-cluster's networks reach it as the networks its Machines
        // may not be in.
        let config = crate::config::Config {
            node_operator_resources: resources.clone(),
            meta_networks: vec![
                "10.96.0.0/12".parse().expect("cidr"),
                "10.244.0.0/16".parse().expect("cidr"),
            ],
            ..crate::config::Config::default()
        };
        let d = node_operator(&c, &n, values.as_object().expect("object"), &config, "h");
        assert_eq!(d.metadata.name.as_deref(), Some("prod-east-node-operator"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("clusters"));
        assert!(d.metadata.owner_references.is_some());
        let spec = d.spec.expect("spec");
        assert_eq!(spec.replicas, Some(1));
        let pod = spec.template.spec.expect("pod");
        assert!(pod.node_selector.is_some(), "placed like the control plane");
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("img:1"));
        assert_eq!(container.resources.as_ref(), Some(&resources));
        assert!(
            container
                .args
                .iter()
                .flatten()
                .any(|a| a == "--log-level=debug")
        );
        assert!(
            container
                .args
                .iter()
                .flatten()
                .any(|a| a == "--refused-machine-networks=10.96.0.0/12,10.244.0.0/16"),
            "{:?}",
            container.args
        );
        let volumes = pod.volumes.expect("volumes");
        let projected = volumes[0].projected.as_ref().expect("projected");
        let secret = projected.sources.as_ref().expect("sources")[0]
            .secret
            .as_ref()
            .expect("secret");
        assert_eq!(secret.name, "prod-east-node-operator-kubeconfig");
    }

    /// `values.nodeWait` becomes the node-operator's `--node-wait`; a value
    /// the node-operator would not start with is refused when the add-on is
    /// rendered, with what is wrong, and no flag comes of it.
    #[test]
    fn node_wait_is_passed_on_or_refused_before_anything_is_applied() {
        let c = production();
        let n = names(&c);
        let config = crate::config::Config::default();
        let args = |values: Value| {
            node_operator(&c, &n, values.as_object().expect("object"), &config, "h")
                .spec
                .and_then(|s| s.template.spec)
                .map(|p| p.containers[0].args.clone().unwrap_or_default())
                .unwrap_or_default()
        };
        assert!(!args(json!({})).iter().any(|a| a.starts_with("--node-wait")));
        for ok in ["1s", "20s", "2m", "60m", "3600s"] {
            let values = json!({ "nodeWait": ok });
            assert_eq!(
                node_wait(values.as_object().expect("object")),
                Ok(Some(ok.into()))
            );
            assert!(args(values).contains(&format!("--node-wait={ok}")), "{ok}");
        }
        for bad in [
            json!("0s"),
            json!("61m"),
            json!("3601s"),
            json!("10"),
            json!("1h"),
            json!("+5s"),
            json!("-5s"),
            json!("5 s"),
            json!("s"),
            json!(""),
            json!(30),
            json!("99999999999s"),
        ] {
            let values = json!({ "nodeWait": bad });
            let err = node_wait(values.as_object().expect("object")).expect_err("refused");
            assert!(err.contains("values.nodeWait must be"), "{err}");
            assert!(
                !args(values).iter().any(|a| a.starts_with("--node-wait")),
                "{bad}"
            );
        }
        let planned = plan(&c, &SETTINGS, &[], &[])
            .into_iter()
            .find_map(|p| match p {
                Plan::Apply(p) if p.name == NODE_OPERATOR => Some(p),
                _ => None,
            })
            .expect("the node-operator add-on");
        let facts = Facts {
            names: &n,
            endpoint: "https://x:6443",
            ca_pem: "",
        };
        let mut bad = planned.clone();
        bad.values.insert("nodeWait".into(), json!("forever"));
        let err = render(&bad, &c, &facts, &SETTINGS).expect_err("refused");
        assert!(err.contains("values.nodeWait must be"), "{err}");
    }

    /// Rendered built-in add-ons of the production example, compared with the
    /// files under `src/render/addons/golden/`; `KOK_UPDATE_GOLDEN=1` rewrites
    /// them.
    #[test]
    fn golden_files() {
        let c = production();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/render/addons/golden");
        let mut outputs: Vec<(String, String)> = render_all(&c)
            .into_iter()
            .map(|(name, r)| {
                let objects: Vec<_> = r
                    .objects
                    .into_iter()
                    .filter(|o| {
                        o.types
                            .as_ref()
                            .is_none_or(|t| t.kind != "CustomResourceDefinition")
                    })
                    .collect();
                (
                    format!("{name}.yaml"),
                    crate::render::golden::yaml(&objects),
                )
            })
            .collect();
        let n = names(&c);
        let values = plan(&c, &SETTINGS, &[], &[])
            .into_iter()
            .find_map(|p| match p {
                Plan::Apply(p) if p.name == NODE_OPERATOR => Some(p.values),
                _ => None,
            })
            .expect("node-operator");
        outputs.push((
            "node-operator-deployment.yaml".into(),
            serde_norway::to_string(&node_operator(
                &c,
                &n,
                &values,
                &crate::config::Config::default(),
                "hash",
            ))
            .expect("yaml"),
        ));
        crate::render::golden::check(&dir, outputs);
    }

    #[test]
    fn the_node_operator_renders_kubelets_with_the_clusters_dns() {
        let mut c = production();
        c.spec.network.service_cidr = "10.100.0.0/16".into();
        c.spec.network.dns_domain = "corp.internal".into();
        let n = names(&c);
        let args = node_operator(&c, &n, &Map::new(), &Default::default(), "hash")
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers[0].args.clone().unwrap_or_default())
            .unwrap_or_default();
        assert!(
            args.contains(&"--cluster-dns=10.100.0.10".to_string()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--cluster-domain=corp.internal".to_string()),
            "{args:?}"
        );
    }

    #[test]
    fn a_template_over_the_size_limit_is_refused_by_name_unparsed() {
        let cm = |data: serde_json::Value, binary: serde_json::Value| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": {"name": "big", "namespace": "t",
                             "labels": {TEMPLATE_LABEL: "demo"}},
                "data": data,
                "binaryData": binary,
            }))
            .expect("configmap")
        };
        // Keys count, values count, binary data counts (decoded).
        let text = cm(json!({"ab": "cde"}), json!({}));
        assert_eq!(data_bytes(&text), 5);
        let binary = cm(json!({}), json!({"k": "AAAA"}));
        assert_eq!(data_bytes(&binary), 1 + 3);
        assert_eq!(within(&text, 5), Ok(()));
        let refused = within(&text, 4).expect_err("over");
        assert_eq!(refused.name, "demo");
        assert_eq!(refused.source, "ConfigMap t/big");
        assert_eq!(
            refused.reason,
            "it holds 5 bytes of data, more than the operator's --max-addon-template-bytes (4), so it is not read"
        );
        // Named in the reason a Cluster asking for that add-on sees.
        let reason = unknown("demo", "1.0.0", &[], &[refused]);
        assert!(
            reason.contains("ConfigMap t/big is unusable: it holds 5 bytes"),
            "{reason}"
        );
    }

    #[test]
    fn only_the_templates_of_used_add_ons_are_selected() {
        let mut c = production();
        c.spec.addons = serde_json::from_value(json!([
            {"name": "coredns", "version": "1.12.1"},
            {"name": "metrics-server", "version": "0.7.2"},
            {"name": "old", "version": "1.0.0", "enabled": false},
        ]))
        .expect("addons");
        assert_eq!(
            template_selector(&c).as_deref(),
            Some(
                "kubeonkube.io/addon-template in (bootstrap,node-operator,kube-proxy,kube-router,konnectivity,coredns,metrics-server)"
            )
        );
        c.spec.addons = BUILTIN
            .iter()
            .map(|n| Addon {
                name: n.to_string(),
                version: "1.0.0".into(),
                values: None,
                enabled: false,
            })
            .collect();
        assert_eq!(template_selector(&c), None);
    }
}
