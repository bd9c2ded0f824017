//! Bounded reads against the real API server: a tenant namespace full of
//! large Secrets labelled with its Cluster costs the operator's process a
//! bounded amount of memory (its peak RSS, read from /proc), the tenant's
//! Cluster is told `Allowed=False` with the flag, and Clusters in another
//! namespace still converge; add-on template ConfigMaps are read only for the
//! add-ons a Cluster uses, within the count and byte limits, and one larger
//! than the template limit is reported unread.

mod backup_pods;
use kok_test_support as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{OperatorProcess, condition_of, kwok_minimal_cluster, wait_cluster};
use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::s3::{S3Options, S3Server};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube_on_kube_api::{Cluster, ClusterStatus};
use kube_on_kube_operator::addons::{TemplatesError, templates};
use kube_on_kube_operator::bounded::Limits;
use kube_on_kube_operator::config::Config;
use kube_on_kube_operator::context::Context;
use kube_on_kube_operator::names::Names;
use serde_json::json;

const CONVERGE: Duration = Duration::from_secs(240);
/// What the tenant plants: this many Secrets of this many bytes each (75 MiB,
/// about 100 MiB as JSON).
const JUNK: usize = 300;
const JUNK_BYTES: usize = 256 << 10;
/// The most the operator's peak memory may grow while it reads them (it
/// holds `--max-listed-bytes`, 4 MiB here, plus one page of 32 of them;
/// reading them all would take more than twice their size).
const BOUND: u64 = 64 << 20;

/// `VmRSS` or `VmHWM` (peak) of process `pid`, in bytes.
fn memory(pid: u32, field: &str) -> u64 {
    kok_testenv::process_memory(pid, field)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn control_plane_ready(c: &Cluster) -> bool {
    c.status
        .as_ref()
        .is_some_and(ClusterStatus::control_plane_ready)
}

/// Bytes no two Secrets share, so nothing on the way can deduplicate them.
fn junk(seed: usize) -> Vec<u8> {
    let mut x = (seed as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..JUNK_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_full_of_large_labelled_secrets_costs_the_operator_a_bounded_amount() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let noisy = env.namespace("noisy").await;
    let quiet = env.namespace("quiet").await;
    // One operator for every namespace, as the chart runs it (this test
    // binary's environment holds only this test's Clusters).
    let mut operator = OperatorProcess::start("bounded-reads", &["--max-listed-bytes=4Mi".into()]);
    let noisy_api: Api<Cluster> = Api::namespaced(client.clone(), &noisy);
    let quiet_api: Api<Cluster> = Api::namespaced(client.clone(), &quiet);
    noisy_api
        .create(
            &PostParams::default(),
            &kwok_minimal_cluster(&noisy, "noisy"),
        )
        .await
        .expect("create");
    quiet_api
        .create(
            &PostParams::default(),
            &kwok_minimal_cluster(&quiet, "quiet"),
        )
        .await
        .expect("create");
    wait_cluster(
        &noisy_api,
        "noisy",
        "the noisy Cluster",
        CONVERGE,
        control_plane_ready,
    )
    .await;
    wait_cluster(
        &quiet_api,
        "quiet",
        "the quiet Cluster",
        CONVERGE,
        control_plane_ready,
    )
    .await;

    // From here on, the process's peak memory.
    let pid = operator.pid();
    let baseline = memory(pid, "VmRSS");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");

    // The tenant fills its namespace with large Secrets carrying its
    // Cluster's label, then touches the Cluster so it is looked at.
    let started = Instant::now();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &noisy);
    futures::stream::iter(0..JUNK)
        .map(|i| {
            let secrets = secrets.clone();
            async move {
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(format!("junk-{i:04}")),
                        labels: Some([("kubeonkube.io/cluster".into(), "noisy".into())].into()),
                        ..Default::default()
                    },
                    data: Some([("junk".to_string(), ByteString(junk(i)))].into()),
                    ..Default::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .expect("create junk");
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    println!(
        "{JUNK} Secrets of {} KiB created in {:?}",
        JUNK_BYTES >> 10,
        started.elapsed()
    );
    noisy_api
        .patch(
            "noisy",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"wake": "1"}}})),
        )
        .await
        .expect("annotate");
    // Meanwhile another tenant creates a Cluster.
    quiet_api
        .create(
            &PostParams::default(),
            &kwok_minimal_cluster(&quiet, "quiet-2"),
        )
        .await
        .expect("create");

    wait_cluster(
        &noisy_api,
        "noisy",
        "the noisy Cluster's refusal",
        CONVERGE,
        |c| {
            condition_of(c, "Allowed")
                .is_some_and(|(s, r, _)| s == "False" && r == "TooManyObjects")
        },
    )
    .await;
    let (_, _, message) =
        condition_of(&noisy_api.get("noisy").await.expect("get"), "Allowed").expect("condition");
    assert!(
        message.contains("Secrets labelled kubeonkube.io/cluster=noisy")
            && message.contains("--max-listed-bytes"),
        "{message}"
    );
    wait_cluster(
        &quiet_api,
        "quiet-2",
        "the other tenant's new Cluster",
        CONVERGE,
        control_plane_ready,
    )
    .await;
    let quiet_c = quiet_api.get("quiet").await.expect("get");
    assert_eq!(
        condition_of(&quiet_c, "Allowed").map(|(s, _, _)| s),
        Some("True".into())
    );
    // A few more passes of the noisy Cluster (each reads until it is over).
    for i in 2..5 {
        noisy_api
            .patch(
                "noisy",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"wake": i.to_string()}}})),
            )
            .await
            .expect("annotate");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    operator.assert_running();
    let peak = memory(pid, "VmHWM");
    let grown = peak.saturating_sub(baseline);
    println!(
        "operator RSS {} MiB before, peak {} MiB after: grew {} MiB with {} MiB of labelled Secrets",
        baseline >> 20,
        peak >> 20,
        grown >> 20,
        (JUNK * JUNK_BYTES) >> 20
    );
    assert!(
        grown < BOUND,
        "the operator's peak memory grew by {} MiB (bound {} MiB)",
        grown >> 20,
        BOUND >> 20
    );
}

/// How large the planted manifest is: a sparse file on the storage's disk,
/// so it costs no disk, but the storage serves every byte of it.
const HUGE_MANIFEST: u64 = 1 << 30;

/// A tenant's own bucket is the tenant's to fill: beside a 1-byte
/// `….db` it writes a 1 GiB `….manifest.json`, then asks to restore a
/// Cluster from it. The operator (one process for every namespace, as the
/// chart runs it) refuses the snapshot on its size without reading it: its
/// peak memory grows by far less than the object, the Cluster says why
/// (`Restored=False`, `BackupTooLarge`), and another namespace's new Cluster
/// converges meanwhile. Restarted (as after the out-of-memory kill reading
/// it whole used to cause), the operator meets the same object first, and
/// again refuses it unread and serves the other namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_huge_snapshot_manifest_is_refused_unread_and_others_converge() {
    use base64::Engine as _;
    let env = KubeEnv::shared();
    let client = env.client().await;
    let noisy = env.namespace("huge").await;
    let quiet = env.namespace("calm").await;
    let s3 = S3Server::start(&S3Options::default()).expect("versitygw");
    let flags = [format!("--backup-endpoints={}", s3.endpoint())];
    let mut operator = OperatorProcess::start("huge-manifest", &flags);
    let noisy_api: Api<Cluster> = Api::namespaced(client.clone(), &noisy);
    let quiet_api: Api<Cluster> = Api::namespaced(client.clone(), &quiet);
    let converged = async |name: &str| {
        quiet_api
            .create(&PostParams::default(), &kwok_minimal_cluster(&quiet, name))
            .await
            .expect("create");
        wait_cluster(
            &quiet_api,
            name,
            "the other tenant's Cluster",
            CONVERGE,
            control_plane_ready,
        )
        .await;
    };
    // The operator at work before anything is planted: its size then.
    converged("calm-0").await;
    let working = memory(operator.pid(), "VmRSS");

    // The tenant's storage Secrets, and its snapshot: a 1-byte data object
    // and a manifest far over any manifest's size.
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    backup_pods::storage_secrets(&client, &noisy, &s3, &key).await;
    let prefix = format!("{noisy}/old");
    let snapshot = "20260101T000000Z-r7";
    let object =
        |suffix: &str| s3.object_path(s3.bucket(), &format!("{prefix}/{snapshot}{suffix}"));
    std::fs::create_dir_all(object(".db").parent().expect("parent")).expect("prefix");
    std::fs::write(object(".db"), b"x").expect("data object");
    std::fs::File::create(object(".manifest.json"))
        .and_then(|f| f.set_len(HUGE_MANIFEST))
        .expect("a sparse manifest");
    let restoring = |name: &str| {
        let mut c = kwok_minimal_cluster(&noisy, name);
        c.spec.etcd.restore_from = Some(
            serde_json::from_value(json!({
                "snapshot": "latest",
                "s3": {
                    "endpoint": s3.endpoint(),
                    "bucket": s3.bucket(),
                    "prefix": prefix,
                    "credentialsSecret": "s3-credentials",
                    "caSecret": "s3-ca",
                },
                "encryptionKeySecret": "backup-key",
            }))
            .expect("restoreFrom"),
        );
        c
    };

    for round in 1..=2 {
        let pid = operator.pid();
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
        // A Cluster restoring from the snapshot (in the second round, the
        // first one's is there too: the new process's first pass reads it).
        let name = format!("restoring-{round}");
        noisy_api
            .create(&PostParams::default(), &restoring(&name))
            .await
            .expect("create");
        converged(&format!("calm-{round}")).await;
        let c = wait_cluster(&noisy_api, &name, "the restore's refusal", CONVERGE, |c| {
            condition_of(c, "Restored")
                .is_some_and(|(s, r, _)| s == "False" && r == "BackupTooLarge")
        })
        .await;
        let (_, _, message) = condition_of(&c, "Restored").expect("condition");
        assert!(
            message.contains("manifest") && message.contains(snapshot),
            "{message}"
        );
        operator.assert_running();
        let peak = memory(pid, "VmHWM");
        println!(
            "round {round}: operator RSS {} MiB at work before, peak {} MiB with a {} MiB manifest to read",
            working >> 20,
            peak >> 20,
            HUGE_MANIFEST >> 20
        );
        assert!(
            peak.saturating_sub(working) < BOUND,
            "the operator's peak memory is {} MiB, {} MiB at work before (bound: {} MiB more)",
            peak >> 20,
            working >> 20,
            BOUND >> 20
        );
        // As after a crash: a new process meets the same object first.
        drop(operator);
        operator = OperatorProcess::start(&format!("huge-manifest-{round}"), &flags);
    }
}

/// A template ConfigMap `name` registering `addon` at `version` with `bytes`
/// of padding.
fn template(name: &str, addon: &str, version: &str, bytes: usize) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubeonkube.io/addon-template": addon}},
        "data": {
            "version": version,
            "template.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  namespace: default\n",
            "padding": "x".repeat(bytes),
        }
    }))
    .expect("template")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_on_templates_are_read_only_for_used_add_ons_and_within_the_limits() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("templates").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let create = async |cm: ConfigMap| {
        maps.create(&PostParams::default(), &cm)
            .await
            .expect("create template");
    };
    create(template("demo-1", "demo", "1.0.0", 100)).await;
    for i in 0..6 {
        create(template(
            &format!("demo-big-{i}"),
            "demo",
            "2.0.0",
            200 << 10,
        ))
        .await;
    }
    // Templates of an add-on no Cluster here uses: far over every limit.
    for i in 0..40 {
        create(template(
            &format!("unused-{i}"),
            "unused",
            "1.0.0",
            200 << 10,
        ))
        .await;
    }
    let limits = Limits {
        max_objects: 20,
        max_bytes: 1 << 20,
        max_template_bytes: 64 << 10,
        page: 4,
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        Recorder::new(
            client.clone(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        ),
        Config {
            limits,
            ..Config::default()
        },
    ));
    let mut cluster = kwok_minimal_cluster(&ns, "c");
    cluster.spec.addons =
        serde_json::from_value(json!([{"name": "demo", "version": "1.0.0"}])).expect("addons");
    let names = Names::new(&cluster, "cluster.local");

    // The unused ones are not read (they alone would exceed both limits),
    // the large ones are dropped unread and do not count as bytes.
    let (found, broken) = templates(&ctx, &cluster, &names)
        .await
        .unwrap_or_else(|e| panic!("within the limits: {e:?}"));
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|t| (t.name.as_str(), t.version.as_str()))
        .collect();
    assert_eq!(found, [("demo", "1.0.0")]);
    let mut unread: Vec<&str> = broken.iter().map(|b| b.source.as_str()).collect();
    unread.sort();
    let expected: Vec<String> = (0..6)
        .map(|i| format!("ConfigMap {ns}/demo-big-{i}"))
        .collect();
    assert_eq!(unread, expected);
    for b in &broken {
        assert!(
            b.reason.contains("--max-addon-template-bytes") && b.reason.contains("65536"),
            "{}",
            b.reason
        );
    }

    // More templates of a used add-on than a list may return: refused whole.
    for i in 0..15 {
        create(template(
            &format!("demo-more-{i}"),
            "demo",
            &format!("1.1.{i}"),
            100,
        ))
        .await;
    }
    match templates(&ctx, &cluster, &names).await {
        Err(TemplatesError::Exceeded(e)) => {
            let text = e.to_string();
            assert!(
                text.contains(&format!("namespace {ns}")) && text.contains("--max-listed-objects"),
                "{text}"
            );
        }
        other => panic!("expected the list to be refused, got {other:?}"),
    }
}
