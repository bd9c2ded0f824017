//! Add-ons of a real business cluster: the operator runs as a Pod, the
//! Cluster's control plane runs as real processes, and the add-ons appear in
//! the business API: kube-proxy, CoreDNS at the tenth Service address, the
//! bootstrap pieces (shown to work: cluster-info read without credentials and
//! signed for a bootstrap token, a kubelet client certificate requested with
//! that token approved and signed, and renewed with the node's own
//! certificate), the node-operator's CRDs, user-registered templates (from the
//! Cluster's namespace and from the operator's template namespace); the
//! node-operator itself runs next to the control plane and reaches the
//! business API. Unchanged add-ons are not re-applied, a deleted object comes
//! back, a version bump re-applies and prunes what the new version dropped,
//! disabling removes, and an invalid template or an unknown add-on is reported
//! while everything else keeps running.

use kok_test_support as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{business_client, grant_operator, node_operator_binary, secret_value, start_runner};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, Service};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::{PodRunner, RUNNER_LABEL};
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{ClusterMode, Placement};
use serde_json::{Value, json};

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| start_runner(vec![("node-operator".into(), node_operator_binary())]))
}

const NODE_OPERATOR_IMAGE: &str = "example.test/kok/node-operator:dev";
/// The bootstrap token the test joins with: `<id>.<secret>`.
const TOKEN_ID: &str = "kokt01";
const TOKEN_SECRET: &str = "0123456789abcdef";
/// The group node-operator's bootstrap tokens carry.
const TOKEN_GROUP: &str = "system:bootstrappers:kube-on-kube";

/// Run the operator's binary as a Pod watching `ns`, taking add-on templates
/// also from `templates`.
async fn start_operator(client: &Client, ns: &str, templates: &str, node: &str) {
    grant_operator(client, ns).await;
    let extra = [
        format!("--addon-template-namespace={templates}"),
        format!("--node-operator-image={NODE_OPERATOR_IMAGE}"),
    ];
    common::start_operator_pod_with(client, ns, node, &extra).await;
}

/// A user add-on template ConfigMap: `demo` at `version`, with `template`.
fn template_map(namespace: &str, version: &str, template: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("demo-{version}"),
            "namespace": namespace,
            "labels": {"kubeonkube.io/addon-template": "demo"}
        },
        "data": {"version": version, "values.yaml": "greeting: hello\n", "template.yaml": template}
    }))
    .expect("template")
}

/// `demo` at `version`, making the ConfigMap `config_map` in the namespace
/// `demo` of the business cluster.
fn demo_template(namespace: &str, version: &str, config_map: &str) -> ConfigMap {
    let template = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {config_map}\n  namespace: demo\n\
         data:\n  greeting: {{{{ values.greeting | yaml }}}}\n  cluster: {{{{ cluster.name | yaml }}}}\n  dns: {{{{ network.dnsIP | yaml }}}}\n"
    );
    template_map(namespace, version, &template)
}

/// The AddonsReady condition: (status, reason, message).
fn addons_condition(c: &Cluster) -> Option<(String, String, String)> {
    let c = c.status.as_ref()?.condition("AddonsReady")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// kubectl against the business API, at the apiserver Pod's address checked
/// against the name in its certificate.
struct Business {
    kubeconfig: PathBuf,
    server: String,
}

impl Business {
    fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(kok_testenv::bins::bin("kubectl").expect("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--server={}", self.server))
            .arg("--tls-server-name=kubernetes")
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// The object as JSON, or None when it does not exist (any other failure
    /// panics).
    fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.run(&all);
        if out.status.success() {
            return Some(serde_json::from_slice(&out.stdout).expect("json"));
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("NotFound"), "kubectl {args:?}: {err}");
        None
    }
}

async fn business(client: &Client, ns: &str, dir: &Path) -> Business {
    let ip = common::ready_pods(client, ns, "ci", "apiserver")
        .await
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("a ready apiserver pod with an address");
    let kubeconfig = common::kubeconfig_file(client, ns, "ci-admin-kubeconfig", dir).await;
    Business {
        kubeconfig,
        server: format!("https://{ip}:6443"),
    }
}

/// A client of the business API at `server`, trusting the cluster CA
/// (`ca_data`, base64) and presenting `user` (kubeconfig `user` fields; `{}`
/// for an anonymous client).
async fn client_as(server: &str, ca_data: &str, user: Value) -> Client {
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "business", "cluster": {
            "server": server,
            "certificate-authority-data": ca_data,
            "tls-server-name": "kubernetes"}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "business", "user": "user"}}],
        "current-context": "ctx"
    }))
    .expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    Client::try_from(config).expect("client")
}

/// Who the business API takes `client` for: (user name, groups).
async fn whoami(client: &Client) -> (String, Vec<String>) {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let info = review.status.and_then(|s| s.user_info).unwrap_or_default();
    (
        info.username.unwrap_or_default(),
        info.groups.unwrap_or_default(),
    )
}

/// Request a kubelet client certificate for `node` as `requester` and wait
/// until the business cluster approves and signs it on its own: the
/// certificate (PEM) and its key.
async fn kubelet_certificate(
    requester: &Client,
    admin: &Client,
    node: &str,
    what: &str,
    auto_approved: bool,
) -> (Vec<u8>, String) {
    let (csr, key) = kok_testenv::node_csr(node).expect("csr");
    let request: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(csr),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"]
        }
    }))
    .expect("csr");
    let created = Api::<CertificateSigningRequest>::all(requester.clone())
        .create(&PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("{what}: creating the CSR: {e}"));
    let name = created.name_any();
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let reason = if auto_approved {
        "AutoApproved"
    } else {
        // Nothing in the business cluster approves it by itself (the
        // controller-manager decides at once when it decides at all); an
        // approver with the right to (the node-operator, for its Machines'
        // tokens) does.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let status = csrs.get(&name).await.expect("csr").status;
        assert!(
            status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .is_empty(),
            "{what}: CSR {name} was decided by the cluster itself"
        );
        let approval = json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "ApprovedByTheTest",
            "message": "a token of no Machine; approved by the admin",
        }]}});
        csrs.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&approval))
            .await
            .expect("approve");
        "ApprovedByTheTest"
    };
    let signed = wait_for(
        &format!("{what}: CSR {name} to be approved and signed"),
        Duration::from_secs(90),
        async || {
            let csr = csrs.get(&name).await.ok()?;
            let status = csr.status?;
            let approved = status.conditions.iter().flatten().any(|c| {
                c.type_ == "Approved" && c.status == "True" && c.reason.as_deref() == Some(reason)
            });
            let certificate = status.certificate.filter(|c| !c.0.is_empty())?;
            approved.then_some(certificate.0)
        },
    )
    .await;
    (signed, key)
}

/// The bootstrap add-on at work, as a kubelet joining with a bootstrap token
/// uses it (what kubeadm's bootstrap-token phase sets up).
async fn bootstrap_works(client: &Client, ns: &str, server: &str, endpoint: &str) {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let ca_data = b64(&secret_value(client, ns, "ci-ca", "tls.crt").await);

    // cluster-info is readable without credentials, names the endpoint and
    // the cluster CA, and nothing else in kube-public is.
    let anonymous = client_as(server, &ca_data, json!({})).await;
    let public: Api<ConfigMap> = Api::namespaced(anonymous.clone(), "kube-public");
    let info = public
        .get("cluster-info")
        .await
        .expect("cluster-info read without credentials");
    let text = info.data.unwrap_or_default()["kubeconfig"].clone();
    let kubeconfig = Kubeconfig::from_yaml(&text).expect("cluster-info kubeconfig");
    let cluster = kubeconfig.clusters[0].cluster.clone().expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some(endpoint), "{text}");
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(ca_data.as_str())
    );
    assert!(kubeconfig.auth_infos.is_empty(), "{text}");
    // Not even authenticated: anonymous requests count only for the health
    // endpoints and cluster-info itself (docs/security.md).
    match public.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) if e.code == 401 => {}
        other => panic!("anonymous list of kube-public ConfigMaps: {other:?}"),
    }

    // A bootstrap token, as node-operator creates one: the controller-manager
    // signs cluster-info for it.
    let admin = business_client(client, ns, "ci").await;
    let token: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{TOKEN_ID}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": TOKEN_ID,
            "token-secret": TOKEN_SECRET,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": TOKEN_GROUP
        }
    }))
    .expect("token");
    Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &token)
        .await
        .expect("bootstrap token");
    wait_for(
        "cluster-info to be signed for the bootstrap token",
        Duration::from_secs(60),
        async || {
            let info = public.get("cluster-info").await.ok()?;
            info.data?
                .contains_key(&format!("jws-kubeconfig-{TOKEN_ID}"))
                .then_some(())
        },
    )
    .await;

    // The token authenticates; a kubelet client certificate asked for with
    // it is not approved by the business cluster alone (a bootstrap token
    // could otherwise become any Node: the node-operator approves those of
    // its Machines' tokens, for their own Node only), and once approved it
    // is signed by the business cluster.
    let bootstrap = client_as(
        server,
        &ca_data,
        json!({"token": format!("{TOKEN_ID}.{TOKEN_SECRET}")}),
    )
    .await;
    let (user, groups) = whoami(&bootstrap).await;
    assert_eq!(user, format!("system:bootstrap:{TOKEN_ID}"));
    assert!(
        groups.contains(&"system:bootstrappers".to_string())
            && groups.contains(&TOKEN_GROUP.to_string()),
        "{groups:?}"
    );
    let node = "addons-joiner";
    let (cert, key) =
        kubelet_certificate(&bootstrap, &admin, node, "first certificate", false).await;
    let kubelet = client_as(
        server,
        &ca_data,
        json!({"client-certificate-data": b64(&cert), "client-key-data": b64(key.as_bytes())}),
    )
    .await;
    let (user, groups) = whoami(&kubelet).await;
    assert_eq!(user, format!("system:node:{node}"));
    assert!(groups.contains(&"system:nodes".to_string()), "{groups:?}");
    // The node renews its certificate with the one it has, approved by the
    // business cluster alone.
    kubelet_certificate(&kubelet, &admin, node, "renewal", true).await;
}

/// `appliedAt` of every add-on in the inventory ConfigMap.
async fn applied_at(maps: &Api<ConfigMap>) -> BTreeMap<String, i64> {
    let map = maps.get("ci-addons").await.expect("inventory");
    let text = map.data.expect("data")["inventory.json"].clone();
    let parsed: Value = serde_json::from_str(&text).expect("inventory json");
    parsed
        .as_object()
        .expect("object")
        .iter()
        .map(|(k, v)| (k.clone(), v["appliedAt"].as_i64().unwrap_or_default()))
        .collect()
}

async fn set_addons(clusters: &Api<Cluster>, addons: Value) {
    clusters
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addons": addons}})),
        )
        .await
        .expect("patch addons");
}

/// Wait until AddonsReady satisfies `until`; on timeout, say what it was.
async fn wait_addons(
    clusters: &Api<Cluster>,
    what: &str,
    timeout: Duration,
    until: impl Fn(&(String, String, String)) -> bool,
) -> (String, String, String) {
    let started = Instant::now();
    let mut last = None;
    loop {
        if let Ok(c) = clusters.get("ci").await {
            last = addons_condition(&c);
            if let Some(found) = last.as_ref().filter(|c| until(c)) {
                println!("{what}: after {:?}", started.elapsed());
                return found.clone();
            }
        }
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}; AddonsReady was {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reasons of the Events on Cluster `ci`, with their notes.
async fn events(client: &Client, ns: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("ci"))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addons_reach_the_business_cluster_and_follow_the_spec() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("addons").await;
    let templates_ns = env.namespace("addon-templates").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(
        &PostParams::default(),
        &demo_template(&ns, "1.0.0", "demo-settings"),
    )
    .await
    .expect("template 1.0.0");
    Api::<ConfigMap>::namespaced(client.clone(), &templates_ns)
        .create(
            &PostParams::default(),
            &demo_template(&templates_ns, "2.0.0", "demo-v2"),
        )
        .await
        .expect("template 2.0.0");
    start_operator(&client, &ns, &templates_ns, &runner.nodes()[0]).await;

    let mut cluster: Cluster = common::minimal_example();
    cluster.metadata.namespace = Some(ns.clone());
    cluster.spec.mode = ClusterMode::Minimal;
    cluster.spec.placement = Some(Placement {
        node_selector: [(RUNNER_LABEL.to_string(), "true".to_string())].into(),
        tolerations: vec![],
    });
    cluster.spec.network.service_cidr = "10.100.0.0/16".into();
    cluster.spec.network.dns_domain = "ci.example".into();
    cluster.spec.addons = serde_json::from_value(json!([
        {"name": "demo", "version": "1.0.0", "values": {"greeting": "hi"}}
    ]))
    .expect("addons");
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");

    let (_, reason, message) = wait_addons(
        &clusters,
        "AddonsReady",
        Duration::from_secs(420),
        |(status, _, _)| status == "True",
    )
    .await;
    println!(
        "add-ons ready {:?} after create: {reason}: {message}",
        started.elapsed()
    );
    for part in [
        "bootstrap@0.1.0",
        "node-operator@0.1.0",
        "kube-proxy@1.35.4",
        "kube-router@2.1.0",
        "coredns@1.12.1",
        "demo@1.0.0",
        "node-operator 1/1 ready",
    ] {
        assert!(message.contains(part), "{part} missing from {message:?}");
    }
    // With the add-ons in, every condition holds.
    let ready = wait_for(
        "every condition to be True",
        Duration::from_secs(60),
        async || {
            let c = clusters.get("ci").await.ok()?;
            common::all_ready(&c).then_some(c)
        },
    )
    .await;
    let endpoint = ready.status.and_then(|s| s.endpoint).expect("endpoint");

    // In the business cluster.
    let dir = tempfile::tempdir().expect("tempdir");
    let api = business(&client, &ns, dir.path()).await;
    // kube-proxy and the pod network reach the API at the external endpoint.
    for (daemonset, image, config) in [
        (
            "kube-proxy",
            "registry.k8s.io/kube-proxy:v1.35.4",
            "kube-proxy",
        ),
        (
            "kube-router",
            "docker.io/cloudnativelabs/kube-router:v2.1.0",
            "kube-router-cfg",
        ),
    ] {
        let ds = api
            .get(&["-n", "kube-system", "daemonset", daemonset])
            .expect(daemonset);
        assert_eq!(
            ds["spec"]["template"]["spec"]["containers"][0]["image"],
            image
        );
        let map = api
            .get(&["-n", "kube-system", "configmap", config])
            .expect(config);
        let kubeconfig = map["data"]["kubeconfig.conf"].as_str().unwrap_or_default();
        assert_eq!(
            common::kubeconfig_server(kubeconfig).as_deref(),
            Some(endpoint.as_str()),
            "{config}: {kubeconfig}"
        );
    }
    let coredns = api
        .get(&["-n", "kube-system", "deployment", "coredns"])
        .expect("CoreDNS Deployment");
    assert_eq!(
        coredns["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.k8s.io/coredns/coredns:v1.12.1"
    );
    let dns = api
        .get(&["-n", "kube-system", "service", "kube-dns"])
        .expect("kube-dns Service");
    assert_eq!(dns["spec"]["clusterIP"], "10.100.0.10");
    let corefile = api
        .get(&["-n", "kube-system", "configmap", "coredns"])
        .expect("Corefile");
    assert!(
        corefile["data"]["Corefile"]
            .as_str()
            .unwrap_or_default()
            .contains("kubernetes ci.example in-addr.arpa"),
        "{corefile}"
    );
    for crd in [
        "machines.kubeonkube.io",
        "packageversions.kubeonkube.io",
        "clusterpackageversions.kubeonkube.io",
        "canaryreleases.kubeonkube.io",
    ] {
        api.get(&["crd", crd]).expect("node-operator CRD");
    }
    assert!(
        api.get(&["crd", "clusters.kubeonkube.io"]).is_none(),
        "the Cluster CRD belongs to the meta-cluster only"
    );
    api.get(&["clusterrolebinding", "kube-on-kube:node-operator"])
        .expect("node-operator rights");
    let demo = api
        .get(&["-n", "demo", "configmap", "demo-settings"])
        .expect("user add-on object");
    assert_eq!(
        demo["data"],
        json!({"greeting": "hi", "cluster": "ci", "dns": "10.100.0.10"})
    );
    assert_eq!(demo["metadata"]["labels"]["kubeonkube.io/addon"], "demo");
    let checked = Instant::now();
    bootstrap_works(&client, &ns, &api.server, &endpoint).await;
    println!("bootstrap token join checked in {:?}", checked.elapsed());

    // The node-operator runs in the meta-cluster, owned by the Cluster, and
    // reached the business API with its own kubeconfig.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let node_operator = deployments
        .get("ci-node-operator")
        .await
        .expect("deployment");
    let uid = clusters.get("ci").await.expect("cluster").uid();
    assert!(
        node_operator
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == uid.as_ref() && o.controller == Some(true))
    );
    assert_eq!(
        node_operator
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers[0].image.as_deref()),
        Some(NODE_OPERATOR_IMAGE)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let connected = common::node_operator_connected(runner, &client, &ns, "ci").await;
    assert!(connected.contains("v1.35.4"), "{connected}");

    // An unchanged add-on is not applied again; a deleted object comes back.
    let before = applied_at(&maps).await;
    let out = api.run(&["-n", "demo", "delete", "configmap", "demo-settings"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    clusters
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/poke": "1"}}})),
        )
        .await
        .expect("poke");
    wait_for(
        "the deleted object to return",
        Duration::from_secs(90),
        async || api.get(&["-n", "demo", "configmap", "demo-settings"]),
    )
    .await;
    // The inventory is written after the pass's objects, so the object can
    // be back a moment before the inventory says so.
    let after = wait_for(
        "the inventory to record demo applied again",
        Duration::from_secs(30),
        async || {
            let after = applied_at(&maps).await;
            (after["demo"] > before["demo"]).then_some(after)
        },
    )
    .await;
    for name in [
        "bootstrap",
        "node-operator",
        "kube-proxy",
        "kube-router",
        "coredns",
    ] {
        assert_eq!(after[name], before[name], "{name} was applied again");
    }

    // Version bumps: a user add-on's new version from the operator's template
    // namespace replaces the old one's objects; a built-in's new version
    // re-applies it with the new image.
    let demo_v2 = json!({"name": "demo", "version": "2.0.0", "values": {"greeting": "hi"}});
    let coredns_bumped = json!({"name": "coredns", "version": "1.12.2"});
    set_addons(&clusters, json!([demo_v2, coredns_bumped])).await;
    wait_for(
        "demo 2.0.0 to replace 1.0.0 and CoreDNS to run 1.12.2",
        Duration::from_secs(90),
        async || {
            let new = api.get(&["-n", "demo", "configmap", "demo-v2"]);
            let old = api.get(&["-n", "demo", "configmap", "demo-settings"]);
            let dns = api.get(&["-n", "kube-system", "deployment", "coredns"])?;
            let image = dns["spec"]["template"]["spec"]["containers"][0]["image"].clone();
            (new.is_some() && old.is_none() && image == "registry.k8s.io/coredns/coredns:v1.12.2")
                .then_some(())
        },
    )
    .await;
    wait_addons(
        &clusters,
        "demo@2.0.0 and coredns@1.12.2 reported",
        Duration::from_secs(90),
        |(s, _, m)| s == "True" && m.contains("demo@2.0.0") && m.contains("coredns@1.12.2"),
    )
    .await;
    let bumped = applied_at(&maps).await;
    assert!(bumped["coredns"] > after["coredns"], "{after:?} {bumped:?}");
    assert_eq!(bumped["kube-proxy"], after["kube-proxy"], "{bumped:?}");

    // Disabling removes: kube-proxy from the business cluster, the
    // node-operator from the meta-cluster and its rights from the business
    // cluster (its CRDs stay).
    let kube_proxy_off = json!({"name": "kube-proxy", "version": "1.35.4", "enabled": false});
    let node_operator_off = json!({"name": "node-operator", "version": "0.1.0", "enabled": false});
    set_addons(
        &clusters,
        json!([demo_v2, coredns_bumped, kube_proxy_off, node_operator_off]),
    )
    .await;
    wait_for(
        "kube-proxy to be removed",
        Duration::from_secs(90),
        async || {
            (api.get(&["-n", "kube-system", "daemonset", "kube-proxy"])
                .is_none()
                && api
                    .get(&["-n", "kube-system", "configmap", "kube-proxy"])
                    .is_none())
            .then_some(())
        },
    )
    .await;
    wait_for(
        "the node-operator Deployment to be removed",
        Duration::from_secs(90),
        async || {
            deployments
                .get_opt("ci-node-operator")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(
        api.get(&["clusterrolebinding", "kube-on-kube:node-operator"])
            .is_none()
    );
    assert!(api.get(&["crd", "machines.kubeonkube.io"]).is_some());
    let (_, _, message) = wait_addons(
        &clusters,
        "AddonsReady after disabling",
        Duration::from_secs(90),
        |(s, _, m)| s == "True" && !m.contains("kube-proxy"),
    )
    .await;
    assert!(!message.contains("node-operator"), "{message}");

    // An invalid template is reported with what is wrong; what its add-on
    // applied before, and every other add-on, stays.
    maps.create(
        &PostParams::default(),
        &template_map(
            &ns,
            "3.0.0",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo-v3\n  namespace: demo\ndata:\n  x: \"{{values.missing}}\"\n",
        ),
    )
    .await
    .expect("template 3.0.0");
    let demo_v3 = json!({"name": "demo", "version": "3.0.0"});
    set_addons(
        &clusters,
        json!([demo_v3, coredns_bumped, kube_proxy_off, node_operator_off]),
    )
    .await;
    let (_, reason, message) = wait_addons(
        &clusters,
        "AddonsReady False for the invalid template",
        Duration::from_secs(90),
        |(s, _, _)| s == "False",
    )
    .await;
    assert_eq!(reason, "InvalidTemplate", "{message}");
    assert!(
        message.contains("demo@3.0.0: template demo 3.0.0 (ConfigMap ")
            && message.contains("`values.missing` is undefined"),
        "{message}"
    );
    assert!(message.contains("coredns@1.12.2"), "{message}");
    api.get(&["-n", "demo", "configmap", "demo-v2"])
        .expect("what demo 2.0.0 applied is kept");
    assert!(api.get(&["-n", "demo", "configmap", "demo-v3"]).is_none());

    // konnectivity values: a valid serverPort moves the external Service's
    // port for agents; a value the add-on refuses is reported by field and
    // changes nothing of the server that runs (neither the port nor the
    // kube-apiserver Deployment).
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let agent_port = async || {
        let svc = services.get("ci-apiserver-external").await.ok()?;
        svc.spec?
            .ports?
            .into_iter()
            .find(|p| p.name.as_deref() == Some("konnectivity"))
            .map(|p| p.port)
    };
    // The add-ons as they are, with konnectivity's values.
    let with_konnectivity = |values: Value| {
        json!([
            demo_v2,
            coredns_bumped,
            kube_proxy_off,
            node_operator_off,
            {"name": "konnectivity", "version": "0.34.0", "values": values},
        ])
    };
    set_addons(&clusters, with_konnectivity(json!({"serverPort": 9132}))).await;
    wait_for(
        "the agents' port to move",
        Duration::from_secs(90),
        async || (agent_port().await == Some(9132)).then_some(()),
    )
    .await;
    let generation = async || {
        deployments
            .get("ci-apiserver")
            .await
            .expect("the kube-apiserver Deployment")
            .metadata
            .generation
    };
    let before = generation().await;
    set_addons(&clusters, with_konnectivity(json!({"serverPort": 70000}))).await;
    let (_, reason, message) = wait_addons(
        &clusters,
        "AddonsReady False for the refused konnectivity value",
        Duration::from_secs(90),
        |(s, _, m)| s == "False" && m.contains("serverPort"),
    )
    .await;
    assert_eq!(reason, "InvalidTemplate", "{message}");
    assert!(
        message
            .contains("konnectivity: values.serverPort must be a port number (1-65535), not 70000"),
        "{message}"
    );
    assert_eq!(agent_port().await, Some(9132), "the server's port is kept");
    assert_eq!(generation().await, before, "kube-apiserver is not rolled");

    // An unknown add-on is reported; nothing else is torn down.
    set_addons(
        &clusters,
        json!([
            demo_v2,
            coredns_bumped,
            kube_proxy_off,
            node_operator_off,
            {"name": "nope", "version": "1.0.0"},
        ]),
    )
    .await;
    let (_, reason, message) = wait_addons(
        &clusters,
        "AddonsReady False for the unknown add-on",
        Duration::from_secs(90),
        |(s, r, _)| s == "False" && r != "InvalidTemplate",
    )
    .await;
    assert_eq!(reason, "UnknownAddon", "{message}");
    assert!(
        message.contains("nope@1.0.0: no add-on template named \"nope\""),
        "{message}"
    );
    assert!(message.contains("coredns@1.12.2"), "{message}");
    assert!(message.contains("demo@2.0.0"), "{message}");
    api.get(&["-n", "kube-system", "deployment", "coredns"])
        .expect("CoreDNS kept");
    api.get(&["-n", "demo", "configmap", "demo-v2"])
        .expect("user add-on kept");
    let c = clusters.get("ci").await.expect("cluster");
    for type_ in [
        "EtcdReady",
        "APIServerReady",
        "ControllerManagerReady",
        "SchedulerReady",
    ] {
        assert_eq!(
            common::condition(&c, type_).as_deref(),
            Some("True"),
            "{type_}"
        );
    }
    assert_eq!(common::condition(&c, "Ready").as_deref(), Some("False"));
    let seen = events(&client, &ns).await;
    let has = |reason: &str, note: &str| seen.iter().any(|(r, n)| r == reason && n.contains(note));
    for (reason, note) in [
        ("AddonApplied", "applied demo@1.0.0"),
        ("AddonApplied", "applied demo@2.0.0"),
        ("AddonApplied", "applied coredns@1.12.2"),
        ("AddonRemoved", "removed kube-proxy"),
        ("AddonRemoved", "removed Deployment ci-node-operator"),
        ("AddonFailed", "demo@3.0.0"),
        ("AddonFailed", "nope@1.0.0"),
    ] {
        assert!(
            has(reason, note),
            "no {reason} Event about {note:?} in {seen:?}"
        );
    }

    // A user add-on taken out of the spec is removed (its Namespace stays);
    // with the unknown one gone too, AddonsReady is True again.
    set_addons(&clusters, json!([coredns_bumped])).await;
    wait_for(
        "the demo add-on to be removed",
        Duration::from_secs(90),
        async || {
            api.get(&["-n", "demo", "configmap", "demo-v2"])
                .is_none()
                .then_some(())
        },
    )
    .await;
    let (_, reason, message) = wait_addons(
        &clusters,
        "AddonsReady True again",
        Duration::from_secs(90),
        |(s, _, _)| s == "True",
    )
    .await;
    assert_eq!(reason, "Applied", "{message}");
    assert!(!message.contains("demo"), "{message}");
    api.get(&["namespace", "demo"])
        .expect("Namespaces are kept");
    api.get(&["-n", "kube-system", "daemonset", "kube-proxy"])
        .expect("kube-proxy is back once no longer disabled");
    let inventory = applied_at(&maps).await;
    assert!(!inventory.contains_key("demo"), "{inventory:?}");
    assert!(
        events(&client, &ns)
            .await
            .iter()
            .any(|(r, n)| r == "AddonRemoved" && n == "removed demo"),
        "no Event about removing demo"
    );

    // Deleting the Cluster removes everything, the inventory included.
    let deleted = Instant::now();
    clusters
        .delete("ci", &DeleteParams::background())
        .await
        .expect("delete");
    wait_for(
        "the cluster's objects to go",
        Duration::from_secs(120),
        async || {
            let left = pods
                .list(&ListParams::default().labels("kubeonkube.io/cluster=ci"))
                .await
                .ok()?
                .items
                .len()
                + maps
                    .list(&ListParams::default().labels("kubeonkube.io/cluster=ci"))
                    .await
                    .ok()?
                    .items
                    .len();
            (left == 0).then_some(())
        },
    )
    .await;
    println!("cluster gone {:?} after delete", deleted.elapsed());
    pods.delete("operator", &DeleteParams::default())
        .await
        .expect("stop the operator");
}

/// A tenant registers a template under the node-operator's own name and
/// version whose default image is its own: that image would run in the
/// meta-cluster, so the add-on step refuses it with the flag to change, and
/// the node-operator Deployment that runs stays as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_cannot_run_a_disallowed_node_operator_image() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("addons-image").await;
    let templates_ns = env.namespace("addon-templates-image").await;
    start_operator(&client, &ns, &templates_ns, &runner.nodes()[0]).await;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(
            &PostParams::default(),
            &common::test_cluster(&ns, "ci", ClusterMode::Minimal),
        )
        .await
        .expect("create cluster");
    wait_addons(
        &clusters,
        "AddonsReady",
        Duration::from_secs(420),
        |(status, _, _)| status == "True",
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let running = async || {
        let d = deployments
            .get("ci-node-operator")
            .await
            .expect("node-operator");
        let image = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers[0].image.clone());
        (d.metadata.generation, image)
    };
    let before = running().await;
    assert_eq!(before.1.as_deref(), Some(NODE_OPERATOR_IMAGE));

    let evil: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "my-node-operator",
            "labels": {"kubeonkube.io/addon-template": "node-operator"}
        },
        "data": {
            "version": "0.1.0",
            "values.yaml": "image: evil.example.com/miner:1\n",
            "template.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tenant-was-here\n"
        }
    }))
    .expect("template");
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &evil)
        .await
        .expect("create the template");
    clusters
        .patch(
            "ci",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"wake": "1"}}})),
        )
        .await
        .expect("annotate");
    let (_, _, message) = wait_addons(
        &clusters,
        "the node-operator image refused",
        Duration::from_secs(120),
        |(status, reason, _)| status == "False" && reason == "ImageNotAllowed",
    )
    .await;
    assert!(
        message.contains("evil.example.com/miner:1")
            && message.contains("--allowed-image-prefixes"),
        "{message}"
    );
    assert_eq!(
        running().await,
        before,
        "the node-operator Deployment changed"
    );
    let notes = events(&client, &ns).await;
    assert!(
        notes
            .iter()
            .any(|(reason, note)| reason == "ImageNotAllowed" && note.contains("evil.example.com")),
        "{notes:?}"
    );
}
