//! The snapshot gateway in front of a claim (see
//! [`crate::render::snapshot_gateway`]): kept as the spec asks by the
//! Cluster pass ([`converge`]), and checked by whoever is about to use it
//! ([`usable`]): the backup controller, a restore, a rebuild.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret, Service};
use kube::Resource;
use kube::api::{Api, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClaimDestination;
use ring::rand::{SecureRandom, SystemRandom};
use time::OffsetDateTime;

use super::failure::Failure;
use crate::Error;
use crate::applied::resource_version;
use crate::context::{Context, apply_if_changed, hash_of};
use crate::names::Names;
use crate::pki::crypto::{self, LeafSpec, Usage};
use crate::render::snapshot_gateway::{self as render, SECRET_FIELDS};

/// The reason given while the gateway is not serving yet.
pub const WAITING: &str = "WaitingForGateway";
/// Its certificate's validity; it is made anew this long before it ends.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Whether the gateway on `claim` can serve now: the claim exists and is
/// not the Cluster's own (an etcd member's), and the gateway's Pod is
/// ready. `Err` says why not, [`WAITING`] while it only has to start.
pub(super) async fn usable(
    ctx: &Context,
    names: &Names,
    claim: &ClaimDestination,
) -> Result<(), Failure> {
    claim_allowed(ctx, names, claim).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = names.snapshot_gateway();
    match deployments.get_opt(&name).await {
        Ok(Some(d)) if ready(&d) => Ok(()),
        Ok(_) => Err(Failure::new(
            WAITING,
            format!(
                "the snapshot gateway {name} on claim {} is not ready yet",
                claim.claim_name
            ),
        )),
        Err(e) => Err(Failure::new(
            "BackupFailed",
            format!("reading Deployment {name}: {e}"),
        )),
    }
}

fn ready(d: &Deployment) -> bool {
    d.status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        > 0
}

/// The claim exists and no Cluster controls it (an etcd member's claim is
/// its Cluster's data, never a place for snapshots).
async fn claim_allowed(
    ctx: &Context,
    names: &Names,
    claim: &ClaimDestination,
) -> Result<(), Failure> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let name = &claim.claim_name;
    let live = claims
        .get_opt(name)
        .await
        .map_err(|e| {
            Failure::new(
                "BackupFailed",
                format!("reading PersistentVolumeClaim {name}: {e}"),
            )
        })?
        .ok_or_else(|| {
            Failure::new(
                "ClaimMissing",
                format!(
                    "PersistentVolumeClaim {name} does not exist in namespace {}: create it",
                    names.namespace
                ),
            )
        })?;
    if let Some(owner) = crate::ownership::controller(&live.metadata)
        && owner.kind == Cluster::kind(&())
    {
        return Err(Failure::new(
            "ClaimNotAllowed",
            format!(
                "PersistentVolumeClaim {name} holds the data of Cluster {}: snapshots need a claim of their own",
                owner.name
            ),
        ));
    }
    Ok(())
}

/// How soon a Cluster whose claim is missing (or not allowed) is looked at
/// again: a claim the user makes later wakes no watch of the operator's.
pub const CLAIM_RECHECK: Duration = Duration::from_secs(30);

/// Keep the gateway as `cluster` asks: on the claim its snapshots use
/// (its Secret, Service and Deployment), or gone. `secrets`, `services`
/// and `deployments` are the Cluster's as the pass read them. `Some`: the
/// claim cannot be served yet; look again this soon.
pub async fn converge(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
    services: &BTreeMap<String, Service>,
    deployments: &BTreeMap<String, Deployment>,
) -> Result<Option<Duration>, Error> {
    let name = names.snapshot_gateway();
    let ns = &names.namespace;
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let services_api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let deployments_api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let Some(claim) = render::claim(cluster) else {
        // No claim any more: what served it goes (the claim and its
        // snapshots stay, they are the user's).
        let owner = crate::render::owner(cluster);
        let params = Default::default();
        if deployments.contains_key(&name) {
            crate::ownership::delete_owned(&deployments_api, &name, &owner, &params).await?;
        }
        if services.contains_key(&name) {
            crate::ownership::delete_owned(&services_api, &name, &owner, &params).await?;
        }
        if secrets.contains_key(&name) {
            crate::ownership::delete_owned(&secrets_api, &name, &owner, &params).await?;
        }
        return Ok(None);
    };
    let now = OffsetDateTime::now_utc();
    let mut secrets = secrets.clone();
    if let Some(why) = renew_reason(secrets.get(&name), names, now) {
        let data = new_secret_data(names, now).map_err(|e| Error::GatewayKeys(Box::new(e)))?;
        let secret = crate::pki::secrets::owned_secret(cluster, names, &name, "Opaque", data);
        tracing::info!(cluster = %names.cluster, secret = %name, %why, "snapshot gateway keys made");
        let written = match secrets.get(&name) {
            None => secrets_api
                .create(&PostParams::default(), &secret)
                .await
                .map_err(|e| Error::writing("Secret", &name, e))?,
            Some(live) => crate::context::apply_over(&secrets_api, &secret, Some(live)).await?,
        };
        secrets.insert(name.clone(), written);
    }
    let service = render::service(cluster, names);
    apply_if_changed(
        ctx,
        names,
        &services_api,
        &service,
        services,
        resource_version,
    )
    .await?;
    if let Err(refused) = claim_allowed(ctx, names, claim).await {
        // Said by whoever uses it (BackupReady, Restored); nothing runs on
        // a claim that is missing or not the user's to give.
        tracing::info!(cluster = %names.cluster, reason = %refused.reason, message = %refused.message, "snapshot gateway not started");
        return Ok(Some(CLAIM_RECHECK));
    }
    let hash = hash_of(&secrets, std::slice::from_ref(&name), &claim.claim_name);
    let deployment = render::deployment(
        cluster,
        names,
        claim,
        &ctx.config.snapshot_gateway_image,
        &ctx.config.snapshot_gateway_resources,
        &hash,
    );
    apply_if_changed(
        ctx,
        names,
        &deployments_api,
        &deployment,
        deployments,
        crate::applied::generation,
    )
    .await?;
    Ok(None)
}

/// Why the gateway's Secret must be made (anew): missing, a key missing,
/// a certificate for other names, or one that ends soon. `None`: it stays.
fn renew_reason(secret: Option<&Secret>, names: &Names, now: OffsetDateTime) -> Option<String> {
    let Some(data) = secret.and_then(|s| s.data.as_ref()) else {
        return Some("no Secret yet".into());
    };
    if let Some(missing) = SECRET_FIELDS.iter().find(|k| !data.contains_key(**k)) {
        return Some(format!("key {missing} missing"));
    }
    let cert = String::from_utf8_lossy(&data[render::CERT_FIELD].0).into_owned();
    let info = match crypto::inspect(&cert) {
        Ok(info) => info,
        Err(e) => return Some(format!("certificate unreadable: {e}")),
    };
    let wanted = render::dns_names(names);
    if wanted.iter().any(|n| !info.dns_names.contains(n)) {
        return Some("certificate for other names".into());
    }
    if info.not_after - now < RENEW_BEFORE {
        return Some("certificate ends soon".into());
    }
    None
}

/// New keys: a CA of the gateway's own, a serving certificate it signed for
/// the gateway's Service names, and a root access key and secret.
fn new_secret_data(
    names: &Names,
    now: OffsetDateTime,
) -> Result<BTreeMap<String, ByteString>, crypto::PkiError> {
    let ca = crypto::new_ca(&format!("{} snapshot gateway CA", names.key()), now)?;
    let leaf = crypto::issue(
        &ca,
        &LeafSpec {
            common_name: names.snapshot_gateway(),
            organizations: vec![],
            dns_names: render::dns_names(names),
            ips: vec![],
            usage: Usage::Server,
        },
        now,
        VALIDITY,
    )?;
    let text = |s: String| ByteString(s.into_bytes());
    Ok([
        (
            render::ACCESS_KEY_FIELD,
            text(format!("kok-{}", random_hex(8))),
        ),
        (render::SECRET_KEY_FIELD, text(random_hex(32))),
        (render::CA_FIELD, text(ca.cert_pem)),
        (render::CERT_FIELD, text(leaf.cert_pem)),
        (render::KEY_FIELD, text(leaf.key_pem)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect())
}

/// `bytes` random bytes from the system, as hex.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // The system's generator failing leaves zeros, which no one would take
    // for a key: it never fails on Linux.
    if SystemRandom::new().fill(&mut buf).is_err() {
        tracing::error!("the system's random generator failed");
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            cluster: "c".into(),
            namespace: "team-a".into(),
            meta_domain: "cluster.local".into(),
        }
    }

    fn secret(data: BTreeMap<String, ByteString>) -> Secret {
        Secret {
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn made_keys_are_kept_until_their_certificate_ends_or_names_change() {
        let n = names();
        let now = OffsetDateTime::now_utc();
        assert!(renew_reason(None, &n, now).is_some());
        let data = new_secret_data(&n, now).expect("keys");
        let access = String::from_utf8(data[render::ACCESS_KEY_FIELD].0.clone()).unwrap();
        let secret_key = String::from_utf8(data[render::SECRET_KEY_FIELD].0.clone()).unwrap();
        assert_eq!(secret_key.len(), 64);
        assert!(access.starts_with("kok-") && access.len() == 20, "{access}");
        let again = new_secret_data(&n, now).expect("keys");
        assert_ne!(
            again[render::SECRET_KEY_FIELD],
            data[render::SECRET_KEY_FIELD]
        );
        let s = secret(data.clone());
        assert_eq!(renew_reason(Some(&s), &n, now), None);
        // Near its end: made anew.
        let late = now + VALIDITY - Duration::from_secs(24 * 3600);
        assert!(renew_reason(Some(&s), &n, late).is_some());
        // For another namespace's names: made anew.
        let other = Names {
            namespace: "team-b".into(),
            ..names()
        };
        assert!(renew_reason(Some(&s), &other, now).is_some());
        // A key gone: made anew.
        let mut partial = data;
        partial.remove(render::CA_FIELD);
        let why = renew_reason(Some(&secret(partial)), &n, now).expect("renew");
        assert!(why.contains("ca.crt"), "{why}");
    }

    #[test]
    fn the_certificate_is_signed_by_the_ca_beside_it() {
        let n = names();
        let data = new_secret_data(&n, OffsetDateTime::now_utc()).expect("keys");
        let ca = String::from_utf8(data[render::CA_FIELD].0.clone()).unwrap();
        let cert = String::from_utf8(data[render::CERT_FIELD].0.clone()).unwrap();
        let ca_info = crypto::inspect(&ca).expect("ca");
        let info = crypto::inspect(&cert).expect("cert");
        assert_eq!(info.authority_key_id, ca_info.subject_key_id);
        assert!(
            info.dns_names
                .contains(&"c-snapshots.team-a.svc".to_string())
        );
    }
}
