//! kube-apiserver's files from the tenant's objects (audit policy, audit
//! webhook kubeconfig, JWT issuers): read from the Cluster's namespace,
//! checked ([`crate::render::apiserver_files`]) and applied as the
//! operator's own objects, which kube-apiserver mounts. A missing or
//! refused object holds them: what kube-apiserver runs with stays as it
//! was, and the APIServerReady condition says what to fix.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube_on_kube_api::cluster::Cluster;
use serde_json::Value;

use crate::context::Context;
use crate::error::Error;
use crate::names::Names;
use crate::render::apiserver_files::{
    AUTHENTICATION_KEY, DEFAULT_POLICY, POLICY_KEY, WEBHOOK_KEY, audit_policy, jwt_issuers,
    webhook_kubeconfig,
};
use crate::render::config_hash;

/// The files kube-apiserver reads, as checked.
#[derive(Debug, Default)]
pub struct Files {
    pub jwt: Vec<Value>,
    /// The audit policy, when the Cluster audits.
    pub policy: Option<String>,
    /// The audit webhook's kubeconfig, when it has one.
    pub webhook: Option<String>,
}

impl Files {
    /// The hash kube-apiserver's Pods carry, so that they roll when one of
    /// these changes (kube-apiserver reads the audit files at start only);
    /// None for a Cluster with none of them, whose Pods keep their hash.
    pub fn hash(&self) -> Option<String> {
        if self.jwt.is_empty() && self.policy.is_none() && self.webhook.is_none() {
            return None;
        }
        let jwt = serde_json::to_vec(&self.jwt).unwrap_or_default();
        Some(config_hash([
            ("jwt", jwt.as_slice()),
            (
                "policy",
                self.policy.as_deref().unwrap_or_default().as_bytes(),
            ),
            (
                "webhook",
                self.webhook.as_deref().unwrap_or_default().as_bytes(),
            ),
        ]))
    }
}

/// Why the tenant's files are held: the condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub reason: &'static str,
    pub message: String,
}

/// Reads and checks the objects the Cluster's spec names. Ok(Err(held))
/// when one is missing or refused.
pub async fn read(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
) -> Result<Result<Files, Held>, Error> {
    let spec = &cluster.spec.api_server;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let refused = &ctx.config.meta_networks;
    let mut files = Files::default();
    if let Some(authentication) = &spec.authentication {
        let name = &authentication.config_map;
        let text = match config_map_key(&maps, &names.namespace, name, AUTHENTICATION_KEY).await? {
            Ok(text) => text,
            Err(missing) => return Ok(Err(held("AuthenticationConfigMissing", missing))),
        };
        match jwt_issuers(&text, refused) {
            Ok(jwt) => files.jwt = jwt,
            Err(e) => {
                return Ok(Err(held(
                    "AuthenticationConfigRefused",
                    format!("ConfigMap {name} key {AUTHENTICATION_KEY}: {e}"),
                )));
            }
        }
    }
    if let Some(audit) = &spec.audit {
        files.policy = Some(match &audit.policy_config_map {
            None => DEFAULT_POLICY.to_string(),
            Some(name) => {
                let text = match config_map_key(&maps, &names.namespace, name, POLICY_KEY).await? {
                    Ok(text) => text,
                    Err(missing) => return Ok(Err(held("AuditPolicyMissing", missing))),
                };
                match audit_policy(&text) {
                    Ok(policy) => policy,
                    Err(e) => {
                        return Ok(Err(held(
                            "AuditPolicyRefused",
                            format!("ConfigMap {name} key {POLICY_KEY}: {e}"),
                        )));
                    }
                }
            }
        });
        if let Some(webhook) = &audit.webhook {
            let name = &webhook.kubeconfig_secret;
            let secret = secrets
                .get_opt(name)
                .await
                .map_err(Error::kube(format!("reading Secret {name}")))?;
            let bytes = secret
                .and_then(|s| s.data)
                .and_then(|mut d| d.remove(WEBHOOK_KEY));
            let Some(bytes) = bytes else {
                return Ok(Err(held(
                    "AuditWebhookMissing",
                    format!(
                        "Secret {name} with key {WEBHOOK_KEY} not found in namespace {}",
                        names.namespace
                    ),
                )));
            };
            let checked = std::str::from_utf8(&bytes.0)
                .map_err(|_| "not UTF-8".to_string())
                .and_then(|text| webhook_kubeconfig(text, refused));
            match checked {
                Ok(kubeconfig) => files.webhook = Some(kubeconfig),
                Err(e) => {
                    return Ok(Err(held(
                        "AuditWebhookRefused",
                        format!("Secret {name} key {WEBHOOK_KEY}: {e}"),
                    )));
                }
            }
        }
    }
    Ok(Ok(files))
}

/// The ConfigMaps of its namespace a Cluster names for kube-apiserver.
pub fn config_maps(cluster: &Cluster) -> Vec<&str> {
    let spec = &cluster.spec.api_server;
    let policy = spec
        .audit
        .as_ref()
        .and_then(|a| a.policy_config_map.as_deref());
    let authentication = spec.authentication.as_ref().map(|a| a.config_map.as_str());
    policy.into_iter().chain(authentication).collect()
}

/// The Secrets of its namespace a Cluster names for kube-apiserver.
pub fn secrets(cluster: &Cluster) -> Vec<&str> {
    let audit = cluster.spec.api_server.audit.as_ref();
    let webhook = audit.and_then(|a| a.webhook.as_ref());
    webhook
        .map(|w| w.kubeconfig_secret.as_str())
        .into_iter()
        .collect()
}

fn held(reason: &'static str, message: String) -> Held {
    Held { reason, message }
}

/// The text under `key` of ConfigMap `name`; Ok(Err) says what is missing.
async fn config_map_key(
    maps: &Api<ConfigMap>,
    ns: &str,
    name: &str,
    key: &str,
) -> Result<Result<String, String>, Error> {
    let map = maps
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {name}")))?;
    let mut data: BTreeMap<String, String> = map.and_then(|m| m.data).unwrap_or_default();
    Ok(data
        .remove(key)
        .ok_or_else(|| format!("ConfigMap {name} with key {key} not found in namespace {ns}")))
}
