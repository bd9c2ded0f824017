//! Benchmark 1: control-plane creation and deletion, for real. The operator
//! runs as a Pod of a real meta-cluster and the Pod runner runs every Pod as
//! real processes (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, the node-operator). Measured from applying a Cluster: the
//! business API answering `/readyz` with the admin kubeconfig the operator
//! wrote, all conditions settled (every readiness condition True, nothing
//! Progressing), and after deleting it, every object gone.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kok_testenv::kube_env::{KubeEnv, Options as EnvOptions};
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, Placement};
use serde_json::json;

use crate::fleet::sibling;
use crate::measure::median;

/// Flags of `kok-bench controlplane`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Cluster modes to measure.
    #[arg(long, value_delimiter = ',', default_values_t = ["Minimal".to_string(), "Production".to_string()])]
    pub modes: Vec<String>,
    /// Clusters created and deleted per mode, one after the other; the table
    /// reports medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Give up on one Cluster after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Append the results table to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The operator's log filter (its `--log-level`); its log is kept under
    /// `target/testenv-logs/`. More than `info` slows what is measured.
    #[arg(long, default_value = "info")]
    pub operator_log_level: String,
}

#[derive(Clone, Debug)]
struct Sample {
    mode: String,
    readyz_s: f64,
    ready_s: f64,
    delete_s: f64,
}

/// Runs the benchmark and prints (and optionally appends) the table.
pub async fn run(args: Args) -> Result<()> {
    // One meta-cluster and runner for every Cluster, as a user has.
    let env = meta_cluster()?;
    let _runner = control_plane_runner(env, Default::default())?;
    let client = env.client().await;
    let ns = env.namespace("bench").await;
    start_operator(&client, &ns, &args.operator_log_level).await?;
    let mut samples = Vec::new();
    for mode in &args.modes {
        let mode_value: ClusterMode =
            serde_json::from_value(json!(mode)).with_context(|| format!("unknown mode {mode}"))?;
        for run in 0..args.runs {
            let name = format!("{}-{run}", mode.to_lowercase());
            let sample = one_cluster(&client, &ns, &name, mode, mode_value, args.timeout).await?;
            eprintln!(
                "{mode} run {}/{}: /readyz {:.1}s, Ready {:.1}s, deleted {:.1}s",
                run + 1,
                args.runs,
                sample.readyz_s,
                sample.ready_s,
                sample.delete_s
            );
            samples.push(sample);
        }
    }
    let table = table(&args, &samples);
    println!("{table}");
    crate::append(args.out.as_deref(), &table)
}

/// The Pod runner of `env`, with three nodes for control planes, running
/// the operators' images as this build's binaries, and `extra` images.
pub(crate) fn control_plane_runner(
    env: &'static KubeEnv,
    extra: std::collections::BTreeMap<String, PathBuf>,
) -> Result<PodRunner> {
    let mut programs = extra;
    for name in ["kube-on-kube-operator", "node-operator"] {
        programs.insert(name.to_string(), sibling(name)?);
    }
    PodRunner::start(
        env,
        Options {
            nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
            programs,
            ..Default::default()
        },
    )
    .context("start the Pod runner")
}

/// A meta-cluster for the Pod runner: kube-apiserver, etcd,
/// kube-controller-manager and kube-scheduler, no kwok, the CRDs installed;
/// it lives as long as the process.
pub(crate) fn meta_cluster() -> Result<&'static KubeEnv> {
    Ok(Box::leak(Box::new(
        KubeEnv::start(EnvOptions {
            controller_manager: true,
            scheduler: true,
            kwok_nodes: 0,
            install_crds: true,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: None,
        })
        .context("start the meta-cluster")?,
    )))
}

/// Runs the kube-on-kube-operator as the Pod `operator` of `ns` on `cp-0`,
/// watching `ns`, allowed everything.
pub(crate) async fn start_operator(client: &Client, ns: &str, log_level: &str) -> Result<()> {
    start_operator_with(client, ns, log_level, &[]).await
}

/// [`start_operator`] with `extra` flags.
pub(crate) async fn start_operator_with(
    client: &Client,
    ns: &str,
    log_level: &str,
    extra: &[String],
) -> Result<()> {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "operator"}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("operator-{ns}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let mut args = vec![
        format!("--namespace={ns}"),
        "--node-operator-image=node-operator".to_string(),
        format!("--log-level={log_level}"),
    ];
    args.extend_from_slice(extra);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "spec": {
            "nodeName": "cp-0",
            "serviceAccountName": "operator",
            "containers": [{"name": "operator", "image": "kube-on-kube-operator", "args": args}]
        }
    }))?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

async fn one_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    mode: &str,
    mode_value: ClusterMode,
    timeout: u64,
) -> Result<Sample> {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let mut cluster: Cluster =
        serde_norway::from_str(include_str!("../../examples/cluster-minimal.yaml"))?;
    cluster.metadata.namespace = Some(ns.into());
    cluster.metadata.name = Some(name.into());
    cluster.spec.mode = mode_value;
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster.spec.etcd.storage = serde_json::from_value(json!({"claimTemplate": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}
    }}))?;
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let started = Instant::now();
    clusters.create(&PostParams::default(), &cluster).await?;

    // The business API answers with the admin kubeconfig.
    let readyz_s = loop {
        if readyz(client, ns, name).await {
            break started.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("{mode} {name}: the business API did not answer /readyz in {timeout}s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ready_s = loop {
        let c = clusters.get(name).await?;
        let status = c.status.as_ref();
        let all = status.is_some_and(|s| settled(&s.conditions));
        if all {
            break started.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            let conditions: Vec<String> = status
                .map(|s| {
                    s.conditions
                        .iter()
                        .filter(|c| !settled(std::slice::from_ref(c)))
                        .map(|c| format!("{}={} {}", c.type_, c.status, c.message))
                        .collect()
                })
                .unwrap_or_default();
            bail!("{mode} {name}: not settled in {timeout}s: {conditions:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let deleted = Instant::now();
    clusters.delete(name, &DeleteParams::background()).await?;
    let labels = ListParams::default().labels(&format!("kubeonkube.io/cluster={name}"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let delete_s = loop {
        let left = pods.list(&labels).await?.items.len()
            + secrets.list(&labels).await?.items.len()
            + services.list(&labels).await?.items.len()
            + deployments.list(&labels).await?.items.len()
            + usize::from(clusters.get_opt(name).await?.is_some());
        if left == 0 {
            break deleted.elapsed().as_secs_f64();
        }
        if deleted.elapsed() > Duration::from_secs(timeout) {
            bail!("{mode} {name}: {left} objects left {timeout}s after delete");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(Sample {
        mode: mode.to_string(),
        readyz_s,
        ready_s,
        delete_s,
    })
}

/// Whether every condition has settled (every readiness condition True,
/// nothing Progressing), and there are some.
pub(crate) fn settled(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> bool {
    kube_on_kube_api::cluster::settled(conditions)
}

/// `/readyz` of the business API through a Ready kube-apiserver Pod, with the
/// admin kubeconfig's credentials and CA (the name checked is the one in the
/// serving certificate, `kubernetes`).
async fn readyz(client: &Client, ns: &str, name: &str) -> bool {
    let timeouts = (Duration::from_secs(1), Duration::from_secs(2));
    let Ok(business) = business_client(client, ns, name, timeouts).await else {
        return false;
    };
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a static request");
    business
        .request_text(request)
        .await
        .is_ok_and(|t| t.trim() == "ok")
}

/// A client of Cluster `name`'s business API, straight to one of its
/// kube-apiserver Pods, with the admin kubeconfig's credentials and CA (the
/// name checked is the one in the serving certificate, `kubernetes`), and
/// the given connect and read timeouts.
pub(crate) async fn business_client(
    client: &Client,
    ns: &str,
    name: &str,
    (connect, read): (Duration, Duration),
) -> Result<Client> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let ip = pods
        .list(&ListParams::default().labels(&format!(
            "kubeonkube.io/cluster={name},kubeonkube.io/component=apiserver"
        )))
        .await?
        .items
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .context("no kube-apiserver Pod with an address")?;
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{name}-admin-kubeconfig"))
        .await?;
    let text = secret
        .data
        .and_then(|d| d.get("kubeconfig").map(|v| v.0.clone()))
        .context("no kubeconfig in the admin kubeconfig Secret")?;
    let kubeconfig: kube::config::Kubeconfig = serde_norway::from_slice(&text)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.cluster_url = format!("https://{ip}:6443").parse()?;
    config.tls_server_name = Some("kubernetes".into());
    config.connect_timeout = Some(connect);
    config.read_timeout = Some(read);
    Ok(Client::try_from(config)?)
}

fn table(args: &Args, samples: &[Sample]) -> String {
    let mut out = format!(
        "\n### Control-plane creation and deletion (real processes), median of {} runs\n\n| mode | business `/readyz` s | all Ready, not Progressing s | deleted, all objects gone s |\n|---|---:|---:|---:|\n",
        args.runs
    );
    for mode in &args.modes {
        let of = |f: fn(&Sample) -> f64| {
            median(
                &samples
                    .iter()
                    .filter(|s| &s.mode == mode)
                    .map(f)
                    .collect::<Vec<_>>(),
            )
        };
        out.push_str(&format!(
            "| {mode} | {:.1} | {:.1} | {:.1} |\n",
            of(|s| s.readyz_s),
            of(|s| s.ready_s),
            of(|s| s.delete_s)
        ));
    }
    out
}
