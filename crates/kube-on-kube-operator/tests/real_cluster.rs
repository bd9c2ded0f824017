//! The examples become working Kubernetes clusters: the operator runs as a Pod
//! of the real meta-cluster, every control-plane Pod runs as a real process
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and the
//! node-operator next to them), and the business API answers with the
//! kubeconfigs the operator wrote: `/readyz` on every kube-apiserver, the
//! admin lists namespaces, every extra user is who the Cluster says with the
//! groups it says, the add-ons are in, every condition is True; deleting the
//! Cluster removes everything, timed.
//!
//! `examples/cluster-minimal.yaml` and `examples/cluster-production.yaml` are
//! applied as they are, except for what the test environment needs: the
//! namespace, and for the Minimal example (which has no placement) a node
//! selector for the runner's nodes. The runner's nodes carry the control-plane
//! label the Production example selects. The two run one after the other so
//! the machine carries one control plane at a time.
//!
//! A Minimal Cluster that comes to be exposed by a LoadBalancer gets its
//! address from the meta-cluster's load balancer: kube-apiserver rolls once
//! onto it, the endpoint is that address, the admin reaches the business API
//! there from the machine, and the business cluster's `kubernetes` Service
//! points at it.

use kok_test_support as common;

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    grant_operator, kubeconfig_file, node_operator_binary, start_operator_pod,
    wait_apiserver_rolled_out,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::load_balancer::wait_for_ingress;
use kok_testenv::pods::{Options, PodRunner};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterPhase, ExtraUser};
use serde_json::Value;

/// The label the Production example's placement selects.
const CONTROL_PLANE_LABEL: &str = "node-role.kubeonkube.io/control-plane";

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let operator = env!("CARGO_BIN_EXE_kube-on-kube-operator");
        PodRunner::start(
            KubeEnv::shared(),
            Options {
                nodes: vec!["cp-0".into(), "cp-1".into(), "cp-2".into()],
                labels: [(CONTROL_PLANE_LABEL.to_string(), String::new())].into(),
                programs: [
                    ("kube-on-kube-operator".to_string(), operator.into()),
                    ("node-operator".to_string(), node_operator_binary()),
                ]
                .into(),
                // The meta-cluster's load balancer, for the external
                // Services of type LoadBalancer.
                load_balancer: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"))
    })
}

/// One control plane at a time on this machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(kok_testenv::bins::bin("kubectl").expect("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .expect("run kubectl")
}

/// kubectl against one kube-apiserver Pod's address, checked against the name
/// in its certificate; stdout on success.
fn kubectl_at(ip: &str, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let server = format!("--server=https://{ip}:6443");
    let mut all = vec![server.as_str(), "--tls-server-name=kubernetes"];
    all.extend_from_slice(args);
    let out = kubectl(kubeconfig, &all);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {args:?} at {ip}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The HTTP status an anonymous request to `url` gets (curl, no client
/// certificate, the server's certificate not checked); `extra` adds curl
/// flags. None when no TLS connection is made.
fn anonymous_status(url: &str, extra: &[&str]) -> Option<u16> {
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    let code: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    (out.status.success() && code != 0).then_some(code)
}

/// The HTTP status an anonymous request to `url` gets once a connection is
/// made: a component that restarts (a controller-manager that lost its
/// lease on a loaded machine exits and starts again) is given 30 s to
/// listen again; what it answers is judged at once.
async fn anonymous_answer(url: &str) -> Option<u16> {
    let started = std::time::Instant::now();
    loop {
        let status = anonymous_status(url, &[]);
        if status.is_some() || started.elapsed() > std::time::Duration::from_secs(30) {
            return status;
        }
        println!("{url}: no connection yet");
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Addresses of the ready Pods of one component.
async fn ready_ips(client: &Client, ns: &str, name: &str, component: &str) -> Vec<String> {
    common::ready_pods(client, ns, name, component)
        .await
        .into_iter()
        .filter_map(|p| p.status.and_then(|s| s.pod_ip))
        .collect()
}

/// What one example must come to, beyond what every Cluster does.
struct Expect {
    /// Replicas of every component.
    replicas: i32,
    /// Objects user add-ons put into the business cluster: `kubectl get` args.
    user_addons: Vec<Vec<&'static str>>,
}

/// Apply `cluster` (with `templates` registered next to it) and check it
/// becomes a working Kubernetes; then delete it and time that.
async fn example_becomes_a_working_kubernetes(
    prefix: &str,
    mut cluster: Cluster,
    templates: Vec<ConfigMap>,
    expect: Expect,
    ready_within: Duration,
) {
    let _one = ONE_AT_A_TIME.lock().await;
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(prefix).await;
    // The operator runs as a Pod of the meta-cluster, as it does in
    // production: it reaches the business API through its internal Service.
    grant_operator(&client, &ns).await;
    start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for mut template in templates {
        template.metadata.namespace = Some(ns.clone());
        maps.create(&PostParams::default(), &template)
            .await
            .expect("add-on template");
    }
    let name = cluster.name_any();
    cluster.metadata.namespace = Some(ns.clone());
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");

    let ready = common::wait_cluster(
        &clusters,
        &name,
        "every condition True",
        ready_within,
        common::all_ready,
    )
    .await;
    println!(
        "{name}: every condition True {:?} after create",
        started.elapsed()
    );
    let status = ready.status.clone().expect("status");
    assert_eq!(status.phase, Some(ClusterPhase::Running));
    assert_eq!(status.observed_generation, ready.metadata.generation);
    let components = status.components.clone().expect("components");
    let want = format!("{0}/{0}", expect.replicas);
    for (what, c) in [
        ("etcd", &components.etcd),
        ("kube-apiserver", &components.api_server),
        ("kube-controller-manager", &components.controller_manager),
        ("kube-scheduler", &components.scheduler),
    ] {
        assert_eq!(c.ready, want, "{what}: {c:?}");
    }
    assert_eq!(status.etcd_members.len(), expect.replicas as usize);
    assert!(
        status.etcd_members.iter().all(|m| m.healthy && !m.learner),
        "{:?}",
        status.etcd_members
    );
    let admin_secret = status
        .admin_kubeconfig_secret
        .clone()
        .expect("admin secret");
    let endpoint = status.endpoint.clone().expect("endpoint");
    println!("{name}: endpoint {endpoint}");
    let conditions: Vec<_> = status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.reason.as_str(), c.message.as_str()))
        .collect();
    println!("{name}: {conditions:#?}");

    // Every kube-apiserver answers /readyz; the admin lists namespaces.
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = kubeconfig_file(&client, &ns, &admin_secret, dir.path()).await;
    let apiservers = ready_ips(&client, &ns, &name, "apiserver").await;
    assert_eq!(apiservers.len(), expect.replicas as usize, "{apiservers:?}");
    for ip in &apiservers {
        let readyz =
            kubectl_at(ip, &admin, &["get", "--raw", "/readyz"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(readyz.trim(), "ok", "{ip}");
    }
    // Hardened as docs/security.md lists: without credentials only the
    // health endpoints and cluster-info answer, TLS below 1.2 gets no connection, and
    // profiling is off even for the admin. The controller-manager's and
    // scheduler's metrics want credentials too.
    for ip in &apiservers {
        let url = |path: &str| format!("https://{ip}:6443{path}");
        for path in [
            "/readyz",
            "/livez",
            "/healthz",
            "/api/v1/namespaces/kube-public/configmaps/cluster-info",
        ] {
            assert_eq!(anonymous_answer(&url(path)).await, Some(200), "{ip}{path}");
        }
        for path in [
            "/version",
            "/api",
            "/apis",
            "/api/v1/namespaces",
            "/api/v1/namespaces/kube-public/configmaps",
        ] {
            assert_eq!(anonymous_answer(&url(path)).await, Some(401), "{ip}{path}");
        }
        let old_tls = ["--tlsv1.1", "--tls-max", "1.1"];
        assert_eq!(
            anonymous_status(&url("/readyz"), &old_tls),
            None,
            "{ip}: TLS 1.1"
        );
        let pprof = kubectl_at(ip, &admin, &["get", "--raw", "/debug/pprof/"]);
        assert!(
            pprof
                .as_ref()
                .is_err_and(|e| e.contains("NotFound") || e.contains("not found")),
            "{ip}: profiling answered {pprof:?}"
        );
    }
    for (component, port) in [("controller-manager", 10257), ("scheduler", 10259)] {
        for ip in ready_ips(&client, &ns, &name, component).await {
            let url = |path: &str| format!("https://{ip}:{port}{path}");
            assert_eq!(
                anonymous_answer(&url("/healthz")).await,
                Some(200),
                "{component} {ip}"
            );
            // Refused once the component's delegated authentication and
            // authorization reach kube-apiserver (a 500 until they do);
            // never served.
            let started = std::time::Instant::now();
            loop {
                let metrics = anonymous_status(&url("/metrics"), &[]);
                assert_ne!(
                    metrics,
                    Some(200),
                    "{component} {ip}: anonymous /metrics served"
                );
                if matches!(metrics, Some(401 | 403)) {
                    break;
                }
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(30),
                    "{component} {ip}: anonymous /metrics answered {metrics:?}"
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
    let ip = apiservers[0].as_str();
    let namespaces = kubectl_at(ip, &admin, &["get", "namespaces", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    for wanted in [
        "namespace/default",
        "namespace/kube-system",
        "namespace/kube-public",
    ] {
        assert!(namespaces.contains(wanted), "{wanted} not in {namespaces}");
    }

    // Every extra user authenticates with the groups the Cluster gives it.
    assert!(!cluster.spec.extra_users.is_empty(), "nothing to check");
    for user in &cluster.spec.extra_users {
        let secret = format!("{name}-kubeconfig-{}", user.name);
        let kubeconfig = kubeconfig_file(&client, &ns, &secret, dir.path()).await;
        let out = kubectl_at(ip, &kubeconfig, &["auth", "whoami", "-o", "json"])
            .unwrap_or_else(|e| panic!("{e}"));
        let who: Value = serde_json::from_str(&out).expect("whoami json");
        let info = &who["status"]["userInfo"];
        assert_eq!(info["username"], user.name.as_str(), "{who}");
        let mut groups: Vec<String> = info["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect();
        groups.sort();
        let mut wanted = user.groups.clone();
        wanted.push("system:authenticated".into());
        wanted.sort();
        assert_eq!(groups, wanted, "{}: {who}", user.name);
    }

    // The add-ons are in the business cluster.
    let get = |args: &[&str]| {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = kubectl_at(ip, &admin, &all).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str::<Value>(&out).expect("json")
    };
    let info = get(&["-n", "kube-public", "configmap", "cluster-info"]);
    let info = info["data"]["kubeconfig"].as_str().unwrap_or_default();
    assert_eq!(
        common::kubeconfig_server(info).as_deref(),
        Some(endpoint.as_str()),
        "{info}"
    );
    for binding in [
        "kube-on-kube:kubelet-bootstrap",
        "kube-on-kube:node-autoapprove-certificate-rotation",
        "kube-on-kube:node-operator",
        "kube-on-kube:node-proxier",
    ] {
        get(&["clusterrolebinding", binding]);
    }
    get(&["-n", "kube-system", "daemonset", "kube-proxy"]);
    get(&["-n", "kube-system", "deployment", "coredns"]);
    let dns = get(&["-n", "kube-system", "service", "kube-dns"]);
    let dns_ip = dns["spec"]["clusterIP"].as_str().unwrap_or_default();
    assert!(dns_ip.ends_with(".10"), "{dns}");
    for crd in [
        "machines.kubeonkube.io",
        "packageversions.kubeonkube.io",
        "clusterpackageversions.kubeonkube.io",
        "canaryreleases.kubeonkube.io",
    ] {
        get(&["crd", crd]);
    }
    for args in &expect.user_addons {
        let object = get(args);
        let labels = &object["metadata"]["labels"];
        assert!(
            labels["kubeonkube.io/addon"].is_string(),
            "{args:?}: {labels}"
        );
    }

    // The node-operator runs next to the control plane and reached the
    // business API with its own kubeconfig.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let node_operator = deployments
        .get(&format!("{name}-node-operator"))
        .await
        .expect("node-operator Deployment");
    assert_eq!(
        node_operator.status.as_ref().and_then(|s| s.ready_replicas),
        Some(1)
    );
    let connected = common::node_operator_connected(runner, &client, &ns, &name).await;
    assert!(
        connected.contains(&format!("v{}", cluster.spec.version)),
        "{connected}"
    );

    // Deleting the Cluster removes everything it owns.
    let deleted = Instant::now();
    clusters
        .delete(&name, &DeleteParams::background())
        .await
        .expect("delete");
    let selector = ListParams::default().labels(&format!("kubeonkube.io/cluster={name}"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "every object of the cluster to go",
        Duration::from_secs(120),
        async || {
            let left = pods.list(&selector).await.ok()?.items.len()
                + services.list(&selector).await.ok()?.items.len()
                + secrets.list(&selector).await.ok()?.items.len()
                + claims.list(&selector).await.ok()?.items.len()
                + deployments.list(&selector).await.ok()?.items.len()
                + maps.list(&selector).await.ok()?.items.len()
                + clusters.get_opt(&name).await.ok()?.iter().count();
            (left == 0).then_some(())
        },
    )
    .await;
    println!(
        "{name}: everything gone {:?} after delete",
        deleted.elapsed()
    );
    pods.delete("operator", &DeleteParams::default())
        .await
        .expect("stop the operator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_example_becomes_a_working_kubernetes() {
    let mut cluster = common::minimal_on_runner();
    cluster.spec.extra_users = vec![ExtraUser {
        name: "sre".into(),
        groups: vec!["system:masters".into(), "sre".into()],
    }];
    example_becomes_a_working_kubernetes(
        "minimal",
        cluster,
        vec![],
        Expect {
            replicas: 1,
            user_addons: vec![],
        },
        Duration::from_secs(360),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_example_becomes_a_working_kubernetes() {
    let cluster: Cluster = common::production_example();
    let metrics_server: ConfigMap = serde_norway::from_str(include_str!(
        "../../../examples/addon-template-metrics-server.yaml"
    ))
    .expect("add-on template example");
    example_becomes_a_working_kubernetes(
        "production",
        cluster,
        vec![metrics_server],
        Expect {
            replicas: 3,
            user_addons: vec![
                vec!["-n", "kube-system", "deployment", "metrics-server"],
                vec!["apiservice", "v1beta1.metrics.k8s.io"],
            ],
        },
        Duration::from_secs(600),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_behind_a_load_balancer_advertises_its_address() {
    let _one = ONE_AT_A_TIME.lock().await;
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("behind-lb").await;
    grant_operator(&client, &ns).await;
    start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
    // Inside the meta-cluster only at first (the example has a LoadBalancer).
    let cluster = common::minimal_inside(&ns);
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let apiserver_args = |d: &Deployment| {
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].args.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    // Running inside the meta-cluster first (ClusterIP): nothing to
    // advertise.
    common::ready_cluster(&clusters, &name, None).await;
    let before = deployments
        .get(&format!("{name}-apiserver"))
        .await
        .expect("kube-apiserver Deployment");
    assert!(
        apiserver_args(&before).contains(&"--endpoint-reconciler-type=none".to_string()),
        "{:?}",
        apiserver_args(&before)
    );

    // Then exposed by a LoadBalancer.
    let exposed = Instant::now();
    clusters
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"apiServer": {"external": {"type": "LoadBalancer"}}}}),
            ),
        )
        .await
        .expect("expose");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let ip = wait_for_ingress(
        &services,
        &format!("{name}-apiserver-external"),
        Duration::from_secs(60),
    )
    .await;
    let endpoint = format!("https://{ip}:6443");
    let ready = common::ready_cluster(&clusters, &name, Some(&endpoint)).await;
    println!(
        "{name}: Ready at {endpoint} {:?} after the change",
        exposed.elapsed()
    );
    // kube-apiserver rolled once, onto the address (and the certificate
    // that names it).
    wait_apiserver_rolled_out(&client, &ns, &name, 1).await;
    let after = deployments
        .get(&format!("{name}-apiserver"))
        .await
        .expect("kube-apiserver Deployment");
    let args = apiserver_args(&after);
    assert!(
        args.contains(&format!("--advertise-address={ip}"))
            && args.contains(&"--endpoint-reconciler-type=lease".to_string()),
        "{args:?}"
    );
    assert_eq!(
        after.metadata.generation,
        before.metadata.generation.map(|g| g + 1)
    );

    // The admin reaches the business API from the machine through the
    // load balancer, checking the certificate against its address.
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = ready
        .status
        .and_then(|s| s.admin_kubeconfig_secret)
        .expect("admin secret");
    let admin = kubeconfig_file(&client, &ns, &secret, dir.path()).await;
    let text = std::fs::read_to_string(&admin).expect("kubeconfig");
    assert_eq!(
        common::kubeconfig_server(&text).as_deref(),
        Some(endpoint.as_str())
    );
    let readyz = kubectl(&admin, &["get", "--raw", "/readyz"]);
    assert!(
        readyz.status.success(),
        "{}",
        String::from_utf8_lossy(&readyz.stderr)
    );

    // The business cluster's `kubernetes` Service points at the address.
    let slice = wait_for(
        "the kubernetes EndpointSlice to hold the load balancer's address",
        Duration::from_secs(60),
        async || {
            let out = kubectl(
                &admin,
                &[
                    "get",
                    "-n",
                    "default",
                    "endpointslice",
                    "kubernetes",
                    "-o",
                    "json",
                ],
            );
            let slice: Value = serde_json::from_slice(&out.stdout).ok()?;
            let addresses: Vec<&str> = slice["endpoints"]
                .as_array()?
                .iter()
                .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
                .collect();
            (addresses == [ip.to_string().as_str()]).then_some(slice)
        },
    )
    .await;
    assert_eq!(slice["ports"][0]["port"], 6443, "{slice}");
    // Not rolled again since.
    let last = deployments
        .get(&format!("{name}-apiserver"))
        .await
        .expect("kube-apiserver Deployment");
    assert_eq!(last.metadata.generation, after.metadata.generation);

    common::delete_and_stop_operator(&client, &ns, &name).await;
}

/// A Cluster with audit (the default policy, to a log file and a webhook)
/// and a JWT issuer from a tenant's ConfigMap: the real kube-apiserver
/// accepts the issuer's token as the user the ConfigMap maps it to and
/// refuses one for another audience, and the request is audited, in the log
/// file of kube-apiserver's Pod and at the webhook. A ConfigMap that tries
/// to open anonymous access is refused with the reason on APIServerReady,
/// and kube-apiserver keeps running with the files it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_audits_and_accepts_its_oidc_issuers() {
    let _one = ONE_AT_A_TIME.lock().await;
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("audit-oidc").await;
    grant_operator(&client, &ns).await;
    start_operator_pod(&client, &ns, &runner.nodes()[0]).await;
    let issuer = kok_testenv::issuer::TestIssuer::start(runner.gateway()).await;

    let authentication = |extra: &str| -> ConfigMap {
        let config = format!(
            "apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: {url}
    audiences: [kok-test]
    certificateAuthority: |
{ca}
  claimMappings:
    username: {{claim: sub, prefix: 'oidc:'}}
{extra}",
            url = issuer.url,
            ca = issuer
                .ca_pem
                .lines()
                .map(|l| format!("      {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "oidc"},
            "data": {"authentication-configuration.yaml": config},
        }))
        .expect("ConfigMap")
    };
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(&PostParams::default(), &authentication(""))
        .await
        .expect("oidc ConfigMap");
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let webhook = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: sink
  cluster: {{server: '{}/audit', certificate-authority-data: {}}}
users:
- name: sink
  user: {{token: audit-sink}}
contexts:
- name: sink
  context: {{cluster: sink, user: sink}}
current-context: sink
",
        issuer.url,
        b64(&issuer.ca_pem)
    );
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "audit-sink"},
        "stringData": {"kubeconfig": webhook},
    }))
    .expect("Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("webhook Secret");

    let mut cluster = common::minimal_inside(&ns);
    cluster.spec.api_server.audit = Some(
        serde_json::from_value(serde_json::json!({
            "log": {"maxSizeMB": 10, "maxBackups": 1},
            "webhook": {"kubeconfigSecret": "audit-sink"},
        }))
        .expect("audit"),
    );
    cluster.spec.api_server.authentication = Some(
        serde_json::from_value(serde_json::json!({"configMap": "oidc"})).expect("authentication"),
    );
    let name = cluster.name_any();
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    let ready = common::ready_cluster(&clusters, &name, None).await;
    let ip = ready_ips(&client, &ns, &name, "apiserver")
        .await
        .into_iter()
        .next()
        .expect("a ready kube-apiserver");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.crt");
    let admin_secret = ready
        .status
        .and_then(|s| s.admin_kubeconfig_secret)
        .expect("admin secret");
    let admin = kubeconfig_file(&client, &ns, &admin_secret, dir.path()).await;
    let text = std::fs::read_to_string(&admin).expect("kubeconfig");
    let parsed: kube::config::Kubeconfig = serde_norway::from_str(&text).expect("kubeconfig");
    let ca_data = parsed.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("CA");
    use base64::Engine;
    std::fs::write(
        &ca,
        base64::engine::general_purpose::STANDARD
            .decode(ca_data)
            .expect("CA base64"),
    )
    .expect("write CA");
    let whoami = |token: String| {
        let out = std::process::Command::new("kubectl")
            .args([
                "--kubeconfig=/dev/null",
                &format!("--server=https://{ip}:6443"),
                "--tls-server-name=kubernetes",
                &format!("--certificate-authority={}", ca.display()),
                &format!("--token={token}"),
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ])
            .output()
            .expect("kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // kube-apiserver fetches the issuer's keys once it starts: the first
    // token may come before them.
    let user = wait_for(
        "the issuer's token to be accepted",
        Duration::from_secs(60),
        async || {
            let (ok, out, _) = whoami(issuer.token("alice", "kok-test"));
            ok.then_some(out)
        },
    )
    .await;
    assert_eq!(user, "oidc:alice");
    let (ok, _, err) = whoami(issuer.token("mallory", "another-audience"));
    assert!(!ok && err.contains("Unauthorized"), "{err}");

    // Audited: at the webhook, and in the log file of the Pod.
    let audited = |e: &Value| {
        e["user"]["username"] == "oidc:alice"
            && e["objectRef"]["resource"] == "selfsubjectreviews"
            && e["stage"] == "ResponseComplete"
    };
    let event = wait_for(
        "the webhook's audit event",
        Duration::from_secs(60),
        async || {
            let found = issuer.audit_events().into_iter().find(audited);
            if found.is_none() {
                println!("requests at the issuer: {:?}", issuer.requests());
            }
            found
        },
    )
    .await;
    assert_eq!(event["level"], "Metadata", "{event}");
    assert!(event.get("requestObject").is_none(), "{event}");
    let logs = find_files(env.log_dir(), "audit.log");
    let logged = logs.iter().any(|path| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|e| audited(&e))
    });
    assert!(logged, "no audit log names the request: {logs:?}");

    // A ConfigMap opening anonymous access: refused, held, said.
    let apiserver = |deployments: Vec<Deployment>| {
        deployments
            .into_iter()
            .find(|d| d.name_any() == format!("{name}-apiserver"))
            .and_then(|d| d.spec?.template.metadata?.annotations)
            .and_then(|a| a.get("kubeonkube.io/config-hash").cloned())
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let hash_before = apiserver(
        deployments
            .list(&Default::default())
            .await
            .expect("list")
            .items,
    );
    maps.replace(
        "oidc",
        &PostParams::default(),
        &ConfigMap {
            metadata: maps.get("oidc").await.expect("oidc").metadata,
            ..authentication("anonymous: {enabled: true}\n")
        },
    )
    .await
    .expect("replace oidc");
    // The edit wakes the Cluster that names the ConfigMap (nothing else
    // changes here; its next pass would otherwise be an hour away).
    let held = wait_for(
        "the refusal on APIServerReady",
        Duration::from_secs(60),
        async || {
            let c = clusters.get(&name).await.ok()?;
            let (status, reason, message) = common::condition_of(&c, "APIServerReady")?;
            (status == "False" && reason == "AuthenticationConfigRefused").then_some(message)
        },
    )
    .await;
    assert!(held.contains("anonymous is set by the operator"), "{held}");
    let (ok, user, err) = whoami(issuer.token("alice", "kok-test"));
    assert!(ok && user == "oidc:alice", "{err}");
    assert_eq!(
        apiserver(
            deployments
                .list(&Default::default())
                .await
                .expect("list")
                .items
        ),
        hash_before,
        "kube-apiserver rolled onto a refused configuration"
    );

    common::delete_and_stop_operator(&client, &ns, &name).await;
}

/// Files named `file` under `dir`, at any depth.
fn find_files(dir: &Path, file: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(path);
            } else if entry.file_name() == file {
                found.push(path);
            }
        }
    }
    found
}
