//! etcd snapshots, restores and quorum-loss rebuilds of a Production Cluster
//! holding N objects, for real: the operator runs as a Pod of a real
//! meta-cluster, every control-plane Pod runs as real processes, snapshots
//! go to a real S3-compatible server (versitygw) over TLS.
//!
//! Per N: the time to write the objects through the business API, the
//! database's size, a snapshot asked for with the annotation (request →
//! stored in S3, checked), `etcdctl snapshot save` of the same member to a
//! local file as the floor (what etcd itself takes to give the snapshot),
//! a restore into a new Production Cluster (apply → every object readable
//! through its API), and an in-place rebuild after every member's Pod and
//! claim is deleted (delete → every object readable through the API that
//! kept running).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kok_testenv::pods::RUNNER_LABEL;
use kok_testenv::s3::{S3Options, S3Server};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{BACKUP_REQUEST_ANNOTATION, RECOVER_ANNOTATION};
use serde_json::{Value, json};

use crate::controlplane::{control_plane_runner, meta_cluster};

/// Flags of `kok-bench backup`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Objects (ConfigMaps of `--object-bytes` each) in the business
    /// cluster, one Cluster per count.
    #[arg(long, value_delimiter = ',', default_values_t = [1000usize, 10000, 100000])]
    pub objects: Vec<usize>,
    /// Bytes of data in each object.
    #[arg(long, default_value_t = 1024)]
    pub object_bytes: usize,
    /// Writes in flight while the objects are written.
    #[arg(long, default_value_t = 32)]
    pub writers: usize,
    /// Give up on one step after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Where snapshots go: `s3` (versitygw on the machine, over TLS) or
    /// `pvc` (a claim in the Clusters' namespace, through the snapshot
    /// gateway the operator runs on it).
    #[arg(long, value_enum, default_value_t = Destination::S3)]
    pub destination: Destination,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Where a benchmark's snapshots go.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    S3,
    Pvc,
}

#[derive(Debug)]
struct Sample {
    objects: usize,
    write_s: f64,
    db_bytes: u64,
    snapshot_s: f64,
    etcdctl_s: f64,
    restore_s: f64,
    rebuild_s: f64,
    /// From the loss to every member a voter again.
    voters_s: f64,
    /// etcd revisions between the snapshot and the loss: the writes lost.
    revisions_lost: u64,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    let env = meta_cluster()?;
    // etcd's image holds etcdutl beside etcd: a restoring member runs it.
    // versitygw's image is the snapshot gateway on a claim.
    let bins = kok_testenv::s3::bin_dir()?;
    let programs = [
        ("etcdutl".to_string(), bins.join("etcdutl")),
        ("versitygw".to_string(), bins.join("versitygw")),
    ];
    let runner = control_plane_runner(env, programs.into_iter().collect())?;
    let s3 = S3Server::start(&S3Options {
        listen: runner.gateway(),
        ..Default::default()
    })?;
    let client = env.client().await;
    let ns = env.namespace("bench-backup").await;
    crate::controlplane::start_operator_with(
        &client,
        &ns,
        "info",
        &[
            format!("--backup-endpoints={}", s3.endpoint()),
            "--operator-image=kube-on-kube-operator".into(),
        ],
    )
    .await?;
    let key = base64_key();
    for (name, data) in [
        (
            "s3-credentials",
            json!({"accessKeyID": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()}),
        ),
        ("s3-ca", json!({"ca.crt": s3.ca_pem().unwrap_or_default()})),
        ("backup-key", json!({"key": key})),
    ] {
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data}))?;
        Api::<Secret>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await?;
    }
    let mut samples = Vec::new();
    for &objects in &args.objects {
        let sample = one(&client, &ns, &s3, &args, objects).await?;
        eprintln!("{sample:?}");
        samples.push(sample);
    }
    let table = table(&args, &samples);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

fn base64_key() -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(73) ^ 0x3c).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Where the snapshots of Cluster `name` go, as `spec.etcd.backup` names
/// it (`s3` or `pvc`).
fn destination(args: &Args, s3: &S3Server, name: &str) -> (&'static str, Value) {
    match args.destination {
        Destination::S3 => (
            "s3",
            json!({
                "endpoint": s3.endpoint(),
                "bucket": s3.bucket(),
                "credentialsSecret": "s3-credentials",
                "caSecret": "s3-ca",
            }),
        ),
        Destination::Pvc => (
            "pvc",
            json!({"claimName": format!("{name}-snapshots-claim")}),
        ),
    }
}

fn cluster(
    ns: &str,
    name: &str,
    (kind, destination): (&str, Value),
    restore_from: Option<Value>,
) -> Result<Cluster> {
    let mut c: Cluster =
        serde_norway::from_str(include_str!("../../examples/cluster-production.yaml"))?;
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.spec.placement = Some(kube_on_kube_api::cluster::Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    // Only what the benchmark needs: no add-on waits for a template.
    c.spec.addons.clear();
    c.spec.etcd.storage = serde_json::from_value(json!({"claimTemplate": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "4Gi"}}
    }}))?;
    c.spec.etcd.backup = Some(serde_json::from_value(json!({
        "schedule": {"every": "24h"},
        "suspend": true,
        kind: destination,
        "encryptionKeySecret": "backup-key",
    }))?);
    if let Some(from) = restore_from {
        c.spec.etcd.restore_from = Some(serde_json::from_value(from)?);
    }
    Ok(c)
}

async fn wait(
    clusters: &Api<Cluster>,
    name: &str,
    what: &str,
    timeout: u64,
    done: impl Fn(&Cluster) -> bool,
) -> Result<Cluster> {
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        if let Some(c) = clusters.get_opt(name).await?
            && done(&c)
        {
            return Ok(c);
        }
        if Instant::now() > deadline {
            bail!("{name}: {what} not reached in {timeout}s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn condition(c: &Cluster, type_: &str) -> Option<String> {
    let c = c.status.as_ref()?.condition(type_)?;
    Some(c.status.clone())
}

/// The admin client of Cluster `name`'s business API, through one of its
/// ready kube-apiserver Pods.
async fn business(client: &Client, ns: &str, name: &str) -> Result<Client> {
    let timeouts = (Duration::from_secs(10), Duration::from_secs(60));
    crate::controlplane::business_client(client, ns, name, timeouts).await
}

/// How many `object-*` ConfigMaps the business API lists, page by page.
async fn count(business: &Client) -> Result<(usize, bool)> {
    let maps: Api<ConfigMap> = Api::namespaced(business.clone(), "default");
    let mut n = 0;
    let mut marker = false;
    let mut params = ListParams::default().limit(5000);
    loop {
        let page = maps.list_metadata(&params).await?;
        for name in page.items.iter().filter_map(|m| m.metadata.name.as_deref()) {
            n += usize::from(name.starts_with("object-"));
            marker |= name == AFTER_SNAPSHOT;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok((n, marker)),
        }
    }
}

/// Written after the snapshot: a Cluster that serves it does not serve the
/// snapshot's data (the lost etcd still answering, in the rebuild).
const AFTER_SNAPSHOT: &str = "written-after-the-snapshot";

/// Wait until all `objects` are readable through Cluster `name`'s API, and
/// [`AFTER_SNAPSHOT`] is not.
async fn readable(
    client: &Client,
    ns: &str,
    name: &str,
    objects: usize,
    timeout: u64,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        let last = match business(client, ns, name).await {
            Ok(b) => match count(&b).await {
                Ok((n, false)) if n == objects => return Ok(()),
                Ok((n, marker)) => format!("{n} of {objects}, {AFTER_SNAPSHOT} there: {marker}"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!("{name}: objects not readable in {timeout}s: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn one(
    client: &Client,
    ns: &str,
    s3: &S3Server,
    args: &Args,
    objects: usize,
) -> Result<Sample> {
    let name = format!("b{objects}");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    if args.destination == Destination::Pvc {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-snapshots-claim")},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
        }))?;
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &claim)
            .await?;
    }
    clusters
        .create(
            &PostParams::default(),
            &cluster(ns, &name, destination(args, s3, &name), None)?,
        )
        .await?;
    // The API and etcd: the add-ons (the example's metrics-server has no
    // template here) do not matter to what is measured.
    wait(&clusters, &name, "the API and etcd", args.timeout, |c| {
        condition(c, "APIServerReady").as_deref() == Some("True")
            && condition(c, "EtcdReady").as_deref() == Some("True")
    })
    .await?;
    let b = business(client, ns, &name).await?;
    let maps: Api<ConfigMap> = Api::namespaced(b.clone(), "default");
    let payload = "x".repeat(args.object_bytes);
    let started = Instant::now();
    let failures = futures::stream::iter(0..objects)
        .map(|n| {
            let maps = maps.clone();
            let payload = payload.clone();
            async move {
                let map: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("object-{n}")},
                    "data": {"payload": payload},
                }))
                .expect("configmap");
                maps.create(&PostParams::default(), &map).await.err()
            }
        })
        .buffer_unordered(args.writers)
        .filter_map(|e| async move { e })
        .collect::<Vec<_>>()
        .await;
    if let Some(e) = failures.first() {
        bail!("{} writes failed, the first: {e}", failures.len());
    }
    let write_s = started.elapsed().as_secs_f64();

    // A snapshot now: request → stored.
    let started = Instant::now();
    clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {BACKUP_REQUEST_ANNOTATION: "bench"}}}),
            ),
        )
        .await?;
    let c = wait(&clusters, &name, "the snapshot", args.timeout, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.backup.as_ref())
            .is_some_and(|b| b.last_request.as_deref() == Some("bench"))
    })
    .await?;
    let snapshot_s = started.elapsed().as_secs_f64();
    if condition(&c, "BackupReady").as_deref() != Some("True") {
        bail!(
            "{name}: the snapshot failed: {:?}",
            c.status.and_then(|s| s.condition("BackupReady").cloned())
        );
    }
    let last = c
        .status
        .as_ref()
        .and_then(|s| s.backup.as_ref())
        .and_then(|b| b.last_snapshot.clone())
        .context("no snapshot recorded")?;

    let etcdctl_s = etcdctl_snapshot(client, ns, &name).await?;
    let marker: ConfigMap = serde_json::from_value(json!({"metadata": {"name": AFTER_SNAPSHOT}}))?;
    maps.create(&PostParams::default(), &marker).await?;

    // Restore into a new Cluster.
    let restored = format!("{name}-r");
    // From where the first one's snapshots are; its own go there too.
    let (kind, mut source) = destination(args, s3, &name);
    source["prefix"] = json!(format!("{ns}/{name}"));
    let from = json!({
        kind: source,
        "snapshot": last.name,
        "encryptionKeySecret": "backup-key",
    });
    let started = Instant::now();
    clusters
        .create(
            &PostParams::default(),
            &cluster(ns, &restored, destination(args, s3, &name), Some(from))?,
        )
        .await?;
    readable(client, ns, &restored, objects, args.timeout).await?;
    let restore_s = started.elapsed().as_secs_f64();

    let lost_at = k8s_openapi::jiff::Timestamp::now();
    // Lose every member of the first, then rebuild it. The revision it had
    // then, against the snapshot's, is what the rebuild loses.
    let at_loss: u64 = maps
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .context("no resourceVersion")?
        .parse()?;
    let started = Instant::now();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {RECOVER_ANNOTATION: last.name}}})),
        )
        .await?;
    for i in 0..3 {
        let member = format!("{name}-etcd-{i}");
        claims.delete(&member, &Default::default()).await?;
        pods.delete(&member, &Default::default()).await?;
    }
    // Serving again (from the rebuilt etcd), and every member back as a
    // voter, each measured from the loss.
    let serving = async {
        readable(client, ns, &name, objects, args.timeout).await?;
        anyhow::Ok(started.elapsed().as_secs_f64())
    };
    let voters = async {
        wait(&clusters, &name, "the rebuild", args.timeout, |c| {
            c.status
                .as_ref()
                .and_then(|s| s.restore.as_ref())
                .is_some_and(|r| r.data_restored && r.cause.as_deref() == Some("quorumLost"))
        })
        .await?;
        anyhow::Ok(started.elapsed().as_secs_f64())
    };
    let (rebuild_s, voters_s) = futures::try_join!(serving, voters)?;
    timeline(client, ns, &name, lost_at).await?;

    for c in [&name, &restored] {
        clusters.delete(c, &Default::default()).await?;
    }
    Ok(Sample {
        objects,
        write_s,
        db_bytes: last.size,
        snapshot_s,
        etcdctl_s,
        restore_s,
        rebuild_s,
        voters_s,
        revisions_lost: at_loss.saturating_sub(last.revision),
    })
}

/// What the rebuild of Cluster `name` was made of: its Events since
/// `since` (the operator's steps, and the Pod runner's about its Pods), as
/// seconds after it, on standard error.
async fn timeline(
    client: &Client,
    ns: &str,
    name: &str,
    since: k8s_openapi::jiff::Timestamp,
) -> Result<()> {
    use k8s_openapi::api::events::v1::Event;
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let mut lines: Vec<(f64, String)> = events
        .items
        .into_iter()
        .filter_map(|e| {
            let at = e.event_time.as_ref().map(|t| t.0).or(e
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0))?;
            let about = e.regarding.as_ref()?.name.clone()?;
            if !about.starts_with(name) || about.starts_with(&format!("{name}-r")) {
                return None;
            }
            let s = (at - since).total(k8s_openapi::jiff::Unit::Second).ok()?;
            (s >= 0.0).then(|| {
                (
                    s,
                    format!(
                        "{about} {} {}",
                        e.reason.unwrap_or_default(),
                        e.note.unwrap_or_default()
                    ),
                )
            })
        })
        .collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    eprintln!("{name}: the rebuild, seconds after the loss:");
    for (s, line) in lines {
        eprintln!("  {s:6.1} {line}");
    }
    Ok(())
}

/// `etcdctl snapshot save` of member 0 to a local file, with the
/// operator's etcd client certificate: what etcd itself takes.
async fn etcdctl_snapshot(client: &Client, ns: &str, name: &str) -> Result<f64> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{name}-operator-etcd-client"))
        .await?;
    let data = secret.data.context("no data")?;
    let dir = tempfile::tempdir()?;
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(dir.path().join(key), &data.get(key).context("key")?.0)?;
    }
    let ip = Api::<Pod>::namespaced(client.clone(), ns)
        .get(&format!("{name}-etcd-0"))
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("no member ip")?;
    let bin = kok_testenv::bins::bin("etcdctl")?;
    let started = Instant::now();
    let out = Command::new(bin)
        .arg(format!("--endpoints=https://{ip}:2379"))
        .arg(format!("--cert={}", dir.path().join("tls.crt").display()))
        .arg(format!("--key={}", dir.path().join("tls.key").display()))
        .arg(format!("--cacert={}", dir.path().join("ca.crt").display()))
        .arg("--insecure-skip-tls-verify")
        .args(["snapshot", "save"])
        .arg(dir.path().join("snapshot.db"))
        .output()?;
    let took = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "etcdctl snapshot save: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}

fn table(args: &Args, samples: &[Sample]) -> String {
    let mut out = format!(
        "\n### etcd snapshots, restores and quorum-loss rebuilds (Production, real processes, {}), ConfigMaps of {} bytes, one run\n\n| objects | written s | database MiB | snapshot to {} s (request → stored) | `etcdctl snapshot save` to disk s | restore into a new Cluster s (apply → all readable) | rebuild after losing every member s (delete → all readable, from the rebuilt etcd) | … → three voters s | revisions lost (snapshot → loss) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        match args.destination {
            Destination::S3 => "versitygw over TLS",
            Destination::Pvc => "on a claim, through the snapshot gateway over TLS",
        },
        args.object_bytes,
        match args.destination {
            Destination::S3 => "S3",
            Destination::Pvc => "the claim",
        },
    );
    for s in samples {
        #[allow(clippy::cast_precision_loss)]
        let mib = s.db_bytes as f64 / 1048576.0;
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {} |\n",
            s.objects,
            s.write_s,
            mib,
            s.snapshot_s,
            s.etcdctl_s,
            s.restore_s,
            s.rebuild_s,
            s.voters_s,
            s.revisions_lost
        ));
    }
    out
}
