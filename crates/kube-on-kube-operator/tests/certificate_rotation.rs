//! Certificate rotation carried out by the operator on real processes, as
//! in `upgrade` (whose helpers it shares): leaf certificates with a short
//! validity are renewed, the components roll onto them and the API serves
//! the new certificate, while the business API is polled throughout. Apart
//! from `upgrade` so that neither binary runs past its share of the test
//! budget.
#![allow(dead_code, unused_imports)]

use kok_test_support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;
use kube_on_kube_operator::pki;
use serde_json::json;

include!("common/upgrade_items.rs");

/// A certificate's serial number and expiry.
type Issued = (String, time::OffsetDateTime);

fn issued(pem: &str) -> Issued {
    let info = pki::inspect(pem).unwrap_or_else(|e| panic!("certificate: {e}"));
    (info.serial, info.not_after)
}

/// Every certificate in the cluster's Secrets, by Secret name: CAs, leaves
/// and the client certificates inside kubeconfigs.
#[derive(Debug, Default)]
struct Certificates {
    cas: BTreeMap<String, Issued>,
    leaves: BTreeMap<String, Issued>,
    kubeconfigs: BTreeMap<String, Issued>,
}

async fn certificates(client: &Client, ns: &str, name: &str) -> Certificates {
    use base64::Engine;
    let secrets = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubeonkube.io/cluster={name}")))
        .await
        .expect("secrets")
        .items;
    let mut out = Certificates::default();
    for s in secrets {
        let data = s.data.clone().unwrap_or_default();
        let text = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        if let Some(kubeconfig) = text("kubeconfig") {
            let parsed = kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("kubeconfig");
            let cert = parsed.auth_infos[0]
                .auth_info
                .as_ref()
                .and_then(|a| a.client_certificate_data.clone())
                .expect("client certificate");
            let pem = base64::engine::general_purpose::STANDARD
                .decode(cert)
                .expect("base64");
            out.kubeconfigs
                .insert(s.name_any(), issued(&String::from_utf8_lossy(&pem)));
        } else if let Some(cert) = text("tls.crt") {
            let slot = if data.contains_key("ca.crt") {
                &mut out.leaves
            } else {
                &mut out.cas
            };
            slot.insert(s.name_any(), issued(&cert));
        }
    }
    out
}

/// The certificate `address` presents on the API port, checked against `ca`
/// for the name `kubernetes`.
fn served_certificate(address: &str, ca: &std::path::Path) -> Result<Issued, String> {
    let out = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("{address}:6443"),
            "-servername",
            "kubernetes",
        ])
        .args([
            "-verify_hostname",
            "kubernetes",
            "-verify_return_error",
            "-CAfile",
        ])
        .arg(ca)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("Verify return code: 0 (ok)") {
        return Err(format!(
            "{address}: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .ok_or("no certificate")?;
    let end = text[begin..]
        .find("-----END CERTIFICATE-----")
        .ok_or("no certificate end")?
        + begin;
    Ok(issued(
        &text[begin..end + "-----END CERTIFICATE-----".len()],
    ))
}

/// What every ready kube-apiserver Pod of the cluster serves.
async fn served(
    client: &Client,
    ns: &str,
    name: &str,
    ca: &std::path::Path,
) -> Vec<Result<Issued, String>> {
    let mut out = Vec::new();
    for p in ready_pods(client, ns, name, "apiserver").await {
        if let Some(ip) = p.status.and_then(|s| s.pod_ip) {
            out.push(served_certificate(&ip, ca));
        }
    }
    out
}

/// Leaf certificates of the rotation test live this long: the least the API
/// allows.
const VALIDITY: Duration = Duration::from_secs(600);

/// They are renewed when less than this remains: 2 minutes after issue,
/// about 95 s after a Production Cluster is ready. The renewed ones are due
/// 2 minutes after that, and the components' roll onto them must end
/// before (71 s measured on a loaded 2-core machine), or it starts over
/// onto the next ones.
const RENEW_BEFORE: Duration = Duration::from_secs(480);

/// With nothing but time passing, every leaf certificate and kubeconfig is
/// issued again once less than `renewBefore` remains (not before, and within
/// a minute and a half), the CAs are kept, every component rolls onto the
/// new ones while the business API answers every call, the kube-apiservers
/// serve the new chain, and the status reports the later expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_certificates_rotate_without_an_outage() {
    let _one_at_a_time = HEAVY.lock().await;
    let name = "rot";
    let (client, ns, clusters) = setup("rotate", name, ClusterMode::Production, |c| {
        c.spec.certificates.validity = format!("{}s", VALIDITY.as_secs());
        c.spec.certificates.renew_before = format!("{}s", RENEW_BEFORE.as_secs());
    })
    .await;
    wait_settled(&clusters, name, TO, 3).await;
    let before = certificates(&client, &ns, name).await;
    assert!(
        before.leaves.contains_key(&format!("{name}-apiserver-tls")),
        "{before:?}"
    );
    assert!(
        before
            .kubeconfigs
            .contains_key(&format!("{name}-admin-kubeconfig")),
        "{before:?}"
    );
    let expiry_before = clusters
        .get(name)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.certificates_expire_at)
        .expect("certificate expiry in status")
        .0;
    let earliest = before
        .leaves
        .values()
        .chain(before.kubeconfigs.values())
        .map(|(_, at)| *at)
        .min()
        .expect("leaves");
    assert_eq!(
        expiry_before.as_second(),
        earliest.unix_timestamp(),
        "status names the earliest expiry"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.crt");
    std::fs::write(
        &ca,
        secret_value(&client, &ns, &format!("{name}-ca"), "tls.crt").await,
    )
    .expect("ca");
    let apiserver_tls = format!("{name}-apiserver-tls");
    for answer in served(&client, &ns, name, &ca).await {
        let (serial, _) = answer.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            serial, before.leaves[&apiserver_tls].0,
            "the API serves its Secret's certificate"
        );
    }
    let pods_before = control_plane_pods(&client, &ns, name).await;

    let business = business_client(&client, &ns, name).await;
    Api::<ConfigMap>::namespaced(business.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "before-rotation"}}))
                .expect("configmap"),
        )
        .await
        .expect("write through the business API");
    let poller = ServicePoller::start(client.clone(), &ns, name, "before-rotation");

    // Every leaf certificate and kubeconfig is issued again once the first
    // is due (renewBefore ahead of its expiry); the CAs stay.
    let due = earliest - RENEW_BEFORE;
    let late = Duration::from_secs(90);
    let t = Instant::now();
    let until_due = Duration::try_from(due - time::OffsetDateTime::now_utc()).unwrap_or_default();
    let after = wait_for(
        "every leaf certificate to be renewed",
        until_due + late,
        async || {
            let now = certificates(&client, &ns, name).await;
            let renewed = |old: &BTreeMap<String, Issued>, new: &BTreeMap<String, Issued>| {
                old.len() == new.len()
                    && old
                        .iter()
                        .all(|(k, (serial, _))| new.get(k).is_some_and(|n| &n.0 != serial))
            };
            (renewed(&before.leaves, &now.leaves) && renewed(&before.kubeconfigs, &now.kubeconfigs))
                .then_some(now)
        },
    )
    .await;
    let renewed_at = t.elapsed();
    println!(
        "{} leaf certificates and {} kubeconfigs renewed {renewed_at:?} after the cluster was ready",
        after.leaves.len(),
        after.kubeconfigs.len()
    );
    assert_eq!(after.cas, before.cas, "the authorities must stay");
    // When each was issued again: its new expiry less the validity.
    let reissued: Vec<_> = after
        .leaves
        .values()
        .chain(after.kubeconfigs.values())
        .map(|(_, at)| *at - VALIDITY)
        .collect();
    let first = *reissued.iter().min().expect("leaves");
    let last = *reissued.iter().max().expect("leaves");
    println!(
        "reissued from {}s to {}s after the first was due",
        (first - due).whole_seconds(),
        (last - due).whole_seconds()
    );
    // Certificate times are whole seconds: a second's slack.
    assert!(
        first >= due - Duration::from_secs(1),
        "renewed at {first}, before it was due at {due}"
    );
    assert!(last <= due + late, "renewed at {last}, due at {due}");
    for (k, (_, at)) in after.leaves.iter().chain(&after.kubeconfigs) {
        let old = before
            .leaves
            .get(k)
            .or_else(|| before.kubeconfigs.get(k))
            .expect("known");
        assert!(*at > old.1, "{k}: expiry {at} not after {}", old.1);
    }
    let events = event_notes(&client, &ns, name, "CertificatesRotated").await;
    assert!(!events.is_empty());

    // The components roll onto them: every control-plane Pod is replaced,
    // and every kube-apiserver serves a certificate of the new chain.
    let rolled = Instant::now();
    // What the wait last saw, printed when it changes (a timeout says why).
    let seen = std::sync::Mutex::new(String::new());
    let saw = |what: String| {
        let mut last = seen.lock().expect("lock");
        if *last != what {
            println!("{:?} after the renewal: {what}", rolled.elapsed());
            *last = what;
        }
    };
    wait_for(
        "every component to run on the renewed certificates",
        Duration::from_secs(600),
        async || {
            let now = control_plane_pods(&client, &ns, name).await;
            let replaced = now.len() == pods_before.len()
                && now
                    .iter()
                    .all(|(k, (u, _))| pods_before.get(k).is_none_or(|(old, _)| old != u));
            if !replaced {
                saw(format!("{} Pods, not all replaced", now.len()));
                return None;
            }
            let c = clusters.get(name).await.ok()?;
            if !(settled_at(&c, TO, 3)
                && condition(&c, "CertificatesReady").as_deref() == Some("True"))
            {
                saw(format!(
                    "not settled: Ready {:?}, Progressing {:?}",
                    condition(&c, "Ready"),
                    progressing(&c)
                ));
                return None;
            }
            let current = certificates(&client, &ns, name).await;
            let serving = &current.leaves.get(&apiserver_tls)?.0;
            let answers = served(&client, &ns, name, &ca).await;
            let done = answers.len() == 3
                && answers.iter().all(|a| {
                    a.as_ref()
                        .is_ok_and(|(s, _)| s == serving && s != &before.leaves[&apiserver_tls].0)
                });
            if !done {
                let shown: Vec<String> = answers
                    .iter()
                    .map(|a| match a {
                        Ok((s, _)) if s == serving => "current".to_string(),
                        Ok((s, _)) => format!("serial {s}"),
                        Err(e) => e.chars().take(200).collect(),
                    })
                    .collect();
                saw(format!("kube-apiservers serve {shown:?}"));
            }
            done.then_some(())
        },
    )
    .await;
    println!(
        "components rolled onto the renewed certificates {:?} after the renewal ({:?} in all)",
        rolled.elapsed(),
        t.elapsed()
    );
    let c = clusters.get(name).await.expect("cluster");
    let expiry_after = c
        .status
        .and_then(|s| s.certificates_expire_at)
        .expect("expiry")
        .0;
    assert!(
        expiry_after > expiry_before,
        "{expiry_after} not after {expiry_before}"
    );

    // A client built from the refreshed admin kubeconfig trusts the chain
    // the API serves now.
    let fresh = business_client(&client, &ns, name).await;
    Api::<ConfigMap>::namespaced(fresh, "default")
        .get("before-rotation")
        .await
        .expect("read with the new kubeconfig");

    let (polled, longest_outage) = poller.stop().await;
    assert_available(&polled, longest_outage);
    clusters
        .delete(name, &DeleteParams::background())
        .await
        .expect("delete cluster");
    stop_operator_pod(&client, &ns).await;
}
