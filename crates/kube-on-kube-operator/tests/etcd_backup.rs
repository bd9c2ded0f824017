//! Scheduled etcd snapshots carried out by the operator, running as a Pod,
//! of a Cluster whose control plane runs as real processes, into a real
//! S3-compatible server (versitygw) the operator's Pod reaches over the Pod
//! network:
//!
//! - snapshots on an interval while the business API serves reads and
//!   writes (none may fail), retention keeping exactly its count, what is
//!   listed in status being what is in storage, each a whole etcd database;
//! - `kubectl kok cluster backup` and `snapshots` against it;
//! - beside each snapshot the Cluster's CAs and service-account key, sealed
//!   with the user's key: they open with it, and with no other;
//! - each bad setting (an endpoint the operator does not allow, one that
//!   does not answer, wrong credentials, a missing Secret, a CA that does
//!   not sign the server, a missing or short encryption key) gives its
//!   `BackupReady` reason and an Event, and leaves every stored snapshot as
//!   it was;
//! - the API server refuses a schedule with both or neither of `every` and
//!   `cron`;
//! - the latest snapshot restored into a new Cluster in another namespace:
//!   every object there, the same CA, and a kubeconfig of the first Cluster
//!   admitted by the second;
//! - restores that cannot be refused with their reasons, nothing made: a
//!   damaged snapshot, a newer Kubernetes minor, a missing snapshot, another
//!   key (its data not even read), and a snapshot whose data and manifest
//!   were swapped for another snapshot's (its sealed identity vouches for
//!   other data);
//! - snapshots on a PersistentVolumeClaim, through the snapshot gateway the
//!   operator runs on it: a missing claim and an etcd member's claim
//!   refused with their reasons, retention on the claim's files, a Cluster
//!   that lost its only member rebuilt from the claim, and a new Cluster
//!   started from it.
//!
//! A Cluster that lost its etcd quorum, rebuilt from S3, is in
//! `etcd_quorum_loss`.

mod backup_pods;
use kok_test_support as common;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::s3::{S3Options, S3Server};
use kok_testenv::wait::wait_for;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ClusterMode;
use serde_json::{Value, json};

use backup_pods::*;

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_follow_the_schedule_and_retention_restore_into_a_new_cluster_and_bad_input_says_why()
 {
    let runner = runner();
    let s3 = S3Server::start(&S3Options {
        listen: runner.gateway(),
        ..Default::default()
    })
    .expect("versitygw");
    // An allowed endpoint nothing listens on.
    let closed = {
        let listener = TcpListener::bind((runner.gateway(), 0)).expect("port");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        format!("https://{}:{port}", runner.gateway())
    };
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("backup").await;
    grant_operator(&client, &ns).await;
    start_operator_pod_with(
        &client,
        &ns,
        &runner.nodes()[0],
        &[
            format!("--backup-endpoints={},{closed}", s3.endpoint()),
            "--backup-min-interval=1s".into(),
        ],
    )
    .await;
    // The key the Cluster's identity is sealed with: 32 bytes as base64.
    let key_text = {
        use base64::Engine as _;
        let bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    storage_secrets(&client, &ns, &s3, &key_text).await;
    put_secret(&client, &ns, &secret("short-key", &[("key", "c2hvcnQ=")])).await;

    // The API server refuses a schedule that is not exactly one kind.
    let name = "bk";
    let mut cluster = test_cluster(&ns, name, ClusterMode::Minimal);
    let destination = json!({
        "endpoint": s3.endpoint(),
        "bucket": s3.bucket(),
        "credentialsSecret": "s3-credentials",
        "caSecret": "s3-ca",
    });
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    for schedule in [json!({}), json!({"every": "1h", "cron": "0 * * * *"})] {
        cluster.spec.etcd.backup = Some(
            serde_json::from_value(
                json!({"schedule": schedule, "s3": destination, "encryptionKeySecret": "backup-key"}),
            )
            .expect("backup"),
        );
        let refused = clusters
            .create(&PostParams::default(), &cluster)
            .await
            .expect_err("a schedule with both or neither of every and cron");
        assert!(
            refused
                .to_string()
                .contains("exactly one of etcd.backup.schedule"),
            "{refused}"
        );
    }

    // Every 3 s (the operator's minimum is lowered to 1 s), keep 2.
    cluster.spec.etcd.backup = Some(
        serde_json::from_value(json!({
            "schedule": {"every": "3s"},
            "retention": {"count": 2},
            "s3": destination,
            "encryptionKeySecret": "backup-key",
        }))
        .expect("backup"),
    );
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    let started = Instant::now();
    wait_cluster(&clusters, name, "the API server to serve", READY, |c| {
        condition(c, "APIServerReady").as_deref() == Some("True")
    })
    .await;
    println!("{name}: API ready after {:?}", started.elapsed());
    let business = business_client(&client, &ns, name).await;
    let maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    let probe: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "probe"}})).expect("configmap");
    maps.create(&PostParams::default(), &probe)
        .await
        .expect("probe");
    let poller = Poller::start(business.clone(), "default", "probe");

    // Writes throughout, while snapshots are taken: every one must succeed.
    let mut names = BTreeSet::new();
    let mut written = 0u32;
    let watching = Instant::now();
    while names.len() < 4 {
        assert!(
            watching.elapsed() < Duration::from_secs(180),
            "4 snapshots not taken in 180 s; saw {names:?}; status {}",
            backup_status(&clusters.get(name).await.expect("cluster"))
        );
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("object-{written}")},
            "data": {"n": written.to_string()},
        }))
        .expect("configmap");
        maps.create(&PostParams::default(), &map)
            .await
            .unwrap_or_else(|e| panic!("write {written} while snapshots run: {e}"));
        written += 1;
        let c = clusters.get(name).await.expect("cluster");
        if let Some(last) = backup_status(&c)["lastSnapshot"]["name"].as_str() {
            names.insert(last.to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let polled = poller.stop().await;
    println!(
        "{} snapshots in {:?}, {written} objects written, reads {polled:?}",
        names.len(),
        watching.elapsed()
    );
    assert_eq!(polled.failed, 0, "{polled:?}");
    assert!(polled.ok > 10, "{polled:?}");

    // Suspended: the count holds still for the checks below.
    set_backup(&clusters, name, json!({"suspend": true})).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let prefix = format!("{ns}/{name}");
    let store = store(&s3, &prefix);
    let kept = stored(&store).await;
    let c = clusters.get(name).await.expect("cluster");
    let status = c.status.clone().expect("status").backup.expect("backup");
    assert_eq!(kept.len(), 2, "retention keeps 2: {kept:?}");
    let listed: Vec<&str> = status.snapshots.iter().map(|s| s.name.as_str()).collect();
    let in_store: Vec<&str> = kept.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(listed, in_store, "status lists what is stored");
    let last = status.last_snapshot.clone().expect("last snapshot");
    assert_eq!(last.name, kept[0].name);
    assert_eq!(last.size, kept[0].size);
    assert_eq!(
        last.kubernetes_version.as_deref(),
        Some(c.spec.version.as_str())
    );
    assert_eq!(condition(&c, "BackupReady").as_deref(), Some("True"));
    assert!(
        status.next_due.is_none(),
        "suspended: nothing due: {status:?}"
    );
    assert!(
        !event_notes(&client, &ns, name, "SnapshotTaken")
            .await
            .is_empty(),
        "an Event per snapshot"
    );
    // Each a whole database: etcdutl reads it, at the revision recorded.
    let dir = tempfile::tempdir().expect("tempdir");
    for m in &kept {
        let file = dir.path().join(format!("{}.db", m.name));
        store.download(m, &file).await.expect("download");
        let out = Command::new(kok_testenv::s3::etcdutl().expect("etcdutl"))
            .args(["snapshot", "status", "-w", "json"])
            .arg(&file)
            .output()
            .expect("etcdutl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status: Value = serde_json::from_slice(&out.stdout).expect("etcdutl json");
        assert!(
            status["revision"].as_u64().unwrap_or(0) >= m.etcd_revision,
            "{status} {m:?}"
        );
    }

    // Beside each, the Cluster's identity, sealed: it opens with the key
    // and holds the CAs and service-account key the Cluster runs with.
    let key = kube_on_kube_operator::backup::pki::Key::from_secret_value(key_text.as_bytes())
        .expect("key");
    for m in &kept {
        let sealed = store.pki(m).await.expect("the sealed identity");
        assert_eq!(m.pki.as_ref().map(|p| p.key_id.clone()), Some(key.id()));
        let bundle = kube_on_kube_operator::backup::pki::open(&sealed, &key, &m.name)
            .expect("opens with the key");
        for role in kube_on_kube_operator::backup::pki::ROLES {
            let live = Api::<Secret>::namespaced(client.clone(), &ns)
                .get(&format!("{name}-{role}"))
                .await
                .expect("identity secret")
                .data
                .expect("data");
            assert_eq!(bundle.secrets[role], live, "{role}");
        }
        // With the key its Secrets are encrypted at rest with.
        let live = Api::<Secret>::namespaced(client.clone(), &ns)
            .get(&format!("{name}-encryption"))
            .await
            .expect("encryption secret")
            .data
            .expect("data");
        assert_eq!(bundle.secrets.get("encryption"), Some(&live));
        // And it names the data it was stored with.
        assert_eq!(
            bundle.data,
            Some(kube_on_kube_operator::backup::pki::Data {
                sha256: m.sha256.clone(),
                size: m.size,
                revision: m.etcd_revision,
            }),
            "{}",
            m.name
        );
        let other =
            kube_on_kube_operator::backup::pki::Key::from_secret_value(&[9u8; 32]).expect("key");
        assert!(kube_on_kube_operator::backup::pki::open(&sealed, &other, &m.name).is_err());
    }

    // kubectl kok: one snapshot now, whatever the schedule; then the list.
    let out = kok(&ns, &["cluster", "backup", name, "--timeout", "2m"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("stored after"), "{said}");
    let after = stored(&store).await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(
        after[1].name, kept[0].name,
        "the oldest went, the newest stayed"
    );
    let out = kok(&ns, &["cluster", "snapshots", name]);
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{table}");
    for m in &after {
        assert!(table.contains(&m.name), "{table}");
    }

    // Bad settings: each its reason and an Event; nothing stored changes.
    let good = destination.clone();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "not allowed",
            json!({"endpoint": "https://192.0.2.10:9000"}),
            "EndpointNotAllowed",
        ),
        (
            "not answering",
            json!({"endpoint": closed}),
            "BackupUnreachable",
        ),
        (
            "missing credentials",
            json!({"credentialsSecret": "no-such-secret"}),
            "CredentialsMissing",
        ),
        (
            "wrong credentials",
            json!({"credentialsSecret": "s3-wrong"}),
            "BackupDenied",
        ),
        (
            "untrusted",
            json!({"caSecret": "other-ca"}),
            "BackupUntrusted",
        ),
        (
            "missing key",
            json!({"encryptionKeySecret": "no-such-key"}),
            "EncryptionKeyMissing",
        ),
        (
            "short key",
            json!({"encryptionKeySecret": "short-key"}),
            "EncryptionKeyInvalid",
        ),
    ];
    put_secret(
        &client,
        &ns,
        &secret(
            "s3-wrong",
            &[
                ("accessKeyID", s3.access_key_id()),
                ("secretAccessKey", "not-the-secret"),
            ],
        ),
    )
    .await;
    let other = S3Server::start(&S3Options::default()).expect("a second server, for its CA");
    put_secret(
        &client,
        &ns,
        &secret("other-ca", &[("ca.crt", other.ca_pem().expect("tls"))]),
    )
    .await;
    for (i, (what, change, reason)) in cases.iter().enumerate() {
        let mut backup = json!({"s3": good.clone(), "encryptionKeySecret": "backup-key"});
        for (k, v) in change.as_object().expect("object") {
            if k == "encryptionKeySecret" {
                backup[k] = v.clone();
            } else {
                backup["s3"][k] = v.clone();
            }
        }
        set_backup(&clusters, name, backup).await;
        let c = ask(&clusters, name, &format!("bad-{i}")).await;
        let (status, got, message) = condition_of(&c, "BackupReady").expect("BackupReady");
        println!("{what}: {got}: {message}");
        assert_eq!(
            (status.as_str(), got.as_str()),
            ("False", *reason),
            "{what}: {message}"
        );
        assert!(
            !event_notes(&client, &ns, name, reason).await.is_empty(),
            "{what}: an Event {reason}"
        );
        assert_eq!(
            stored(&store).await,
            after,
            "{what}: nothing stored changed"
        );
        assert_eq!(
            backup_status(&c)["lastSnapshot"]["name"],
            after[0].name.as_str(),
            "{what}"
        );
    }
    // The CLI says so too, with exit status 1.
    let out = kok(&ns, &["cluster", "backup", name, "--timeout", "2m"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("EncryptionKeyInvalid"),
        "{out:?}"
    );

    // Settings fixed: the next request is stored.
    set_backup(
        &clusters,
        name,
        json!({"s3": good, "encryptionKeySecret": "backup-key"}),
    )
    .await;
    let c = ask(&clusters, name, "fixed").await;
    assert_eq!(condition(&c, "BackupReady").as_deref(), Some("True"));
    let now = stored(&store).await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert_eq!(now[1].name, after[0].name);
    assert_eq!(backup_status(&c)["consecutiveFailures"], Value::Null);

    // Restore: the latest snapshot, taken after one more write, into a new
    // Cluster in another namespace.
    let marker: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "before-restore"}})).expect("marker");
    maps.create(&PostParams::default(), &marker)
        .await
        .expect("marker");
    // And a Secret, which etcd (and so the snapshot) holds only encrypted.
    let secret_value = "kok-marker-0f3c9a7e5d1b";
    let business_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "marker"},
        "stringData": {"value": secret_value},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(business.clone(), "default")
        .create(&PostParams::default(), &business_secret)
        .await
        .expect("marker secret");
    let c = ask(&clusters, name, "for-restore").await;
    assert_eq!(condition(&c, "BackupReady").as_deref(), Some("True"));
    let source = backup_status(&c)["lastSnapshot"]["name"]
        .as_str()
        .expect("snapshot")
        .to_string();
    let stored_db = std::fs::read(s3.object_path(s3.bucket(), &format!("{prefix}/{source}.db")))
        .expect("the stored snapshot");
    let has = |needle: &[u8]| stored_db.windows(needle.len()).any(|w| w == needle);
    assert!(
        has(b"/registry/secrets/default/marker"),
        "the Secret is in the snapshot"
    );
    assert!(
        has(b"k8s:enc:secretbox:v1:key1:"),
        "Secrets are stored encrypted"
    );
    assert!(
        !has(secret_value.as_bytes()),
        "the Secret's value is not in the snapshot in clear"
    );
    let ns2 = env.namespace("restore").await;
    grant_operator(&client, &ns2).await;
    start_operator_pod_with(
        &client,
        &ns2,
        &runner.nodes()[1],
        &[
            format!("--backup-endpoints={}", s3.endpoint()),
            "--operator-image=kube-on-kube-operator".into(),
        ],
    )
    .await;
    storage_secrets(&client, &ns2, &s3, &key_text).await;
    // Three members, each restored from the snapshot with the bootstrap's
    // initial cluster (etcd's procedure for a cluster).
    let mut restored = test_cluster(&ns2, "rs", ClusterMode::Production);
    let mut from = good.clone();
    from["prefix"] = json!(prefix);
    restored.spec.etcd.restore_from = Some(
        serde_json::from_value(json!({
            "s3": from,
            "snapshot": "latest",
            "encryptionKeySecret": "backup-key",
        }))
        .expect("restoreFrom"),
    );
    let clusters2: Api<Cluster> = Api::namespaced(client.clone(), &ns2);
    let started = Instant::now();
    clusters2
        .create(&PostParams::default(), &restored)
        .await
        .expect("create the restored cluster");
    let rs = wait_cluster(
        &clusters2,
        "rs",
        "the restored cluster to serve",
        READY,
        |c| {
            condition(c, "APIServerReady").as_deref() == Some("True")
                && condition(c, "Restored").as_deref() == Some("True")
                && etcd_converged(c, 3)
        },
    )
    .await;
    println!(
        "restored from {source} and serving after {:?}: {:?}",
        started.elapsed(),
        condition_of(&rs, "Restored")
    );
    assert!(etcd_converged(&rs, 3), "{:?}", reported_members(&rs));
    // The data was recorded as restored before kube-apiserver, the first
    // to write to it, was made: a member Pod made again afterwards keeps
    // what was written instead of restoring the snapshot over it.
    let restored_at = rs
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Restored"))
        .map(|c| c.last_transition_time.0)
        .expect("Restored");
    let apiserver_made =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &ns2)
            .get("rs-apiserver")
            .await
            .expect("kube-apiserver")
            .metadata
            .creation_timestamp
            .expect("created")
            .0;
    assert!(
        restored_at <= apiserver_made,
        "Restored at {restored_at}, kube-apiserver made at {apiserver_made}"
    );
    let restore = rs.status.clone().expect("status").restore.expect("restore");
    assert_eq!(restore.snapshot, source, "latest is the one just taken");
    // Same identity: the CAs and service-account key are the first
    // Cluster's.
    assert_same_identity(&client, (&ns, name), (&ns2, "rs")).await;
    // Same data: every object written before the snapshot.
    let business2 = business_client(&client, &ns2, "rs").await;
    let maps2: Api<ConfigMap> = Api::namespaced(business2.clone(), "default");
    let listed: BTreeSet<String> = maps2
        .list(&Default::default())
        .await
        .expect("list restored objects")
        .items
        .iter()
        .map(|m| m.name_any())
        .collect();
    for n in 0..written {
        assert!(
            listed.contains(&format!("object-{n}")),
            "object-{n} restored"
        );
    }
    assert!(listed.contains("before-restore"), "{listed:?}");
    // The Secret reads back: the restored Cluster has the key it was
    // encrypted with.
    let restored_secret = Api::<Secret>::namespaced(business2, "default")
        .get("marker")
        .await
        .expect("the marker Secret restored");
    assert_eq!(
        restored_secret.data.expect("data")["value"].0,
        secret_value.as_bytes()
    );
    // A kubeconfig issued by the first Cluster works against the second.
    let rs_apiserver = ready_pods(&client, &ns2, "rs", "apiserver")
        .await
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("a ready apiserver pod");
    let mut config = admin_config(&client, &ns, name).await;
    config.cluster_url = format!("https://{rs_apiserver}:6443").parse().expect("url");
    let via_old = Client::try_from(config).expect("client");
    Api::<ConfigMap>::namespaced(via_old, "default")
        .get("before-restore")
        .await
        .expect("the first Cluster's admin kubeconfig is admitted by the restored one");

    // A snapshot damaged in storage: one byte of its data flipped.
    let c = ask(&clusters, name, "to-damage").await;
    let damaged = backup_status(&c)["lastSnapshot"]["name"]
        .as_str()
        .expect("snapshot")
        .to_string();
    let file = s3.object_path(s3.bucket(), &format!("{prefix}/{damaged}.db"));
    let mut bytes = std::fs::read(&file).expect("the stored object");
    bytes[100] ^= 0xff;
    std::fs::write(&file, &bytes).expect("damage it");

    // A snapshot whose data was swapped for another snapshot's, the
    // manifest's size and sha256 made to match: data and manifest agree,
    // but the sealed identity vouches for other data.
    // (Retention keeps more now: the source must stay beside the damaged
    // snapshot and this one.)
    set_backup(&clusters, name, json!({"retention": {"count": 5}})).await;
    let c = ask(&clusters, name, "to-swap").await;
    let swapped = backup_status(&c)["lastSnapshot"]["name"]
        .as_str()
        .expect("snapshot")
        .to_string();
    let object = |snapshot: &str, suffix: &str| {
        s3.object_path(s3.bucket(), &format!("{prefix}/{snapshot}{suffix}"))
    };
    std::fs::copy(object(&source, ".db"), object(&swapped, ".db")).expect("swap the data");
    let read_manifest = |snapshot: &str| -> Value {
        serde_json::from_slice(&std::fs::read(object(snapshot, ".manifest.json")).expect("read"))
            .expect("manifest")
    };
    let mut forged = read_manifest(&swapped);
    let theirs = read_manifest(&source);
    forged["size"] = theirs["size"].clone();
    forged["sha256"] = theirs["sha256"].clone();
    std::fs::write(
        object(&swapped, ".manifest.json"),
        serde_json::to_vec_pretty(&forged).expect("json"),
    )
    .expect("forge the manifest");
    // Reads of the source's data from here on: a restore refused for its
    // key reads none (its identity is opened before the data is read).
    let data_reads = |snapshot: &str| {
        let key = format!("{prefix}/{snapshot}.db ");
        std::fs::read_to_string(s3.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("s3_GetObject") && l.contains(&key))
            .count()
    };

    // Restores that cannot be: each its reason, and nothing of the Cluster
    // made (no member that would start on an empty database, no CA).
    let refused: Vec<(&str, Value, &str)> = vec![
        (
            "a damaged snapshot",
            json!({"snapshot": damaged, "key": "backup-key"}),
            "BackupCorrupt",
        ),
        (
            "a newer Kubernetes minor",
            json!({"version": "1.34.0", "snapshot": source, "key": "backup-key"}),
            "SnapshotTooNew",
        ),
        (
            "no such snapshot",
            json!({"snapshot": "20200101T000000Z-r1", "key": "backup-key"}),
            "SnapshotNotFound",
        ),
        (
            "another key",
            json!({"snapshot": source, "key": "other-key"}),
            "IdentityNotOpened",
        ),
        (
            "another snapshot's data",
            json!({"snapshot": swapped, "key": "backup-key"}),
            "SnapshotDataMismatch",
        ),
    ];
    let other_key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([3u8; 32])
    };
    put_secret(&client, &ns2, &secret("other-key", &[("key", &other_key)])).await;
    for (i, (what, case, reason)) in refused.iter().enumerate() {
        let reads_before = data_reads(&source);
        let cluster_name = format!("refused-{i}");
        let mut c = test_cluster(&ns2, &cluster_name, ClusterMode::Minimal);
        if let Some(version) = case["version"].as_str() {
            c.spec.version = version.into();
        }
        c.spec.etcd.restore_from = Some(
            serde_json::from_value(json!({
                "s3": from,
                "snapshot": case["snapshot"],
                "encryptionKeySecret": case["key"],
            }))
            .expect("restoreFrom"),
        );
        clusters2
            .create(&PostParams::default(), &c)
            .await
            .expect("create");
        let c = wait_cluster(&clusters2, &cluster_name, what, ANSWER, |c| {
            condition_of(c, "Restored").is_some_and(|(_, r, _)| r != "NoSnapshotYet")
        })
        .await;
        let (status, got, message) = condition_of(&c, "Restored").expect("Restored");
        println!("restore of {what}: {got}: {message}");
        assert_eq!(
            (status.as_str(), got.as_str()),
            ("False", *reason),
            "{what}"
        );
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns2)
            .list(&kube::api::ListParams::default().labels(&format!(
                "{}={cluster_name}",
                kube_on_kube_api::shared::CLUSTER_LABEL
            )))
            .await
            .expect("pods");
        assert!(pods.items.is_empty(), "{what}: no member started");
        let ca = Api::<Secret>::namespaced(client.clone(), &ns2)
            .get_opt(&format!("{cluster_name}-ca"))
            .await
            .expect("secret");
        assert!(ca.is_none(), "{what}: no CA made");
        if *reason == "IdentityNotOpened" {
            assert_eq!(
                data_reads(&source),
                reads_before,
                "{what}: the snapshot's data is not read"
            );
        }
        assert!(
            !event_notes(&client, &ns2, &cluster_name, reason)
                .await
                .is_empty(),
            "{what}: an Event"
        );
    }
}

/// The files on a claim: the directory of its PersistentVolume (the test
/// environment's provisioner backs each with a directory on the machine).
async fn claim_dir(client: &Client, ns: &str, claim: &str) -> PathBuf {
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), ns);
    let volume = wait_for("the claim to be bound", ANSWER, async || {
        claims.get(claim).await.ok()?.spec?.volume_name
    })
    .await;
    let pv = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .expect("volume");
    PathBuf::from(pv.spec.and_then(|s| s.host_path).expect("hostPath").path)
}

/// Snapshots of a Minimal Cluster on a claim of its namespace, through the
/// gateway the operator runs on it: bad claims refused with their reasons
/// (and no gateway Pod on them), retention on the claim's own files (each a
/// whole etcd database, as `etcdutl` reads it), the Cluster rebuilt from the
/// claim after its only member lost its data, and a second Cluster started
/// from the claim with the first one's identity and objects; once it is
/// restored, its gateway goes.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_on_a_claim_go_through_the_gateway_rebuild_the_cluster_and_start_another() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("claim").await;
    grant_operator(&client, &ns).await;
    start_operator_pod_with(
        &client,
        &ns,
        &runner.nodes()[2],
        &[
            "--operator-image=kube-on-kube-operator".into(),
            // Requests one after the other (the default answers one per
            // five minutes).
            "--backup-min-interval=1s".into(),
        ],
    )
    .await;
    let key_text = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([9u8; 32])
    };
    put_secret(&client, &ns, &secret("backup-key", &[("key", &key_text)])).await;
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "snapshots"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .expect("claim");
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    let name = "pc";
    let backup = |claim: &str| {
        json!({
            "schedule": {"every": "24h"},
            "suspend": true,
            "autoRecover": true,
            "retention": {"count": 2},
            "pvc": {"claimName": claim},
            "encryptionKeySecret": "backup-key",
        })
    };
    let mut cluster = test_cluster(&ns, name, ClusterMode::Minimal);
    cluster.spec.etcd.backup = Some(serde_json::from_value(backup("nowhere")).expect("backup"));
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    // The API server refuses both destinations at once.
    let mut both = test_cluster(&ns, "both", ClusterMode::Minimal);
    let mut two = backup("snapshots");
    two["s3"] = json!({"endpoint": "https://s3.example", "bucket": "b", "credentialsSecret": "c"});
    both.spec.etcd.backup = Some(serde_json::from_value(two).expect("backup"));
    let refused = clusters
        .create(&PostParams::default(), &both)
        .await
        .expect_err("s3 and pvc together are refused");
    assert!(
        refused
            .to_string()
            .contains("exactly one of etcd.backup.s3 or etcd.backup.pvc"),
        "{refused}"
    );
    wait_cluster(&clusters, name, "etcd and the API", READY, |c| {
        etcd_converged(c, 1) && condition(c, "APIServerReady").as_deref() == Some("True")
    })
    .await;
    let gateway = format!("{name}-snapshots");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns);

    // Bad claims: said why, and nothing runs on them.
    for (claim, token, reason) in [
        ("nowhere", "missing", "ClaimMissing"),
        (&*format!("{name}-etcd-0"), "member", "ClaimNotAllowed"),
    ] {
        set_backup(&clusters, name, backup(claim)).await;
        let c = ask(&clusters, name, token).await;
        let (status, got, message) = condition_of(&c, "BackupReady").expect("BackupReady");
        println!("claim {claim}: {got}: {message}");
        assert_eq!(
            (status.as_str(), got.as_str()),
            ("False", reason),
            "{claim}"
        );
        assert!(
            !event_notes(&client, &ns, name, reason).await.is_empty(),
            "{claim}: an Event"
        );
        assert!(
            deployments.get_opt(&gateway).await.expect("read").is_none(),
            "{claim}: no gateway on it"
        );
    }

    // 200 objects, then three snapshots on the claim: two kept.
    let business = business_client(&client, &ns, name).await;
    let maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    for n in 0..200 {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("object-{n}")},
            "data": {"n": n.to_string()},
        }))
        .expect("configmap");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("write");
    }
    set_backup(&clusters, name, backup("snapshots")).await;
    let started = Instant::now();
    let mut taken = Vec::new();
    for token in ["c1", "c2", "c3"] {
        let c = ask(&clusters, name, token).await;
        let (status, reason, message) = condition_of(&c, "BackupReady").expect("BackupReady");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "SnapshotTaken"),
            "{message}"
        );
        taken.push(
            backup_status(&c)["lastSnapshot"]["name"]
                .as_str()
                .expect("name")
                .to_string(),
        );
        if token == "c1" {
            println!(
                "first snapshot on the claim {:?} after asking (gateway started)",
                started.elapsed()
            );
        }
    }
    let c = clusters.get(name).await.expect("cluster");
    let listed: Vec<String> = backup_status(&c)["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| s["name"].as_str().expect("name").to_string())
        .collect();
    assert_eq!(
        listed,
        [taken[2].clone(), taken[1].clone()],
        "newest two kept"
    );
    let dir = claim_dir(&client, &ns, "snapshots")
        .await
        .join(&ns)
        .join(name);
    let mut on_claim: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_claim.sort();
    let mut expected: Vec<String> = listed
        .iter()
        .flat_map(|n| {
            [
                format!("{n}.db"),
                format!("{n}.manifest.json"),
                format!("{n}.pki"),
            ]
        })
        .collect();
    expected.sort();
    assert_eq!(
        on_claim, expected,
        "the claim holds exactly the kept snapshots"
    );
    let status = Command::new(kok_testenv::s3::etcdutl().expect("etcdutl"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(dir.join(format!("{}.db", taken[2])))
        .output()
        .expect("etcdutl");
    assert!(
        status.status.success(),
        "etcdutl reads the snapshot: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let gateway_pods = ready_pods(&client, &ns, name, "snapshots").await;
    assert_eq!(gateway_pods.len(), 1, "one gateway Pod");

    // The only member loses its data: rebuilt from the claim at once
    // (autoRecover), every object back.
    let lost_at = Instant::now();
    let member = format!("{name}-etcd-0");
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .delete(&member, &Default::default())
        .await
        .expect("delete claim");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
        .delete(&member, &Default::default())
        .await
        .expect("delete pod");
    let c = wait_cluster(&clusters, name, "etcd rebuilt from the claim", READY, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.restore.as_ref())
            .is_some_and(|r| r.cause.as_deref() == Some("quorumLost"))
            && condition(c, "Restored").as_deref() == Some("True")
            && etcd_converged(c, 1)
            && condition(c, "APIServerReady").as_deref() == Some("True")
    })
    .await;
    let restore = c.status.clone().expect("status").restore.expect("restore");
    assert_eq!(restore.snapshot, taken[2]);
    println!(
        "rebuilt from the claim's {} in {:?}",
        restore.snapshot,
        lost_at.elapsed()
    );
    let count = async |maps: &Api<ConfigMap>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = maps
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|m| m.name_any().starts_with("object-"))
                        .count()
                })
                .unwrap_or(0);
            if seen == 200 || Instant::now() > deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    // Through a kube-apiserver made after the rebuild: none ran while the
    // data was being restored.
    let maps: Api<ConfigMap> =
        Api::namespaced(business_client(&client, &ns, name).await, "default");
    assert_eq!(count(&maps).await, 200, "every object after the rebuild");

    // A new Cluster started from the claim: the first one's identity and
    // objects; its gateway goes once it is restored.
    let mut second = test_cluster(&ns, "pc2", ClusterMode::Minimal);
    second.spec.etcd.restore_from = Some(
        serde_json::from_value(json!({
            "pvc": {"claimName": "snapshots", "prefix": format!("{ns}/{name}")},
            "snapshot": "latest",
            "encryptionKeySecret": "backup-key",
        }))
        .expect("restoreFrom"),
    );
    let started = Instant::now();
    clusters
        .create(&PostParams::default(), &second)
        .await
        .expect("create the second cluster");
    let c2 = wait_cluster(
        &clusters,
        "pc2",
        "the second cluster to serve",
        READY,
        |c| {
            condition(c, "Restored").as_deref() == Some("True")
                && condition(c, "APIServerReady").as_deref() == Some("True")
        },
    )
    .await;
    println!(
        "second cluster restored from the claim and serving after {:?}: {:?}",
        started.elapsed(),
        condition_of(&c2, "Restored")
    );
    let restore = c2.status.clone().expect("status").restore.expect("restore");
    assert_eq!(restore.snapshot, taken[2], "latest on the claim");
    assert_same_identity(&client, (&ns, name), (&ns, "pc2")).await;
    let maps2: Api<ConfigMap> =
        Api::namespaced(business_client(&client, &ns, "pc2").await, "default");
    assert_eq!(
        count(&maps2).await,
        200,
        "every object in the second cluster"
    );
    wait_for("the second cluster's gateway to go", ANSWER, async || {
        deployments
            .get_opt("pc2-snapshots")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // The first Cluster's gateway is still there, and its snapshots too.
    assert!(deployments.get_opt(&gateway).await.expect("read").is_some());
    assert!(dir.join(format!("{}.db", taken[2])).exists());
}
