//! `kubectl kok cluster …`: create a business cluster and wait for it, print
//! its kubeconfig, delete it and wait until everything it owned is gone, and
//! the fleet view.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, ExposureType};
use kube_on_kube_api::shared::CLUSTER_LABEL;
use serde::de::DeserializeOwned;

use crate::error::{Call, Error};
use crate::output::{self, Output, or_dash};
use crate::progress::{self, Conditions};

/// The condition a created cluster is waited for.
pub const READY: &str = "Ready";
/// Key of the kubeconfig in the operator's kubeconfig Secrets.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(1000);

/// What `cluster create` was asked for.
#[derive(Debug, Clone, Default)]
pub struct CreateArgs {
    /// Kubernetes version; overrides the file's.
    pub version: Option<String>,
    /// Production or Minimal; overrides the file's.
    pub mode: Option<ClusterMode>,
    /// `emptyDir` or a claim size such as `10Gi`; overrides the file's.
    pub etcd_storage: Option<String>,
    /// Service type of the API's external endpoint; overrides the file's.
    pub expose: Option<ExposureType>,
    /// A Cluster manifest to start from.
    pub from: Option<Cluster>,
}

/// Version of clusters created without `--version` or a file that sets one.
pub const DEFAULT_VERSION: &str = "1.35.4";

/// The Cluster `create` sends: the file's (or a minimal one), named `name` in
/// `namespace`, with the flags applied on top. Without a file and without
/// `--etcd-storage`, a Minimal cluster keeps etcd on `emptyDir` (throw-away, as
/// CI wants) and a Production one gets a 10Gi claim per member; without a
/// file and without `--expose`, the API is exposed through a LoadBalancer
/// Service, since kubelets and users outside the meta-cluster cannot reach a
/// ClusterIP (the CRD's default, for Clusters whose file names DNS names).
pub fn build(name: &str, namespace: &str, args: &CreateArgs) -> Result<Cluster, Error> {
    let mut cluster = match &args.from {
        Some(c) => c.clone(),
        None => {
            let mode = args.mode.unwrap_or(ClusterMode::Production);
            let storage = args.etcd_storage.clone().unwrap_or_else(|| {
                match mode {
                    ClusterMode::Minimal => "emptyDir",
                    ClusterMode::Production => "10Gi",
                }
                .into()
            });
            let spec = serde_json::json!({
                "version": args.version.clone().unwrap_or_else(|| DEFAULT_VERSION.into()),
                "etcd": {"storage": etcd_storage(&storage)?},
                "apiServer": {"external": {"type": ExposureType::LoadBalancer}},
            });
            Cluster::new(
                name,
                serde_json::from_value(spec).map_err(|e| Error::Usage(e.to_string()))?,
            )
        }
    };
    cluster.metadata.name = Some(name.into());
    cluster.metadata.namespace = Some(namespace.into());
    cluster.metadata.resource_version = None;
    cluster.metadata.uid = None;
    cluster.status = None;
    if let Some(v) = &args.version {
        cluster.spec.version = v.clone();
    }
    if let Some(m) = args.mode {
        cluster.spec.mode = m;
    }
    if let Some(t) = args.expose {
        cluster.spec.api_server.external.type_ = t;
        if t != ExposureType::NodePort {
            cluster.spec.api_server.external.node_port = None;
        }
    }
    if let (Some(s), Some(_)) = (&args.etcd_storage, &args.from) {
        cluster.spec.etcd.storage =
            serde_json::from_value(etcd_storage(s)?).map_err(|e| Error::Usage(e.to_string()))?;
    }
    Ok(cluster)
}

fn etcd_storage(value: &str) -> Result<serde_json::Value, Error> {
    if value.eq_ignore_ascii_case("emptydir") {
        return Ok(serde_json::json!({"volumeSource": {"emptyDir": {}}}));
    }
    let ok = value.starts_with(|c: char| c.is_ascii_digit())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
    if !ok {
        return Err(Error::Usage(format!(
            "--etcd-storage {value:?}: use emptyDir or a size such as 10Gi"
        )));
    }
    Ok(serde_json::json!({"claimTemplate": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": value}},
    }}))
}

/// Read a Cluster manifest (YAML or JSON).
pub fn read_manifest(path: &Path) -> Result<Cluster, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: format!("cannot read {}", path.display()),
        source,
    })?;
    serde_norway::from_str(&text).map_err(|e| Error::Format {
        what: format!("{} is not a Cluster manifest", path.display()),
        message: e.to_string(),
    })
}

/// The Secret holding the kubeconfig of `user` (the admin when `None`); the
/// names follow the operator's (`<cluster>-admin-kubeconfig`,
/// `<cluster>-kubeconfig-<user>`).
pub fn kubeconfig_secret(cluster: &Cluster, user: Option<&str>) -> Result<String, Error> {
    let name = cluster.name_any();
    match user {
        None | Some("admin") => Ok(cluster
            .status
            .as_ref()
            .and_then(|s| s.admin_kubeconfig_secret.clone())
            .unwrap_or_else(|| format!("{name}-admin-kubeconfig"))),
        Some(user) if cluster.spec.extra_users.iter().any(|u| u.name == user) => {
            Ok(format!("{name}-kubeconfig-{user}"))
        }
        Some(user) => {
            let known: Vec<&str> = cluster
                .spec
                .extra_users
                .iter()
                .map(|u| u.name.as_str())
                .collect();
            Err(Error::Usage(format!(
                "Cluster {name:?} has no user {user:?} (users: admin{}{}); add it to spec.extraUsers first",
                if known.is_empty() { "" } else { ", " },
                known.join(", ")
            )))
        }
    }
}

/// `kubeconfig` with every cluster entry's server set to `server`. The original
/// host name is kept as `tls-server-name`, so the serving certificate is still
/// checked against the name it was issued for.
pub fn with_server(kubeconfig: &str, server: &str) -> Result<String, Error> {
    let bad = |message: String| Error::Format {
        what: "cannot rewrite the kubeconfig's server".into(),
        message,
    };
    let mut doc: serde_json::Value =
        serde_norway::from_str(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let clusters = doc
        .get_mut("clusters")
        .and_then(|c| c.as_array_mut())
        .ok_or_else(|| bad("it has no clusters".into()))?;
    for entry in clusters {
        let Some(cluster) = entry.get_mut("cluster").and_then(|c| c.as_object_mut()) else {
            continue;
        };
        let original = cluster
            .get("server")
            .and_then(|s| s.as_str())
            .and_then(host_of)
            .map(str::to_string);
        cluster.insert("server".into(), server.into());
        if let Some(host) = original
            && !cluster.contains_key("tls-server-name")
        {
            cluster.insert("tls-server-name".into(), host.into());
        }
    }
    serde_norway::to_string(&doc).map_err(|e| bad(e.to_string()))
}

/// Host of `https://host:port/path` (brackets of IPv6 kept off).
fn host_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    authority.split(':').next().filter(|h| !h.is_empty())
}

pub(crate) fn call<'a>(verb: &'static str, name: Option<&'a str>, namespace: &'a str) -> Call<'a> {
    Call {
        verb,
        kind: "Cluster",
        plural: "clusters",
        name,
        namespace: Some(namespace),
        cluster: "is --kubeconfig/--context pointing at the meta-cluster?",
        list: "kubectl kok cluster list -A",
    }
}

/// Create the Cluster and, with `wait`, wait until it is Ready.
pub async fn create(
    client: Client,
    namespace: &str,
    name: &str,
    args: &CreateArgs,
    wait: Option<Duration>,
) -> Result<(), Error> {
    let api: Api<Cluster> = Api::namespaced(client, namespace);
    let cluster = build(name, namespace, args)?;
    api.create(&PostParams::default(), &cluster)
        .await
        .map_err(|e| call("create", Some(name), namespace).error(e))?;
    println!("cluster.kubeonkube.io/{name} created in namespace {namespace}");
    match wait {
        Some(timeout) => wait_ready(&api, namespace, name, timeout).await,
        None => Ok(()),
    }
}

/// Wait until the Cluster reports `Ready=True` for its current generation,
/// printing each condition as it turns True.
pub async fn wait_ready(
    api: &Api<Cluster>,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let started = Instant::now();
    let mut seen = Conditions::default();
    let mut held = progress::Holding::default();
    println!("waiting up to {timeout:?} for Cluster {name} to be Ready");
    let status = loop {
        let cluster = api
            .get(name)
            .await
            .map_err(|e| call("get", Some(name), namespace).error(e))?;
        let status = cluster.status.clone().unwrap_or_default();
        for change in seen.update(&status.conditions) {
            println!("{}", progress::line(started.elapsed(), &change));
        }
        if let Some(line) = held.update(started.elapsed(), &status.conditions) {
            println!("{line}");
        }
        let current = status.observed_generation == cluster.metadata.generation;
        if current && status.condition(READY).is_some_and(|c| c.status == "True") {
            println!(
                "{} Cluster {name} is Ready: {}",
                progress::stamp(started.elapsed()),
                or_dash(status.endpoint.clone())
            );
            return Ok(());
        }
        if started.elapsed() >= timeout {
            break status;
        }
        tokio::time::sleep(POLL).await;
    };
    let why = if status.conditions.is_empty() {
        "  no status reported yet: is the kube-on-kube-operator running and watching this namespace?\n".to_string()
    } else {
        progress::failing(&status.conditions)
    };
    Err(Error::Timeout(format!(
        "Cluster {name} in namespace {namespace} is not Ready after {timeout:?}; not ready:\n{}see `kubectl describe cluster {name} -n {namespace}` and its Events",
        why
    )))
}

/// Print the kubeconfig of the admin or of an extra user, or write it to `file`
/// (mode 0600). With `server`, point it at that URL instead.
pub async fn kubeconfig(
    client: Client,
    namespace: &str,
    name: &str,
    user: Option<&str>,
    server: Option<&str>,
    file: Option<&PathBuf>,
) -> Result<(), Error> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    let cluster = clusters
        .get(name)
        .await
        .map_err(|e| call("get", Some(name), namespace).error(e))?;
    let secret_name = kubeconfig_secret(&cluster, user)?;
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let secret = secrets.get_opt(&secret_name).await.map_err(|e| {
        Call {
            verb: "get",
            kind: "Secret",
            plural: "secrets",
            name: Some(&secret_name),
            namespace: Some(namespace),
            cluster: "the meta-cluster",
            list: "kubectl get secrets",
        }
        .error(e)
    })?;
    let text = secret
        .and_then(|s| s.data)
        .and_then(|d| d.get(KUBECONFIG_KEY).cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| {
            Error::Usage(format!(
                "the kubeconfig Secret {secret_name} of Cluster {name} does not exist yet: the operator writes it while creating the control plane; wait with `kubectl kok cluster create … --wait` or check the Cluster's status"
            ))
        })?;
    let text = match server {
        Some(url) => with_server(&text, url)?,
        None => text,
    };
    match file {
        None => print!("{text}"),
        Some(path) => {
            write_private(path, &text)?;
            eprintln!(
                "wrote the kubeconfig of Cluster {name} to {}",
                path.display()
            );
        }
    }
    Ok(())
}

fn write_private(path: &Path, text: &str) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| Error::Io {
        what: format!("cannot write {}", path.display()),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

async fn count<K>(client: &Client, namespace: &str, selector: &str) -> Result<usize, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Error::Api {
            verb: "list",
            what: K::plural(&()).into_owned(),
            source: e,
        })?;
    Ok(list.items.len())
}

/// Objects still labelled as belonging to the Cluster, by kind.
async fn owned(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<&'static str, usize>, Error> {
    let selector = format!("{CLUSTER_LABEL}={name}");
    Ok([
        ("Pod", count::<Pod>(client, namespace, &selector).await?),
        (
            "Deployment",
            count::<Deployment>(client, namespace, &selector).await?,
        ),
        (
            "Service",
            count::<Service>(client, namespace, &selector).await?,
        ),
        (
            "Secret",
            count::<Secret>(client, namespace, &selector).await?,
        ),
        (
            "ConfigMap",
            count::<ConfigMap>(client, namespace, &selector).await?,
        ),
        (
            "PersistentVolumeClaim",
            count::<PersistentVolumeClaim>(client, namespace, &selector).await?,
        ),
    ]
    .into())
}

/// Delete the Cluster; with `wait`, until it and everything it owned are gone.
pub async fn delete(
    client: Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> Result<(), Error> {
    let api: Api<Cluster> = Api::namespaced(client.clone(), namespace);
    api.delete(name, &DeleteParams::background())
        .await
        .map_err(|e| call("delete", Some(name), namespace).error(e))?;
    println!("cluster.kubeonkube.io/{name} deleted from namespace {namespace}");
    let Some(timeout) = wait else {
        return Ok(());
    };
    let started = Instant::now();
    let mut last = String::new();
    let mut cluster_gone = false;
    loop {
        if !cluster_gone
            && api
                .get_opt(name)
                .await
                .map_err(|e| call("get", Some(name), namespace).error(e))?
                .is_none()
        {
            cluster_gone = true;
            println!(
                "{} Cluster {name} is gone",
                progress::stamp(started.elapsed())
            );
        }
        let counts = owned(&client, namespace, name).await?;
        let left = progress::remaining(&counts);
        if left != last {
            println!(
                "{} owned objects remaining: {left}",
                progress::stamp(started.elapsed())
            );
            last = left;
        }
        if cluster_gone && counts.values().all(|n| *n == 0) {
            println!(
                "{} Cluster {name} and everything it owned are deleted",
                progress::stamp(started.elapsed())
            );
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(Error::Timeout(format!(
                "Cluster {name} in namespace {namespace} is not fully deleted after {timeout:?}: {}; remaining: {last}; check the garbage collector (kube-controller-manager) and finalizers",
                if cluster_gone {
                    "the Cluster is gone"
                } else {
                    "the Cluster still exists"
                }
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The fleet view.
pub async fn list(client: Client, namespace: Option<&str>, output: Output) -> Result<(), Error> {
    let api: Api<Cluster> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| call("list", None, namespace.unwrap_or("")).error(e))?;
    output::list(output, &list.items, row, &HEADER)
}

const HEADER: [&str; 9] = [
    "NAMESPACE",
    "NAME",
    "VERSION",
    "MODE",
    "PHASE",
    "READY",
    "ETCD",
    "APISERVER",
    "ENDPOINT",
];

/// One fleet-view row.
pub fn row(c: &Cluster) -> Vec<String> {
    let status = c.status.clone().unwrap_or_default();
    let ready = status.condition(READY).map(|x| x.status.clone());
    let components = status.components.clone();
    vec![
        c.namespace().unwrap_or_default(),
        c.name_any(),
        c.spec.version.clone(),
        format!("{:?}", c.spec.mode),
        or_dash(status.phase.map(|p| format!("{p:?}"))),
        or_dash(ready),
        or_dash(components.as_ref().map(|x| x.etcd.ready.clone())),
        or_dash(components.map(|x| x.api_server.ready)),
        or_dash(status.endpoint),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::cluster::ExtraUser;

    #[test]
    fn minimal_without_a_file_keeps_etcd_on_empty_dir() {
        let args = CreateArgs {
            mode: Some(ClusterMode::Minimal),
            ..Default::default()
        };
        let c = build("ci", "team-a", &args).expect("build");
        assert_eq!(c.name_any(), "ci");
        assert_eq!(c.namespace().as_deref(), Some("team-a"));
        assert_eq!(c.spec.version, DEFAULT_VERSION);
        assert_eq!(c.spec.mode, ClusterMode::Minimal);
        assert!(c.spec.etcd.storage.volume_source.is_some());
        assert!(c.spec.etcd.storage.claim_template.is_none());
    }

    #[test]
    fn production_without_a_file_gets_claims() {
        let c = build("prod", "ns", &CreateArgs::default()).expect("build");
        assert_eq!(c.spec.mode, ClusterMode::Production);
        let claim = c.spec.etcd.storage.claim_template.expect("claim");
        let size = claim
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned())
            .expect("size");
        assert_eq!(size.0, "10Gi");
        assert_eq!(c.spec.api_server.external.type_, ExposureType::LoadBalancer);
    }

    #[test]
    fn expose_overrides_the_file_and_drops_a_node_port_it_no_longer_fits() {
        let mut from: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        from.spec.api_server.external.type_ = ExposureType::NodePort;
        from.spec.api_server.external.node_port = Some(31443);
        let kept = CreateArgs {
            from: Some(from.clone()),
            ..Default::default()
        };
        let c = build("a", "ns", &kept).expect("build");
        assert_eq!(c.spec.api_server.external.type_, ExposureType::NodePort);
        assert_eq!(c.spec.api_server.external.node_port, Some(31443));
        let args = CreateArgs {
            expose: Some(ExposureType::ClusterIP),
            from: Some(from),
            ..Default::default()
        };
        let c = build("b", "ns", &args).expect("build");
        assert_eq!(c.spec.api_server.external.type_, ExposureType::ClusterIP);
        assert_eq!(c.spec.api_server.external.node_port, None);
    }

    #[test]
    fn flags_override_the_file() {
        let from: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-production.yaml"))
                .expect("example");
        let args = CreateArgs {
            version: Some("1.35.9".into()),
            mode: Some(ClusterMode::Minimal),
            etcd_storage: Some("emptyDir".into()),
            expose: None,
            from: Some(from.clone()),
        };
        let c = build("other", "ns", &args).expect("build");
        assert_eq!(c.name_any(), "other");
        assert_eq!(c.spec.version, "1.35.9");
        assert_eq!(c.spec.mode, ClusterMode::Minimal);
        assert!(c.spec.etcd.storage.volume_source.is_some());
        // Everything else comes from the file.
        assert_eq!(c.spec.extra_users, from.spec.extra_users);
        assert_eq!(c.spec.api_server, from.spec.api_server);
    }

    #[test]
    fn bad_storage_is_a_usage_error() {
        let args = CreateArgs {
            etcd_storage: Some("lots".into()),
            ..Default::default()
        };
        let e = build("x", "ns", &args).expect_err("rejected");
        assert_eq!(e.category(), "usage");
    }

    #[test]
    fn kubeconfig_secrets_follow_the_operator_names() {
        let mut c = build("prod", "ns", &CreateArgs::default()).expect("build");
        c.spec.extra_users = vec![ExtraUser {
            name: "sre".into(),
            groups: vec![],
        }];
        // The operator's names (crates/kube-on-kube-operator/src/names.rs); the
        // CLI integration test reads them from a running operator.
        assert_eq!(
            kubeconfig_secret(&c, None).expect("admin"),
            "prod-admin-kubeconfig"
        );
        assert_eq!(
            kubeconfig_secret(&c, Some("sre")).expect("sre"),
            "prod-kubeconfig-sre"
        );
        let e = kubeconfig_secret(&c, Some("bob")).expect_err("unknown user");
        assert!(e.to_string().contains("users: admin, sre"), "{e}");
    }

    #[test]
    fn server_override_keeps_the_certificate_name() {
        let kc = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://prod-apiserver-external.ns.svc.cluster.local:6443\n    certificate-authority-data: Q0E=\n";
        let out = with_server(kc, "https://10.1.2.3:6443").expect("rewrite");
        let doc: serde_json::Value = serde_norway::from_str(&out).expect("yaml");
        let cluster = &doc["clusters"][0]["cluster"];
        assert_eq!(cluster["server"], "https://10.1.2.3:6443");
        assert_eq!(
            cluster["tls-server-name"],
            "prod-apiserver-external.ns.svc.cluster.local"
        );
        assert_eq!(cluster["certificate-authority-data"], "Q0E=");
        assert_eq!(host_of("https://[fd00::1]:6443"), Some("fd00::1"));
    }
}
