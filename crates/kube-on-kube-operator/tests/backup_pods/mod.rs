//! A Cluster's etcd snapshots, the operator running as a Pod of a
//! meta-cluster whose Pods run as real processes, into a real S3-compatible
//! server (versitygw) or onto a claim: what `etcd_backup` and
//! `etcd_quorum_loss` share.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::Secret;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::s3::S3Server;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::BACKUP_REQUEST_ANNOTATION;
use kube_on_kube_operator::backup::{Manifest, SnapshotStore, StoreConfig};
use serde_json::{Value, json};

pub fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    // etcd's image holds etcdutl beside etcd: a restoring member runs it.
    // versitygw's image is the snapshot gateway on a claim.
    RUNNER.get_or_init(|| {
        let bins = kok_testenv::s3::bin_dir().expect("backup binaries");
        start_runner(vec![
            ("etcdutl".into(), bins.join("etcdutl")),
            ("versitygw".into(), bins.join("versitygw")),
        ])
    })
}

pub const READY: Duration = Duration::from_secs(300);
pub const ANSWER: Duration = Duration::from_secs(120);

/// `kubectl-kok`, built beside the operator by `cargo build --workspace
/// --bins` (scripts/test.sh builds it before the tests).
pub fn kubectl_kok() -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_kube-on-kube-operator"))
        .with_file_name("kubectl-kok");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// A kubeconfig file for the meta-cluster, for `kubectl-kok`.
pub fn meta_kubeconfig() -> PathBuf {
    KubeEnv::shared().kubeconfig_path().to_path_buf()
}

pub fn kok(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new(kubectl_kok())
        .arg("--kubeconfig")
        .arg(meta_kubeconfig())
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("run kubectl-kok")
}

pub fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data})).expect("secret")
}

pub async fn put_secret(client: &Client, ns: &str, secret: &Secret) {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            &secret.name_any(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(secret),
        )
        .await
        .expect("secret");
}

/// The Secrets a Cluster's backups name, in `ns`: `s3-credentials`,
/// `s3-ca` (of `s3`) and `backup-key` (holding `key`).
pub async fn storage_secrets(client: &Client, ns: &str, s3: &S3Server, key: &str) {
    for (name, data) in [
        (
            "s3-credentials",
            vec![
                ("accessKeyID", s3.access_key_id()),
                ("secretAccessKey", s3.secret_access_key()),
            ],
        ),
        ("s3-ca", vec![("ca.crt", s3.ca_pem().expect("tls"))]),
        ("backup-key", vec![("key", key)]),
    ] {
        put_secret(client, ns, &secret(name, &data)).await;
    }
}

/// What the test reads of the storage: the operator's own store code,
/// pointed at the same bucket and prefix.
pub fn store(s3: &S3Server, prefix: &str) -> SnapshotStore {
    let mut config = StoreConfig::new(
        s3.endpoint(),
        s3.bucket(),
        prefix,
        s3.access_key_id(),
        s3.secret_access_key(),
    );
    config.ca_pem = s3.ca_pem().map(str::to_owned);
    SnapshotStore::new(&config).expect("store")
}

pub async fn stored(store: &SnapshotStore) -> Vec<Manifest> {
    store.list().await.expect("list snapshots")
}

pub fn backup_status(c: &Cluster) -> Value {
    serde_json::to_value(c.status.as_ref().and_then(|s| s.backup.clone())).unwrap_or_default()
}

/// Ask for a snapshot with the annotation and wait for the operator's
/// answer; returns the Cluster as answered.
pub async fn ask(clusters: &Api<Cluster>, name: &str, token: &str) -> Cluster {
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {BACKUP_REQUEST_ANNOTATION: token}}})),
        )
        .await
        .expect("annotate");
    wait_cluster(
        clusters,
        name,
        &format!("the operator to answer request {token}"),
        ANSWER,
        |c| backup_status(c)["lastRequest"] == token,
    )
    .await
}

/// Whether any file lies under `dir` (its subdirectories included).
pub fn files_under(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let path = e.path();
            if path.is_dir() {
                files_under(&path)
            } else {
                true
            }
        })
}

/// Cluster `b` (namespace, name) has `a`'s identity: the same CAs and
/// service-account key, Secret by Secret.
pub async fn assert_same_identity(client: &Client, a: (&str, &str), b: (&str, &str)) {
    for role in kube_on_kube_operator::backup::pki::ROLES {
        let of = |(ns, cluster): (&str, &str)| {
            let api = Api::<Secret>::namespaced(client.clone(), ns);
            let name = format!("{cluster}-{role}");
            async move { api.get(&name).await.expect("identity secret").data }
        };
        assert_eq!(of(b).await, of(a).await, "{role}");
    }
}

pub async fn set_backup(clusters: &Api<Cluster>, name: &str, backup: Value) {
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"etcd": {"backup": backup}}})),
        )
        .await
        .expect("patch backup");
}
