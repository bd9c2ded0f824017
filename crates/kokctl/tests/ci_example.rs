//! `examples/ci/ephemeral-cluster.sh` run for real, as CI would run it: the
//! kube-on-kube-operator runs as a Pod of the test meta-cluster, the Cluster's
//! control plane runs as real processes under the Pod runner, and the script
//! creates the cluster, smoke-tests the business API and deletes it.
//!
//! The business API is reached at an apiserver Pod's address: the Pod runner
//! routes its Pod network to this machine (as flat networks do), which the
//! script's `KOK_API_SERVER=pod-ip` mode uses; the serving certificate is
//! still checked against the Cluster's endpoint name.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::{Options, PodRunner, RUNNER_LABEL};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_on_kube_api::Cluster;
use serde_json::json;
use support::workspace_bin;

/// The operator as a Pod watching `ns`, with a ServiceAccount allowed
/// everything (the chart's least-privilege rules are tested with the chart).
async fn start_operator(client: &Client, ns: &str, node: &str) {
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

fn dir_of(path: &Path) -> String {
    path.parent()
        .expect("parent dir")
        .to_str()
        .expect("utf-8")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_cluster_script_creates_smoke_tests_and_deletes() {
    let env = KubeEnv::shared();
    let runner = tokio::task::spawn_blocking(|| {
        PodRunner::start(
            KubeEnv::shared(),
            Options {
                nodes: vec!["ci-0".into()],
                // The operator, and the node-operator it runs for the Cluster.
                programs: [
                    (
                        "kube-on-kube-operator".to_string(),
                        workspace_bin("kube-on-kube-operator"),
                    ),
                    ("node-operator".to_string(), workspace_bin("node-operator")),
                ]
                .into(),
                ..Default::default()
            },
        )
    })
    .await
    .expect("join")
    .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"));
    let client = env.client().await;
    let ns = env.namespace("ci-example").await;
    start_operator(&client, &ns, &runner.nodes()[0]).await;

    // The control plane goes to the runner's node, not to kwok's.
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("cluster.yaml");
    std::fs::write(
        &manifest,
        serde_norway::to_string(&json!({
            "apiVersion": "kubeonkube.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": "from-file"},
            "spec": {
                "version": "1.35.4",
                "mode": "Minimal",
                "placement": {"nodeSelector": {RUNNER_LABEL: "true"}},
                "etcd": {"storage": {"volumeSource": {"emptyDir": {}}}},
            }
        }))
        .expect("yaml"),
    )
    .expect("write manifest");

    let kubectl = kok_testenv::bins::bin("kubectl").expect("kubectl");
    let path = format!(
        "{}:{}:{}",
        dir_of(Path::new(env!("CARGO_BIN_EXE_kubectl-kok"))),
        dir_of(&kubectl),
        std::env::var("PATH").unwrap_or_default()
    );
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/ci/ephemeral-cluster.sh");
    let mut command = std::process::Command::new(script);
    command
        .env("PATH", path)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("KOK_CLUSTER_NAME", "ci-run")
        .env("KOK_NAMESPACE", &ns)
        .env("KOK_CLUSTER_FILE", &manifest)
        .env("KOK_TIMEOUT", "5m")
        .env("KOK_API_SERVER", "pod-ip")
        .env("KOK_WORKDIR", dir.path());
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "script finished in {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        started.elapsed()
    );
    assert!(out.status.success(), "the script failed: {:?}", out.status);
    assert!(stdout.contains("Cluster ci-run is Ready"), "{stdout}");
    assert!(stdout.contains("namespace/kube-system") || stdout.contains("kube-system"));
    assert!(stdout.contains("smoke test passed"), "{stdout}");
    assert!(
        stdout.contains("Cluster ci-run and everything it owned are deleted"),
        "{stdout}"
    );
    assert!(
        !dir.path().join("ci-run.kubeconfig").exists(),
        "the kubeconfig was left behind"
    );

    // Gone for the API server too.
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    assert!(clusters.get_opt("ci-run").await.expect("get").is_none());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let left = pods
        .list(&ListParams::default().labels("kubeonkube.io/cluster=ci-run"))
        .await
        .expect("pods");
    assert!(left.items.is_empty(), "{} pods left", left.items.len());
    pods.delete("operator", &DeleteParams::default())
        .await
        .expect("stop the operator");
    // Let the runner stop the operator's process before it goes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(runner);
}
