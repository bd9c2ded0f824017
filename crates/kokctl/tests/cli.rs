//! The built `kubectl-kok` against the real API server of the test environment,
//! with the kube-on-kube-operator binary running as a process beside it. kwok
//! stands in for the nodes, so control-plane Pods turn Ready but the business
//! API never answers: a Cluster never becomes Ready, which is exactly what the
//! timeout path needs.

mod support;

use std::time::{Duration, Instant};

use kok_testenv::kube_env::{KubeEnv, Options};
use kube::api::{Api, ListParams, PostParams};
use kube_on_kube_api::canary::CanaryAction;
use kube_on_kube_api::{CanaryRelease, Cluster, Machine};
use support::{Process, kok, log_dir, workspace_bin};

fn start_operator(env: &KubeEnv, ns: &str) -> Process {
    Process::start(
        &workspace_bin("kube-on-kube-operator"),
        &[
            format!("--kubeconfig={}", env.kubeconfig_path().display()),
            format!("--namespace={ns}"),
            // Several operators run on this machine at once: any free port.
            "--http-address=127.0.0.1:0".into(),
            "--log-level=info".into(),
        ],
        log_dir().join(format!("operator-{ns}.log")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_wait_kubeconfig_list_and_delete() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("cli").await;
    let kc = env.kubeconfig_path();
    let _operator = start_operator(env, &ns);

    // kwok never gives the Cluster a real API: the wait must time out, name the
    // conditions that are not True, and show progress until then.
    let started = Instant::now();
    let run = kok(
        kc,
        &[
            "-n",
            &ns,
            "cluster",
            "create",
            "c1",
            "--mode",
            "Minimal",
            "--wait",
            "--timeout",
            "20s",
        ],
    )
    .await;
    let took = started.elapsed();
    println!("create --wait --timeout 20s returned after {took:?}");
    assert_eq!(run.code, Some(2), "a timed-out wait exits 2: {run:#?}");
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(40),
        "{took:?}"
    );
    assert!(
        run.stdout.contains("cluster.kubeonkube.io/c1 created"),
        "{run:#?}"
    );
    assert!(
        run.stdout.contains("s] CertificatesReady is True"),
        "progress lines: {run:#?}"
    );
    assert!(
        run.stderr.contains("is not Ready after 20s") && run.stderr.contains("  Ready=False ("),
        "failing conditions: {run:#?}"
    );
    assert!(run.stderr.contains("AddonsReady="), "{run:#?}");

    // The admin kubeconfig, printed and written, and with another server.
    let run = kok(kc, &["-n", &ns, "cluster", "kubeconfig", "c1"])
        .await
        .ok();
    let doc: serde_json::Value = serde_norway::from_str(&run.stdout).expect("kubeconfig yaml");
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server")
        .to_string();
    assert!(server.starts_with("https://"), "{server}");
    assert!(doc["users"][0]["user"]["client-certificate-data"].is_string());
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c1.kubeconfig");
    kok(
        kc,
        &[
            "-n",
            &ns,
            "cluster",
            "kubeconfig",
            "c1",
            "--server",
            "https://10.0.0.1:6443",
            "--output-file",
            file.to_str().expect("utf-8"),
        ],
    )
    .await
    .ok();
    let written: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&file).expect("written")).expect("yaml");
    assert_eq!(
        written["clusters"][0]["cluster"]["server"],
        "https://10.0.0.1:6443"
    );
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let run = kok(
        kc,
        &["-n", &ns, "cluster", "kubeconfig", "c1", "--user", "bob"],
    )
    .await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("has no user \"bob\""), "{}", run.stderr);

    // The fleet view, as JSON and as a table.
    let run = kok(kc, &["-n", &ns, "cluster", "list", "-o", "json"])
        .await
        .ok();
    let listed: Vec<Cluster> = serde_json::from_str(&run.stdout).expect("json list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].spec.version, "1.35.4");
    let run = kok(kc, &["cluster", "list", "-A"]).await.ok();
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{ns} ")))
        .unwrap_or_else(|| panic!("no row for {ns}: {}", run.stdout));
    assert!(
        line.contains("c1") && line.contains("Minimal") && line.contains("1/1"),
        "{line}"
    );

    // Delete and wait until everything the Cluster owned is gone.
    let run = kok(
        kc,
        &[
            "-n",
            &ns,
            "cluster",
            "delete",
            "c1",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .await
    .ok();
    assert!(run.stdout.contains("owned objects remaining: "), "{run:#?}");
    assert!(
        run.stdout
            .contains("Cluster c1 and everything it owned are deleted"),
        "{run:#?}"
    );
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    assert!(clusters.get_opt("c1").await.expect("get").is_none());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let left = pods
        .list(&ListParams::default().labels("kubeonkube.io/cluster=c1"))
        .await
        .expect("pods");
    assert!(left.items.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_say_how_to_find_them() {
    let env = KubeEnv::shared();
    let ns = env.namespace("cli-missing").await;
    let kc = env.kubeconfig_path();

    let run = kok(kc, &["-n", &ns, "cluster", "delete", "nope"]).await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("Cluster \"nope\" not found in namespace")
            && run.stderr.contains("kubectl kok cluster list -A"),
        "{}",
        run.stderr
    );
    let run = kok(kc, &["-n", &ns, "cluster", "kubeconfig", "nope"]).await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("not found"), "{}", run.stderr);
    let run = kok(kc, &["canary", "status", "nope"]).await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("CanaryRelease \"nope\" not found"),
        "{}",
        run.stderr
    );
    let run = kok(kc, &["canary", "pause", "nope"]).await;
    assert_eq!(run.code, Some(1));
    let run = kok(kc, &["machine", "describe", "nope"]).await;
    assert!(
        run.stderr.contains("Machine \"nope\" not found") && run.stderr.contains("machine list"),
        "{}",
        run.stderr
    );
    // A bad kubeconfig path is a connection error that names the flag.
    let run = kok(
        std::path::Path::new("/nonexistent/kubeconfig"),
        &["cluster", "list"],
    )
    .await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("--kubeconfig"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_crds_the_error_says_to_install_them() {
    // A second API server without the CRDs (and without the controllers this
    // test does not need).
    let bare = tokio::task::spawn_blocking(|| {
        KubeEnv::start(Options {
            controller_manager: false,
            scheduler: false,
            kwok_nodes: 0,
            install_crds: false,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: None,
        })
    })
    .await
    .expect("join")
    .expect("bare API server");
    let kc = bare.kubeconfig_path();
    for args in [
        &["cluster", "list", "-A"][..],
        &[
            "-n", "default", "cluster", "create", "x", "--mode", "Minimal",
        ],
        &["machine", "list"],
        &["canary", "status", "x"],
    ] {
        let run = kok(kc, args).await;
        assert_eq!(run.code, Some(1), "{args:?}");
        assert!(
            run.stderr.contains("does not serve")
                && run.stderr.contains("helm install")
                && run.stderr.contains("kubectl apply -f crds/"),
            "{args:?}: {}",
            run.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_actions_set_spec_action_and_machines_are_listed() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let kc = env.kubeconfig_path();
    // Cluster-scoped kinds: a name of this test's own.
    let ns = env.namespace("cli-canary").await;
    let name = format!("{ns}-kubelet");
    let mut canary: CanaryRelease =
        serde_norway::from_str(include_str!("../../../examples/canaryrelease.yaml"))
            .expect("example");
    canary.metadata.name = Some(name.clone());
    let canaries: Api<CanaryRelease> = Api::all(client.clone());
    canaries
        .create(&PostParams::default(), &canary)
        .await
        .expect("create canary");
    for (verb, action) in [
        ("pause", CanaryAction::Pause),
        ("resume", CanaryAction::Resume),
        ("promote", CanaryAction::Promote),
        ("rollback", CanaryAction::Rollback),
    ] {
        let run = kok(kc, &["canary", verb, &name]).await.ok();
        assert!(run.stdout.contains(&format!("{action:?}")), "{run:#?}");
        let now = canaries.get(&name).await.expect("get");
        assert_eq!(now.spec.action, Some(action), "after {verb}");
        // Nothing else in the spec moved.
        assert_eq!(now.spec.packages, canary.spec.packages);
        assert_eq!(now.spec.batches, canary.spec.batches);
    }
    let run = kok(kc, &["canary", "status", &name]).await.ok();
    assert!(
        run.stdout.contains("Action:     Rollback"),
        "{}",
        run.stdout
    );
    let run = kok(kc, &["canary", "status", &name, "-o", "yaml"])
        .await
        .ok();
    let back: CanaryRelease = serde_norway::from_str(&run.stdout).expect("yaml");
    assert_eq!(back.spec.action, Some(CanaryAction::Rollback));

    let example = include_str!("../../../examples/machine.yaml");
    let mut machine: Machine =
        serde_norway::from_str(example.split("\n---\n").last().expect("doc")).expect("machine");
    let machine_name = format!("{ns}-worker");
    machine.metadata.name = Some(machine_name.clone());
    Api::<Machine>::all(client.clone())
        .create(&PostParams::default(), &machine)
        .await
        .expect("create machine");
    let run = kok(kc, &["machine", "list", "-o", "json"]).await.ok();
    let listed: Vec<Machine> = serde_json::from_str(&run.stdout).expect("json");
    assert!(
        listed
            .iter()
            .any(|m| m.metadata.name.as_deref() == Some(machine_name.as_str()))
    );
    let run = kok(kc, &["machine", "describe", &machine_name]).await.ok();
    assert!(
        run.stdout
            .contains(&format!("IP:          {}", machine.spec.ip)),
        "{}",
        run.stdout
    );
}
