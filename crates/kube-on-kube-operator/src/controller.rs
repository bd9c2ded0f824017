//! The Cluster controller's pass: the reconcile (fetch → build → apply →
//! status), when it runs again, and the error policy. Its shared context is
//! in [`crate::context`], its watches in [`crate::watches`], a deleted
//! Cluster's teardown in [`crate::teardown`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::Status;
use kok_common::finalizer;
use kok_common::watch::hash;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{AuthorityFingerprints, ExposureType};
use time::OffsetDateTime;

use crate::addon_retry::{self, Wait};
use crate::applied::resource_version;
use crate::context::{Context, MANAGER, Pass, apply_if_changed, apply_over, list, publish};
use crate::names::{Component, Names};
use crate::pki::{authorities, certificates, secrets};
use crate::render::etcd;
use crate::teardown::{TEARDOWN_FINALIZER, teardown};
use crate::versions::Resolved;
use crate::{Error, addons, control_plane, render, status};

/// The longest a settled Cluster waits for its next reconcile.
const IDLE_RECHECK: Duration = Duration::from_secs(3600);

/// A converging Cluster that waits only for its Pods and Deployments to
/// become Ready is woken by their watch events; it is looked at again after
/// this long in case one went unseen (see [`waits_on_watches`]).
pub const WATCHED_RECHECK: Duration = Duration::from_secs(300);

/// While old control-plane Pods shut down (after a roll), the Cluster is
/// looked at again this soon: their going wakes nothing (only etcd members'
/// Pods are watched), yet a component's version is reported only once none
/// of its old Pods is left.
const SHUTDOWN_RECHECK: Duration = Duration::from_secs(2);

/// A Cluster whose namespace holds more labelled objects than the operator
/// reads is looked at again this soon (see [`limited`]).
const LIMITED_RECHECK: Duration = Duration::from_secs(120);

fn to_jiff(t: OffsetDateTime) -> Timestamp {
    Timestamp::from_second(t.unix_timestamp()).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The Secret of kube-apiserver's encryption configuration with the
/// Cluster's KMS v2 plugin first, then the keys of its encryption Secret;
/// None without a plugin, or while that Secret holds no readable keys (the
/// PKI step holds it and says so).
fn kms_secret(
    cluster: &Cluster,
    names: &Names,
    secrets: &BTreeMap<String, Secret>,
) -> Option<Secret> {
    use crate::pki::encryption::{CONFIG, kms_config, stored};
    let kms = cluster.spec.api_server.kms.as_ref()?;
    let ring = stored(secrets.get(&names.encryption_secret())?)?;
    Some(crate::pki::secrets::owned_secret(
        cluster,
        names,
        &names.encryption_kms_secret(),
        "Opaque",
        [(
            CONFIG.to_string(),
            k8s_openapi::ByteString(kms_config(&ring, &kms.name).into_bytes()),
        )]
        .into(),
    ))
}

/// The URL users and kubelets reach the business API at.
fn external_url(cluster: &Cluster, names: &Names, external: Option<&Service>) -> String {
    let spec = &cluster.spec.api_server.external;
    let port = spec.port;
    if let Some(name) = spec.dns_names.first() {
        return format!("https://{name}:{port}");
    }
    if let Some(address) = spec.addresses.first() {
        return format!("https://{}:{port}", bracket(address));
    }
    let ingress = external
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()));
    match (spec.type_, ingress) {
        (ExposureType::LoadBalancer, Some(address)) => {
            format!("https://{}:{port}", bracket(&address))
        }
        _ => format!(
            "https://{}:{port}",
            names.service_fqdn(&names.apiserver_external_service())
        ),
    }
}

fn bracket(address: &str) -> String {
    if address.contains(':') {
        format!("[{address}]")
    } else {
        address.to_string()
    }
}

fn service_ips(services: &[&Service]) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for svc in services {
        if let Some(ip) = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_ref())
            .and_then(|ip| ip.parse().ok())
        {
            out.push(ip);
        }
        for ingress in svc
            .status
            .iter()
            .flat_map(|s| s.load_balancer.iter())
            .flat_map(|lb| lb.ingress.iter().flatten())
        {
            if let Some(ip) = ingress.ip.as_ref().and_then(|ip| ip.parse().ok()) {
                out.push(ip);
            }
        }
    }
    out
}

/// Field manager of `status.certificateAuthorities`: written apart from
/// the rest of the status, which every pass applies whole.
const AUTHORITIES_MANAGER: &str = "kube-on-kube-operator-authorities";

/// The authorities recorded in the Cluster's status. Read fresh while the
/// record is incomplete: the Cluster the reconcile was handed may predate
/// the pass that recorded them, and an authority missing from the record
/// would be made again.
async fn recorded_authorities(
    clusters: &Api<Cluster>,
    cluster: &Cluster,
) -> Result<AuthorityFingerprints, Error> {
    let of = |c: &Cluster| {
        c.status
            .as_ref()
            .and_then(|s| s.certificate_authorities.clone())
            .unwrap_or_default()
    };
    let cached = of(cluster);
    let complete = [
        &cached.cluster,
        &cached.etcd,
        &cached.front_proxy,
        &cached.service_account,
    ]
    .iter()
    .all(|f| f.is_some());
    if complete {
        return Ok(cached);
    }
    let fresh = clusters
        .get_status(&cluster.name_any())
        .await
        .map_err(Error::kube(format!(
            "reading the status of Cluster {}",
            cluster.name_any()
        )))?;
    Ok(of(&fresh))
}

/// Record what the PKI step used or made (a held authority keeps its
/// record); the record as it now stands.
async fn record_authorities(
    clusters: &Api<Cluster>,
    names: &Names,
    recorded: &AuthorityFingerprints,
    outcome: &secrets::Outcome,
) -> Result<AuthorityFingerprints, Error> {
    let used = &outcome.authorities;
    let pick = |new: &Option<String>, old: &Option<String>| new.clone().or_else(|| old.clone());
    let record = AuthorityFingerprints {
        cluster: pick(&used.cluster, &recorded.cluster),
        etcd: pick(&used.etcd, &recorded.etcd),
        front_proxy: pick(&used.front_proxy, &recorded.front_proxy),
        service_account: pick(&used.service_account, &recorded.service_account),
        encryption: pick(&used.encryption, &recorded.encryption),
    };
    if record != *recorded {
        let status = serde_json::json!({ "certificateAuthorities": record });
        kok_common::apply::apply_status(clusters, AUTHORITIES_MANAGER, &names.cluster, &status)
            .await?;
    }
    Ok(record)
}

/// The CertificatesReady condition's reason and message while authorities
/// are held.
fn held_condition(held: &[authorities::Held]) -> Option<(&'static str, String)> {
    let first = held.first()?;
    let messages: Vec<&str> = held.iter().map(|h| h.message.as_str()).collect();
    Some((first.reason, messages.join("; ")))
}

/// Events of the PKI step: certificates rotated, kubeconfigs rewritten,
/// authorities held (once, when the condition does not say so yet) or
/// replaced.
async fn pki_events(ctx: &Context, cluster: &Cluster, outcome: &secrets::Outcome) {
    let named = |keep: &dyn Fn(&str) -> bool| -> Vec<String> {
        outcome
            .changes
            .iter()
            .filter(|c| keep(c.reason))
            .filter_map(|c| c.secret.metadata.name.clone())
            .collect()
    };
    let renewed = named(&|r| !["Created", "Replaced", secrets::TAMPERED].contains(&r));
    if !renewed.is_empty() {
        publish(
            ctx,
            cluster,
            EventType::Normal,
            "CertificatesRotated",
            "RotateCertificates",
            format!("reissued {}", renewed.join(", ")),
        )
        .await;
    }
    let rewritten = named(&|r| r == secrets::TAMPERED);
    if !rewritten.is_empty() {
        publish(
            ctx,
            cluster,
            EventType::Warning,
            "KubeconfigRewritten",
            "RewriteKubeconfig",
            format!(
                "{} did not hold what the operator issued (fields added or changed) and were issued again",
                rewritten.join(", ")
            ),
        )
        .await;
    }
    let shown = cluster
        .status
        .as_ref()
        .and_then(|s| s.condition(status::CERTIFICATES_READY))
        .map(|c| (c.reason.as_str(), c.message.as_str()));
    if let Some((reason, message)) = held_condition(&outcome.held)
        && shown != Some((reason, message.as_str()))
    {
        publish(
            ctx,
            cluster,
            EventType::Warning,
            reason,
            "KeepCertificateAuthorities",
            message,
        )
        .await;
    }
    for which in &outcome.replaced {
        publish(
            ctx,
            cluster,
            EventType::Normal,
            "CertificateAuthorityReplaced",
            "ReplaceCertificateAuthority",
            format!(
                "the {} was replaced as the Cluster's {} annotation allowed",
                which.label(),
                kube_on_kube_api::cluster::REPLACE_AUTHORITIES_ANNOTATION
            ),
        )
        .await;
    }
}

/// Converge one Cluster. A namespace holding more of its labelled objects
/// than the operator reads is reported on the Cluster (see [`limited`]); a
/// write that was refused is shown on the Cluster (see [`crate::refused`])
/// rather than retried at once.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    match converge(cluster.clone(), ctx.clone()).await {
        Err(Error::Limit(exceeded)) => limited(&ctx, &cluster, &exceeded).await,
        Err(error) => match crate::refused::Refusal::of(&error) {
            Some(refusal) => crate::refused::report(&ctx, &cluster, &refusal).await,
            None => Err(error),
        },
        done => done,
    }
}

/// A list of the Cluster's namespace went over the operator's limits: the
/// `Allowed` condition and an Event say which and what to do, and the pass
/// stops there. Nothing wakes the Cluster when the extra objects go (they
/// are not its own), so it is looked at again after a while.
async fn limited(
    ctx: &Context,
    cluster: &Cluster,
    exceeded: &crate::bounded::Exceeded,
) -> Result<Action, Error> {
    let names = Names::new(cluster, &ctx.config.meta_domain);
    tracing::warn!(cluster = %names.cluster, error = %exceeded, "a list went over the operator's limits");
    publish(
        ctx,
        cluster,
        EventType::Warning,
        crate::bounded::TOO_MANY_OBJECTS,
        "ListObjects",
        exceeded.to_string(),
    )
    .await;
    let status = crate::refused::with_condition(
        cluster,
        kok_common::conditions::Desired {
            type_: kube_on_kube_api::cluster::ALLOWED,
            status: Status::False,
            reason: crate::bounded::TOO_MANY_OBJECTS,
            message: exceeded.to_string(),
        },
        None,
        Timestamp::now(),
    );
    crate::refused::write_status(ctx, cluster, &status).await?;
    Ok(Action::requeue(LIMITED_RECHECK))
}

/// The pass of [`reconcile`].
async fn converge(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let names = Names::new(&cluster, &ctx.config.meta_domain);
    let ns = names.namespace.clone();
    let client = &ctx.client;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let services_api: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deployments_api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let spec = &cluster.spec;
    let version = spec.version.clone();
    // What the spec asks each component to run, resolved once for the pass.
    let resolved = Resolved::of(&cluster, &ctx.config);
    let etcd_version = resolved.etcd.version.clone();

    if cluster.metadata.deletion_timestamp.is_some() {
        return teardown(&ctx, &cluster, &names).await;
    }
    // Without it deletion still works, only slower (garbage collection
    // alone): not a reason to stop converging the cluster.
    if let Err(error) = finalizer::add(&clusters, &cluster, TEARDOWN_FINALIZER).await {
        tracing::warn!(cluster = %names.cluster, %error, "cannot add the teardown finalizer");
    }

    // A Cluster that waits only for its add-on step's next attempt, with
    // nothing changed since the pass that found so: that step alone.
    let key = names.key();
    let epoch = ctx.addon_waits.epoch(&key);
    let mut retried = None;
    if let Some(wait) = ctx
        .addon_waits
        .take(&key, cluster.resource_version().as_deref())
    {
        match retry_addons(&ctx, &cluster, &names, &clusters, wait).await? {
            Retried::Done(action) => return Ok(action),
            Retried::Full(report) => retried = report,
        }
    }

    // Fetch.
    let existing: BTreeMap<String, Secret> = list(&ctx, &secrets_api, &names)
        .await?
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect();
    let deployments: BTreeMap<String, Deployment> = list(&ctx, &deployments_api, &names)
        .await?
        .into_iter()
        .map(|d| (d.name_any(), d))
        .collect();
    let services: BTreeMap<String, Service> = list(&ctx, &services_api, &names)
        .await?
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect();

    // A spec asking for what the operator's flags do not allow is treated
    // like a paused one: read, reported, never applied.
    let refusals = crate::policy::check(&cluster, &ctx.config, &resolved);
    if !refusals.is_empty() && !spec.paused {
        publish(
            &ctx,
            &cluster,
            EventType::Warning,
            refusals[0].reason,
            "CheckSpec",
            refusals
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
        .await;
    }
    if spec.paused || !refusals.is_empty() {
        // Only read, never applied, while paused.
        let etcd_pods: Vec<Pod> = list(&ctx, &pods_api, &names)
            .await?
            .into_iter()
            .filter(|p| p.labels().contains_key(etcd::MEMBER_LABEL))
            .collect();
        let external = services.get(&names.apiserver_external_service());
        let endpoint = external_url(&cluster, &names, external);
        let observed = status::Observed {
            etcd_pods: &etcd_pods,
            apiserver: deployments.get(&names.deployment(Component::ApiServer)),
            controller_manager: deployments.get(&names.deployment(Component::ControllerManager)),
            scheduler: deployments.get(&names.deployment(Component::Scheduler)),
            endpoint,
            certificates_expire_at: cluster
                .status
                .as_ref()
                .and_then(|s| s.certificates_expire_at.clone())
                .map(|t| t.0),
            certificates_error: None,
            certificates_held: None,
            apiserver_files_held: None,
            addons: None,
            version: &version,
            etcd_version: &etcd_version,
            etcd: None,
            upgrade: None,
        };
        let mut status = status::build(&cluster, &names, &observed, Timestamp::now());
        crate::policy::set_condition(&mut status, &cluster, &refusals, Timestamp::now());
        kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &status).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }

    // The snapshot gateway on a claim snapshots go to (or come from).
    let claim_recheck = crate::backup::gateway::converge(
        &ctx,
        &cluster,
        &names,
        &existing,
        &services,
        &deployments,
    )
    .await?;
    // A Cluster started from a snapshot: its identity first, nothing else
    // until it is there.
    if let Some(action) = crate::backup::restore::prepare(&ctx, &cluster, &names).await? {
        return Ok(action);
    }

    // The apiserver Services first: their addresses go into the serving
    // certificate, and issuing it before they exist would mean issuing it twice.
    let service = async |desired: Service| {
        apply_if_changed(
            &ctx,
            &names,
            &services_api,
            &desired,
            &services,
            resource_version,
        )
        .await
    };
    // The konnectivity server beside kube-apiserver, read once for the
    // Services, the egress configuration and the Deployment. Values the
    // add-on refuses (its condition names the field) change nothing of what
    // runs: agents keep dialing the server they know.
    let konnectivity = crate::render::addons::konnectivity(&cluster, &ctx.config.registry)
        .unwrap_or_else(|_| {
            render::control_plane::running_konnectivity(
                deployments.get(&names.deployment(Component::ApiServer)),
                services.get(&names.apiserver_external_service()),
            )
        });
    let internal_svc = service(render::control_plane::apiserver_internal_service(
        &cluster, &names,
    ))
    .await?;
    let external_svc = service(render::control_plane::apiserver_external_service(
        &cluster,
        &names,
        konnectivity.as_ref(),
    ))
    .await?;
    let endpoint = external_url(&cluster, &names, Some(&external_svc));
    let advertise = render::control_plane::advertised_address(&cluster, Some(&external_svc));
    // Then certificates: everything else mounts them.
    let ips = service_ips(&[&internal_svc, &external_svc]);
    let validity = kok_common::duration::parse(&spec.certificates.validity)
        .unwrap_or(Duration::from_secs(365 * 24 * 3600));
    let renew_before = kok_common::duration::parse(&spec.certificates.renew_before)
        .unwrap_or(Duration::from_secs(30 * 24 * 3600));
    let internal_url = render::control_plane::internal_api_url(&names);
    let now = OffsetDateTime::now_utc();
    let mut record = recorded_authorities(&clusters, &cluster).await?;
    let mut held = Vec::new();
    let (all_secrets, expiry, certificates_error) = match certificates::plan(&cluster, &names, &ips)
    {
        Err(e) => (existing.clone(), None, Some(e.to_string())),
        Ok(plan) => {
            let replace = authorities::replaceable(cluster.metadata.annotations.as_ref());
            let inputs = secrets::Inputs {
                cluster: &cluster,
                names: &names,
                existing: &existing,
                now,
                validity,
                renew_before,
                external_url: &endpoint,
                internal_url: &internal_url,
                previous_endpoint: cluster.status.as_ref().and_then(|s| s.endpoint.as_deref()),
                recorded: &record,
                replace: &replace,
            };
            match secrets::reconcile(&inputs, &plan) {
                Err(e) => (existing.clone(), None, Some(e.to_string())),
                Ok(outcome) => {
                    for change in &outcome.changes {
                        let listed = change
                            .secret
                            .metadata
                            .name
                            .as_ref()
                            .and_then(|name| existing.get(name));
                        apply_over(&secrets_api, &change.secret, listed).await?;
                    }
                    // Recorded once the Secrets are written: a record of a
                    // CA whose Secret was never written would hold it forever.
                    record = record_authorities(&clusters, &names, &record, &outcome).await?;
                    pki_events(&ctx, &cluster, &outcome).await;
                    held = outcome.held;
                    (
                        secrets::merged(&existing, &outcome.changes),
                        outcome.earliest_expiry,
                        None,
                    )
                }
            }
        }
    };
    let mut all_secrets = all_secrets;
    if let Some(secret) = kms_secret(&cluster, &names, &all_secrets) {
        let written = apply_if_changed(
            &ctx,
            &names,
            &secrets_api,
            &secret,
            &all_secrets,
            resource_version,
        )
        .await?;
        all_secrets.insert(names.encryption_kms_secret(), written);
    }
    let certificates_held = held_condition(&held);
    if let Some(error) = &certificates_error {
        publish(
            &ctx,
            &cluster,
            EventType::Warning,
            "InvalidSpec",
            "IssueCertificates",
            error.clone(),
        )
        .await;
    }

    // etcd: member Pods, claims and Services, and membership changes one at
    // a time (see the etcd module). The Cluster's Pods are read once, for
    // etcd's members and the control plane's replicas: what the etcd step
    // does to its members does not concern the replicas.
    let pods = list(&ctx, &pods_api, &names).await?;
    if let Some(action) = quorum_lost(&ctx, &cluster, &names, &pods).await? {
        return Ok(action);
    }
    let pass = Pass {
        ctx: &ctx,
        cluster: &cluster,
        names: &names,
        resolved: &resolved,
        secrets: &all_secrets,
        services: &services,
        deployments: &deployments,
        pods: &pods,
    };
    let etcd_report = crate::etcd::reconcile(&pass).await?;
    let etcd_pods = etcd_report.pods.clone();
    // The restored member serves: recorded before kube-apiserver, the first
    // to write, is made in this pass below, so a member Pod made again
    // afterwards starts on its own data (which holds every write) rather
    // than on the snapshot again.
    crate::backup::restore::finish(&ctx, &cluster, &names, etcd_report.ready > 0).await?;
    // Until then no kube-apiserver runs: during a rebuild after a lost
    // quorum, running ones would write to the restored member before the
    // record, and a member Pod made again then would restore the snapshot
    // over those writes.
    let restoring = crate::render::restore::pending(&cluster).is_some() && etcd_report.ready == 0;

    // kube-apiserver's configuration files, before the Pods that mount
    // them: its authentication configuration (with the tenant's JWT
    // issuers), its audit policy and webhook kubeconfig if it audits, and
    // with a konnectivity-server beside it, the egress selector
    // configuration that sends its traffic to the business cluster there.
    // Each read by its name. The tenant's files, missing or refused, hold
    // theirs as they are (see apiserver_files).
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let tenant_files = crate::apiserver_files::read(&ctx, &cluster, &names).await?;
    let files_held = tenant_files.as_ref().err().cloned();
    if let Some(held) = &files_held {
        publish(
            &ctx,
            &cluster,
            EventType::Warning,
            held.reason,
            "ConfigureAPIServer",
            held.message.clone(),
        )
        .await;
    }
    let files = tenant_files.ok();
    let files_hash = files.as_ref().and_then(crate::apiserver_files::Files::hash);
    let tenant_configs = files.iter().flat_map(|f| {
        std::iter::once(render::control_plane::authentication_config(
            &cluster, &names, &f.jwt,
        ))
        .chain(
            f.policy
                .clone()
                .map(|policy| render::control_plane::audit_policy_config(&cluster, &names, policy)),
        )
    });
    if let Some(kubeconfig) = files.as_ref().and_then(|f| f.webhook.clone()) {
        let desired = render::control_plane::audit_webhook_secret(&cluster, &names, kubeconfig);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        apply_if_changed(
            &ctx,
            &names,
            &secrets,
            &desired,
            &all_secrets,
            resource_version,
        )
        .await?;
    }
    let configs = tenant_configs.chain(
        konnectivity
            .is_some()
            .then(|| render::control_plane::egress_selector_config(&cluster, &names)),
    );
    for desired in configs {
        let name = desired.name_any();
        let read: BTreeMap<String, ConfigMap> = maps
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading ConfigMap {name}")))?
            .map(|m| (name, m))
            .into_iter()
            .collect();
        apply_if_changed(&ctx, &names, &maps, &desired, &read, resource_version).await?;
    }

    // The stateless control plane, upgraded in order behind etcd.
    let etcd_settled = crate::etcd::settled(&etcd_report);
    let control_plane::Outcome {
        apiserver,
        controller_manager,
        scheduler,
        plan: upgrade_plan,
    } = control_plane::reconcile(
        &pass,
        &control_plane::Prior {
            etcd_settled,
            etcd_serving: etcd_report.ready,
            pki_held: certificates_held.is_some(),
            files_held: files_held.is_some(),
            files_hash: files_hash.as_deref(),
            advertise: advertise.as_deref(),
            konnectivity: konnectivity.as_ref(),
            restoring,
        },
    )
    .await?;

    // A rotation of the encryption key takes its next step once every
    // kube-apiserver runs the key ring as it is stored: a held configuration
    // keeps the running Pods on what they have.
    let rotation_recheck = if crate::render::restore::pending(&cluster).is_none() {
        let rolled = certificates_held.is_none()
            && files_held.is_none()
            && apiserver
                .as_ref()
                .is_some_and(|d| control_plane::settled(Component::ApiServer, d, &pods));
        crate::key_rotation::reconcile(&crate::key_rotation::Inputs {
            ctx: &ctx,
            cluster: &cluster,
            names: &names,
            secrets: &all_secrets,
            rolled,
            ca_fingerprint: record.cluster.as_deref(),
        })
        .await?
    } else {
        None
    };

    // Add-ons, once the business API answers.
    let api_ready = apiserver
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        > 0;
    // Add-ons follow the control plane: not while it upgrades or refuses a
    // version, not while no etcd member serves (its kube-apiservers may
    // still look ready for a moment), and not while etcd starts from a
    // snapshot (which holds the add-ons applied before): a pass that waited
    // out the business API's timeouts would hold back the next etcd step.
    let mut addons_wait = None;
    let addons = if api_ready
        && etcd_report.ready > 0
        && crate::render::restore::pending(&cluster).is_none()
        && certificates_error.is_none()
        && certificates_held.is_none()
        && upgrade_plan.addons
    {
        let key = names.key();
        let generation = cluster.metadata.generation;
        Some(if let Some(report) = retried {
            ctx.addon_backoff.succeeded(&key);
            report
        } else if let Some((wait, last)) = ctx.addon_backoff.waiting(&key, generation) {
            addons_wait = Some(wait);
            last
        } else {
            let inputs = addons::Inputs {
                cluster: &cluster,
                names: &names,
                secrets: &all_secrets,
                endpoint: &endpoint,
                ca_fingerprint: record.cluster.as_deref(),
            };
            let report = addons::reconcile(&ctx, &inputs).await;
            crate::metrics::domain().addon_attempt(false);
            if report.failed() {
                let (shown, wait) = addon_failed(&ctx, &names, generation, &report);
                addons_wait = Some(wait);
                shown
            } else {
                ctx.addon_backoff.succeeded(&key);
                report
            }
        })
    } else {
        None
    };

    // Status.
    let addon_endpoint = endpoint.clone();
    let observed = status::Observed {
        etcd_pods: &etcd_pods,
        apiserver: apiserver.as_ref(),
        controller_manager: Some(&controller_manager),
        scheduler: Some(&scheduler),
        endpoint,
        certificates_expire_at: expiry.map(to_jiff),
        certificates_error,
        certificates_held,
        apiserver_files_held: files_held.as_ref(),
        addons,
        version: &version,
        etcd_version: &etcd_version,
        etcd: Some(&etcd_report),
        upgrade: Some(&upgrade_plan),
    };
    crate::metrics::record(&names, &all_secrets, &etcd_report);
    let mut status = status::build(&cluster, &names, &observed, Timestamp::now());
    crate::policy::set_condition(&mut status, &cluster, &[], Timestamp::now());
    let ready = kok_common::conditions::is_true(&status.conditions, status::READY);
    let written =
        kok_common::apply::apply_status(&clusters, MANAGER, &names.cluster, &status).await?;
    // Certificates are re-checked at least hourly, and when the first one is
    // due for renewal (which, with a short validity, can be sooner than
    // anything else would wake the reconcile).
    let idle = expiry.map_or(IDLE_RECHECK, |at| {
        secrets::until_renewal(at, renew_before, OffsetDateTime::now_utc())
            .clamp(Duration::from_secs(1), IDLE_RECHECK)
    });
    let idle = claim_recheck.map_or(idle, |soon| idle.min(soon));
    let idle = rotation_recheck.map_or(idle, |soon| idle.min(soon));
    // A control plane that is ready but for its failing add-ons waits for
    // their next attempt.
    let only_addons_wait = addons_wait.filter(|_| {
        status
            .conditions
            .iter()
            .filter(|c| {
                ![status::READY, status::ADDONS_READY, status::PROGRESSING]
                    .contains(&c.type_.as_str())
            })
            .all(|c| c.status == Status::True)
    });
    // Anything else still converging is looked at again soon, and less often
    // while its status stays the same (changes of its objects wake it at once).
    let key = names.key();
    let converging = !etcd_report.settled || (!ready && only_addons_wait.is_none());
    let watched = waits_on_watches(&etcd_report);
    if !converging || watched {
        ctx.polls.forget(&key);
    }
    let shutting_down = replicas_shutting_down(&pods);
    let next = next_pass(
        &Schedule {
            etcd_requeue: etcd_report.requeue,
            idle,
            converging,
            watched,
            addons_wait,
            only_addons_wait,
            shutting_down,
        },
        || ctx.polls.next(&key, fingerprint(&status)),
    );
    // Settled but for failing add-ons: their retries need no full pass
    // until something changes or one is due anyway.
    if etcd_report.requeue.is_none() && !converging && !shutting_down && only_addons_wait.is_some()
    {
        let read = addons::secrets_read(&names);
        let secrets = all_secrets
            .iter()
            .filter(|(name, _)| read.contains(name))
            .map(|(name, secret)| (name.clone(), secret.clone()))
            .collect();
        let wait = Wait::new(
            epoch,
            written.resource_version().unwrap_or_default(),
            Instant::now() + idle,
            addon_endpoint,
            secrets,
        );
        ctx.addon_waits.record(&key, wait);
    }
    tracing::debug!(
        cluster = %names.cluster,
        ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == status::READY)
            .map_or("", |c| c.message.as_str()),
        converging,
        watched,
        next_in = ?next,
        "reconciled"
    );
    Ok(Action::requeue(next))
}

/// A Cluster with backups whose etcd members lost their data, a majority
/// of those it reported: rebuilt from a snapshot, or held (see
/// [`crate::backup::restore::recover`]); never bootstrapped empty.
async fn quorum_lost(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    pods: &[Pod],
) -> Result<Option<Action>, Error> {
    let Some(status) = cluster.status.as_ref() else {
        return Ok(None);
    };
    if cluster.spec.etcd.backup.is_none() || status.etcd_members.is_empty() {
        return Ok(None);
    }
    let storage = &cluster.spec.etcd.storage;
    if crate::render::etcd::on_host_path(cluster) {
        // On the node, the data outlives its Pod and its Service's pin.
        return Ok(None);
    }
    let member_pods: Vec<String> = pods
        .iter()
        .filter(|p| p.labels().contains_key(etcd::MEMBER_LABEL))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(ResourceExt::name_any)
        .collect();
    let had: Vec<&str> = status
        .etcd_members
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    // More members reported than wanted: a scale-down is removing some,
    // their claims on purpose.
    if had.len() > cluster.spec.mode.replicas() as usize {
        return Ok(None);
    }
    // Every reported member with a live Pod: nothing lost (a claim in use
    // is not deleted while its Pod runs), and no claim list on this pass.
    if had.iter().all(|m| member_pods.iter().any(|p| p == m)) {
        return Ok(None);
    }
    let claims: Vec<String> = if storage.claim_template.is_some() {
        let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &names.namespace);
        list(ctx, &api, names)
            .await?
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.name_any())
            .collect()
    } else {
        Vec::new()
    };
    let lost = had
        .iter()
        .filter(|m| {
            if storage.claim_template.is_some() {
                !claims.iter().any(|c| c == *m)
            } else {
                !member_pods.iter().any(|p| p == *m)
            }
        })
        .count();
    // Every member Pod goes before the rebuild, those already stopping too.
    let every_member_pod: Vec<String> = pods
        .iter()
        .filter(|p| p.labels().contains_key(etcd::MEMBER_LABEL))
        .map(ResourceExt::name_any)
        .collect();
    crate::backup::restore::recover(
        ctx,
        cluster,
        names,
        lost,
        had.len(),
        (&every_member_pod, &claims),
    )
    .await
}

/// What decides when a Cluster's next pass runs, as the pass found it.
#[derive(Debug, Clone, Copy, Default)]
struct Schedule {
    /// etcd's membership step asks to be looked at again this soon.
    etcd_requeue: Option<Duration>,
    /// The longest wait: until the first certificate is due for renewal, at
    /// most [`IDLE_RECHECK`].
    idle: Duration,
    /// Something is still converging (etcd, or the control plane other than
    /// its add-ons).
    converging: bool,
    /// What it waits for is reported by the watches (see
    /// [`waits_on_watches`]).
    watched: bool,
    /// The add-on step's next attempt, when it failed.
    addons_wait: Option<Duration>,
    /// The same, when the add-ons are all that is not ready.
    only_addons_wait: Option<Duration>,
    /// Old control-plane Pods are still shutting down.
    shutting_down: bool,
}

/// How long until the next pass. `poll` is the backing-off wait of a
/// converging Cluster no watch reports on; it is asked for only then (it
/// records the status it was asked with).
fn next_pass(s: &Schedule, poll: impl FnOnce() -> Duration) -> Duration {
    const SOONEST: Duration = Duration::from_secs(1);
    let next = if let Some(soon) = s.etcd_requeue {
        soon
    } else if s.converging && s.watched {
        s.addons_wait
            .map_or(WATCHED_RECHECK, |wait| wait.max(SOONEST))
            .min(WATCHED_RECHECK)
    } else if s.converging {
        poll()
    } else if let Some(wait) = s.only_addons_wait {
        wait.max(SOONEST)
    } else {
        s.idle
    };
    let next = next.min(s.idle);
    if s.shutting_down {
        next.min(SHUTDOWN_RECHECK)
    } else {
        next
    }
}

/// Records a failed add-on step: what the status shows until its next
/// attempt, and the wait for it.
fn addon_failed(
    ctx: &Context,
    names: &Names,
    generation: Option<i64>,
    report: &addon_retry::Report,
) -> (addon_retry::Report, Duration) {
    tracing::debug!(cluster = %names.cluster, reason = report.reason, message = %report.message, "add-on step failed");
    // The time of the next attempt, not the time left: the message must not
    // change while waiting, or each status write would wake the Cluster again.
    ctx.addon_backoff
        .failed(&names.key(), generation, |n, wait| {
            let at = Timestamp::now()
                .checked_add(wait)
                .unwrap_or(Timestamp::now());
            addon_retry::Report {
                message: format!(
                    "{} (attempt {n} failed; next at {})",
                    report.message,
                    at.strftime("%H:%M:%SZ")
                ),
                ..report.clone()
            }
        })
}

/// What a retry of the add-on step left to do.
enum Retried {
    /// It failed again and the status says so: nothing more this time.
    Done(Action),
    /// A full pass follows, with the step's outcome when it no longer failed.
    Full(Option<addon_retry::Report>),
}

/// Retry the add-on step of a Cluster whose control plane is settled and
/// waits only for it (see [`crate::addon_retry`]): the step itself and the
/// AddonsReady condition, nothing a full pass reads.
async fn retry_addons(
    ctx: &Context,
    cluster: &Cluster,
    names: &Names,
    clusters: &Api<Cluster>,
    wait: Wait,
) -> Result<Retried, Error> {
    let key = names.key();
    let generation = cluster.metadata.generation;
    let soonest = Duration::from_secs(1);
    if let Some((left, _)) = ctx.addon_backoff.waiting(&key, generation) {
        ctx.addon_waits.record(&key, wait);
        return Ok(Retried::Done(Action::requeue(left.max(soonest))));
    }
    let inputs = addons::Inputs {
        cluster,
        names,
        secrets: &wait.secrets,
        endpoint: &wait.endpoint,
        ca_fingerprint: cluster
            .status
            .as_ref()
            .and_then(|s| s.certificate_authorities.as_ref())
            .and_then(|r| r.cluster.as_deref()),
    };
    let report = addons::reconcile(ctx, &inputs).await;
    crate::metrics::domain().addon_attempt(true);
    if !report.failed() {
        return Ok(Retried::Full(Some(report)));
    }
    let (shown, next) = addon_failed(ctx, names, generation, &report);
    let Some(status) = status::with_addons(cluster, &shown, Timestamp::now()) else {
        return Ok(Retried::Full(None));
    };
    let written =
        kok_common::apply::apply_status(clusters, MANAGER, &names.cluster, &status).await?;
    let full_in = wait.full_by().saturating_duration_since(Instant::now());
    ctx.addon_waits.record(
        &key,
        wait.after_write(written.resource_version().unwrap_or_default()),
    );
    let next = next.min(full_in).max(soonest);
    tracing::debug!(cluster = %names.cluster, next_in = ?next, "add-on step retried");
    Ok(Retried::Done(Action::requeue(next)))
}

/// Whether what a converging Cluster still waits for reaches it through its
/// watches. Deployments that are not Ready yet do: each change of their
/// status wakes the reconcile. So do member Pods that are not Ready, as long
/// as none has restarted. What does not, and is polled: etcd members whose
/// Pods are Ready but which do not serve yet (only asking etcd tells), and a
/// member Pod that restarts, judged failed after a time without any event.
pub fn waits_on_watches(etcd: &crate::etcd::Report) -> bool {
    let waiting_on_a_pod = etcd.pods.len() < etcd.desired as usize
        || etcd.pods.iter().any(|p| !crate::etcd::pod_ready(p));
    etcd.settled || (waiting_on_a_pod && etcd.pods.iter().all(|p| crate::etcd::restarts(p) == 0))
}

/// Whether a Deployment's Pod of the Cluster is shutting down (see
/// [`SHUTDOWN_RECHECK`]); etcd members' Pods wake the Cluster themselves.
fn replicas_shutting_down(pods: &[Pod]) -> bool {
    pods.iter().any(|p| {
        p.metadata.deletion_timestamp.is_some() && !p.labels().contains_key(etcd::MEMBER_LABEL)
    })
}

/// A hash of what a status reports, without its timestamps: equal while a
/// converging Cluster makes no visible progress.
fn fingerprint(status: &kube_on_kube_api::cluster::ClusterStatus) -> u64 {
    let conditions: Vec<_> = status
        .conditions
        .iter()
        .map(|c| (&c.type_, &c.status, &c.reason, &c.message))
        .collect();
    hash(&(
        conditions,
        serde_json::to_string(&status.components).unwrap_or_default(),
    ))
}

/// Transient failures are retried with a delay; the controller runtime adds its
/// own backoff on top for repeated failures.
pub fn error_policy(cluster: Arc<Cluster>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(15))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn report(settled: bool, pods: Vec<Pod>) -> crate::etcd::Report {
        crate::etcd::Report {
            members: Vec::new(),
            desired: 1,
            ready: 0,
            version: None,
            condition: crate::etcd::Health {
                ready: settled,
                reason: "Test",
                message: String::new(),
            },
            spread: crate::etcd::Health {
                ready: true,
                reason: "Test",
                message: String::new(),
            },
            settled,
            pods,
            requeue: None,
        }
    }

    pub(crate) fn member(ready: bool, restarts: i32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{
                    "name": "etcd", "image": "etcd", "imageID": "", "ready": ready,
                    "restartCount": restarts
                }]
            }
        }))
        .expect("pod")
    }

    #[test]
    fn the_next_pass_comes_as_soon_as_what_the_cluster_waits_for_needs() {
        let s = |secs: u64| Duration::from_secs(secs);
        let idle = Schedule {
            idle: IDLE_RECHECK,
            ..Default::default()
        };
        let unpolled = || -> Duration { panic!("only a converging, unwatched Cluster polls") };
        // Settled: at the idle recheck, or sooner for a certificate's renewal.
        assert_eq!(next_pass(&idle, unpolled), IDLE_RECHECK);
        let renewal = Schedule {
            idle: s(30),
            ..idle
        };
        assert_eq!(next_pass(&renewal, unpolled), s(30));
        // etcd's own step first, never after the idle recheck.
        let etcd = Schedule {
            etcd_requeue: Some(s(3)),
            converging: true,
            ..idle
        };
        assert_eq!(next_pass(&etcd, unpolled), s(3));
        assert_eq!(
            next_pass(
                &Schedule {
                    etcd_requeue: Some(s(7200)),
                    ..idle
                },
                unpolled
            ),
            IDLE_RECHECK
        );
        // Converging on what the watches report: woken by them, with a
        // recheck, or the add-ons' next attempt (not sooner than 1 s).
        let watched = Schedule {
            converging: true,
            watched: true,
            ..idle
        };
        assert_eq!(next_pass(&watched, unpolled), WATCHED_RECHECK);
        let retry = |wait: Duration| Schedule {
            addons_wait: Some(wait),
            ..watched
        };
        assert_eq!(next_pass(&retry(s(10)), unpolled), s(10));
        assert_eq!(next_pass(&retry(Duration::ZERO), unpolled), s(1));
        assert_eq!(next_pass(&retry(s(3600)), unpolled), WATCHED_RECHECK);
        // Converging on what no watch reports: the poll's backing-off wait.
        let polled = Schedule {
            watched: false,
            ..watched
        };
        assert_eq!(next_pass(&polled, || s(20)), s(20));
        // Ready but for failing add-ons: their next attempt.
        let addons = Schedule {
            only_addons_wait: Some(s(40)),
            ..idle
        };
        assert_eq!(next_pass(&addons, unpolled), s(40));
        // Old Pods shutting down: soon, whatever else waits.
        let leaving = Schedule {
            shutting_down: true,
            ..addons
        };
        assert_eq!(next_pass(&leaving, unpolled), SHUTDOWN_RECHECK);
    }

    #[test]
    fn replicas_shutting_down_are_polled_and_members_are_not() {
        let gone = Some(Time(Timestamp::UNIX_EPOCH));
        let mut replica = member(true, 0);
        replica.metadata.labels =
            Some([("kubeonkube.io/cluster".to_string(), "c".to_string())].into());
        assert!(!replicas_shutting_down(std::slice::from_ref(&replica)));
        replica.metadata.deletion_timestamp = gone.clone();
        assert!(replicas_shutting_down(&[member(true, 0), replica]));
        let mut leaving = member(true, 0);
        leaving.metadata.labels = Some([(etcd::MEMBER_LABEL.to_string(), "0".to_string())].into());
        leaving.metadata.deletion_timestamp = gone;
        assert!(!replicas_shutting_down(&[leaving]));
    }

    #[test]
    fn only_what_no_watch_reports_is_polled() {
        // Settled etcd: the rest are Deployments, whose status changes wake.
        assert!(waits_on_watches(&report(true, vec![member(true, 0)])));
        // A member Pod still to come or to become Ready: its events wake.
        assert!(waits_on_watches(&report(false, Vec::new())));
        assert!(waits_on_watches(&report(false, vec![member(false, 0)])));
        // Ready Pods whose members do not serve yet: only etcd can tell.
        assert!(!waits_on_watches(&report(false, vec![member(true, 0)])));
        // A restarting member is judged failed after a while, with no event.
        assert!(!waits_on_watches(&report(false, vec![member(false, 2)])));
    }
}
