//! The example documents, where each goes, what the environment fills in,
//! and waiting until they have converged.
//!
//! Cluster objects and add-on templates live in the meta-cluster; every
//! other kind in the business cluster that gets the workers. Filled in for the environment,
//! as a user would edit them for their site:
//! - a Machine: its host's address and pinned SSH key, in file order one
//!   test host each; and what a test host needs that a real one does not
//!   (kernel parameters of its own network namespace only, the kubelet's
//!   cgroup root inside the host's subtree of the machine's cgroups, disk
//!   eviction thresholds for a disk shared with the machine);
//! - the Secret a Machine names for its SSH key: the key the hosts accept;
//! - a Cluster exposed by a LoadBalancer at an address it names: an
//!   address of the environment's load balancer instead;
//! - a PackageVersion: the one of the same name that
//!   `scripts/node-packageversions.sh` prints for the test hosts (artifact
//!   URLs on this machine's artifact server with their real checksums, the
//!   registry mirror, cgroup v1). An example naming software the
//!   environment does not serve is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
use kube::{Client, Resource as _};
use kube_on_kube_api::canary::CanaryPhase;
use kube_on_kube_api::cluster::{ClusterPhase, settled};
use kube_on_kube_api::machine::MachinePhase;
use kube_on_kube_api::{CanaryRelease, Cluster, Machine};
use serde::Deserialize as _;
use serde_json::Value;

use kok_testenv::hosts::TestHost;
use kok_testenv::node_software;

use crate::progress::{Progress, report_change};

/// The label of an add-on template, which the kube-on-kube-operator reads in
/// the meta-cluster.
const ADDON_TEMPLATE_LABEL: &str = "kubeonkube.io/addon-template";

/// Cluster objects and add-on templates live in the meta-cluster.
fn belongs_to_meta(doc: &Document) -> bool {
    doc.is_ours("Cluster")
        || (doc.gvk.group.is_empty()
            && doc.gvk.kind == "ConfigMap"
            && doc
                .object
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(ADDON_TEMPLATE_LABEL)))
}

/// The field manager of everything this program applies.
const MANAGER: &str = "kok-dev-env";

/// A freshly Established CRD can take a moment to show up in discovery.
const DISCOVERY_WAIT: Duration = Duration::from_secs(30);

/// How often the waits below look.
const POLL: Duration = Duration::from_millis(500);

#[derive(Clone)]
pub struct Document {
    /// The file it came from, for messages.
    file: String,
    gvk: GroupVersionKind,
    object: DynamicObject,
}

impl Document {
    fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or_default()
    }

    fn kind(&self) -> &str {
        &self.gvk.kind
    }

    fn is_ours(&self, kind: &str) -> bool {
        self.gvk.group == Cluster::group(&()) && self.gvk.kind == kind
    }

    fn value(&self) -> anyhow::Result<Value> {
        Ok(serde_json::to_value(&self.object)?)
    }

    fn with_value(&self, value: Value) -> anyhow::Result<Document> {
        Ok(Document {
            file: self.file.clone(),
            gvk: self.gvk.clone(),
            object: serde_json::from_value(value)
                .with_context(|| format!("{} {} from {}", self.kind(), self.name(), self.file))?,
        })
    }
}

/// The examples, sorted by where they go.
pub struct Plan {
    /// Add-on templates (ConfigMaps labelled [`ADDON_TEMPLATE_LABEL`]), for
    /// the meta-cluster.
    pub templates: Vec<Document>,
    pub clusters: Vec<Document>,
    /// `namespace/name` of each Cluster that gets the rest, on hosts of its
    /// own.
    pub workers_clusters: Vec<String>,
    business: Vec<Document>,
}

/// The business-cluster documents filled in for the environment.
pub struct Filled {
    /// Everything but the CanaryReleases, which wait for Ready workers.
    pub business: Vec<Document>,
    pub canaries: Vec<Document>,
    /// Names of the Machines.
    pub machines: Vec<String>,
}

impl Plan {
    /// Every document of every `*.yaml`/`*.yml` file in `dir`, in file name
    /// order; each of `workers_clusters` must be one of its Clusters (none:
    /// every one).
    pub fn load(dir: &Path, workers_clusters: &[String]) -> anyhow::Result<Plan> {
        let documents = load(dir)?;
        let (meta, business): (Vec<_>, Vec<_>) = documents.into_iter().partition(belongs_to_meta);
        // Add-on templates first: the Clusters that enable them look them up.
        let (clusters, templates): (Vec<_>, Vec<_>) =
            meta.into_iter().partition(|d| d.is_ours("Cluster"));
        let keys: Vec<String> = clusters
            .iter()
            .map(|c| {
                format!(
                    "{}/{}",
                    c.object.metadata.namespace.as_deref().unwrap_or("default"),
                    c.name()
                )
            })
            .collect();
        for chosen in workers_clusters {
            if !keys.contains(chosen) {
                bail!(
                    "--workers-cluster {chosen} is none of the example Clusters ({})",
                    keys.join(", ")
                );
            }
        }
        Ok(Plan {
            templates,
            clusters,
            workers_clusters: if workers_clusters.is_empty() {
                keys
            } else {
                workers_clusters.to_vec()
            },
            business,
        })
    }

    /// The example Clusters for this site: a Cluster exposed by a
    /// LoadBalancer that names its address (`apiServer.external.addresses`,
    /// the Production example's documentation address 192.0.2.10) gets one
    /// of `pool` (the load balancer's `10.212.X.0/24`) in its place, from
    /// .200 on, as a user puts in an address reserved in their load
    /// balancer's pool.
    pub fn clusters_for(&self, pool: &str) -> anyhow::Result<Vec<Document>> {
        let prefix = pool
            .strip_suffix("0/24")
            .with_context(|| format!("the load balancer's pool {pool} is no /24"))?;
        let mut next = 200;
        let mut clusters = Vec::new();
        for doc in &self.clusters {
            let mut v = doc.value()?;
            let load_balanced =
                v.pointer("/spec/apiServer/external/type") == Some(&Value::from("LoadBalancer"));
            if load_balanced
                && let Some(first) = v
                    .pointer_mut("/spec/apiServer/external/addresses")
                    .and_then(Value::as_array_mut)
                    .and_then(|a| a.first_mut())
            {
                *first = format!("{prefix}{next}").into();
                next += 1;
            }
            clusters.push(doc.with_value(v)?);
        }
        Ok(clusters)
    }

    /// How many test hosts the examples need in one workers cluster: one
    /// per Machine.
    pub fn machines(&self) -> usize {
        self.business
            .iter()
            .filter(|d| d.is_ours("Machine"))
            .count()
    }

    /// The business documents filled in for `hosts` (one per Machine, in
    /// file order), the key they accept (`private_key`, PEM) and the
    /// environment's PackageVersions (`package_versions`, YAML).
    pub fn fill_in(
        &self,
        hosts: &[TestHost],
        private_key: &str,
        package_versions: &str,
    ) -> anyhow::Result<Filled> {
        fill_in(&self.business, hosts, private_key, package_versions)
    }

    /// What a cluster of the user's own needs to get `hosts` as workers, as
    /// one YAML file to apply to it: the example key Secret,
    /// PackageVersions and ClusterPackageVersion, and for each host a copy
    /// of the first example Machine named `spare-<i>`, all filled in as
    /// [`Plan::fill_in`] does; no CanaryRelease.
    pub fn spare_kit(
        &self,
        hosts: &[TestHost],
        private_key: &str,
        package_versions: &str,
    ) -> anyhow::Result<(String, Vec<String>)> {
        let template = self
            .business
            .iter()
            .find(|d| d.is_ours("Machine"))
            .context("the examples hold no Machine to copy for the spare hosts")?;
        let mut documents: Vec<Document> = self
            .business
            .iter()
            .filter(|d| !d.is_ours("Machine") && !d.is_ours("CanaryRelease"))
            .cloned()
            .collect();
        for i in 0..hosts.len() {
            let mut v = template.value()?;
            let name = format!("spare-{i}");
            v["metadata"]["name"] = name.clone().into();
            v["spec"]["hostname"] = name.into();
            documents.push(template.with_value(v)?);
        }
        let filled = fill_in(&documents, hosts, private_key, package_versions)?;
        let mut yaml = String::new();
        for doc in &filled.business {
            yaml += "---\n";
            yaml += &serde_norway::to_string(&doc.object)?;
        }
        Ok((yaml, filled.machines))
    }
}

/// [`Plan::fill_in`] of `business`.
fn fill_in(
    business: &[Document],
    hosts: &[TestHost],
    private_key: &str,
    package_versions: &str,
) -> anyhow::Result<Filled> {
    let served = served_package_versions(package_versions)?;
    // The Secrets the Machines log in with.
    let key_refs: BTreeSet<(String, String, String)> = business
        .iter()
        .filter(|d| d.is_ours("Machine"))
        .map(|d| {
            let v = d.value()?;
            let r = &v["spec"]["ssh"]["privateKeySecretRef"];
            Ok((
                r["namespace"].as_str().unwrap_or("default").to_owned(),
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["key"].as_str().unwrap_or("ssh-privatekey").to_owned(),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut machines = hosts.iter();
    let mut filled = Filled {
        business: Vec::new(),
        canaries: Vec::new(),
        machines: Vec::new(),
    };
    for doc in business {
        let mut v = doc.value()?;
        if doc.is_ours("Machine") {
            let host = machines.next().context("fewer test hosts than Machines")?;
            node_software::fill_in_machine(&mut v, host);
            filled.machines.push(doc.name().to_owned());
        } else if doc.is_ours("PackageVersion") {
            let Some(spec) = served.get(doc.name()) else {
                bail!(
                    "{}: PackageVersion {} is none the environment serves ({}); \
                     scripts/node-packageversions.sh prints those",
                    doc.file,
                    doc.name(),
                    served.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            };
            v["spec"] = spec.clone();
        } else if doc.is_ours("CanaryRelease") {
            filled.canaries.push(doc.clone());
            continue;
        } else if doc.kind() == "Secret" {
            let namespace = doc
                .object
                .metadata
                .namespace
                .as_deref()
                .unwrap_or("default");
            if let Some((_, _, key)) = key_refs
                .iter()
                .find(|(ns, name, _)| ns == namespace && name == doc.name())
            {
                if let Some(data) = v["data"].as_object_mut() {
                    data.remove(key);
                }
                v["stringData"][key] = private_key.into();
            }
        }
        filled.business.push(doc.with_value(v)?);
    }
    // What a Machine needs exists before it: no Machine starts out
    // failing for a missing key or PackageVersion.
    filled.business.sort_by_key(|d| match d.kind() {
        "PackageVersion" => 1,
        "ClusterPackageVersion" => 2,
        "Machine" => 3,
        _ => 0,
    });
    Ok(filled)
}

/// The PackageVersions' specs by name.
fn served_package_versions(yaml: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut served = BTreeMap::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc).context("the generated PackageVersions")?;
        if v["kind"] == "PackageVersion" {
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            served.insert(name, v["spec"].clone());
        }
    }
    Ok(served)
}

/// Every document of every `*.yaml`/`*.yml` file in `dir`, in file name order.
fn load(dir: &Path) -> anyhow::Result<Vec<Document>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            files.push(path);
        }
    }
    files.sort();
    let mut documents = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (index, yaml) in serde_norway::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(yaml)
                .with_context(|| format!("{}: document {}", path.display(), index + 1))?;
            if value.is_null() {
                continue;
            }
            let document = parse(&file, value)
                .with_context(|| format!("{}: document {}", path.display(), index + 1))?;
            documents.push(document);
        }
    }
    if documents.is_empty() {
        bail!("{} holds no YAML documents", dir.display());
    }
    Ok(documents)
}

fn parse(file: &str, value: Value) -> anyhow::Result<Document> {
    let object: DynamicObject = serde_json::from_value(value)?;
    let Some(types) = &object.types else {
        bail!("apiVersion and kind are required");
    };
    let gvk = GroupVersionKind::try_from(types)?;
    if object
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        bail!("metadata.name is required");
    }
    Ok(Document {
        file: file.to_owned(),
        gvk,
        object,
    })
}

/// Server-side applies `documents` to one cluster, after creating the
/// namespaces they name.
pub async fn apply(
    client: &Client,
    cluster: &str,
    documents: &[Document],
    progress: &Progress,
) -> anyhow::Result<()> {
    let mut resolved = Vec::new();
    for doc in documents {
        let (resource, caps) = resolve(client, &doc.gvk)
            .await
            .with_context(|| format!("finding {} in the {cluster}'s API", doc.gvk.kind))?;
        let namespace = match caps.scope {
            Scope::Namespaced => Some(
                doc.object
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_owned()),
            ),
            Scope::Cluster => None,
        };
        resolved.push((doc, resource, namespace));
    }

    let params = PatchParams::apply(MANAGER).force();
    let namespaces: BTreeSet<&str> = resolved
        .iter()
        .filter_map(|(_, _, ns)| ns.as_deref())
        .collect();
    let namespace_api: Api<Namespace> = Api::all(client.clone());
    for name in namespaces {
        let namespace = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name},
        });
        namespace_api
            .patch(name, &params, &Patch::Apply(&namespace))
            .await
            .with_context(|| format!("creating namespace {name} in the {cluster}"))?;
    }

    for (doc, resource, namespace) in resolved {
        let (api, shown) = match &namespace {
            Some(ns) => (
                Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
                format!("{ns}/{}", doc.name()),
            ),
            None => (
                Api::all_with(client.clone(), &resource),
                doc.name().to_owned(),
            ),
        };
        api.patch(doc.name(), &params, &Patch::Apply(&doc.object))
            .await
            .with_context(|| {
                format!(
                    "applying {} {shown} from {} to the {cluster}",
                    doc.gvk.kind, doc.file
                )
            })?;
        progress.say(&format!(
            "applied {} {shown} ({}) to the {cluster}",
            doc.gvk.kind, doc.file
        ));
    }
    Ok(())
}

async fn resolve(
    client: &Client,
    gvk: &GroupVersionKind,
) -> Result<(ApiResource, ApiCapabilities), kube::Error> {
    let deadline = Instant::now() + DISCOVERY_WAIT;
    loop {
        match discovery::pinned_kind(client, gvk).await {
            Err(_) if Instant::now() < deadline => tokio::time::sleep(POLL).await,
            found => return found,
        }
    }
}

/// Looks every [`POLL`] until `check` returns a value, printing the state
/// it describes whenever it changes; an error after `timeout` with the last
/// state.
async fn wait<T>(
    progress: &Progress,
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> anyhow::Result<Result<T, String>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let state = match check().await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(state)) => state,
            // The API may be briefly unavailable (an apiserver rolling).
            Err(e) => format!("{e:#}"),
        };
        report_change(progress, &mut last, state.clone());
        if Instant::now() >= deadline {
            bail!("{what} after {}s: {state}", timeout.as_secs());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until every example Cluster is Running with its conditions
/// settled (every readiness condition True, nothing Progressing); returns
/// them.
pub async fn wait_clusters(
    meta: &Client,
    clusters: &[Document],
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<Vec<Cluster>> {
    let keys: Vec<(String, String)> = clusters
        .iter()
        .map(|c| {
            (
                c.object
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                c.name().to_owned(),
            )
        })
        .collect();
    wait(
        progress,
        "the Clusters are not Ready",
        timeout,
        async || {
            let mut ready = Vec::new();
            let mut waiting = Vec::new();
            for (ns, name) in &keys {
                let c = Api::<Cluster>::namespaced(meta.clone(), ns)
                    .get(name)
                    .await?;
                let status = c.status.clone().unwrap_or_default();
                let pending: Vec<&str> = status
                    .conditions
                    .iter()
                    .filter(|c| !settled(std::slice::from_ref(c)))
                    .map(|c| c.type_.as_str())
                    .collect();
                if status.phase == Some(ClusterPhase::Running) && settled(&status.conditions) {
                    ready.push(c);
                } else {
                    let phase = status
                        .phase
                        .map_or("Pending".to_owned(), |p| format!("{p:?}"));
                    if phase == "Failed" {
                        bail!("Cluster {ns}/{name} Failed: {:?}", status.conditions);
                    }
                    waiting.push(format!(
                        "{ns}/{name} {phase}{}",
                        if pending.is_empty() {
                            String::new()
                        } else {
                            format!(" (waiting on {})", pending.join(", "))
                        }
                    ));
                }
            }
            Ok(if waiting.is_empty() {
                Ok(ready)
            } else {
                Err(format!("Clusters: {}", waiting.join("; ")))
            })
        },
    )
    .await
}

/// A business cluster that gets workers: where to reach it and what it gets.
pub struct Workers {
    /// `namespace/name` of its Cluster.
    pub key: String,
    pub client: Client,
    pub filled: Filled,
}

/// A Ready worker.
pub struct Worker {
    /// `namespace/name` of its Cluster.
    pub cluster: String,
    pub node: String,
    pub kubelet: String,
}

/// Waits until every Machine of every cluster is Ready and its Node Ready.
pub async fn wait_workers(
    clusters: &[Workers],
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<Vec<Worker>> {
    wait(progress, "the workers are not Ready", timeout, async || {
        let mut ready = Vec::new();
        let mut waiting = Vec::new();
        for cluster in clusters {
            let api = Api::<Machine>::all(cluster.client.clone());
            let nodes = Api::<Node>::all(cluster.client.clone());
            for name in &cluster.filled.machines {
                let m = api.get(name).await?;
                let status = m.status.clone().unwrap_or_default();
                let node = match &status.node_name {
                    Some(node) => nodes.get_opt(node).await?,
                    None => None,
                };
                let node_ready = node.as_ref().is_some_and(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                });
                let phase = status.phase;
                if phase == Some(MachinePhase::Ready) && node_ready {
                    ready.push(Worker {
                        cluster: cluster.key.clone(),
                        node: status.node_name.clone().unwrap_or_default(),
                        kubelet: node
                            .and_then(|n| n.status?.node_info.map(|i| i.kubelet_version))
                            .unwrap_or_default(),
                    });
                } else {
                    // The newest condition says what it is doing.
                    let doing = status
                        .conditions
                        .iter()
                        .max_by_key(|c| c.last_transition_time.0)
                        .map(|c| format!(": {} {}", c.type_, c.message))
                        .unwrap_or_default();
                    waiting.push(format!(
                        "{} Machine {name} {}{}{doing}",
                        cluster.key,
                        phase.map_or("Pending".to_owned(), |p| format!("{p:?}")),
                        if node.is_some() && !node_ready {
                            ", Node not Ready"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
        Ok(if waiting.is_empty() {
            Ok(ready)
        } else {
            Err(waiting.join("; "))
        })
    })
    .await
}

/// Waits until every Pod of every cluster (the add-ons: kube-proxy, the
/// pod network, CoreDNS, the example add-ons) runs and is ready, or has
/// completed: none is left Pending on a cluster that has workers.
pub async fn wait_pods(
    clusters: &[Workers],
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait(progress, "the Pods are not ready", timeout, async || {
        let mut waiting = Vec::new();
        for cluster in clusters {
            let pods = Api::<Pod>::all(cluster.client.clone())
                .list(&Default::default())
                .await?;
            for pod in pods.items {
                let status = pod.status.clone().unwrap_or_default();
                let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
                let ready = status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                match phase.as_str() {
                    "Succeeded" => {}
                    "Running" if ready => {}
                    "Failed" => bail!(
                        "{} Pod {}/{} Failed: {}",
                        cluster.key,
                        pod.metadata.namespace.as_deref().unwrap_or_default(),
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        status.message.unwrap_or_default()
                    ),
                    _ => waiting.push(format!(
                        "{} Pod {}/{} {phase}{}",
                        cluster.key,
                        pod.metadata.namespace.as_deref().unwrap_or_default(),
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        match (phase.as_str(), why_waiting(&pod)) {
                            ("Running", None) => " (not ready)".to_owned(),
                            ("Running", Some(why)) => format!(" (not ready, {why})"),
                            (_, None) => String::new(),
                            (_, Some(why)) => format!(" ({why})"),
                        }
                    )),
                }
            }
            if !waiting.is_empty() {
                let nodes = Api::<Node>::all(cluster.client.clone())
                    .list(&Default::default())
                    .await?;
                waiting.push(format!(
                    "{} Nodes: {}",
                    cluster.key,
                    nodes
                        .items
                        .iter()
                        .map(node_summary)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        Ok(if waiting.is_empty() {
            Ok(())
        } else {
            Err(waiting.join("; "))
        })
    })
    .await
}

/// Why a Pod that is not ready waits, as the scheduler or the kubelet says
/// it: the first condition that is not True with a message, else the first
/// container (init ones first) that waits with a reason. A wait that times
/// out then says more than "Pending".
fn why_waiting(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled");
    if let Some(c) = scheduled.filter(|c| c.status != "True") {
        return Some(format!(
            "not scheduled: {}",
            clip(c.message.as_deref().unwrap_or_default())
        ));
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("?");
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            return Some(format!(
                "on {node}: {} {}: {}",
                c.name,
                w.reason.as_deref().unwrap_or("waiting"),
                clip(w.message.as_deref().unwrap_or_default())
            ));
        }
    }
    Some(format!("on {node}"))
}

/// A Node as one word of a wait's report: its name, Ready or not, and
/// cordoned or tainted.
fn node_summary(node: &Node) -> String {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or("Unknown", |c| c.status.as_str());
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable) == Some(true);
    let taints = spec
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.as_str()).collect::<Vec<_>>())
        .unwrap_or_default();
    format!(
        "{} Ready={ready}{}{}",
        node.metadata.name.as_deref().unwrap_or_default(),
        if cordoned { " cordoned" } else { "" },
        if taints.is_empty() {
            String::new()
        } else {
            format!(" taints={}", taints.join(","))
        }
    )
}

/// At most 160 characters of a message, on one line.
fn clip(message: &str) -> String {
    let line = message.replace('\n', " ");
    match line.char_indices().nth(160) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// Waits until every CanaryRelease of every cluster has succeeded; an error
/// as soon as one halts or rolls back.
pub async fn wait_canaries(
    clusters: &[Workers],
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait(
        progress,
        "the CanaryReleases have not succeeded",
        timeout,
        async || {
            let mut waiting = Vec::new();
            for cluster in clusters {
                let api = Api::<CanaryRelease>::all(cluster.client.clone());
                for canary in &cluster.filled.canaries {
                    let name = canary.name();
                    let key = &cluster.key;
                    let c = api.get(name).await?;
                    let status = c.status.clone().unwrap_or_default();
                    match status.phase {
                        Some(CanaryPhase::Succeeded | CanaryPhase::Promoted) => {}
                        Some(
                            phase @ (CanaryPhase::Halted
                            | CanaryPhase::RollingBack
                            | CanaryPhase::RolledBack),
                        ) => bail!(
                            "{key} CanaryRelease {name} is {phase:?}: {:?}",
                            status.conditions
                        ),
                        phase => waiting.push(format!(
                            "{key} CanaryRelease {name} {}: {} of {} Machines succeeded",
                            phase.map_or("Pending".to_owned(), |p| format!("{p:?}")),
                            status.succeeded,
                            status.machines.len()
                        )),
                    }
                }
            }
            Ok(if waiting.is_empty() {
                Ok(())
            } else {
                Err(waiting.join("; "))
            })
        },
    )
    .await
}
