//! The PKI step: from the certificate plan and the Secrets that exist, the
//! Secrets to write. Certificate authorities and the service-account key are
//! created once and kept; leaf certificates and kubeconfigs are issued again
//! only when they no longer match the plan or are about to expire.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_on_kube_api::cluster::Cluster;
use time::OffsetDateTime;

use crate::certs::{Authority, PlannedCert, Target};
use crate::names::Names;
use crate::pki::{self, CertInfo, KeyCert, PkiError};
use crate::render::kubeconfig::{self, KubeconfigInput};
use crate::render::owner;

/// Data keys of CA Secrets (`kubernetes.io/tls`).
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";
/// Data key of the issuing CA in leaf Secrets.
pub const CA: &str = "ca.crt";

/// A Secret to write, and why.
#[derive(Debug, Clone)]
pub struct Change {
    pub secret: Secret,
    /// `Created`, `Expiring`, `SubjectAltNamesChanged`, …
    pub reason: &'static str,
}

/// What the step decided: Secrets to write, and the earliest leaf expiry among
/// the certificates that will exist afterwards.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub changes: Vec<Change>,
    pub earliest_expiry: Option<OffsetDateTime>,
}

/// Inputs besides the plan.
pub struct Inputs<'a> {
    pub cluster: &'a Cluster,
    pub names: &'a Names,
    /// Secrets of this cluster that exist now, by name.
    pub existing: &'a BTreeMap<String, Secret>,
    pub now: OffsetDateTime,
    pub validity: Duration,
    pub renew_before: Duration,
    /// API URL for kubeconfigs of users and kubelets.
    pub external_url: &'a str,
    /// API URL for kubeconfigs of components in the meta-cluster.
    pub internal_url: &'a str,
}

fn data(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
}

fn secret(inputs: &Inputs<'_>, name: &str, type_: &str, entries: Vec<(&str, String)>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(inputs.names.namespace.clone()),
            labels: Some(
                [(
                    kube_on_kube_api::shared::CLUSTER_LABEL.to_string(),
                    inputs.names.cluster.clone(),
                )]
                .into(),
            ),
            owner_references: Some(vec![owner(inputs.cluster)]),
            ..Default::default()
        },
        type_: Some(type_.to_string()),
        data: Some(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Load a CA from its Secret, or create it.
fn ca(
    inputs: &Inputs<'_>,
    name: &str,
    common_name: &str,
    out: &mut Outcome,
) -> Result<KeyCert, PkiError> {
    if let Some(existing) = inputs.existing.get(name)
        && let (Some(cert_pem), Some(key_pem)) = (data(existing, CERT), data(existing, KEY))
        && pki::inspect(&cert_pem).is_ok()
    {
        return Ok(KeyCert { cert_pem, key_pem });
    }
    let created = pki::new_ca(common_name, inputs.now)?;
    out.changes.push(Change {
        secret: secret(
            inputs,
            name,
            "kubernetes.io/tls",
            vec![
                (CERT, created.cert_pem.clone()),
                (KEY, created.key_pem.clone()),
            ],
        ),
        reason: "Created",
    });
    Ok(created)
}

/// The client certificate inside a kubeconfig Secret, and its server URL.
fn kubeconfig_cert(existing: &Secret) -> Option<(String, String)> {
    use base64::Engine;
    let text = data(existing, kubeconfig::KEY)?;
    let parsed = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let server = parsed.clusters.first()?.cluster.as_ref()?.server.clone()?;
    let cert = parsed
        .auth_infos
        .first()?
        .auth_info
        .as_ref()?
        .client_certificate_data
        .clone()?;
    let cert = base64::engine::general_purpose::STANDARD
        .decode(cert)
        .ok()?;
    Some((String::from_utf8(cert).ok()?, server))
}

/// Decide every PKI Secret of the cluster.
pub fn reconcile(inputs: &Inputs<'_>, plan: &[PlannedCert]) -> Result<Outcome, PkiError> {
    let mut out = Outcome::default();
    let names = inputs.names;
    let cluster_ca = ca(inputs, &names.ca_secret(), "kubernetes", &mut out)?;
    let etcd_ca = ca(inputs, &names.etcd_ca_secret(), "etcd-ca", &mut out)?;
    let front_proxy_ca = ca(
        inputs,
        &names.front_proxy_ca_secret(),
        "front-proxy-ca",
        &mut out,
    )?;
    let sa = names.service_account_secret();
    if inputs
        .existing
        .get(&sa)
        .and_then(|s| data(s, "sa.key"))
        .is_none()
    {
        let (private, public) = pki::new_service_account_key()?;
        out.changes.push(Change {
            secret: secret(
                inputs,
                &sa,
                "Opaque",
                vec![("sa.key", private), ("sa.pub", public)],
            ),
            reason: "Created",
        });
    }
    let infos: BTreeMap<Authority, (KeyCert, CertInfo)> = [
        (Authority::Cluster, cluster_ca),
        (Authority::Etcd, etcd_ca),
        (Authority::FrontProxy, front_proxy_ca),
    ]
    .into_iter()
    .map(|(a, kc)| pki::inspect(&kc.cert_pem).map(|info| (a, (kc, info))))
    .collect::<Result<_, _>>()?;

    for planned in plan {
        let (ca, ca_info) = &infos[&planned.authority];
        let (name, current, url) = match &planned.target {
            Target::TlsSecret(name) => (
                name,
                inputs
                    .existing
                    .get(name)
                    .and_then(|s| data(s, CERT))
                    .map(|c| (c, String::new())),
                None,
            ),
            Target::Kubeconfig { secret, external } => {
                let url = if *external {
                    inputs.external_url
                } else {
                    inputs.internal_url
                };
                (
                    secret,
                    inputs.existing.get(secret).and_then(kubeconfig_cert),
                    Some(url),
                )
            }
        };
        let reason = match &current {
            None => Some("Created"),
            Some((cert, server)) => match pki::inspect(cert) {
                Err(_) => Some("Unreadable"),
                Ok(info) => {
                    let reissue = pki::reissue_reason(
                        &info,
                        ca_info,
                        &planned.spec,
                        inputs.now,
                        inputs.renew_before,
                    );
                    if reissue.is_none() {
                        note_expiry(&mut out, info.not_after);
                    }
                    match (reissue, url) {
                        (Some(r), _) => Some(r),
                        (None, Some(url)) if url != server => Some("EndpointChanged"),
                        (None, _) => None,
                    }
                }
            },
        };
        let Some(reason) = reason else { continue };
        let issued = pki::issue(ca, &planned.spec, inputs.now, inputs.validity)?;
        note_expiry(&mut out, inputs.now + inputs.validity);
        let secret = match url {
            None => secret(
                inputs,
                name,
                "kubernetes.io/tls",
                vec![
                    (CERT, issued.cert_pem),
                    (KEY, issued.key_pem),
                    (CA, ca.cert_pem.clone()),
                ],
            ),
            Some(server) => {
                let text = kubeconfig::render(&KubeconfigInput {
                    cluster: &names.cluster,
                    user: &planned.spec.common_name,
                    server,
                    ca_pem: &infos[&Authority::Cluster].0.cert_pem,
                    cert_pem: &issued.cert_pem,
                    key_pem: &issued.key_pem,
                });
                secret(inputs, name, "Opaque", vec![(kubeconfig::KEY, text)])
            }
        };
        out.changes.push(Change { secret, reason });
    }
    Ok(out)
}

fn note_expiry(out: &mut Outcome, at: OffsetDateTime) {
    out.earliest_expiry = Some(out.earliest_expiry.map_or(at, |e| e.min(at)));
}

/// How long until the first leaf certificate that expires at
/// `earliest_expiry` is due for renewal (`renew_before` ahead of it), so the
/// reconcile comes back then even when nothing else changes. A second past
/// the due time, so that the renewal check sees it due; zero when it is
/// already due.
pub fn until_renewal(
    earliest_expiry: OffsetDateTime,
    renew_before: Duration,
    now: OffsetDateTime,
) -> Duration {
    let due = earliest_expiry - renew_before + Duration::from_secs(1);
    Duration::try_from(due - now).unwrap_or(Duration::ZERO)
}

/// Apply `changes` to `existing` as the API server would, for tests and for
/// computing config hashes before the writes land.
pub fn merged(existing: &BTreeMap<String, Secret>, changes: &[Change]) -> BTreeMap<String, Secret> {
    let mut all = existing.clone();
    for change in changes {
        if let Some(name) = &change.secret.metadata.name {
            all.insert(name.clone(), change.secret.clone());
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;
    use kube_on_kube_api::cluster::ClusterMode;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-production.yaml"))
                .expect("example");
        c.metadata.uid = Some("uid-1".into());
        c.spec.mode = ClusterMode::Minimal;
        c
    }

    fn at(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000 + secs).expect("time")
    }

    #[test]
    fn the_reconcile_returns_when_the_first_certificate_is_due() {
        let ten_minutes = Duration::from_secs(600);
        let seven_and_a_half = Duration::from_secs(450);
        assert_eq!(
            until_renewal(at(600), seven_and_a_half, at(0)),
            Duration::from_secs(151)
        );
        assert_eq!(
            until_renewal(at(600), seven_and_a_half, at(200)),
            Duration::ZERO
        );
        assert_eq!(
            until_renewal(at(600), ten_minutes, at(0)),
            Duration::from_secs(1)
        );
    }

    fn run(
        c: &Cluster,
        existing: &BTreeMap<String, Secret>,
        now: OffsetDateTime,
        external: &str,
    ) -> Outcome {
        let names = Names::new(c, "cluster.local");
        let plan = certs::plan(c, &names, &[]).expect("plan");
        reconcile(
            &Inputs {
                cluster: c,
                names: &names,
                existing,
                now,
                validity: Duration::from_secs(3600),
                renew_before: Duration::from_secs(600),
                external_url: external,
                internal_url: "https://prod-east-apiserver.clusters.svc:6443",
            },
            &plan,
        )
        .expect("reconcile")
    }

    #[test]
    fn first_pass_creates_everything_second_pass_nothing() {
        let c = cluster();
        let first = run(&c, &BTreeMap::new(), at(0), "https://api:6443");
        assert!(first.changes.iter().all(|ch| ch.reason == "Created"));
        // 3 CAs, SA key, 5 TLS leaves + 2 etcd member certs, 4 kubeconfigs + 2 users.
        assert_eq!(first.changes.len(), 3 + 1 + 5 + 2 + 4 + 2);
        let existing = merged(&BTreeMap::new(), &first.changes);
        let second = run(&c, &existing, at(60), "https://api:6443");
        assert!(
            second.changes.is_empty(),
            "{:?}",
            second
                .changes
                .iter()
                .map(|c| (&c.secret.metadata.name, c.reason))
                .collect::<Vec<_>>()
        );
        assert_eq!(second.earliest_expiry, Some(at(3600)));
    }

    #[test]
    fn expiring_leaves_are_renewed_but_cas_kept() {
        let c = cluster();
        let existing = merged(
            &BTreeMap::new(),
            &run(&c, &BTreeMap::new(), at(0), "https://api:6443").changes,
        );
        let later = run(&c, &existing, at(3100), "https://api:6443");
        assert!(!later.changes.is_empty());
        assert!(
            later.changes.iter().all(|ch| ch.reason == "Expiring"),
            "{:?}",
            later.changes.iter().map(|c| c.reason).collect::<Vec<_>>()
        );
        assert!(later.changes.iter().all(|ch| {
            !ch.secret
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .ends_with("-ca")
        }));
    }

    #[test]
    fn a_new_endpoint_reissues_only_external_kubeconfigs() {
        let c = cluster();
        let existing = merged(
            &BTreeMap::new(),
            &run(&c, &BTreeMap::new(), at(0), "https://api:6443").changes,
        );
        let moved = run(&c, &existing, at(60), "https://api2:6443");
        let names: Vec<_> = moved
            .changes
            .iter()
            .map(|c| c.secret.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            vec![
                "prod-east-admin-kubeconfig",
                "prod-east-kubeconfig-sre",
                "prod-east-kubeconfig-ci-bot"
            ]
        );
        assert!(moved.changes.iter().all(|c| c.reason == "EndpointChanged"));
    }
}
