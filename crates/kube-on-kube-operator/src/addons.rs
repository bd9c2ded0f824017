//! Applying add-ons into the business cluster, once its API answers, with the
//! admin identity over the internal Service (the operator runs in the
//! meta-cluster, where that name resolves).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::controller::MANAGER;
use crate::names::Names;
use crate::render::addons;
use crate::render::control_plane::internal_api_url;
use crate::render::kubeconfig;

/// A client of the business cluster as its admin, through the internal Service.
pub async fn business_client(
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
) -> Result<Client, String> {
    let secret = names.kubeconfig_secret("admin");
    let text = secrets
        .get(&secret)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(kubeconfig::KEY))
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
        .ok_or_else(|| format!("secret {secret} has no kubeconfig yet"))?;
    let mut parsed = Kubeconfig::from_yaml(&text).map_err(|e| format!("secret {secret}: {e}"))?;
    for cluster in parsed
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        cluster.server = Some(internal_api_url(names));
    }
    let mut config = kube::Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("secret {secret}: {e}"))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    Client::try_from(config).map_err(|e| e.to_string())
}

async fn apply<K>(api: Api<K>, obj: &K) -> Result<(), String>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    kok_common::apply::apply(&api, MANAGER, &name, obj)
        .await
        .map(drop)
        .map_err(|e| format!("{} {name}: {e}", K::kind(&())))
}

/// Apply the built-in add-ons: the bootstrap pieces and the node-operator's
/// CRDs.
pub async fn apply_builtin(client: &Client, server: &str, ca_pem: &str) -> Result<(), String> {
    let bootstrap = addons::bootstrap(server, ca_pem);
    apply(
        Api::<ConfigMap>::namespaced(client.clone(), "kube-public"),
        &bootstrap.cluster_info,
    )
    .await?;
    apply(
        Api::<Role>::namespaced(client.clone(), "kube-public"),
        &bootstrap.cluster_info_role,
    )
    .await?;
    apply(
        Api::<RoleBinding>::namespaced(client.clone(), "kube-public"),
        &bootstrap.cluster_info_binding,
    )
    .await?;
    for binding in &bootstrap.cluster_role_bindings {
        apply(Api::<ClusterRoleBinding>::all(client.clone()), binding).await?;
    }
    for (_, crd) in kube_on_kube_api::crds()
        .into_iter()
        .filter(|(file, _)| *file != "cluster.yaml")
    {
        apply(Api::<CustomResourceDefinition>::all(client.clone()), &crd).await?;
    }
    Ok(())
}
