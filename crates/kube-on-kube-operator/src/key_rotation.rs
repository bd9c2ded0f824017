//! Rotating the key a business cluster's Secrets are encrypted at rest with,
//! asked for by naming the recorded key in
//! [`ROTATE_ENCRYPTION_KEY_ANNOTATION`]. One step per pass, each taken only
//! once every kube-apiserver runs the configuration of the step before (its
//! Deployment settled on the Secret as it is now, see [`Inputs::rolled`]):
//!
//! 1. `[a]` → `[a, b]`: a new key every kube-apiserver can read;
//! 2. `[a, b]` → `[b, a]`: the new key encrypts, the old one is still read;
//! 3. every Secret of the business cluster is written again (an update that
//!    changes nothing still writes a value read with a key that is not
//!    first), a page at a time, resumed where it stopped;
//! 4. `[b, a]` → `[b]`: the old key goes.
//!
//! The ring in the encryption Secret is the state (see
//! [`crate::pki::encryption`]), so a restarted operator goes on where it was;
//! `status.encryptionKeyRotation` shows how far it is, under its own field
//! manager, and is removed once kube-apiserver runs on the new key alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{KeyRotationStatus, ROTATE_ENCRYPTION_KEY_ANNOTATION};

use crate::context::{Context, apply_over, publish};
use crate::error::Error;
use crate::names::Names;
use crate::pki::encryption::{self, Phase, Ring};
use crate::pki::secrets::{authority_secret_type, owned_secret};

/// The field manager of `status.encryptionKeyRotation`.
const MANAGER: &str = "kube-on-kube-operator/key-rotation";
/// Secrets read per page of the rewrite: a Secret may hold up to 1 MiB, so
/// a page stays within a few MiB of the operator's memory whatever the
/// tenant stores.
const PAGE: u32 = 10;
/// The longest one pass rewrites before it records where it is and lets the
/// other Clusters have the worker.
const REWRITE_PER_PASS: Duration = Duration::from_secs(20);
/// A rotation waiting on kube-apiserver's roll looks again this soon (the
/// Deployment's changes do not wake the Cluster).
const RECHECK: Duration = Duration::from_secs(2);

/// What this pass does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No rotation is asked for and none runs.
    Idle,
    /// Write the encryption Secret with this ring.
    Write(Ring),
    /// Wait until kube-apiserver runs the ring as it is.
    WaitForRoll,
    /// Write every Secret again under the new key, then drop the old one.
    Rewrite,
    /// The rotation is over: kube-apiserver runs on the new key alone.
    Finish,
}

/// The step for `ring`: `requested` is the annotation's value, `rolled`
/// whether every kube-apiserver runs the ring as stored, `running` whether
/// the status still shows a rotation.
pub fn plan(
    ring: &Ring,
    requested: Option<&str>,
    rolled: bool,
    running: bool,
) -> Result<Step, crate::pki::PkiError> {
    Ok(match ring.phase() {
        Phase::Steady if requested.is_some_and(|r| r.trim() == ring.first().fingerprint()) => {
            Step::Write(ring.with_new_key()?)
        }
        Phase::Steady if running && rolled => Step::Finish,
        Phase::Steady if running => Step::WaitForRoll,
        Phase::Steady => Step::Idle,
        Phase::Adding if rolled => Step::Write(ring.switched()),
        Phase::Retiring if rolled => Step::Rewrite,
        Phase::Adding | Phase::Retiring => Step::WaitForRoll,
    })
}

/// What the rotation needs of the pass.
pub struct Inputs<'a> {
    pub ctx: &'a Context,
    pub cluster: &'a Cluster,
    pub names: &'a Names,
    /// The Cluster's Secrets as the PKI step left them.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// Every kube-apiserver runs the Secrets as they are: its Deployment was
    /// applied from them this pass (nothing held its configuration) and has
    /// settled, with no old Pod left.
    pub rolled: bool,
    /// The recorded cluster CA, for the business API's client.
    pub ca_fingerprint: Option<&'a str>,
}

/// Take this pass's step; when to look again, if soon.
pub async fn reconcile(inputs: &Inputs<'_>) -> Result<Option<Duration>, Error> {
    let Inputs {
        ctx,
        cluster,
        names,
        secrets,
        rolled,
        ..
    } = *inputs;
    let name = names.encryption_secret();
    let Some(ring) = secrets.get(&name).and_then(encryption::stored) else {
        // Missing or unreadable: the PKI step holds it and says so.
        return Ok(None);
    };
    let shown = cluster
        .status
        .as_ref()
        .and_then(|s| s.encryption_key_rotation.clone());
    let requested = cluster
        .annotations()
        .get(ROTATE_ENCRYPTION_KEY_ANNOTATION)
        .map(String::as_str);
    let mut status = shown.clone().unwrap_or_default();
    let step = match plan(&ring, requested, rolled, shown.is_some()) {
        Ok(step) => step,
        Err(e) => {
            status.message = Some(format!("making a new key: {e}"));
            Step::WaitForRoll
        }
    };
    let requeue = match step {
        Step::Idle => return Ok(None),
        Step::Finish => {
            clear_status(ctx, names).await?;
            publish(
                ctx,
                cluster,
                EventType::Normal,
                "EncryptionKeyRotated",
                "RotateEncryptionKey",
                format!(
                    "kube-apiserver encrypts with {} alone; {} Secrets were written again under it",
                    ring.first().fingerprint(),
                    status.secrets_rewritten
                ),
            )
            .await;
            return Ok(None);
        }
        Step::WaitForRoll => {
            if status.message.is_none() {
                status.message =
                    Some("waiting for every kube-apiserver to run the new configuration".into());
            }
            Some(RECHECK)
        }
        Step::Write(next) => {
            write_ring(ctx, cluster, names, secrets, &name, &next).await?;
            let (reason, note) = match next.phase() {
                Phase::Adding => (
                    "EncryptionKeyRotationStarted",
                    format!(
                        "a new key {} is given to every kube-apiserver to read before it encrypts",
                        next.keys[1].fingerprint()
                    ),
                ),
                _ => (
                    "EncryptionKeySwitched",
                    format!(
                        "{} encrypts now; every Secret is written again under it once every kube-apiserver has it",
                        next.first().fingerprint()
                    ),
                ),
            };
            publish(
                ctx,
                cluster,
                EventType::Normal,
                reason,
                "RotateEncryptionKey",
                note,
            )
            .await;
            status = progress(&next, &status);
            status.message = None;
            Some(RECHECK)
        }
        Step::Rewrite => {
            status.phase = "RewritingSecrets".into();
            let rewritten =
                match crate::addons::business_client(names, secrets, inputs.ca_fingerprint).await {
                    Ok(client) => {
                        rewrite(client, status.resume_from.clone(), REWRITE_PER_PASS).await
                    }
                    Err(e) => Err(format!("no client of the business API: {e}")),
                };
            match rewritten {
                Ok(done) => {
                    status.secrets_rewritten += done.rewritten;
                    status.resume_from = done.resume_from.clone();
                    status.message = None;
                    if done.resume_from.is_none() {
                        let retired = ring.retired();
                        write_ring(ctx, cluster, names, secrets, &name, &retired).await?;
                        publish(
                            ctx,
                            cluster,
                            EventType::Normal,
                            "SecretsRewritten",
                            "RotateEncryptionKey",
                            format!(
                                "{} Secrets written again under {}; the old key {} is removed",
                                status.secrets_rewritten,
                                ring.first().fingerprint(),
                                ring.keys[1].fingerprint()
                            ),
                        )
                        .await;
                        status = progress(&retired, &status);
                    }
                    Some(Duration::from_secs(1))
                }
                Err(e) => {
                    status.message = Some(format!("rewriting Secrets: {e}"));
                    Some(Duration::from_secs(10))
                }
            }
        }
    };
    if shown.as_ref() != Some(&status) {
        let body = serde_json::json!({ "encryptionKeyRotation": status });
        let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
        kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &body).await?;
    }
    Ok(requeue)
}

/// The status for `ring`, keeping the counts of `before`.
fn progress(ring: &Ring, before: &KeyRotationStatus) -> KeyRotationStatus {
    let (phase, from, to) = match ring.phase() {
        Phase::Adding => ("AddingKey", &ring.keys[0], &ring.keys[1]),
        Phase::Retiring => ("SwitchingKey", &ring.keys[1], &ring.keys[0]),
        Phase::Steady => ("RemovingKey", ring.first(), ring.first()),
    };
    KeyRotationStatus {
        phase: phase.into(),
        from: if ring.phase() == Phase::Steady {
            before.from.clone()
        } else {
            from.fingerprint()
        },
        to: to.fingerprint(),
        ..before.clone()
    }
}

async fn write_ring(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
    name: &str,
    ring: &Ring,
) -> Result<(), Error> {
    use k8s_openapi::ByteString;
    let data = [
        (encryption::KEY, ring.first().secret.clone()),
        (encryption::CONFIG, ring.config()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    let desired = owned_secret(
        cluster,
        names,
        name,
        authority_secret_type(crate::pki::authorities::Which::Encryption),
        data,
    );
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    apply_over(&api, &desired, secrets.get(name)).await?;
    Ok(())
}

async fn clear_status(ctx: &Context, names: &Names) -> Result<(), Error> {
    let clusters: Api<Cluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &serde_json::json!({}))
        .await?;
    Ok(())
}

/// What one pass of the rewrite did.
#[derive(Debug)]
struct Rewritten {
    rewritten: u64,
    /// Where the next pass goes on; None when every Secret is done.
    resume_from: Option<String>,
}

/// Write every Secret of the business cluster again, from `resume_from`,
/// for at most `budget`. A Secret changed or deleted meanwhile was written
/// (or is gone) under the new key already: a conflict or a 404 is skipped.
/// A list token that expired starts the listing over.
async fn rewrite(
    client: Client,
    mut resume_from: Option<String>,
    budget: Duration,
) -> Result<Rewritten, String> {
    let started = Instant::now();
    let all: Api<Secret> = Api::all(client.clone());
    let mut rewritten = 0;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = &resume_from {
            params = params.continue_token(token);
        }
        let page = match all.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(e)) if e.code == 410 && resume_from.is_some() => {
                resume_from = None;
                continue;
            }
            Err(e) => return Err(format!("listing Secrets: {e}")),
        };
        for secret in page.items {
            let ns = secret.namespace().unwrap_or_default();
            let name = secret.name_any();
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            match api.replace(&name, &PostParams::default(), &secret).await {
                Ok(_) => rewritten += 1,
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => return Err(format!("writing Secret {ns}/{name}: {e}")),
            }
        }
        resume_from = page.metadata.continue_.filter(|t| !t.is_empty());
        if resume_from.is_none() || started.elapsed() >= budget {
            return Ok(Rewritten {
                rewritten,
                resume_from,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_waits_for_every_kube_apiserver_to_run_the_one_before() {
        let (key, config, fingerprint) = encryption::new_key().unwrap();
        let steady = Ring::parse(&key, &config).unwrap();
        // Nothing asked, or another key named (a finished rotation's
        // annotation names the key it replaced): nothing happens.
        assert_eq!(plan(&steady, None, true, false).unwrap(), Step::Idle);
        assert_eq!(
            plan(&steady, Some("sha256:other"), true, false).unwrap(),
            Step::Idle
        );
        // Asked: a second key to read, the first still encrypting.
        let Step::Write(adding) = plan(&steady, Some(&fingerprint), false, false).unwrap() else {
            panic!("a rotation starts");
        };
        assert_eq!(adding.phase(), Phase::Adding);
        assert_eq!(adding.first(), steady.first());
        // Not before every kube-apiserver can read the new key.
        assert_eq!(
            plan(&adding, Some(&fingerprint), false, true).unwrap(),
            Step::WaitForRoll
        );
        let Step::Write(retiring) = plan(&adding, Some(&fingerprint), true, true).unwrap() else {
            panic!("the new key encrypts");
        };
        assert_eq!(retiring.phase(), Phase::Retiring);
        // The rewrite only once every kube-apiserver encrypts with it.
        assert_eq!(
            plan(&retiring, None, false, true).unwrap(),
            Step::WaitForRoll
        );
        assert_eq!(plan(&retiring, None, true, true).unwrap(), Step::Rewrite);
        // Done once kube-apiserver runs the new key alone; the annotation,
        // naming the old key, asks for nothing more.
        let done = retiring.retired();
        assert_eq!(
            plan(&done, Some(&fingerprint), false, true).unwrap(),
            Step::WaitForRoll
        );
        assert_eq!(
            plan(&done, Some(&fingerprint), true, true).unwrap(),
            Step::Finish
        );
        assert_eq!(
            plan(&done, Some(&fingerprint), true, false).unwrap(),
            Step::Idle
        );
    }

    #[test]
    fn the_status_names_the_old_and_the_new_key_throughout() {
        let (key, config, fingerprint) = encryption::new_key().unwrap();
        let steady = Ring::parse(&key, &config).unwrap();
        let adding = steady.with_new_key().unwrap();
        let new = adding.keys[1].fingerprint();
        let first = progress(&adding, &KeyRotationStatus::default());
        assert_eq!(
            (first.phase.as_str(), &first.from, &first.to),
            ("AddingKey", &fingerprint, &new)
        );
        let retiring = adding.switched();
        let mut second = progress(&retiring, &first);
        assert_eq!(
            (second.phase.as_str(), &second.from, &second.to),
            ("SwitchingKey", &fingerprint, &new)
        );
        second.secrets_rewritten = 7;
        let last = progress(&retiring.retired(), &second);
        assert_eq!(
            (last.phase.as_str(), &last.from, &last.to),
            ("RemovingKey", &fingerprint, &new)
        );
        assert_eq!(last.secrets_rewritten, 7);
    }
}
