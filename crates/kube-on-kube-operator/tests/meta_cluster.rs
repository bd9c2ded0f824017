//! Business control planes in real containers on a real meta-cluster
//! (`kok_test_support::meta`): the chart installs both operators from their images;
//! a Production Cluster, admitted as `restricted`, becomes Ready while its
//! leading operator is killed; another tenant cannot reach its etcd; and a
//! version upgrade pulls and rolls upstream's next images.

use kok_test_support as common;
use kok_test_support::meta;

use meta::*;

use std::time::{Duration, Instant};

use kok_testenv::wait::wait_for;
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn a_control_plane_runs_in_real_containers_on_meta_workers_that_are_machines() {
    let meta = Meta::up(3, 0).await;

    // The Pods the checks below use start while the Cluster is made: a
    // probe, another tenant's Pod and one of the operator's namespace.
    meta.kubectl.apply(&restricted_namespace("tenant-b"));
    let probe = meta.start_restricted_pod("default", "probe");
    let intruder = meta.start_restricted_pod("tenant-b", "intruder");
    let insider = meta.start_restricted_pod(RELEASE_NAMESPACE, "insider");

    // The Production example at the previous patch release; the operator
    // that leads is killed while it makes the control plane: its container
    // comes back from its image, and the Cluster converges.
    let client = meta.env.client().await;
    let ns = "tenant-a";
    let created = Instant::now();
    let (clusters, name) = meta.create_production(ns, FROM_VERSION).await;
    let killed = meta.kill_operator_leader().await;

    // Meanwhile a Pod on a meta worker finds the API server by its Service
    // name (CoreDNS, kube-proxy) and reaches it.
    meta.wait_pod_ready(&probe);
    let (probe_ns, probe_name) = probe.split_once('/').expect("namespace/name");
    let answer = wait_for(
        "the API server answering a meta Pod by its Service name",
        Duration::from_secs(60),
        async || {
            meta.kubectl
                .run(
                    &[
                        "-n",
                        probe_ns,
                        "exec",
                        probe_name,
                        "--",
                        "curl",
                        "-sk",
                        "--max-time",
                        "5",
                        "https://kubernetes.default.svc.cluster.local/version",
                    ],
                    None,
                )
                .ok()
                .filter(|out| out.contains("gitVersion"))
        },
    )
    .await;
    assert!(answer.contains("v1.35"), "{answer}");

    common::ready_cluster(&clusters, &name, None).await;
    println!(
        "Cluster {name} Ready {:?} after it was created (operator {killed} killed on the way)",
        created.elapsed()
    );
    meta.wait_restarted(&killed).await;
    // Its API answers at the load balancer's address, from this machine.
    let dir = tempfile::tempdir().expect("a directory");
    meta.business_kubectl(ns, &name, dir.path()).await;

    // Another tenant's Pod cannot open a connection to this Cluster's etcd
    // nor its controller-manager, which a Pod of the operator's namespace
    // reaches (so they listen, and the fence is what stops the other); its
    // API server's port stays open to every client. Every attempt at
    // once, each waiting up to 3 s.
    meta.wait_pod_ready(&intruder);
    meta.wait_pod_ready(&insider);
    let apiserver_ip = meta.pod_ip(ns, "kubeonkube.io/component=apiserver");
    let mut attempts = vec![(intruder.clone(), "kube-apiserver", apiserver_ip, 6443, true)];
    for (component, port) in [("etcd", 2379), ("controller-manager", 10257)] {
        let ip = meta.pod_ip(ns, &format!("kubeonkube.io/component={component}"));
        attempts.push((insider.clone(), component, ip.clone(), port, true));
        // Twice: a refused connection is not a moment's loss.
        attempts.push((intruder.clone(), component, ip.clone(), port, false));
        attempts.push((intruder.clone(), component, ip, port, false));
    }
    let outcomes: Vec<bool> = std::thread::scope(|s| {
        let running: Vec<_> = attempts
            .iter()
            .map(|(from, _, ip, port, _)| s.spawn(|| meta.connects(from, ip, *port)))
            .collect();
        running
            .into_iter()
            .map(|h| h.join().expect("a connection attempt"))
            .collect()
    });
    for ((from, component, ip, port, expected), connected) in attempts.iter().zip(outcomes) {
        assert_eq!(
            connected, *expected,
            "{from} connecting to tenant-a's {component} at {ip}:{port}"
        );
    }
    println!("tenant-b reaches tenant-a's API server, not its etcd nor its controller-manager");

    // A version upgrade pulls the next release's images and rolls onto
    // them.
    let upgraded = Instant::now();
    clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": TO_VERSION}})),
        )
        .await
        .expect("upgrade the Cluster");
    common::wait_cluster(
        &clusters,
        &name,
        &format!("every component at v{TO_VERSION}"),
        Duration::from_secs(360),
        |c| settled_at(c, TO_VERSION),
    )
    .await;
    println!("upgraded to v{TO_VERSION} in {:?}", upgraded.elapsed());
    let seen = running_images(&client, ns).await;
    println!("images running in {ns}: {seen:?}");
    for component in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let image = format!("registry.k8s.io/{component}:v{TO_VERSION}");
        assert!(seen.contains(&image), "{image} runs in {ns}: {seen:?}");
        let old = format!("registry.k8s.io/{component}:v{FROM_VERSION}");
        assert!(!seen.contains(&old), "{old} is gone from {ns}: {seen:?}");
    }
}

/// The benchmark command behind bench/README.md's "Control planes in real
/// containers": on a real meta-cluster (three meta workers) a Minimal
/// Cluster (which pulls its images), a Production Cluster (which pulls them
/// onto the other workers) and a second Minimal (every image already on
/// every worker), one after the other: the time from create to every
/// condition True, then, after a minute idle, the memory their Pods'
/// containers use (working set, from each meta worker's kubelet). Then, in
/// the same run, the same Minimal and Production on the Pod runner the fast
/// tests use (components as processes, nothing to pull), timed the same
/// way. `cargo test -p kube-on-kube-operator --test meta_cluster --
/// --ignored --nocapture measured`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: bench/README.md"]
async fn control_planes_in_real_containers_measured() {
    let mut rows = Vec::new();
    {
        let meta = Meta::up(3, 0).await;
        let client = meta.env.client().await;
        for (shown, mode, ns) in [
            ("Minimal, images pulled", "Minimal", "bench-minimal"),
            ("Production", "Production", "bench-production"),
            (
                "Minimal, images on the nodes",
                "Minimal",
                "bench-minimal-warm",
            ),
        ] {
            let created = Instant::now();
            let (clusters, name) = match mode {
                "Production" => meta.create_production(ns, TO_VERSION).await,
                _ => {
                    meta.kubectl.apply(&restricted_namespace(ns));
                    let mut small = common::minimal_example();
                    small.metadata.namespace = Some(ns.to_string());
                    small.spec.api_server.external.type_ =
                        kube_on_kube_api::cluster::ExposureType::ClusterIP;
                    let clusters: kube::Api<kube_on_kube_api::Cluster> =
                        kube::Api::namespaced(client.clone(), ns);
                    clusters
                        .create(&Default::default(), &small)
                        .await
                        .expect("create the Minimal Cluster");
                    (clusters, kube::ResourceExt::name_any(&small))
                }
            };
            common::ready_cluster(&clusters, &name, None).await;
            let ready = created.elapsed();
            tokio::time::sleep(Duration::from_secs(60)).await;
            let (pods, containers, bytes) = meta.memory_of(ns);
            println!(
                "real meta-cluster, {shown}: Ready in {ready:?}; {pods} Pods, {containers} containers, {:.0} MiB",
                bytes as f64 / 1048576.0
            );
            rows.push(format!(
                "| real containers | {shown} | {:.1} | {pods} | {containers} | {:.0} |",
                ready.as_secs_f64(),
                bytes as f64 / 1048576.0
            ));
        }
    }

    // The Pod runner: the operator as a Pod of the test environment's
    // meta-cluster, every component a process on three runner nodes.
    let env = kok_testenv::kube_env::KubeEnv::shared();
    let runner = kok_testenv::pods::PodRunner::start(
        env,
        kok_testenv::pods::Options {
            nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
            labels: [(CONTROL_PLANE_LABEL.to_string(), String::new())].into(),
            programs: [
                (
                    "kube-on-kube-operator".to_string(),
                    common::operator_binary(),
                ),
                ("node-operator".to_string(), common::node_operator_binary()),
            ]
            .into(),
            load_balancer: true,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"));
    let client = env.client().await;
    for (shown, mode) in [("Minimal", "Minimal"), ("Production", "Production")] {
        let ns = env
            .namespace(&format!("bench-{}", mode.to_lowercase()))
            .await;
        common::grant_operator(&client, &ns).await;
        common::start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
        let mut cluster = match mode {
            "Production" => common::production_example(),
            _ => common::minimal_on_runner(),
        };
        cluster.metadata.namespace = Some(ns.clone());
        let clusters: kube::Api<kube_on_kube_api::Cluster> =
            kube::Api::namespaced(client.clone(), &ns);
        let created = Instant::now();
        clusters
            .create(&Default::default(), &cluster)
            .await
            .expect("create the Cluster on the Pod runner");
        common::ready_cluster(&clusters, &kube::ResourceExt::name_any(&cluster), None).await;
        let ready = created.elapsed();
        println!("Pod runner, {shown}: Ready in {ready:?}");
        rows.push(format!(
            "| Pod runner (processes) | {shown} | {:.1} | | | |",
            ready.as_secs_f64()
        ));
    }

    println!(
        "\n| meta-cluster | Cluster | create → all conditions True s | Pods | containers | memory (working set) MiB |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
}
