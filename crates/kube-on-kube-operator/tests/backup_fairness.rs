//! One operator, as a Pod, serving the snapshots of two tenants' namespaces,
//! each Cluster's control plane real processes (etcd on claims):
//!
//! - **greedy**: four Clusters whose storage accepts connections and never
//!   answers (a snapshot attempt holds its slot until the storage deadline),
//!   and which ask for a snapshot again and again with the
//!   `kubeonkube.io/backup-requested` annotation;
//! - **patient**: one Cluster with a schedule of every 20 s into a real
//!   S3-compatible server (versitygw). Its snapshots keep their interval
//!   while the greedy namespace holds what it may (two of the four attempts
//!   at once). With no share per namespace, the greedy attempts held all
//!   four for minutes and the patient's schedule waited on them.
//!
//! In the patient namespace, a Cluster restoring the patient's first
//! snapshot with another key is refused, and its data object is not read
//! once while the test runs (its sealed identity is opened first, and the
//! refusal is retried with a backoff).

mod backup_pods;
use kok_test_support as common;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backup_pods::{backup_status, put_secret, runner, secret, storage_secrets};
use common::{condition_of, grant_operator, start_operator_pod_args, test_cluster, wait_cluster};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::s3::{S3Options, S3Server};
use kok_testenv::wait::wait_for;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{BACKUP_REQUEST_ANNOTATION, ClusterMode};
use serde_json::json;

const GREEDY: usize = 4;
/// The patient Cluster's schedule, and how late one of its snapshots may
/// come beyond it (a pass, the snapshot itself, a loaded machine).
const EVERY: Duration = Duration::from_secs(20);
const LATE: Duration = Duration::from_secs(15);
/// How long the patient's snapshots are watched once the greedy attempts
/// hold their slots.
const WATCH: Duration = Duration::from_secs(80);

/// A TCP listener that accepts every connection and never answers: a
/// storage as slow as it gets. Counts the connections it holds.
fn stalling_storage(ip: std::net::IpAddr) -> (String, Arc<Mutex<Vec<std::net::TcpStream>>>) {
    let listener = TcpListener::bind((ip, 0)).expect("bind");
    let endpoint = format!("https://{}", listener.local_addr().expect("addr"));
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            keep.lock().expect("held").push(stream);
        }
    });
    (endpoint, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_asking_again_and_again_cannot_delay_anothers_schedule() {
    let runner = runner();
    let s3 = S3Server::start(&S3Options {
        listen: runner.gateway(),
        ..Default::default()
    })
    .expect("versitygw");
    let (stalling, held) = stalling_storage(runner.gateway().into());
    let env = KubeEnv::shared();
    let client = env.client().await;
    let greedy = env.namespace("greedy").await;
    let patient = env.namespace("patient").await;
    grant_operator(&client, &patient).await;
    // One operator for both namespaces, as a shared operator runs.
    start_operator_pod_args(
        &client,
        &patient,
        &runner.nodes()[0],
        &[
            format!("--backup-endpoints={},{stalling}", s3.endpoint()),
            "--backup-min-interval=10s".into(),
        ],
    )
    .await;
    let key_text = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([7u8; 32])
    };
    let other_key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([8u8; 32])
    };
    for ns in [&greedy, &patient] {
        storage_secrets(&client, ns, &s3, &key_text).await;
    }
    put_secret(
        &client,
        &patient,
        &secret("other-key", &[("key", &other_key)]),
    )
    .await;
    let destination = |endpoint: &str| {
        json!({
            "endpoint": endpoint,
            "bucket": s3.bucket(),
            "credentialsSecret": "s3-credentials",
            "caSecret": "s3-ca",
        })
    };

    let greedy_clusters: Api<Cluster> = Api::namespaced(client.clone(), &greedy);
    for i in 0..GREEDY {
        let mut c = test_cluster(&greedy, &format!("g{i}"), ClusterMode::Minimal);
        // Due at once (the first snapshot of a schedule is), then asked for.
        c.spec.etcd.backup = Some(
            serde_json::from_value(json!({
                "schedule": {"every": "1h"},
                "s3": destination(&stalling),
                "encryptionKeySecret": "backup-key",
            }))
            .expect("backup"),
        );
        greedy_clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create greedy cluster");
    }
    let patient_clusters: Api<Cluster> = Api::namespaced(client.clone(), &patient);
    let mut p = test_cluster(&patient, "p", ClusterMode::Minimal);
    p.spec.etcd.backup = Some(
        serde_json::from_value(json!({
            "schedule": {"every": format!("{}s", EVERY.as_secs())},
            "retention": {"count": 20},
            "s3": destination(&s3.endpoint()),
            "encryptionKeySecret": "backup-key",
        }))
        .expect("backup"),
    );
    patient_clusters
        .create(&PostParams::default(), &p)
        .await
        .expect("create patient cluster");

    // The greedy namespace asks again and again, all the time.
    let asking = {
        let clusters = greedy_clusters.clone();
        tokio::spawn(async move {
            for round in 0u64.. {
                for i in 0..GREEDY {
                    let token = format!("again-{round}");
                    let _ = clusters
                        .patch(
                            &format!("g{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"annotations": {
                                BACKUP_REQUEST_ANNOTATION: token
                            }}})),
                        )
                        .await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    // Once two greedy attempts hold the stalling storage (all the greedy
    // namespace may hold), watch the patient's snapshots.
    let setup = Instant::now();
    wait_for(
        "two greedy attempts to hold their slots",
        Duration::from_secs(300),
        async || (held.lock().expect("held").len() >= 2).then_some(()),
    )
    .await;
    let first = wait_cluster(
        &patient_clusters,
        "p",
        "the patient's first snapshot",
        Duration::from_secs(300),
        |c| backup_status(c)["lastSnapshot"]["name"].is_string(),
    )
    .await;
    let first_name = backup_status(&first)["lastSnapshot"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    println!(
        "{:?}: greedy attempts holding the storage: {}; patient's first snapshot {first_name}",
        setup.elapsed(),
        held.lock().expect("held").len()
    );

    // Another key restoring the patient's first snapshot: refused, and its
    // data never read.
    let prefix = format!("{patient}/p");
    let data_reads = || {
        let key = format!("{prefix}/{first_name}.db ");
        std::fs::read_to_string(s3.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("s3_GetObject") && l.contains(&key))
            .count()
    };
    let identity_reads = || {
        let key = format!("{prefix}/{first_name}.pki ");
        std::fs::read_to_string(s3.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("s3_GetObject") && l.contains(&key))
            .count()
    };
    let reads_before = (data_reads(), identity_reads());
    let mut wrong = test_cluster(&patient, "wrong-key", ClusterMode::Minimal);
    let mut from = destination(&s3.endpoint());
    from["prefix"] = json!(prefix);
    wrong.spec.etcd.restore_from = Some(
        serde_json::from_value(json!({
            "s3": from,
            "snapshot": first_name,
            "encryptionKeySecret": "other-key",
        }))
        .expect("restoreFrom"),
    );
    patient_clusters
        .create(&PostParams::default(), &wrong)
        .await
        .expect("create the wrong-key restore");
    let wrong_since = Instant::now();

    // The patient's schedule keeps its interval.
    let watching = Instant::now();
    let mut taken: Vec<(String, k8s_openapi::jiff::Timestamp)> = Vec::new();
    while watching.elapsed() < WATCH {
        if let Ok(c) = patient_clusters.get("p").await
            && let Some(last) = c
                .status
                .as_ref()
                .and_then(|s| s.backup.as_ref())
                .and_then(|b| b.last_snapshot.clone())
            && taken.last().is_none_or(|(name, _)| *name != last.name)
        {
            println!("{:?}: patient snapshot {}", watching.elapsed(), last.name);
            taken.push((last.name, last.taken_at.0));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    asking.abort();
    let holding = held.lock().expect("held").len();
    println!("greedy connections to the stalling storage: {holding}");
    let gaps: Vec<Duration> = taken
        .windows(2)
        .map(|w| Duration::try_from(w[0].1.duration_until(w[1].1)).unwrap_or_default())
        .collect();
    println!(
        "patient's snapshots {:?}, gaps {gaps:?}",
        taken.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    let least = (WATCH.as_secs() / (EVERY + LATE).as_secs()) as usize;
    assert!(
        taken.len() > least,
        "{} snapshots of the patient's in {WATCH:?} (every {EVERY:?}): {gaps:?}",
        taken.len()
    );
    assert!(
        gaps.iter().all(|g| *g <= EVERY + LATE),
        "a patient snapshot came more than {LATE:?} late: {gaps:?}"
    );

    // The wrong key: refused, said, and the data not read.
    let c = wait_cluster(
        &patient_clusters,
        "wrong-key",
        "the wrong key's refusal",
        Duration::from_secs(60),
        |c| condition_of(c, "Restored").is_some_and(|(_, r, _)| r == "IdentityNotOpened"),
    )
    .await;
    let (_, _, message) = condition_of(&c, "Restored").expect("Restored");
    let (data, identity) = (data_reads(), identity_reads());
    println!(
        "wrong key for {:?}: {message}; identity read {} times, data {} times",
        wrong_since.elapsed(),
        identity - reads_before.1,
        data - reads_before.0
    );
    assert_eq!(
        data, reads_before.0,
        "the data of a snapshot whose identity does not open is read"
    );
    // Tried again after 30 s, then 60 s (doubling), whatever wakes the
    // Cluster meanwhile (its own condition written, say): in the ~80 s
    // watched, at most three reads of the identity, not one per wake-up.
    let tries = identity - reads_before.1;
    assert!(
        (1..=3).contains(&tries),
        "the identity read {tries} times in {:?}",
        wrong_since.elapsed()
    );
}
