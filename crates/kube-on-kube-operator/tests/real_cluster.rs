//! A Cluster becomes a working Kubernetes: the operator runs against the real
//! meta-cluster, its control-plane Pods run as real processes (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler), and the business
//! API answers with the kubeconfigs the operator wrote.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, ExtraUser, Placement};
use serde_json::json;

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let operator = env!("CARGO_BIN_EXE_kube-on-kube-operator");
        PodRunner::start(
            KubeEnv::shared(),
            Options {
                nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
                programs: [("kube-on-kube-operator".to_string(), operator.into())].into(),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"))
    })
}

/// Run the operator's binary as a Pod watching `ns`, with a ServiceAccount
/// allowed to manage everything (the chart's least-privilege rules are tested
/// with the chart).
async fn start_operator(client: &Client, ns: &str, node: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "operator"}})).expect("account");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("service account");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("operator-{ns}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "operator"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "operator",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "operator", "image": "kube-on-kube-operator",
                            "args": [format!("--namespace={ns}"), "--log-level=info"]}]
        }
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("operator pod");
}

fn condition(c: &Cluster, type_: &str) -> Option<String> {
    Some(c.status.as_ref()?.condition(type_)?.status.clone())
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(kok_testenv::bins::bin("kubectl").expect("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .expect("run kubectl")
}

async fn kubeconfig_file(
    client: &Client,
    ns: &str,
    secret: &str,
    dir: &Path,
) -> std::path::PathBuf {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(secret)
        .await
        .expect("kubeconfig secret");
    let text = s
        .data
        .expect("data")
        .get("kubeconfig")
        .expect("kubeconfig key")
        .0
        .clone();
    let path = dir.join(secret);
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_cluster_becomes_a_working_kubernetes() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("real-cluster").await;
    // The operator runs as a Pod of the meta-cluster, as it does in production:
    // it reaches the business API through its internal Service name.
    start_operator(&client, &ns, &runner.nodes()[0]).await;

    let mut cluster: Cluster =
        serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
            .expect("example");
    cluster.metadata.namespace = Some(ns.clone());
    cluster.spec.mode = ClusterMode::Minimal;
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster.spec.extra_users = vec![ExtraUser {
        name: "sre".into(),
        groups: vec!["system:masters".into(), "sre".into()],
    }];
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");

    let components = [
        "EtcdReady",
        "APIServerReady",
        "ControllerManagerReady",
        "SchedulerReady",
        "CertificatesReady",
    ];
    let ready = wait_for(
        "every control-plane component to be ready",
        Duration::from_secs(240),
        async || {
            let c = clusters.get("ci").await.ok()?;
            components
                .iter()
                .all(|t| condition(&c, t).as_deref() == Some("True"))
                .then_some(c)
        },
    )
    .await;
    println!("control plane ready {:?} after create", started.elapsed());
    assert_eq!(
        ready.status.as_ref().and_then(|s| s.phase),
        Some(kube_on_kube_api::cluster::ClusterPhase::Running)
    );
    assert_eq!(
        ready
            .status
            .as_ref()
            .and_then(|s| s.components.as_ref())
            .map(|c| c.api_server.ready.clone())
            .as_deref(),
        Some("1/1")
    );

    // The business API, from the machine: the apiserver Pod's address, checked
    // against the name in its certificate.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let apiserver = pods
        .list(&ListParams::default().labels("kubeonkube.io/component=apiserver"))
        .await
        .expect("pods")
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
        .expect("an apiserver pod");
    assert!(
        runner.nodes().contains(
            &apiserver
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default()
        )
    );
    let ip = apiserver.status.and_then(|s| s.pod_ip).expect("ip");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = kubeconfig_file(&client, &ns, "ci-admin-kubeconfig", dir.path()).await;
    let server = format!("--server=https://{ip}:6443");
    let out = kubectl(
        &admin,
        &[
            &server,
            "--tls-server-name=kubernetes",
            "get",
            "--raw",
            "/readyz",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(
        &admin,
        &[
            &server,
            "--tls-server-name=kubernetes",
            "get",
            "namespaces",
            "-o",
            "name",
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("namespace/kube-system"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An extra user authenticates with the groups it was given.
    let sre = kubeconfig_file(&client, &ns, "ci-kubeconfig-sre", dir.path()).await;
    let out = kubectl(
        &sre,
        &[
            &server,
            "--tls-server-name=kubernetes",
            "auth",
            "whoami",
            "-o",
            "json",
        ],
    );
    let who: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("whoami: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(who["status"]["userInfo"]["username"], "sre");
    let groups = who["status"]["userInfo"]["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        groups.contains(&json!("sre")) && groups.contains(&json!("system:masters")),
        "{who}"
    );

    // The business API through its Service name, from a Pod in the meta-cluster
    // (as the node-operator will reach it).
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "readyz"},
        "spec": {
            "nodeName": runner.nodes()[0],
            "restartPolicy": "OnFailure",
            "containers": [{"name": "kubectl", "image": "registry.k8s.io/kubectl:v1.35.4",
                "command": ["kubectl", "--kubeconfig=/kc/kubeconfig", "get", "--raw", "/readyz"],
                "volumeMounts": [{"name": "kc", "mountPath": "/kc"}]}],
            "volumes": [{"name": "kc", "secret": {"secretName": "ci-controller-manager-kubeconfig"}}]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &probe)
        .await
        .expect("probe pod");
    let probe = wait_for(
        "the in-cluster readyz probe to succeed",
        Duration::from_secs(60),
        async || {
            pods.get("readyz")
                .await
                .ok()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        },
    )
    .await;
    let log = runner.container_log(&ns, "readyz", &probe.uid().unwrap_or_default(), "kubectl");
    assert!(
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("ok"),
        "log {}",
        log.display()
    );

    // Deleting the Cluster stops everything.
    let deleted = Instant::now();
    clusters
        .delete("ci", &DeleteParams::background())
        .await
        .expect("delete");
    wait_for(
        "the control-plane pods to go",
        Duration::from_secs(90),
        async || {
            let left = pods
                .list(&ListParams::default().labels("kubeonkube.io/cluster=ci"))
                .await
                .ok()?
                .items
                .len();
            (left == 0).then_some(())
        },
    )
    .await;
    println!("control plane gone {:?} after delete", deleted.elapsed());
    pods.delete("operator", &DeleteParams::default())
        .await
        .expect("stop the operator");
}
