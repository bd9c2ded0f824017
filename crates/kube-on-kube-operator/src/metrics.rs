//! The Cluster controller's domain metrics: certificate expiry per Secret and
//! etcd member health, recorded after every reconcile into the process's
//! metrics (`kok_common::metrics`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use crate::etcd::Report;
use crate::names::Names;
use crate::pki;
use crate::secrets::CERT;

/// Record what one reconcile of a Cluster saw.
pub fn record(names: &Names, secrets: &BTreeMap<String, Secret>, etcd: &Report) {
    let metrics = kok_common::metrics::global();
    let certificates = secrets.iter().filter_map(|(name, secret)| {
        let pem = secret.data.as_ref()?.get(CERT)?;
        let info = pki::inspect(std::str::from_utf8(&pem.0).ok()?).ok()?;
        Some((name.as_str(), info.not_after.unix_timestamp()))
    });
    metrics.set_certificates(&names.namespace, &names.cluster, certificates);
    metrics.set_etcd_members(
        &names.namespace,
        &names.cluster,
        etcd.members.iter().map(|m| (m.name.as_str(), m.healthy)),
    );
}
