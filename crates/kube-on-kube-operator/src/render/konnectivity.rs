//! konnectivity's server side, as both ends read it: the add-on's entry in
//! the spec (version, `values.serverImage`, `values.serverPort`) gives the
//! image and port of the konnectivity-server that runs beside each
//! kube-apiserver ([`super::control_plane`]), and the agent DaemonSet the
//! add-on renders ([`super::addons`]) dials that port. One parser for both,
//! so that the two never disagree on a value.

use kube_on_kube_api::cluster::Cluster;
use serde_json::{Map, Value};

/// Built-in add-on: konnectivity, the business API's way to the nodes, Pods
/// and Services: its agent on every node here, its server beside each
/// kube-apiserver replica (see [`konnectivity`]).
pub const KONNECTIVITY: &str = "konnectivity";
/// Konnectivity version used unless the Cluster asks for another.
pub const KONNECTIVITY_VERSION: &str = "0.34.0";
/// Port the konnectivity-server listens on for agents, in its Pod and on the
/// external Service unless the add-on's `serverPort` value says otherwise.
pub const KONNECTIVITY_AGENT_PORT: i32 = 8132;

/// The server side of the `konnectivity` add-on: what the kube-apiserver
/// Pods run beside kube-apiserver and the external Service exposes.
#[derive(Debug, Clone, PartialEq)]
pub struct Konnectivity {
    /// Image of the konnectivity-server container.
    pub server_image: String,
    /// Port of the external Service agents dial.
    pub server_port: i32,
}

/// The Cluster's konnectivity server, from its `konnectivity` add-on entry
/// (version, `values.serverImage`, `values.serverPort`), or None when the
/// add-on is disabled: kube-apiserver then dials nodes, Pods and Services
/// directly, which works only where the meta-cluster routes to them. Values
/// the add-on would refuse are an error here too, with the same message
/// ([`konnectivity_values`]): both ends read them through one parser.
pub fn konnectivity(cluster: &Cluster, registry: &str) -> Result<Option<Konnectivity>, String> {
    let entry = cluster.spec.addons.iter().find(|e| e.name == KONNECTIVITY);
    if entry.is_some_and(|e| !e.enabled) {
        return Ok(None);
    }
    let version = entry.map_or(KONNECTIVITY_VERSION, |e| e.version.as_str());
    // As the add-on's own plan reads them: an object, or nothing given.
    let values = match entry.and_then(|e| e.values.as_ref()) {
        Some(Value::Object(values)) => konnectivity_values(values)?,
        _ => KonnectivityValues::default(),
    };
    Ok(Some(Konnectivity {
        server_image: values
            .server_image
            .unwrap_or_else(|| konnectivity_image(registry, "proxy-server", version)),
        server_port: values.server_port.unwrap_or(KONNECTIVITY_AGENT_PORT),
    }))
}

pub(crate) fn konnectivity_image(registry: &str, program: &str, version: &str) -> String {
    format!("{registry}/kas-network-proxy/{program}:v{version}")
}

/// What the server side reads of the `konnectivity` values.
#[derive(Debug, Default)]
pub(crate) struct KonnectivityValues {
    pub server_image: Option<String>,
    pub server_port: Option<i32>,
}

/// The `konnectivity` values, checked: a port the agents would dial but the
/// external Service could not expose is an error here, not a DaemonSet that
/// never connects.
pub(crate) fn konnectivity_values(
    values: &Map<String, Value>,
) -> Result<KonnectivityValues, String> {
    let port = |key: &str| -> Result<Option<i32>, String> {
        let Some(v) = values.get(key) else {
            return Ok(None);
        };
        v.as_i64()
            .filter(|p| (1..=65535).contains(p))
            .and_then(|p| i32::try_from(p).ok())
            .map(Some)
            .ok_or_else(|| {
                format!("konnectivity: values.{key} must be a port number (1-65535), not {v}")
            })
    };
    let server_port = port("serverPort")?;
    port("adminPort")?;
    port("healthPort")?;
    let server_image = match values.get("serverImage") {
        None => None,
        Some(Value::String(image)) if !image.is_empty() => Some(image.clone()),
        Some(v) => {
            return Err(format!(
                "konnectivity: values.serverImage must be an image reference, not {v}"
            ));
        }
    };
    Ok(KonnectivityValues {
        server_image,
        server_port,
    })
}
