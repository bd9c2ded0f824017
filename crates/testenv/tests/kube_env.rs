//! The Kubernetes test environment against the real upstream binaries: what the
//! operator tests rely on must hold here first - a serving API server with our
//! CRDs, scheduling onto kwok nodes, garbage collection, CSR signing, several
//! environments side by side, and no process outliving its test binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kok_testenv::bins;
use kok_testenv::kube_env::{KubeEnv, Options};
use kok_testenv::watchdog;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::KubeConfigOptions;
use kube::{Api, Client};

/// Set in the child process of the leak tests: what `leak_probe` should do.
const PROBE_MODE: &str = "KOK_TESTENV_LEAK_PROBE";
/// Set in the child process of the leak tests: where `leak_probe` writes pids.
const PROBE_OUT: &str = "KOK_TESTENV_LEAK_PROBE_OUT";

/// Fails the test with a clear message when `fut` takes longer than `limit`.
async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(value) => value,
        Err(_) => panic!(
            "{what} did not finish within {limit:?}; component logs: {}",
            KubeEnv::shared().log_dir().display()
        ),
    }
}

/// Polls `check` until it returns `Some`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(what, limit, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
}

#[tokio::test]
async fn api_server_serves_crds_and_kubectl_works() {
    let env = KubeEnv::shared();
    within("the API checks", Duration::from_secs(120), async {
        let client = env.client().await;
        let version = client.apiserver_version().await.expect("server version");
        assert_eq!(
            (version.major.as_str(), version.minor.as_str()),
            ("1", "35")
        );

        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for (file, crd) in kube_on_kube_api::crds() {
            let name = crd.metadata.name.expect("CRD name");
            let live = crds
                .get(&name)
                .await
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let established = live
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            assert!(established, "CRD {name} from {file} is not Established");
        }

        let kubectl = bins::bin("kubectl").expect("kubectl");
        let out = tokio::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["get", "namespaces", "-o", "name"])
            .output()
            .await
            .expect("running kubectl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("namespace/default"), "{stdout}");
        assert!(stdout.contains("namespace/kube-system"), "{stdout}");
    })
    .await;
}

#[tokio::test]
async fn deployment_runs_on_kwok_nodes_and_is_garbage_collected() {
    let env = KubeEnv::shared();
    let ns = env.namespace("deploy").await;
    let client = env.client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "registry.k8s.io/pause:3.10" }] },
            },
        },
    }))
    .expect("deployment manifest");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("creating the deployment");

    eventually("2 ready replicas", Duration::from_secs(120), || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.ready_replicas? == 2).then_some(())
    })
    .await;
    let running = pods.list(&ListParams::default()).await.expect("pods");
    assert_eq!(running.items.len(), 2);
    for pod in &running.items {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        assert!(
            node.as_deref().is_some_and(|n| n.starts_with("kwok-node-")),
            "pod scheduled to {node:?}"
        );
    }
    assert!(
        !replicasets
            .list(&ListParams::default())
            .await
            .expect("replicasets")
            .items
            .is_empty()
    );

    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .expect("deleting the deployment");
    eventually(
        "deployment, replica sets and pods deleted",
        Duration::from_secs(120),
        || async {
            let gone = deployments.get_opt("web").await.ok()?.is_none()
                && replicasets
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                && pods
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty();
            gone.then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn approved_csr_is_signed_by_the_controller_manager() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());

    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "kok-testers");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kok-test-user");
    let request = params
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("PEM");

    let name = "kok-test-user";
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into()]),
            expiration_seconds: Some(3600),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    within(
        "creating and approving the CSR",
        Duration::from_secs(30),
        async {
            csrs.create(&PostParams::default(), &csr)
                .await
                .expect("creating the CSR");
            let approval = serde_json::json!({ "status": { "conditions": [{
                "type": "Approved",
                "status": "True",
                "reason": "KokTestenv",
                "message": "approved by the test",
            }]}});
            csrs.patch_approval(name, &PatchParams::default(), &Patch::Merge(&approval))
                .await
                .expect("approving the CSR");
        },
    )
    .await;

    let certificate = eventually(
        "the signed certificate",
        Duration::from_secs(60),
        || async {
            let csr = csrs.get(name).await.ok()?;
            csr.status?.certificate.filter(|c| !c.0.is_empty())
        },
    )
    .await;

    // The certificate is only good if this API server accepts it: log in with it.
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut kubeconfig = env.kubeconfig().clone();
    for user in &mut kubeconfig.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.client_certificate_data = Some(b64(&certificate.0));
            auth.client_key_data = Some(b64(key.serialize_pem().as_bytes()).into());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config with the issued certificate");
    let user_client = Client::try_from(config).expect("client");
    let review = within("the self subject review", Duration::from_secs(30), async {
        Api::<SelfSubjectReview>::all(user_client)
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .expect("self subject review with the issued certificate")
    })
    .await;
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    assert_eq!(user.username.as_deref(), Some("kok-test-user"));
    assert!(
        user.groups
            .unwrap_or_default()
            .contains(&"kok-testers".to_owned())
    );
}

#[tokio::test]
async fn independent_env_runs_beside_the_shared_one() {
    let shared = KubeEnv::shared();
    let started = Instant::now();
    let business = KubeEnv::start(Options {
        controller_manager: false,
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("starting a second environment: {}", e.report()));
    eprintln!("second environment ready in {:?}", started.elapsed());
    assert_ne!(shared.api_url(), business.api_url());
    assert_ne!(shared.kubeconfig_path(), business.kubeconfig_path());

    within("using both environments", Duration::from_secs(60), async {
        let ns = business.namespace("business").await;
        let in_business: Api<Namespace> = Api::all(business.client().await);
        let in_shared: Api<Namespace> = Api::all(shared.client().await);
        assert!(in_business.get_opt(&ns).await.expect("get").is_some());
        assert!(in_shared.get_opt(&ns).await.expect("get").is_none());
        let crds: Api<CustomResourceDefinition> = Api::all(business.client().await);
        assert_eq!(
            crds.list(&ListParams::default())
                .await
                .expect("crds")
                .items
                .len(),
            kube_on_kube_api::crds().len()
        );
    })
    .await;

    let pids: Vec<(String, u32, u64)> = business
        .processes()
        .into_iter()
        .map(|(name, pid)| {
            let (_, start) = proc_stat(pid).unwrap_or_else(|| panic!("{name} is not running"));
            (name.to_owned(), pid, start)
        })
        .collect();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver: {pids:?}");
    let state = business
        .kubeconfig_path()
        .parent()
        .map(Path::to_owned)
        .expect("state dir");
    drop(business);
    assert_all_gone(&pids, Duration::from_secs(10));
    assert!(!state.exists(), "{} was not deleted", state.display());
}

/// A child of the leak tests, not a test of its own: does nothing unless
/// `KOK_TESTENV_LEAK_PROBE` is set. Then it starts the shared environment,
/// records its processes, and either panics or waits to be killed.
#[test]
fn leak_probe() {
    let Ok(mode) = std::env::var(PROBE_MODE) else {
        return;
    };
    let out = PathBuf::from(std::env::var_os(PROBE_OUT).expect("probe output path"));
    let env = KubeEnv::shared();
    let lines: Vec<String> = env
        .processes()
        .into_iter()
        .filter_map(|(name, pid)| {
            let (_, start) = proc_stat(pid)?;
            Some(format!("{name} {pid} {start}"))
        })
        .collect();
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, lines.join("\n")).expect("writing the probe output");
    std::fs::rename(&tmp, &out).expect("publishing the probe output");
    match mode.as_str() {
        "panic" => panic!("the leak probe fails on purpose"),
        _ => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
    }
}

#[test]
fn no_process_survives_a_failing_test() {
    let mut probe = Probe::start("panic");
    let status = probe.wait(Duration::from_secs(240));
    assert_eq!(
        status.code(),
        Some(101),
        "the probe should fail its test; {}",
        probe.output()
    );
    let pids = probe.pids();
    assert_all_gone(&pids, Duration::from_secs(10));
}

#[test]
fn no_process_survives_a_killed_test_binary() {
    let mut probe = Probe::start("hang");
    let deadline = Instant::now() + Duration::from_secs(240);
    while !probe.out.exists() {
        if let Ok(Some(status)) = probe.child.try_wait() {
            panic!("the probe exited ({status}) early; {}", probe.output());
        }
        assert!(
            Instant::now() < deadline,
            "the probe did not start its environment; {}",
            probe.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let pids = probe.pids();
    probe.child.kill().expect("SIGKILL to the probe");
    let _ = probe.child.wait();
    assert_all_gone(&pids, Duration::from_secs(10));
}

#[test]
fn a_hung_test_binary_is_stopped_by_its_watchdog() {
    let limit = Duration::from_secs(40);
    let mut probe = Probe::start_with("hang", Some(&format!("{}s", limit.as_secs())));
    let started = Instant::now();
    let status = probe.wait(Duration::from_secs(240));
    let took = started.elapsed();
    let output = probe.output();
    assert_eq!(status.code(), Some(101), "{output}");
    assert!(
        took >= limit,
        "exited after {took:?}, before the limit; {output}"
    );
    assert!(
        output.contains(watchdog::TIMEOUT_VAR) && output.contains("a test hangs"),
        "{output}"
    );
    println!("watchdog stopped the hung probe after {took:?}");
    let pids = probe.pids();
    assert_all_gone(&pids, Duration::from_secs(10));
}

/// This test binary run again with only `leak_probe` selected.
struct Probe {
    child: std::process::Child,
    dir: tempfile::TempDir,
    out: PathBuf,
}

impl Probe {
    fn start(mode: &str) -> Probe {
        Self::start_with(mode, None)
    }

    /// With `watchdog` as the probe's `KOK_TEST_BINARY_TIMEOUT`; `None`
    /// removes it, so the limit this run may have does not reach the probe.
    fn start_with(mode: &str, watchdog: Option<&str>) -> Probe {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("pids");
        let exe = std::env::current_exe().expect("test binary path");
        let log =
            |name: &str| std::fs::File::create(dir.path().join(name)).expect("probe log file");
        let mut command = Command::new(exe);
        match watchdog {
            Some(limit) => command.env(watchdog::TIMEOUT_VAR, limit),
            None => command.env_remove(watchdog::TIMEOUT_VAR),
        };
        let child = command
            .args(["leak_probe", "--exact", "--nocapture", "--test-threads=1"])
            .env(PROBE_MODE, mode)
            .env(PROBE_OUT, &out)
            .stdin(Stdio::null())
            .stdout(log("stdout"))
            .stderr(log("stderr"))
            .spawn()
            .expect("starting the probe");
        Probe { child, dir, out }
    }

    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the probe did not exit within {limit:?}; {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn pids(&self) -> Vec<(String, u32, u64)> {
        let text = std::fs::read_to_string(&self.out)
            .unwrap_or_else(|e| panic!("no probe output ({e}); {}", self.output()));
        let pids: Vec<(String, u32, u64)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some((
                    parts.next()?.to_owned(),
                    parts.next()?.parse().ok()?,
                    parts.next()?.parse().ok()?,
                ))
            })
            .collect();
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            assert!(
                pids.iter().any(|(n, _, _)| n == name),
                "the probe did not run {name}: {pids:?}"
            );
        }
        pids
    }

    fn output(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "probe stdout:\n{}\nprobe stderr:\n{}",
            read("stdout"),
            read("stderr")
        )
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// State letter and start time (in clock ticks since boot) of a process.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; the fields after it do not.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// Alive means: the same process (same start time) and not a zombie.
fn alive(pid: u32, start: u64) -> bool {
    matches!(proc_stat(pid), Some((state, s)) if s == start && state != 'Z')
}

fn assert_all_gone(pids: &[(String, u32, u64)], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let survivors: Vec<_> = pids
            .iter()
            .filter(|(_, pid, start)| alive(*pid, *start))
            .collect();
        if survivors.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes survived their test binary: {survivors:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
