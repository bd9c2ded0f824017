//! Applying add-ons into the business cluster once its API answers, with the
//! admin identity over the internal Service (the operator runs in the
//! meta-cluster, where that name resolves), and the node-operator's Deployment
//! into the meta-cluster.
//!
//! What each add-on put into the business cluster is recorded in an inventory
//! ConfigMap next to the Cluster (`<cluster>-addons`): with it an unchanged
//! add-on costs one read per object instead of a write, a disabled add-on or an
//! object a new version dropped can be removed, and an add-on that cannot be
//! rendered keeps what it applied before.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::shared::{CLUSTER_LABEL, COMPONENT_LABEL};
use serde::{Deserialize, Serialize};

use crate::addon_retry::Report;
use crate::context::{Context, MANAGER};
use crate::names::{Component, Names};
use crate::pki::secrets;
use crate::render::addons::{self as render, Facts, Plan, Settings};
use crate::render::control_plane::internal_api_url;
use crate::render::{config_hash, kubeconfig, owner};

/// How long a connection to a business API may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Data key of the inventory ConfigMap.
pub const INVENTORY_KEY: &str = "inventory.json";
/// An unchanged add-on is applied again after this long anyway, which
/// repairs edits made to its objects in the business cluster.
pub const RESYNC: Duration = Duration::from_secs(30 * 60);
/// Kinds never deleted when an add-on is disabled or drops them: deleting a
/// CRD deletes every object of it, and a Namespace everything in it.
const KEPT_KINDS: [&str; 2] = ["CustomResourceDefinition", "Namespace"];

/// A client of the business cluster as its admin, through the internal
/// Service, built from nothing but what the operator issued: the cluster CA
/// (the one recorded in the Cluster's status, `ca_fingerprint`), the admin
/// client certificate and key (signed by that CA) and the URL the operator
/// computes. The tenant can edit the kubeconfig Secret, so nothing else of it
/// is read: no token, token file, exec plugin, auth provider, proxy or
/// `insecure-skip-tls-verify`, and no proxy from the environment either; the
/// server's certificate is always checked against the cluster CA.
pub async fn business_client(
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
    ca_fingerprint: Option<&str>,
) -> Result<Client, String> {
    use base64::Engine;
    let ca_secret = names.ca_secret();
    let ca_pem = secrets
        .get(&ca_secret)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(secrets::CERT))
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
        .ok_or_else(|| format!("secret {ca_secret} has no CA certificate"))?;
    let fingerprint = crate::pki::certificate_fingerprint(&ca_pem)
        .map_err(|e| format!("secret {ca_secret}: {e}"))?;
    if ca_fingerprint != Some(fingerprint.as_str()) {
        return Err(format!(
            "secret {ca_secret} does not hold the recorded cluster CA ({})",
            ca_fingerprint.unwrap_or("none recorded yet")
        ));
    }
    let secret = names.kubeconfig_secret("admin");
    let admin = secrets
        .get(&secret)
        .and_then(secrets::stored_kubeconfig)
        .ok_or_else(|| format!("secret {secret} has no client certificate and key yet"))?;
    crate::pki::check_client(
        &admin.cert_pem,
        &admin.key_pem,
        &ca_pem,
        time::OffsetDateTime::now_utc(),
    )
    .map_err(|e| format!("secret {secret}: {e}"))?;
    let url = internal_api_url(names);
    let mut config = kube::Config::new(url.parse().map_err(|e| format!("{url}: {e}"))?);
    config.root_cert = Some(vec![
        crate::pki::certificate_der(&ca_pem).map_err(|e| e.to_string())?,
    ]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    config.auth_info = serde_json::from_value(serde_json::json!({
        "client-certificate-data": b64(&admin.cert_pem),
        "client-key-data": b64(&admin.key_pem),
    }))
    .map_err(|e| e.to_string())?;
    // The internal Service is in the operator's own network: a connection
    // that is not made within a second will not be made. Waiting longer
    // only holds a reconcile worker (of `--concurrency`) away from the
    // other Clusters while an unreachable business API is retried.
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(Duration::from_secs(15));
    Client::try_from(config).map_err(|e| e.to_string())
}

/// One object an add-on applied, with what it takes to read or delete it
/// again without discovery.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub plural: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    fn api(&self, client: &Client) -> Api<DynamicObject> {
        let (group, version) = match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &self.kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &self.plural);
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        }
    }

    fn kept(&self) -> bool {
        KEPT_KINDS.contains(&self.kind.as_str())
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// What one add-on last applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub version: String,
    pub hash: String,
    /// Unix time of the last full apply.
    pub applied_at: i64,
    pub objects: Vec<ObjectRef>,
}

/// Every add-on's record, by name.
pub type Inventory = BTreeMap<String, Record>;

/// Name of the inventory ConfigMap of a Cluster.
pub fn inventory_name(names: &Names) -> String {
    format!("{}-addons", names.cluster)
}

/// The Secrets of [`Inputs::secrets`] the add-on step reads: the CA (its
/// certificate goes into add-ons), the admin kubeconfig (to reach the
/// business API) and the node-operator's (its Deployment's config hash).
pub fn secrets_read(names: &Names) -> [String; 3] {
    [
        names.ca_secret(),
        names.kubeconfig_secret("admin"),
        names.kubeconfig_secret("node-operator"),
    ]
}

/// Inputs of one pass.
pub struct Inputs<'a> {
    pub cluster: &'a Cluster,
    pub names: &'a Names,
    /// The Cluster's Secrets (CA, kubeconfigs) as the reconcile has them.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// URL kubelets and users reach the business API at.
    pub endpoint: &'a str,
    /// Fingerprint of the cluster CA recorded in the Cluster's status: the
    /// only CA the business API client trusts.
    pub ca_fingerprint: Option<&'a str>,
}

/// Resolved kinds of one pass, so each group-version is discovered once.
#[derive(Default)]
struct Kinds(HashMap<(String, String), (ApiResource, bool)>);

impl Kinds {
    async fn resolve(
        &mut self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), String> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.0.get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| {
                format!("the business cluster does not serve {kind} {api_version}: {e}")
            })?;
        let found = (resource, caps.scope == Scope::Namespaced);
        self.0.insert(key, found.clone());
        Ok(found)
    }
}

/// Server-side apply every object; Namespaces and CRDs first so what lives in
/// them can follow.
async fn apply_objects(
    client: &Client,
    kinds: &mut Kinds,
    objects: &[DynamicObject],
) -> Result<Vec<ObjectRef>, String> {
    let mut ordered: Vec<&DynamicObject> = objects.iter().collect();
    ordered.sort_by_key(|o| {
        let kind = o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("");
        !KEPT_KINDS.contains(&kind)
    });
    let mut refs = Vec::with_capacity(objects.len());
    for object in ordered {
        let types = object.types.clone().unwrap_or_default();
        let name = object.name_any();
        let (resource, namespaced) = kinds
            .resolve(client, &types.api_version, &types.kind)
            .await?;
        let namespace =
            namespaced.then(|| object.namespace().unwrap_or_else(|| "default".to_string()));
        let reference = ObjectRef {
            api_version: types.api_version.clone(),
            kind: types.kind.clone(),
            plural: resource.plural.clone(),
            namespace,
            name: name.clone(),
        };
        let mut object = object.clone();
        object.metadata.namespace = reference.namespace.clone();
        kok_common::apply::apply(&reference.api(client), MANAGER, &name, &object)
            .await
            .map_err(|e| format!("{reference}: {e}"))?;
        refs.push(reference);
    }
    Ok(refs)
}

/// Whether every recorded object is still there (and not being deleted).
async fn all_exist(client: &Client, objects: &[ObjectRef]) -> Result<bool, String> {
    for reference in objects {
        let found = reference
            .api(client)
            .get_metadata_opt(&reference.name)
            .await
            .map_err(|e| format!("{reference}: {e}"))?;
        if found.is_none_or(|m| m.metadata.deletion_timestamp.is_some()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Delete objects (except [`KEPT_KINDS`]); already gone is fine.
async fn delete_objects(client: &Client, objects: &[ObjectRef]) -> Result<(), String> {
    for reference in objects.iter().filter(|r| !r.kept()) {
        match reference
            .api(client)
            .delete(&reference.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("deleting {reference}: {e}")),
        }
    }
    Ok(())
}

/// The registered add-on templates the Cluster can use: its own namespace's
/// first, then the operator's template namespace. Only templates of the
/// add-ons it uses are listed, within the operator's limits; a template
/// larger than `--max-addon-template-bytes` is dropped unparsed (and
/// reported as unusable).
pub async fn templates(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
) -> Result<(Vec<render::Template>, Vec<render::Broken>), TemplatesError> {
    let mut namespaces = vec![names.namespace.clone()];
    if let Some(ns) = &ctx.config.addon_template_namespace
        && *ns != names.namespace
    {
        namespaces.push(ns.clone());
    }
    let mut found = Vec::new();
    let mut broken = Vec::new();
    let Some(selector) = render::template_selector(cluster) else {
        return Ok((found, broken));
    };
    let params = ListParams::default().labels(&selector);
    let limits = &ctx.config.limits;
    for ns in namespaces {
        let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
        let sieve = |map: ConfigMap| match render::within(&map, limits.max_template_bytes) {
            Ok(()) => Some(map),
            Err(b) => {
                broken.push(b);
                None
            }
        };
        let mut maps = crate::bounded::list_sieved(&api, &ns, &params, limits, sieve)
            .await
            .map_err(|e| match e {
                crate::bounded::ListError::Exceeded(e) => TemplatesError::Exceeded(e),
                e => TemplatesError::Unreadable(format!("add-on templates: {e}")),
            })?;
        maps.sort_by_key(|m| m.name_any());
        for map in &maps {
            match render::registered(map) {
                Ok(t) => found.push(t),
                Err(b) => broken.push(b),
            }
        }
    }
    Ok((found, broken))
}

/// Why the add-on templates could not be read.
#[derive(Debug)]
pub enum TemplatesError {
    /// The namespace holds more template ConfigMaps than the limits allow.
    Exceeded(crate::bounded::Exceeded),
    /// The list failed.
    Unreadable(String),
}

impl TemplatesError {
    fn report(self) -> Report {
        match self {
            TemplatesError::Exceeded(e) => {
                Report::failure(crate::bounded::TOO_MANY_OBJECTS, e.to_string())
            }
            TemplatesError::Unreadable(e) => Report::failure("TemplatesUnreadable", e),
        }
    }
}

/// The inventory of the Cluster `owner`; a ConfigMap of its name that the
/// Cluster does not control is not its inventory (a forged one would have
/// the step delete what it lists): a `NameConflict` failure.
async fn read_inventory(
    api: &Api<ConfigMap>,
    name: &str,
    owner: &OwnerReference,
) -> Result<Inventory, (&'static str, String)> {
    let map = api.get_opt(name).await.map_err(|e| {
        (
            "InventoryUnreadable",
            format!("reading ConfigMap {name}: {e}"),
        )
    })?;
    if let Some(map) = &map {
        crate::ownership::check("ConfigMap", owner, &map.metadata)
            .map_err(|c| (crate::refused::NAME_CONFLICT, c.to_string()))?;
    }
    Ok(map
        .and_then(|m| m.data)
        .and_then(|d| d.get(INVENTORY_KEY).cloned())
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default())
}

async fn write_inventory(
    api: &Api<ConfigMap>,
    inputs: &Inputs<'_>,
    inventory: &Inventory,
) -> Result<(), String> {
    let name = inventory_name(inputs.names);
    let labels: BTreeMap<String, String> = [
        (CLUSTER_LABEL.to_string(), inputs.names.cluster.clone()),
        (COMPONENT_LABEL.to_string(), "addons".to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGER.to_string(),
        ),
    ]
    .into();
    let text = serde_json::to_string_pretty(inventory).map_err(|e| e.to_string())?;
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(inputs.names.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner(inputs.cluster)]),
            ..Default::default()
        },
        data: Some([(INVENTORY_KEY.to_string(), text)].into()),
        ..Default::default()
    };
    crate::ownership::guard(api, &map, None)
        .await
        .map_err(|e| format!("writing ConfigMap {name}: {e}"))?;
    kok_common::apply::apply(api, MANAGER, &name, &map)
        .await
        .map(drop)
        .map_err(|e| format!("writing ConfigMap {name}: {e}"))
}

/// The node-operator Deployment's config hash: its kubeconfig Secret and image.
fn node_operator_hash(inputs: &Inputs<'_>, image: &str) -> String {
    let secret = inputs.names.kubeconfig_secret("node-operator");
    let data = inputs
        .secrets
        .get(&secret)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(kubeconfig::KEY))
        .map(|v| v.0.as_slice())
        .unwrap_or_default();
    config_hash([("kubeconfig", data), ("image", image.as_bytes())])
}

/// Publish an Event on the Cluster about one add-on (`addon`: its name, or
/// name@version). The Event's related object is the add-on's entry in the
/// inventory ConfigMap: the recorder folds Events with the same reason,
/// action and objects into one series that keeps the first note, so without
/// it "applied coredns" would hide every later "applied …" on the Cluster.
async fn addon_event(
    ctx: &Context,
    inputs: &Inputs<'_>,
    type_: EventType,
    reason: &str,
    action: &str,
    addon: &str,
    note: String,
) {
    let related = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(inputs.names.namespace.clone()),
        name: Some(inventory_name(inputs.names)),
        field_path: Some(format!("data[{INVENTORY_KEY}].{addon}")),
        ..Default::default()
    };
    crate::context::publish_related(
        ctx,
        inputs.cluster,
        type_,
        reason,
        action,
        note,
        Some(related),
    )
    .await;
}

/// Converge every add-on of one Cluster and say how that went.
pub async fn reconcile(ctx: &Context, inputs: &Inputs<'_>) -> Report {
    let cluster = inputs.cluster;
    let names = inputs.names;
    let ca_pem = inputs
        .secrets
        .get(&names.ca_secret())
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(secrets::CERT))
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
        .unwrap_or_default();
    let image = ctx.config.node_operator_image.clone().unwrap_or_else(|| {
        format!(
            "{}/node-operator:{}",
            ctx.config.registry,
            env!("CARGO_PKG_VERSION")
        )
    });
    let settings = Settings {
        registry: &ctx.config.registry,
        operator_version: env!("CARGO_PKG_VERSION"),
        node_operator_image: &image,
    };
    let facts = Facts {
        names,
        endpoint: inputs.endpoint,
        ca_pem: &ca_pem,
    };
    // One cheap request first, so an unreachable API costs one timeout, not
    // one per add-on, and no read of the meta-cluster (a Cluster whose
    // business API is down keeps retrying this step).
    let business = match business_client(names, inputs.secrets, inputs.ca_fingerprint).await {
        Ok(c) => match c.apiserver_version().await {
            Ok(_) => c,
            Err(e) => {
                return Report::failure(
                    "BusinessAPIUnreachable",
                    format!("the business API does not answer: {e}"),
                );
            }
        },
        Err(e) => return Report::failure("BusinessAPIUnreachable", e),
    };
    let (registered, broken) = match templates(ctx, cluster, names).await {
        Ok(t) => t,
        Err(e) => return e.report(),
    };
    let plans = render::plan(cluster, &settings, &registered, &broken);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let controller = owner(cluster);
    let mut inventory = match read_inventory(&maps, &inventory_name(names), &controller).await {
        Ok(i) => i,
        Err((reason, e)) => return Report::failure(reason, e),
    };
    let before = inventory.clone();

    let mut kinds = Kinds::default();
    let mut applied: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut unknown = false;
    let mut invalid = false;
    let mut node_operator_values = None;
    for plan in &plans {
        match plan {
            Plan::Apply(planned) => {
                let label = format!("{}@{}", planned.name, planned.version);
                let result = match render::render(planned, cluster, &facts, &settings) {
                    Err(e) => {
                        invalid = true;
                        Err(e)
                    }
                    Ok(rendered) => {
                        let record = inventory.get(&planned.name);
                        let now = time::OffsetDateTime::now_utc().unix_timestamp();
                        let fresh = match record {
                            Some(r)
                                if r.hash == rendered.hash
                                    && now - r.applied_at < RESYNC.as_secs() as i64 =>
                            {
                                all_exist(&business, &r.objects).await
                            }
                            _ => Ok(false),
                        };
                        match fresh {
                            Err(e) => Err(e),
                            Ok(true) => Ok(()),
                            Ok(false) => {
                                match apply_objects(&business, &mut kinds, &rendered.objects).await
                                {
                                    Err(e) => Err(e),
                                    Ok(refs) => {
                                        let new: BTreeSet<&ObjectRef> = refs.iter().collect();
                                        let dropped: Vec<ObjectRef> = record
                                            .map(|r| {
                                                r.objects
                                                    .iter()
                                                    .filter(|o| !new.contains(o))
                                                    .cloned()
                                                    .collect()
                                            })
                                            .unwrap_or_default();
                                        let changed =
                                            record.is_none_or(|r| r.hash != rendered.hash);
                                        let pruned = delete_objects(&business, &dropped).await;
                                        if changed {
                                            addon_event(
                                                ctx,
                                                inputs,
                                                EventType::Normal,
                                                "AddonApplied",
                                                "ApplyAddon",
                                                &label,
                                                format!("applied {label} ({} objects)", refs.len()),
                                            )
                                            .await;
                                        }
                                        inventory.insert(
                                            planned.name.clone(),
                                            Record {
                                                version: planned.version.clone(),
                                                hash: rendered.hash.clone(),
                                                applied_at: time::OffsetDateTime::now_utc()
                                                    .unix_timestamp(),
                                                objects: refs,
                                            },
                                        );
                                        pruned
                                    }
                                }
                            }
                        }
                    }
                };
                match result {
                    Ok(()) => {
                        applied.push(label);
                        if planned.name == render::NODE_OPERATOR {
                            node_operator_values = Some(planned.values.clone());
                        }
                    }
                    Err(e) => {
                        addon_event(
                            ctx,
                            inputs,
                            EventType::Warning,
                            "AddonFailed",
                            "ApplyAddon",
                            &label,
                            format!("{label}: {e}"),
                        )
                        .await;
                        failed.push(format!("{label}: {e}"));
                    }
                }
            }
            Plan::Invalid {
                name,
                version,
                reason,
            } => {
                unknown = true;
                let label = format!("{name}@{version}");
                let message = format!("{label}: {reason}");
                addon_event(
                    ctx,
                    inputs,
                    EventType::Warning,
                    "AddonFailed",
                    "ResolveAddon",
                    &label,
                    message.clone(),
                )
                .await;
                failed.push(message);
            }
            Plan::Disabled { .. } => {}
        }
    }
    // Disabled add-ons, and user add-ons no longer listed, are removed.
    let keep: BTreeSet<&str> = plans
        .iter()
        .filter(|p| !matches!(p, Plan::Disabled { .. }))
        .map(Plan::name)
        .collect();
    let gone: Vec<String> = inventory
        .keys()
        .filter(|name| !keep.contains(name.as_str()))
        .cloned()
        .collect();
    for name in gone {
        let objects = inventory
            .get(&name)
            .map(|r| r.objects.clone())
            .unwrap_or_default();
        match delete_objects(&business, &objects).await {
            Ok(()) => {
                inventory.remove(&name);
                addon_event(
                    ctx,
                    inputs,
                    EventType::Normal,
                    "AddonRemoved",
                    "RemoveAddon",
                    &name,
                    format!("removed {name}"),
                )
                .await;
            }
            Err(e) => {
                addon_event(
                    ctx,
                    inputs,
                    EventType::Warning,
                    "AddonFailed",
                    "RemoveAddon",
                    &name,
                    format!("{name}: {e}"),
                )
                .await;
                failed.push(format!("removing {name}: {e}"));
            }
        }
    }
    if inventory != before
        && let Err(e) = write_inventory(&maps, inputs, &inventory).await
    {
        failed.push(e);
    }

    // The node-operator runs in the meta-cluster once its CRDs and rights exist.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let deployment_name = names.deployment(Component::NodeOperator);
    let mut node_operator = None;
    let mut image_refused = false;
    // Its image runs in the meta-cluster: checked as the spec's images are,
    // whether the Cluster's values or a template's defaults name it.
    if let Some(values) = &node_operator_values
        && let Some(refusal) = crate::policy::node_operator_refusal(values, &ctx.config)
    {
        image_refused = true;
        addon_event(
            ctx,
            inputs,
            EventType::Warning,
            refusal.reason,
            "ApplyAddon",
            render::NODE_OPERATOR,
            refusal.to_string(),
        )
        .await;
        failed.push(format!(
            "{refusal}; Deployment {deployment_name} is left as it is"
        ));
    }
    if let Some(values) = node_operator_values.as_ref().filter(|_| !image_refused) {
        let image = values
            .get("image")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let desired = render::node_operator(
            cluster,
            names,
            values,
            &ctx.config,
            &node_operator_hash(inputs, image),
        );
        let written = match crate::ownership::guard(&deployments, &desired, None).await {
            Ok(()) => kok_common::apply::apply(&deployments, MANAGER, &deployment_name, &desired)
                .await
                .map_err(crate::Error::from),
            Err(e) => Err(e),
        };
        match written {
            Ok(d) => {
                let want = desired.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let ready = d
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0);
                node_operator = Some((ready, want));
            }
            Err(e) => {
                if let crate::Error::NameConflict(c) = &e {
                    addon_event(
                        ctx,
                        inputs,
                        EventType::Warning,
                        crate::refused::NAME_CONFLICT,
                        "ApplyDeployment",
                        render::NODE_OPERATOR,
                        c.to_string(),
                    )
                    .await;
                }
                failed.push(format!("Deployment {deployment_name}: {e}"))
            }
        }
    } else if plans
        .iter()
        .any(|p| matches!(p, Plan::Disabled { name } if name == render::NODE_OPERATOR))
    {
        match crate::ownership::delete_owned(
            &deployments,
            &deployment_name,
            &controller,
            &DeleteParams::background(),
        )
        .await
        {
            Ok(false) => {}
            Ok(true) => {
                addon_event(
                    ctx,
                    inputs,
                    EventType::Normal,
                    "AddonRemoved",
                    "RemoveDeployment",
                    render::NODE_OPERATOR,
                    format!("removed Deployment {deployment_name}"),
                )
                .await;
            }
            Err(e) => failed.push(format!("deleting Deployment {deployment_name}: {e}")),
        }
    }
    let trouble = if unknown {
        Some(Trouble::UnknownAddon)
    } else if image_refused {
        Some(Trouble::ImageNotAllowed)
    } else if invalid {
        Some(Trouble::InvalidTemplate)
    } else if !failed.is_empty() {
        Some(Trouble::ApplyFailed)
    } else {
        None
    };
    summarize(&applied, &failed, trouble, node_operator)
}

/// The worst thing that went wrong in a pass, for the condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// `spec.addons` names an add-on or version no template provides.
    UnknownAddon,
    /// A template could not be rendered into objects.
    InvalidTemplate,
    /// Rendered objects could not be applied or removed.
    ApplyFailed,
    /// The node-operator's image is not one the operator's flags allow.
    ImageNotAllowed,
}

impl Trouble {
    fn reason(self) -> &'static str {
        match self {
            Trouble::UnknownAddon => "UnknownAddon",
            Trouble::InvalidTemplate => "InvalidTemplate",
            Trouble::ApplyFailed => "ApplyFailed",
            Trouble::ImageNotAllowed => crate::policy::IMAGE_NOT_ALLOWED,
        }
    }
}

/// The AddonsReady outcome from what happened.
pub fn summarize(
    applied: &[String],
    failed: &[String],
    trouble: Option<Trouble>,
    node_operator: Option<(i32, i32)>,
) -> Report {
    let mut message = String::new();
    if !failed.is_empty() {
        message.push_str(&format!("failed: {}; ", failed.join("; ")));
    }
    message.push_str(&format!("applied: {}", applied.join(", ")));
    if let Some((ready, want)) = node_operator {
        message.push_str(&format!("; node-operator {ready}/{want} ready"));
    }
    let operator_ready = node_operator.is_none_or(|(ready, want)| ready >= want);
    let (ready, reason) = if let Some(trouble) = trouble {
        (false, trouble.reason())
    } else if !failed.is_empty() {
        (false, Trouble::ApplyFailed.reason())
    } else if !operator_ready {
        (false, "NodeOperatorNotReady")
    } else {
        (true, "Applied")
    };
    Report {
        ready,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_failures_first_and_the_node_operator() {
        let applied = vec!["bootstrap@0.1.0".to_string(), "coredns@1.12.1".to_string()];
        let ok = summarize(&applied, &[], None, Some((1, 1)));
        assert!(ok.ready);
        assert_eq!(ok.reason, "Applied");
        assert_eq!(
            ok.message,
            "applied: bootstrap@0.1.0, coredns@1.12.1; node-operator 1/1 ready"
        );
        let waiting = summarize(&applied, &[], None, Some((0, 1)));
        assert_eq!(
            (waiting.ready, waiting.reason),
            (false, "NodeOperatorNotReady")
        );
        let bad = summarize(
            &applied,
            &["x@1.0.0: no template".into()],
            Some(Trouble::UnknownAddon),
            None,
        );
        assert_eq!((bad.ready, bad.reason), (false, "UnknownAddon"));
        assert!(
            bad.message
                .starts_with("failed: x@1.0.0: no template; applied: bootstrap@0.1.0")
        );
        let failed = summarize(&applied, &["y: refused".into()], None, Some((1, 1)));
        assert_eq!(failed.reason, "ApplyFailed");
        let invalid = summarize(
            &applied,
            &["z@1.0.0: template: no value for values.x".into()],
            Some(Trouble::InvalidTemplate),
            Some((1, 1)),
        );
        assert_eq!((invalid.ready, invalid.reason), (false, "InvalidTemplate"));
    }

    #[test]
    fn object_refs_round_trip_and_address_their_api() {
        let r = ObjectRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespace: Some("kube-system".into()),
            name: "coredns".into(),
        };
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(serde_json::from_str::<ObjectRef>(&text).expect("back"), r);
        assert_eq!(r.to_string(), "Deployment kube-system/coredns");
        assert!(!r.kept());
        let crd = ObjectRef {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            plural: "customresourcedefinitions".into(),
            namespace: None,
            name: "machines.kubeonkube.io".into(),
        };
        assert!(crd.kept());
    }
}
