//! Secrets at rest in a business cluster whose control plane runs as real
//! processes (kube-apiserver, etcd) under the Pod runner: a rotation of the
//! operator's key writes every Secret again under the new one, and a KMS v2
//! plugin (this repository's, on k8s.io/kms) encrypts them instead. Apart
//! from `real_cluster` so that neither binary runs past its share of the
//! test budget.

use kok_test_support as common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    delete_and_stop_operator, grant_operator, minimal_inside, node_operator_binary, ready_cluster,
    start_operator_pod,
};
use k8s_openapi::api::core::v1::Secret;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_on_kube_api::Cluster;
use serde_json::Value;

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        common::start_runner(vec![
            ("node-operator".to_string(), node_operator_binary()),
            // The KMS v2 plugin a Cluster may run beside kube-apiserver.
            (
                "kms-plugin".to_string(),
                kok_testenv::bins::bin("kms-plugin").expect("kms-plugin"),
            ),
        ])
    })
}

/// One control plane at a time on this machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What etcd stores under `/registry/secrets/`: (key, value) of each.
fn stored_secrets(etcd: &common::Etcdctl, endpoints: &[String]) -> Vec<(String, Vec<u8>)> {
    use base64::Engine;
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("base64 from etcdctl")
    };
    let text = etcd
        .run(
            endpoints,
            &["get", "/registry/secrets/", "--prefix", "-w", "json"],
        )
        .expect("etcdctl get");
    let answer: Value = serde_json::from_str(&text).expect("etcdctl json");
    answer["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    let key = String::from_utf8_lossy(&b64(&kv["key"])).into_owned();
                    (key, b64(&kv["value"]))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes Secret `default/marker` holding `marker` through the business
/// API of Cluster `name`.
async fn write_marker(client: &kube::Client, ns: &str, name: &str, marker: &str) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "marker"},
        "stringData": {"value": marker},
    }))
    .expect("Secret");
    let business = common::business_client(client, ns, name).await;
    Api::<Secret>::namespaced(business, "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("marker Secret");
}

/// Secret `default/marker` reads back through the business API with
/// `marker` in it.
async fn assert_marker_reads(client: &kube::Client, ns: &str, name: &str, marker: &str) {
    let business = common::business_client(client, ns, name).await;
    let read = Api::<Secret>::namespaced(business, "default")
        .get("marker")
        .await
        .expect("read the marker");
    let value = read
        .data
        .and_then(|d| d.get("value").cloned())
        .expect("marker value");
    assert_eq!(value.0, marker.as_bytes());
}

/// Every Secret etcd holds starts with `prefix` (what encrypted it) and
/// none holds `marker` in clear.
fn assert_all_under(stored: &[(String, Vec<u8>)], prefix: &str, marker: &str) {
    assert!(
        stored.iter().any(|(k, _)| k.ends_with("/default/marker")),
        "the marker is stored"
    );
    for (key, value) in stored {
        assert!(
            value.starts_with(prefix.as_bytes()),
            "{key} is not under {prefix}: {:?}",
            String::from_utf8_lossy(&value[..value.len().min(40)])
        );
        assert!(
            !value.windows(marker.len()).any(|w| w == marker.as_bytes()),
            "{key} holds the marker in clear"
        );
    }
}

/// Naming the recorded encryption key in `kubeonkube.io/rotate-encryption-key`
/// rotates it on a real kube-apiserver and etcd: afterwards every Secret
/// etcd holds is encrypted under the new key (`key2`), none holds the
/// marker in clear, the old key is gone from kube-apiserver's
/// configuration, the new one is recorded, and the business API still
/// reads the marker (it was written again, not lost). It fails without a
/// rotation (the Secrets stay under `key1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_writes_every_secret_again_under_a_new_key() {
    const MARKER: &str = "kok-rotation-marker-7c1f";
    let _one = ONE_AT_A_TIME.lock().await;
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("key-rotation").await;
    grant_operator(&client, &ns).await;
    start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
    let cluster = minimal_inside(&ns);
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    let ready = ready_cluster(&clusters, &name, None).await;
    let recorded = |c: &Cluster| {
        c.status
            .as_ref()
            .and_then(|s| s.certificate_authorities.as_ref())
            .and_then(|a| a.encryption.clone())
    };
    let old = recorded(&ready).expect("the encryption key is recorded");
    write_marker(&client, &ns, &name, MARKER).await;
    let etcd = common::Etcdctl::new(&client, &ns, &name).await;
    let endpoints = common::member_endpoints(&client, &ns, &name).await;
    let before = stored_secrets(&etcd, &endpoints);
    assert!(
        before
            .iter()
            .any(|(key, value)| key.ends_with("/default/marker")
                && value.starts_with(b"k8s:enc:secretbox:v1:key1:")),
        "the marker is stored under key1: {:?}",
        before.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );

    let started = Instant::now();
    clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"kubeonkube.io/rotate-encryption-key": old}}
            })),
        )
        .await
        .expect("annotate");
    let mut phases: Vec<String> = Vec::new();
    let rotated = wait_for(
        "the rotation to finish",
        Duration::from_secs(240),
        async || {
            let c = clusters.get(&name).await.ok()?;
            let status = c.status.as_ref()?;
            if let Some(p) = status
                .encryption_key_rotation
                .as_ref()
                .map(|r| r.phase.clone())
                && phases.last() != Some(&p)
            {
                println!("{:?}: {p}", started.elapsed());
                phases.push(p);
            }
            let new = recorded(&c)?;
            (new != old && status.encryption_key_rotation.is_none()).then_some(new)
        },
    )
    .await;
    println!(
        "key rotation took {:?}, phases seen {phases:?}",
        started.elapsed()
    );
    for reason in [
        "EncryptionKeyRotationStarted",
        "EncryptionKeySwitched",
        "SecretsRewritten",
        "EncryptionKeyRotated",
    ] {
        let notes = common::event_notes(&client, &ns, &name, reason).await;
        assert!(!notes.is_empty(), "no {reason} Event");
        println!("{reason}: {notes:?}");
    }

    // etcd holds every Secret under the new key, none in clear.
    let endpoints = common::member_endpoints(&client, &ns, &name).await;
    let after = stored_secrets(&etcd, &endpoints);
    assert!(
        after.len() >= before.len(),
        "{} of {} Secrets",
        after.len(),
        before.len()
    );
    assert_all_under(&after, "k8s:enc:secretbox:v1:key2:", MARKER);
    // kube-apiserver's configuration names the new key alone, the one
    // recorded.
    let config = String::from_utf8(
        common::secret_value(
            &client,
            &ns,
            &format!("{name}-encryption"),
            "encryption-config.yaml",
        )
        .await,
    )
    .expect("configuration");
    assert!(
        config.contains("name: key2") && !config.contains("name: key1"),
        "{config}"
    );
    let key = String::from_utf8(
        common::secret_value(&client, &ns, &format!("{name}-encryption"), "key").await,
    )
    .expect("key");
    assert!(
        config.contains(&key),
        "the recorded key {rotated} is the configured one"
    );
    // The marker reads back through the business API.
    assert_marker_reads(&client, &ns, &name, MARKER).await;

    delete_and_stop_operator(&client, &ns, &name).await;
}

/// A Cluster with a KMS v2 plugin (`spec.apiServer.kms`, this
/// repository's plugin on k8s.io/kms, run by the real kube-apiserver over
/// its socket): every Secret etcd holds is stored under the plugin
/// (`k8s:enc:kms:v2:<name>:`), none in clear, and reads back through it;
/// the API server refuses removing the plugin (what it encrypted is read
/// only through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kms_plugin_encrypts_the_clusters_secrets() {
    const MARKER: &str = "kok-kms-marker-31d2";
    let _one = ONE_AT_A_TIME.lock().await;
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kms").await;
    grant_operator(&client, &ns).await;
    common::start_operator_pod_with(
        &client,
        &ns,
        &runner.nodes()[0],
        &["--allowed-image-prefixes=kms-plugin".into()],
    )
    .await;
    let key_b64 = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode([9u8; 32])
    };
    let key: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kms-key"},
        "data": {"key": key_b64},
    }))
    .expect("Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &key)
        .await
        .expect("the plugin's key");
    let mut cluster = minimal_inside(&ns);
    cluster.spec.api_server.kms = Some(
        serde_json::from_value(serde_json::json!({
            "name": "testkms",
            "image": "kms-plugin:v1",
            "args": ["--listen=$(KMS_SOCKET)", "--key-file=/etc/kms/key"],
            "configSecret": "kms-key",
        }))
        .expect("kms"),
    );
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    ready_cluster(&clusters, &name, None).await;
    write_marker(&client, &ns, &name, MARKER).await;
    let etcd = common::Etcdctl::new(&client, &ns, &name).await;
    let endpoints = common::member_endpoints(&client, &ns, &name).await;
    assert_all_under(
        &stored_secrets(&etcd, &endpoints),
        "k8s:enc:kms:v2:testkms:",
        MARKER,
    );
    assert_marker_reads(&client, &ns, &name, MARKER).await;
    // The plugin stays: removing it is refused by the API server.
    let refused = clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"apiServer": {"kms": null}}})),
        )
        .await
        .expect_err("removing the plugin");
    assert!(
        refused
            .to_string()
            .contains("apiServer.kms cannot be removed"),
        "{refused}"
    );

    delete_and_stop_operator(&client, &ns, &name).await;
}
