//! The PKI step: from the certificate plan and the Secrets that exist, the
//! Secrets to write. Certificate authorities and the service-account key are
//! created once and kept; leaf certificates and kubeconfigs are issued again
//! only when they no longer match the plan or are about to expire.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_on_kube_api::cluster::{AuthorityFingerprints, Cluster};
use time::OffsetDateTime;

use crate::names::Names;
use crate::pki::authorities::{self, Decision, Held, Stored, Which};
use crate::pki::certificates::{Authority, PlannedCert, Target};
use crate::pki::{self, CertInfo, KeyCert, PkiError};
use crate::render::kubeconfig::{self, KubeconfigInput};
use crate::render::owner;

/// Data keys of CA Secrets (`kubernetes.io/tls`).
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";
/// Data key of the issuing CA in leaf Secrets.
pub const CA: &str = "ca.crt";
/// Data keys of the service-account key pair Secret.
pub const SA_KEY: &str = "sa.key";
pub const SA_PUB: &str = "sa.pub";
/// Why a kubeconfig Secret is written again when its content is not what the
/// operator issued (fields added, another server, CA or key).
pub const TAMPERED: &str = "Tampered";

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
    /// Fingerprints of the authorities in use after the changes, to record.
    pub authorities: AuthorityFingerprints,
    /// Authorities neither used nor replaced: nothing is issued from them.
    pub held: Vec<Held>,
    /// Authorities replaced on the user's word (see [`authorities`]).
    pub replaced: Vec<Which>,
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
    /// The external URL the last pass reported (`status.endpoint`): a user
    /// kubeconfig still naming it is from before the endpoint moved, any
    /// other server was put there by someone else.
    pub previous_endpoint: Option<&'a str>,
    /// Fingerprints recorded in the Cluster's status.
    pub recorded: &'a AuthorityFingerprints,
    /// Recorded fingerprints the user allowed to be replaced.
    pub replace: &'a [String],
}

fn data(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8_lossy(&v.0).to_string())
}

fn secret(inputs: &Inputs<'_>, name: &str, type_: &str, entries: Vec<(&str, String)>) -> Secret {
    owned_secret(
        inputs.cluster,
        inputs.names,
        name,
        type_,
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
            .collect(),
    )
}

/// A Secret of `cluster`'s PKI named `name`: in its namespace, labelled
/// with it and owned by it, as the PKI step writes them all.
pub fn owned_secret(
    cluster: &Cluster,
    names: &Names,
    name: &str,
    type_: &str,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(names.namespace.clone()),
            labels: Some(
                [(
                    kube_on_kube_api::shared::CLUSTER_LABEL.to_string(),
                    names.cluster.clone(),
                )]
                .into(),
            ),
            owner_references: Some(vec![owner(cluster)]),
            ..Default::default()
        },
        type_: Some(type_.to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// The Secret type of an authority's Secret: a TLS pair, or the
/// service-account key pair, which is no certificate.
pub fn authority_secret_type(which: Which) -> &'static str {
    match which {
        Which::ServiceAccount | Which::Encryption => "Opaque",
        Which::Cluster | Which::Etcd | Which::FrontProxy => "kubernetes.io/tls",
    }
}

/// What the Secret `name` holds of `which`: its fingerprint when `check`
/// accepts the data under `keys`.
fn stored(
    inputs: &Inputs<'_>,
    name: &str,
    keys: [&str; 2],
    check: impl Fn(&str, &str) -> Result<String, PkiError>,
) -> Stored {
    let Some(existing) = inputs.existing.get(name) else {
        return Stored::Missing;
    };
    match (data(existing, keys[0]), data(existing, keys[1])) {
        (None, None) => Stored::Missing,
        (Some(a), Some(b)) => match check(&a, &b) {
            Ok(fingerprint) => Stored::Found(fingerprint),
            Err(e) => Stored::Unreadable(e.to_string()),
        },
        _ => Stored::Unreadable(format!("it lacks {} or {}", keys[0], keys[1])),
    }
}

/// The key ring of the encryption Secret `name`, when it holds one.
fn encryption_ring(inputs: &Inputs<'_>, name: &str) -> Option<pki::encryption::Ring> {
    pki::encryption::stored(inputs.existing.get(name)?)
}

/// Decide one authority or key; a new one is made with `make`. The key
/// material to issue from, or None when it is held.
fn authority(
    inputs: &Inputs<'_>,
    which: Which,
    name: &str,
    keys: [&str; 2],
    check: impl Fn(&str, &str) -> Result<String, PkiError>,
    make: impl Fn() -> Result<(String, String, String), PkiError>,
    out: &mut Outcome,
) -> Result<Option<(String, String)>, PkiError> {
    let stored = stored(inputs, name, keys, check);
    let recorded = which.recorded(inputs.recorded);
    // A key rotation moves the encrypting key of the ring first: a ring that
    // still holds the recorded key reads everything it wrote, so the key
    // now first is the one to record (see `pki::encryption`).
    let rotated = match (which, recorded, &stored) {
        (Which::Encryption, Some(r), Stored::Found(f))
            if r != f && encryption_ring(inputs, name).is_some_and(|ring| ring.holds(r)) =>
        {
            Some(f.clone())
        }
        _ => None,
    };
    let recorded = rotated.as_deref().or(recorded);
    let decision = authorities::decide(which, name, recorded, &stored, inputs.replace);
    let type_ = authority_secret_type(which);
    let existing = || {
        let s = inputs.existing.get(name)?;
        Some((data(s, keys[0])?, data(s, keys[1])?))
    };
    match (decision, stored) {
        (Decision::Hold(held), _) => {
            out.held.push(held);
            Ok(None)
        }
        (Decision::Use | Decision::Replace, Stored::Found(fingerprint)) => {
            if matches!(recorded, Some(r) if r != fingerprint) {
                out.replaced.push(which);
            }
            which.record(&mut out.authorities, fingerprint);
            Ok(existing())
        }
        (decision, _) => {
            let (first, second, fingerprint) = make()?;
            let reason = if decision == Decision::Replace {
                out.replaced.push(which);
                "Replaced"
            } else {
                "Created"
            };
            out.changes.push(Change {
                secret: secret(
                    inputs,
                    name,
                    type_,
                    vec![(keys[0], first.clone()), (keys[1], second.clone())],
                ),
                reason,
            });
            which.record(&mut out.authorities, fingerprint);
            Ok(Some((first, second)))
        }
    }
}

/// Decide one CA: its key and certificate, or None when it is held.
fn ca(
    inputs: &Inputs<'_>,
    which: Which,
    name: &str,
    common_name: &str,
    out: &mut Outcome,
) -> Result<Option<KeyCert>, PkiError> {
    let made = authority(
        inputs,
        which,
        name,
        [CERT, KEY],
        pki::check_authority,
        || {
            let ca = pki::new_ca(common_name, inputs.now)?;
            let fingerprint = pki::certificate_fingerprint(&ca.cert_pem)?;
            Ok((ca.cert_pem, ca.key_pem, fingerprint))
        },
        out,
    )?;
    Ok(made.map(|(cert_pem, key_pem)| KeyCert { cert_pem, key_pem }))
}

/// A kubeconfig Secret as stored: its client certificate and key, server,
/// and the whole document, to compare with what the operator would issue.
#[derive(Debug, Clone)]
pub struct StoredKubeconfig {
    pub cert_pem: String,
    pub key_pem: String,
    pub server: String,
    pub document: serde_json::Value,
}

/// Read a kubeconfig Secret: None when it has no kubeconfig the operator
/// could have written (no text, not YAML, no embedded certificate and key).
pub fn stored_kubeconfig(existing: &Secret) -> Option<StoredKubeconfig> {
    use base64::Engine;
    let text = data(existing, kubeconfig::KEY)?;
    let document: serde_json::Value = serde_norway::from_str(&text).ok()?;
    let decode = |v: &serde_json::Value| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str()?)
            .ok()?;
        String::from_utf8(bytes).ok()
    };
    let user = &document["users"][0]["user"];
    Some(StoredKubeconfig {
        cert_pem: decode(&user["client-certificate-data"])?,
        key_pem: decode(&user["client-key-data"])?,
        server: document["clusters"][0]["cluster"]["server"]
            .as_str()?
            .to_string(),
        document,
    })
}

/// Whether a stored kubeconfig differs from the one the operator issues
/// (`issued`, rendered with the same certificate and key): any field added
/// (`tokenFile`, `exec`, `auth-provider`, `proxy-url`,
/// `insecure-skip-tls-verify`, another user or context), removed or
/// changed. Compared as documents, so YAML for JSON is no difference.
pub fn tampered(stored: &serde_json::Value, issued: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(issued).map_or(true, |issued| *stored != issued)
}

/// Decide every PKI Secret of the cluster.
pub fn reconcile(inputs: &Inputs<'_>, plan: &[PlannedCert]) -> Result<Outcome, PkiError> {
    let mut out = Outcome::default();
    let names = inputs.names;
    let cluster_ca = ca(
        inputs,
        Which::Cluster,
        &names.ca_secret(),
        "kubernetes",
        &mut out,
    )?;
    let etcd_ca = ca(
        inputs,
        Which::Etcd,
        &names.etcd_ca_secret(),
        "etcd-ca",
        &mut out,
    )?;
    let front_proxy_ca = ca(
        inputs,
        Which::FrontProxy,
        &names.front_proxy_ca_secret(),
        "front-proxy-ca",
        &mut out,
    )?;
    authority(
        inputs,
        Which::ServiceAccount,
        &names.service_account_secret(),
        [SA_KEY, SA_PUB],
        pki::check_key_pair,
        || {
            let (private, public) = pki::new_service_account_key()?;
            let fingerprint = pki::public_key_fingerprint(&public)?;
            Ok((private, public, fingerprint))
        },
        &mut out,
    )?;
    authority(
        inputs,
        Which::Encryption,
        &names.encryption_secret(),
        [pki::encryption::KEY, pki::encryption::CONFIG],
        pki::encryption::check,
        pki::encryption::new_key,
        &mut out,
    )?;
    // Only the authorities in use: nothing is issued from a held one.
    let mut infos: BTreeMap<Authority, (KeyCert, CertInfo)> = BTreeMap::new();
    for (authority, kc) in [
        (Authority::Cluster, cluster_ca),
        (Authority::Etcd, etcd_ca),
        (Authority::FrontProxy, front_proxy_ca),
    ] {
        if let Some(kc) = kc {
            let info = pki::inspect(&kc.cert_pem)?;
            infos.insert(authority, (kc, info));
        }
    }

    for planned in plan {
        let target_name = match &planned.target {
            Target::TlsSecret(name) => name,
            Target::Kubeconfig { secret, .. } => secret,
        };
        let Some((ca, ca_info)) = infos.get(&planned.authority) else {
            // Its authority is held: the certificate stays as it is.
            let current = inputs
                .existing
                .get(target_name)
                .and_then(|s| match &planned.target {
                    Target::TlsSecret(_) => data(s, CERT),
                    Target::Kubeconfig { .. } => stored_kubeconfig(s).map(|k| k.cert_pem),
                });
            if let Some(info) = current.and_then(|c| pki::inspect(&c).ok()) {
                note_expiry(&mut out, info.not_after);
            }
            continue;
        };
        let cluster_ca_pem = infos
            .get(&Authority::Cluster)
            .map(|(kc, _)| kc.cert_pem.as_str())
            .unwrap_or_default();
        let (name, reason, url) = match &planned.target {
            Target::TlsSecret(name) => {
                let current = inputs.existing.get(name).and_then(|s| data(s, CERT));
                let reason = match current {
                    None => Some("Created"),
                    Some(cert) => leaf_reason(inputs, &cert, ca_info, planned, &mut out),
                };
                (name, reason, None)
            }
            Target::Kubeconfig { secret, external } => {
                let url = if *external {
                    inputs.external_url
                } else {
                    inputs.internal_url
                };
                let reason = match inputs.existing.get(secret) {
                    None => Some("Created"),
                    Some(existing) => match stored_kubeconfig(existing) {
                        None => Some(TAMPERED),
                        Some(stored) => kubeconfig_reason(
                            inputs,
                            &stored,
                            (ca, ca_info),
                            cluster_ca_pem,
                            planned,
                            url,
                            *external,
                            &mut out,
                        ),
                    },
                };
                (secret, reason, Some(url))
            }
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
                let text = render_kubeconfig(
                    inputs,
                    planned,
                    server,
                    cluster_ca_pem,
                    &issued.cert_pem,
                    &issued.key_pem,
                );
                secret(inputs, name, "Opaque", vec![(kubeconfig::KEY, text)])
            }
        };
        out.changes.push(Change { secret, reason });
    }
    Ok(out)
}

fn render_kubeconfig(
    inputs: &Inputs<'_>,
    planned: &PlannedCert,
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    kubeconfig::render(&KubeconfigInput {
        cluster: &inputs.names.cluster,
        user: &planned.spec.common_name,
        server,
        ca_pem,
        cert_pem,
        key_pem,
    })
}

/// Why a stored leaf certificate is issued again, if it is; its expiry is
/// noted when it is kept.
fn leaf_reason(
    inputs: &Inputs<'_>,
    cert: &str,
    ca_info: &CertInfo,
    planned: &PlannedCert,
    out: &mut Outcome,
) -> Option<&'static str> {
    let Ok(info) = pki::inspect(cert) else {
        return Some("Unreadable");
    };
    let reissue = pki::reissue_reason(
        &info,
        ca_info,
        &planned.spec,
        inputs.now,
        inputs.renew_before,
    );
    if reissue.is_none() {
        note_expiry(out, info.not_after);
    }
    reissue
}

/// Why a stored kubeconfig is issued again, if it is: its certificate is due
/// (as a leaf's), the endpoint moved, or it is not what the operator issued.
#[allow(clippy::too_many_arguments)]
fn kubeconfig_reason(
    inputs: &Inputs<'_>,
    stored: &StoredKubeconfig,
    (ca, ca_info): (&KeyCert, &CertInfo),
    cluster_ca_pem: &str,
    planned: &PlannedCert,
    url: &str,
    external: bool,
    out: &mut Outcome,
) -> Option<&'static str> {
    let mut noted = Outcome::default();
    if let Some(reason) = leaf_reason(inputs, &stored.cert_pem, ca_info, planned, &mut noted) {
        return Some(reason);
    }
    if stored.server != url {
        let moved = external && inputs.previous_endpoint == Some(stored.server.as_str());
        return Some(if moved { "EndpointChanged" } else { TAMPERED });
    }
    if pki::check_client(&stored.cert_pem, &stored.key_pem, &ca.cert_pem, inputs.now).is_err() {
        return Some(TAMPERED);
    }
    let issued = render_kubeconfig(
        inputs,
        planned,
        url,
        cluster_ca_pem,
        &stored.cert_pem,
        &stored.key_pem,
    );
    if tampered(&stored.document, &issued) {
        return Some(TAMPERED);
    }
    if let Some(at) = noted.earliest_expiry {
        note_expiry(out, at);
    }
    None
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
    use crate::pki::certificates;
    use kube_on_kube_api::cluster::ClusterMode;

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
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
        run_recorded(c, existing, now, external, &Default::default(), &[])
    }

    fn run_recorded(
        c: &Cluster,
        existing: &BTreeMap<String, Secret>,
        now: OffsetDateTime,
        external: &str,
        recorded: &AuthorityFingerprints,
        replace: &[String],
    ) -> Outcome {
        let names = Names::new(c, "cluster.local");
        let plan = certificates::plan(c, &names, &[]).expect("plan");
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
                previous_endpoint: Some("https://api:6443"),
                recorded,
                replace,
            },
            &plan,
        )
        .expect("reconcile")
    }

    fn changed(outcome: &Outcome) -> Vec<(String, &'static str)> {
        outcome
            .changes
            .iter()
            .map(|c| (c.secret.metadata.name.clone().unwrap_or_default(), c.reason))
            .collect()
    }

    /// A first pass's Secrets and what it recorded.
    fn bootstrapped(c: &Cluster) -> (BTreeMap<String, Secret>, AuthorityFingerprints) {
        let first = run(c, &BTreeMap::new(), at(0), "https://api:6443");
        (merged(&BTreeMap::new(), &first.changes), first.authorities)
    }

    fn kubeconfig_text(secret: &Secret) -> String {
        data(secret, kubeconfig::KEY).expect("kubeconfig")
    }

    #[test]
    fn the_first_pass_records_every_authority_and_later_passes_keep_the_record() {
        let c = cluster();
        let (existing, recorded) = bootstrapped(&c);
        for fingerprint in [
            &recorded.cluster,
            &recorded.etcd,
            &recorded.front_proxy,
            &recorded.service_account,
        ] {
            assert!(
                fingerprint
                    .as_deref()
                    .is_some_and(|f| f.starts_with("sha256:") && f.len() == 71),
                "{recorded:?}"
            );
        }
        let ca_pem = data(&existing["prod-east-ca"], CERT).expect("ca");
        assert_eq!(
            recorded.cluster,
            Some(pki::certificate_fingerprint(&ca_pem).expect("fingerprint"))
        );
        let again = run_recorded(&c, &existing, at(60), "https://api:6443", &recorded, &[]);
        assert!(again.changes.is_empty() && again.held.is_empty());
        assert_eq!(again.authorities, recorded);
    }

    #[test]
    fn a_deleted_or_swapped_ca_is_held_and_nothing_is_issued_from_it() {
        let c = cluster();
        let (existing, recorded) = bootstrapped(&c);
        let mut gone = existing.clone();
        gone.remove("prod-east-ca");
        // Even with every leaf due, none is issued while its CA is held.
        let later = run_recorded(&c, &gone, at(3100), "https://api:6443", &recorded, &[]);
        assert_eq!(later.held.len(), 1);
        assert_eq!(later.held[0].reason, "CertificateAuthorityMissing");
        assert!(
            changed(&later)
                .iter()
                .all(|(name, reason)| *reason == "Expiring" && !name.starts_with("prod-east-ca")),
            "{:?}",
            changed(&later)
        );
        let cluster_ca_leaves = ["prod-east-apiserver-tls", "prod-east-admin-kubeconfig"];
        assert!(
            changed(&later)
                .iter()
                .all(|(name, _)| !cluster_ca_leaves.contains(&name.as_str())),
            "{:?}",
            changed(&later)
        );
        // The etcd CA's leaves are still renewed.
        assert!(
            changed(&later)
                .iter()
                .any(|(name, _)| name == "prod-east-etcd-0-peer")
        );

        let mut swapped = existing.clone();
        let other = pki::new_ca("kubernetes", at(0)).expect("ca");
        swapped.insert(
            "prod-east-ca".into(),
            Secret {
                data: Some(
                    [
                        (CERT.to_string(), ByteString(other.cert_pem.into_bytes())),
                        (KEY.to_string(), ByteString(other.key_pem.into_bytes())),
                    ]
                    .into(),
                ),
                ..existing["prod-east-ca"].clone()
            },
        );
        let held = run_recorded(&c, &swapped, at(60), "https://api:6443", &recorded, &[]);
        assert_eq!(held.held[0].reason, "CertificateAuthorityChanged");
        assert!(held.changes.is_empty(), "{:?}", changed(&held));

        let mut no_sa = existing.clone();
        no_sa.remove("prod-east-sa");
        let sa = run_recorded(&c, &no_sa, at(60), "https://api:6443", &recorded, &[]);
        assert_eq!(sa.held[0].reason, "ServiceAccountKeyMissing");
        assert!(sa.changes.is_empty(), "{:?}", changed(&sa));

        // A new encryption key would leave every stored Secret unreadable.
        let mut no_key = existing.clone();
        no_key.remove("prod-east-encryption");
        let key = run_recorded(&c, &no_key, at(60), "https://api:6443", &recorded, &[]);
        assert_eq!(key.held[0].reason, "EncryptionKeyMissing");
        assert!(key.changes.is_empty(), "{:?}", changed(&key));

        // Restored from a backup: used again, nothing changes.
        let restored = run_recorded(&c, &existing, at(60), "https://api:6443", &recorded, &[]);
        assert!(restored.held.is_empty() && restored.changes.is_empty());
    }

    #[test]
    fn a_rotated_encryption_key_is_recorded_while_its_ring_holds_the_recorded_one() {
        use pki::encryption::Ring;
        let c = cluster();
        let (existing, recorded) = bootstrapped(&c);
        let name = "prod-east-encryption";
        let with_ring = |ring: &Ring| {
            let mut secrets = existing.clone();
            let data = [
                (pki::encryption::KEY, ring.first().secret.clone()),
                (pki::encryption::CONFIG, ring.config()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
            .collect();
            secrets.get_mut(name).expect("encryption Secret").data = Some(data);
            secrets
        };
        let stored = |key: &str| data(&existing[name], key).expect("stored");
        let ring = Ring::parse(
            &stored(pki::encryption::KEY),
            &stored(pki::encryption::CONFIG),
        )
        .expect("ring");
        let old = recorded.encryption.clone().expect("recorded");
        // The new key encrypts, the recorded one is still read: recorded
        // anew, nothing held, no Event of a replaced key.
        let switched = ring.with_new_key().expect("key").switched();
        let out = run_recorded(
            &c,
            &with_ring(&switched),
            at(60),
            "https://api:6443",
            &recorded,
            &[],
        );
        assert!(
            out.held.is_empty() && out.replaced.is_empty(),
            "{:?}",
            out.held
        );
        assert_eq!(
            out.authorities.encryption,
            Some(switched.first().fingerprint())
        );
        assert_ne!(out.authorities.encryption, Some(old));
        // A ring without the recorded key is another key: held.
        let foreign = switched.retired();
        let held = run_recorded(
            &c,
            &with_ring(&foreign),
            at(60),
            "https://api:6443",
            &recorded,
            &[],
        );
        assert_eq!(held.held[0].reason, "EncryptionKeyChanged");
        assert!(held.changes.is_empty(), "{:?}", changed(&held));
    }

    #[test]
    fn naming_the_recorded_fingerprint_replaces_the_ca_and_reissues_its_leaves() {
        let c = cluster();
        let (mut existing, recorded) = bootstrapped(&c);
        existing.remove("prod-east-ca");
        let replace = vec![recorded.cluster.clone().expect("recorded")];
        let out = run_recorded(
            &c,
            &existing,
            at(60),
            "https://api:6443",
            &recorded,
            &replace,
        );
        assert!(out.held.is_empty());
        assert_eq!(out.replaced, vec![Which::Cluster]);
        assert_ne!(out.authorities.cluster, recorded.cluster);
        assert_eq!(out.authorities.etcd, recorded.etcd);
        let changes = changed(&out);
        assert!(changes.contains(&("prod-east-ca".to_string(), "Replaced")));
        assert!(changes.contains(&("prod-east-apiserver-tls".to_string(), "SignedByAnotherCA")));
        assert!(!changes.iter().any(|(n, _)| n == "prod-east-etcd-0-peer"));
    }

    /// The admin kubeconfig with `edit` applied to its document.
    fn edited_admin(
        existing: &BTreeMap<String, Secret>,
        edit: impl Fn(&mut serde_json::Value),
    ) -> BTreeMap<String, Secret> {
        let name = "prod-east-admin-kubeconfig";
        let mut doc: serde_json::Value =
            serde_json::from_str(&kubeconfig_text(&existing[name])).expect("json");
        edit(&mut doc);
        let mut edited = existing.clone();
        edited.insert(
            name.into(),
            Secret {
                data: Some(kubeconfig::secret_data(
                    serde_norway::to_string(&doc).expect("yaml"),
                )),
                ..existing[name].clone()
            },
        );
        edited
    }

    #[test]
    fn a_kubeconfig_that_is_not_what_was_issued_is_issued_again() {
        use serde_json::json;
        let c = cluster();
        let (existing, recorded) = bootstrapped(&c);
        let pass = |secrets: &BTreeMap<String, Secret>| {
            run_recorded(&c, secrets, at(60), "https://api:6443", &recorded, &[])
        };
        // The same document as YAML is no change.
        assert!(pass(&edited_admin(&existing, |_| {})).changes.is_empty());
        let user = |f: &'static str, v: serde_json::Value| {
            move |d: &mut serde_json::Value| d["users"][0]["user"][f] = v.clone()
        };
        let cluster = |f: &'static str, v: serde_json::Value| {
            move |d: &mut serde_json::Value| d["clusters"][0]["cluster"][f] = v.clone()
        };
        let other_ca = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(
                pki::new_ca("kubernetes", at(0))
                    .expect("ca")
                    .cert_pem
                    .as_bytes(),
            )
        };
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "tokenFile",
                Box::new(user(
                    "tokenFile",
                    json!("/var/run/secrets/kubernetes.io/serviceaccount/token"),
                )),
            ),
            ("token", Box::new(user("token", json!("abc")))),
            (
                "exec",
                Box::new(user("exec", json!({"command": "sh", "apiVersion": "v1"}))),
            ),
            (
                "auth-provider",
                Box::new(user("auth-provider", json!({"name": "oidc"}))),
            ),
            (
                "insecure-skip-tls-verify",
                Box::new(cluster("insecure-skip-tls-verify", json!(true))),
            ),
            (
                "proxy-url",
                Box::new(cluster("proxy-url", json!("http://evil:3128"))),
            ),
            (
                "another server",
                Box::new(cluster("server", json!("https://evil.example:6443"))),
            ),
            (
                "another CA",
                Box::new(cluster("certificate-authority-data", json!(other_ca))),
            ),
            (
                "a CA file",
                Box::new(cluster("certificate-authority", json!("/etc/evil.crt"))),
            ),
            (
                "another user",
                Box::new(|d: &mut serde_json::Value| {
                    d["users"]
                        .as_array_mut()
                        .expect("users")
                        .push(json!({"name": "x", "user": {"token": "t"}}))
                }),
            ),
            (
                "another current context",
                Box::new(|d: &mut serde_json::Value| d["current-context"] = json!("x")),
            ),
        ];
        for (what, edit) in edits {
            let out = pass(&edited_admin(&existing, edit));
            assert_eq!(
                changed(&out),
                vec![("prod-east-admin-kubeconfig".to_string(), TAMPERED)],
                "{what}"
            );
            let rewritten = kubeconfig_text(&out.changes[0].secret);
            let stored = stored_kubeconfig(&out.changes[0].secret).expect("stored");
            assert_eq!(stored.server, "https://api:6443", "{what}");
            assert!(!rewritten.contains("token") && !rewritten.contains("insecure"));
        }
        // Another certificate and key, even one signed by the cluster CA,
        // are not what was issued to the admin.
        let swapped_key = edited_admin(&existing, |d| {
            use base64::Engine;
            let other = pki::new_ca("x", at(0)).expect("key");
            d["users"][0]["user"]["client-key-data"] =
                json!(base64::engine::general_purpose::STANDARD.encode(other.key_pem));
        });
        assert_eq!(
            changed(&pass(&swapped_key)),
            vec![("prod-east-admin-kubeconfig".to_string(), TAMPERED)]
        );
        let mut garbage = existing.clone();
        garbage.insert(
            "prod-east-admin-kubeconfig".into(),
            Secret {
                data: Some(kubeconfig::secret_data("not: [a kubeconfig".into())),
                ..existing["prod-east-admin-kubeconfig"].clone()
            },
        );
        assert_eq!(
            changed(&pass(&garbage)),
            vec![("prod-east-admin-kubeconfig".to_string(), TAMPERED)]
        );
    }

    #[test]
    fn first_pass_creates_everything_second_pass_nothing() {
        let c = cluster();
        let first = run(&c, &BTreeMap::new(), at(0), "https://api:6443");
        assert!(first.changes.iter().all(|ch| ch.reason == "Created"));
        // 3 CAs, SA key, encryption key, 5 TLS leaves + 2 etcd member
        // certs, 5 kubeconfigs + 2 users.
        assert_eq!(first.changes.len(), 3 + 1 + 1 + 5 + 2 + 5 + 2);
        assert!(first.authorities.encryption.is_some());
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
