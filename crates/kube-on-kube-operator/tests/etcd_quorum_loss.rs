//! A Production Cluster that lost its etcd quorum, rebuilt by the operator
//! (running as a Pod, its control plane as real processes) from its latest
//! snapshot in a real S3-compatible server (versitygw), across an operator
//! killed while it uploads and while it restores. Scheduled snapshots and
//! snapshots on a claim are in `etcd_backup`.

mod backup_pods;
use kok_test_support as common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::s3::{S3Options, S3Server};
use kok_testenv::wait::wait_for;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{BACKUP_REQUEST_ANNOTATION, ClusterMode};
use kube_on_kube_operator::backup::Manifest;
use serde_json::json;

use backup_pods::*;

/// A Production Cluster loses every etcd member's Pod and claim after a
/// snapshot: the operator says the quorum is lost and bootstraps no empty
/// etcd in its place; asked to (the annotation), it rebuilds all three
/// members from the snapshot, and the 1,000 objects written before are
/// there, read through a kubeconfig issued before the loss.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_that_lost_its_etcd_quorum_is_rebuilt_from_its_latest_snapshot() {
    use futures::StreamExt as _;
    let runner = runner();
    let s3 = S3Server::start(&S3Options {
        listen: runner.gateway(),
        ..Default::default()
    })
    .expect("versitygw");
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("quorum").await;
    grant_operator(&client, &ns).await;
    start_operator_pod_with(
        &client,
        &ns,
        &runner.nodes()[2],
        &[
            format!("--backup-endpoints={}", s3.endpoint()),
            "--operator-image=kube-on-kube-operator".into(),
            "--backup-min-interval=1s".into(),
        ],
    )
    .await;
    let key_text = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([7u8; 32])
    };
    storage_secrets(&client, &ns, &s3, &key_text).await;
    let name = "qc";
    let mut cluster = test_cluster(&ns, name, ClusterMode::Production);
    cluster.spec.etcd.backup = Some(
        serde_json::from_value(json!({
            "schedule": {"every": "24h"},
            "suspend": true,
            "s3": {
                "endpoint": s3.endpoint(),
                "bucket": s3.bucket(),
                "credentialsSecret": "s3-credentials",
                "caSecret": "s3-ca",
            },
            "encryptionKeySecret": "backup-key",
        }))
        .expect("backup"),
    );
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    wait_cluster(&clusters, name, "3 members and the API", READY, |c| {
        etcd_converged(c, 3) && condition(c, "APIServerReady").as_deref() == Some("True")
    })
    .await;

    // 1,000 objects, then a snapshot of them.
    let business = business_client(&client, &ns, name).await;
    let maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    let started = Instant::now();
    let failed = futures::stream::iter(0..1000)
        .map(|n| {
            let maps = maps.clone();
            async move {
                let map: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("object-{n}")},
                    "data": {"n": n.to_string()},
                }))
                .expect("configmap");
                maps.create(&PostParams::default(), &map).await.err()
            }
        })
        .buffer_unordered(16)
        .filter_map(|e| async move { e })
        .collect::<Vec<_>>()
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    println!("1,000 objects written in {:?}", started.elapsed());
    // Some bulk, so the snapshot's upload takes several parts.
    let bulk = "x".repeat(900 * 1024);
    for n in 0..24 {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("bulk-{n}")},
            "data": {"x": bulk},
        }))
        .expect("configmap");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("bulk");
    }

    // The operator killed while it uploads the snapshot asked for; started
    // again, it answers the request with one whole snapshot and leaves
    // nothing of the cut upload.
    let operator_args = [
        format!("--backup-endpoints={}", s3.endpoint()),
        "--operator-image=kube-on-kube-operator".into(),
        "--backup-min-interval=1s".into(),
    ];
    let prefix = format!("{ns}/{name}");
    let snapshots = store(&s3, &prefix);
    let before = stored(&snapshots).await;
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {BACKUP_REQUEST_ANNOTATION: "mid-snapshot"}}}),
            ),
        )
        .await
        .expect("ask for a snapshot");
    let uploads = s3.object_path(s3.bucket(), ".sgwtmp/multipart");
    // Looked for often: the upload lasts a fraction of a second. Should it
    // end unseen, the operator is killed after it instead, and the same
    // must hold.
    let deadline = Instant::now() + ANSWER;
    let mut polls = 0u32;
    let cut = loop {
        if files_under(&uploads) {
            break true;
        }
        polls += 1;
        if polls.is_multiple_of(50) {
            let c = clusters.get(name).await.expect("cluster");
            if backup_status(&c)["lastRequest"] == "mid-snapshot" {
                break false;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no upload seen in {}",
            uploads.display()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    kill_operator_pod(&client, &ns).await;
    if !cut {
        println!("the upload ended before it was seen: the operator was killed after it");
    }
    let right_after = stored(&snapshots).await;
    println!(
        "operator killed mid-upload; {} snapshot(s) stored before, {} right after",
        before.len(),
        right_after.len()
    );
    start_operator_pod_with(&client, &ns, &runner.nodes()[2], &operator_args).await;
    let c = wait_cluster(
        &clusters,
        name,
        "the request answered after the restart",
        ANSWER,
        |c| backup_status(c)["lastRequest"] == "mid-snapshot",
    )
    .await;
    assert_eq!(condition(&c, "BackupReady").as_deref(), Some("True"));
    let after = stored(&snapshots).await;
    let answering: Vec<&Manifest> = after
        .iter()
        .filter(|m| m.request.as_deref() == Some("mid-snapshot"))
        .collect();
    assert_eq!(
        answering.len(),
        1,
        "one snapshot for the request: {after:?}"
    );
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    let snapshot = answering[0].name.clone();
    assert_eq!(backup_status(&c)["lastSnapshot"]["name"], snapshot.as_str());
    // Every stored object belongs to a listed snapshot: no cut-short data.
    let on_disk: Vec<String> = std::fs::read_dir(s3.object_path(s3.bucket(), &prefix))
        .expect("prefix directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    for object in &on_disk {
        assert!(
            after
                .iter()
                .any(|m| object.starts_with(&format!("{}.", m.name))),
            "{object} belongs to no listed snapshot: {on_disk:?}"
        );
    }

    // Every member's claim and Pod.
    let lost_at = Instant::now();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..3 {
        let member = format!("{name}-etcd-{i}");
        claims
            .delete(&member, &Default::default())
            .await
            .expect("delete claim");
        pods.delete(&member, &Default::default())
            .await
            .expect("delete pod");
    }
    let c = wait_cluster(
        &clusters,
        name,
        "the quorum loss to be reported",
        ANSWER,
        |c| condition_of(c, "Restored").is_some_and(|(_, r, _)| r == "QuorumLost"),
    )
    .await;
    println!("{:?}", condition_of(&c, "Restored"));
    // Held: no member is started on an empty database.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let members = pods
        .list(&kube::api::ListParams::default().labels("kubeonkube.io/etcd-member"))
        .await
        .expect("pods");
    assert!(
        members
            .items
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "no member started while held: {:?}",
        members
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    let asked_at = Instant::now();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                kube_on_kube_api::cluster::RECOVER_ANNOTATION: "latest"
            }}})),
        )
        .await
        .expect("ask for the rebuild");
    // The operator killed mid-restore, and the first member's Pod with it
    // (its restore cut short): started again, the restore goes on.
    let first = format!("{name}-etcd-0");
    wait_for("the first member to start restoring", ANSWER, async || {
        let pod = pods.get_opt(&first).await.ok()??;
        pod.metadata.deletion_timestamp.is_none().then_some(())
    })
    .await;
    // No kube-apiserver runs while the data is being restored: one would
    // write to the restored member before the restore is recorded.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), &ns);
    wait_for("kube-apiserver held at zero replicas", ANSWER, async || {
        let d = deployments.get(&format!("{name}-apiserver")).await.ok()?;
        (d.spec?.replicas == Some(0)).then_some(())
    })
    .await;
    kill_operator_pod(&client, &ns).await;
    pods.delete(&first, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the restoring member");
    start_operator_pod_with(&client, &ns, &runner.nodes()[2], &operator_args).await;
    let c = wait_cluster(
        &clusters,
        name,
        "etcd rebuilt from the snapshot",
        READY,
        |c| {
            condition(c, "Restored").as_deref() == Some("True")
                && etcd_converged(c, 3)
                && condition(c, "APIServerReady").as_deref() == Some("True")
        },
    )
    .await;
    let restore = c.status.clone().expect("status").restore.expect("restore");
    println!(
        "rebuilt from {} {:?} after the loss, {:?} after it was asked for: {:?}",
        restore.snapshot,
        lost_at.elapsed(),
        asked_at.elapsed(),
        condition_of(&c, "Restored")
    );
    assert_eq!(restore.snapshot, snapshot);
    assert_eq!(restore.cause.as_deref(), Some("quorumLost"));
    assert!(
        !event_notes(&client, &ns, name, "QuorumLost")
            .await
            .is_empty(),
        "an Event says the quorum was lost"
    );
    // One member started on the snapshot; the others joined it as learners
    // on empty data and were promoted.
    let bootstrapped = event_notes(&client, &ns, name, "EtcdBootstrapped").await;
    assert!(
        bootstrapped.iter().any(|n| n.contains(&format!(
            "{first} as a new etcd cluster on snapshot {snapshot}"
        ))),
        "{bootstrapped:?}"
    );
    for i in 0..3 {
        let member = format!("{name}-etcd-{i}");
        let pod = pods.get(&member).await.expect("member pod");
        let restores = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == "restore-snapshot");
        assert_eq!(
            restores,
            i == 0,
            "{member} restores from the snapshot: {restores}"
        );
        if i > 0 {
            let added = event_notes(&client, &ns, name, "MemberAdded").await;
            assert!(
                added
                    .iter()
                    .any(|n| n.contains(&format!("added {member} as a learner"))),
                "{member}: {added:?}"
            );
            let promoted = event_notes(&client, &ns, name, "MemberPromoted").await;
            assert!(
                promoted
                    .iter()
                    .any(|n| n.contains(&format!("promoted {member} "))),
                "{member}: {promoted:?}"
            );
        }
    }
    // Through the kubeconfig issued before the loss, at a kube-apiserver
    // Pod made after the restore (none ran while it was under way): every
    // object, read until the API answers from the rebuilt etcd.
    let maps: Api<ConfigMap> =
        Api::namespaced(business_client(&client, &ns, name).await, "default");
    let mut seen = BTreeSet::new();
    let mut last_error = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match maps.list(&Default::default()).await {
            Err(e) => last_error = Some(e.to_string()),
            Ok(list) => {
                seen = list
                    .items
                    .iter()
                    .map(|m| m.name_any())
                    .filter(|n| n.starts_with("object-"))
                    .collect()
            }
        }
        if seen.len() == 1000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of 1,000 objects readable after the rebuild (last error: {last_error:?})",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
