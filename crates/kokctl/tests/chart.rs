//! The Helm chart `charts/kube-on-kube` with the real `helm` and API server of
//! the test environment: it lints clean; what it renders runs hardened (non-root,
//! read-only root filesystem, no privilege escalation, seccomp, no capabilities)
//! and grants exactly the rights `docs/rbac.md` lists; its CRDs are the
//! repository's; it installs; each operator, run with a token of the chart's
//! ServiceAccount instead of admin, does its work without a single forbidden
//! request; and `helm uninstall` leaves nothing of the operators behind.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kok_testenv::hosts::TestHosts;
use kok_testenv::kube_env::{KubeEnv, Options};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::{CanaryRelease, Cluster, ClusterPackageVersion, Machine, PackageVersion};
use serde::Deserialize;
use serde_json::{Value, json};

const RELEASE: &str = "kube-on-kube";
/// Release namespace of the rendered (not installed) chart.
const RENDER_NAMESPACE: &str = "kok-system";
/// Namespace of Machine SSH keys when rendering.
const RENDER_KEYS_NAMESPACE: &str = "machine-keys";
const KOK_SA: &str = "kube-on-kube-operator";
const NODE_SA: &str = "kube-on-kube-node-operator";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> PathBuf {
    repo().join("charts/kube-on-kube")
}

/// Runs the real helm with its caches in a private directory, so the test
/// neither reads nor changes the user's helm set-up.
fn helm(args: &[&str], kubeconfig: Option<&Path>) -> Output {
    let bin = kok_testenv::bins::bin("helm").expect("helm from scripts/testenv-bins.sh");
    let home = repo().join("target/chart-test-helm-home");
    std::fs::create_dir_all(&home).expect("helm home");
    let mut command = Command::new(bin);
    command
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null());
    if let Some(path) = kubeconfig {
        command.env("KUBECONFIG", path);
    }
    let out = command.output().expect("run helm");
    println!(
        "$ helm {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every document of a multi-document YAML stream, empty ones left out.
fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `helm template` of the chart with `sets` (`key=value`), parsed.
fn render(sets: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        RENDER_NAMESPACE,
    ];
    for set in sets {
        args.push("--set");
        args.push(set);
    }
    documents(&ok(helm(&args, None), "helm template"))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The component a ServiceAccount name belongs to.
fn component_of(service_account: &str) -> &'static str {
    match service_account {
        KOK_SA => "kube-on-kube-operator",
        NODE_SA => "node-operator",
        other => panic!("a binding names an unexpected ServiceAccount {other}"),
    }
}

/// One granted (or documented) right.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Right {
    operator: String,
    scope: String,
    group: String,
    resource: String,
    names: String,
    verb: String,
}

/// The rights the rendered RBAC grants each operator's ServiceAccount, with the
/// scope named as `docs/rbac.md` names it.
fn granted(objects: &[Value]) -> BTreeSet<Right> {
    let scope_of = |namespace: Option<&str>| match namespace {
        None => "cluster-wide".to_string(),
        Some(RENDER_NAMESPACE) => "release namespace".to_string(),
        Some(RENDER_KEYS_NAMESPACE) => "SSH key namespaces".to_string(),
        Some(ns) => ns.to_string(),
    };
    let mut out = BTreeSet::new();
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let namespace = binding["metadata"]["namespace"].as_str();
        let role_kind = binding["roleRef"]["kind"].as_str().expect("roleRef.kind");
        let role_name = binding["roleRef"]["name"].as_str().expect("roleRef.name");
        let role = named(objects, role_kind, role_name);
        if role_kind == "Role" {
            assert_eq!(
                role["metadata"]["namespace"].as_str(),
                namespace,
                "{role_name} is bound outside its namespace"
            );
        }
        let subjects = binding["subjects"].as_array().expect("subjects");
        for subject in subjects {
            assert_eq!(subject["kind"], "ServiceAccount", "{binding}");
            assert_eq!(subject["namespace"], RENDER_NAMESPACE, "{binding}");
            let operator = component_of(subject["name"].as_str().expect("subject name"));
            for rule in role["rules"].as_array().expect("rules") {
                let names = strings(&rule["resourceNames"]);
                let names = if names.is_empty() {
                    "any".to_string()
                } else {
                    names.join(",")
                };
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            out.insert(Right {
                                operator: operator.into(),
                                scope: scope_of(namespace),
                                group: if group.is_empty() {
                                    "core".into()
                                } else {
                                    group.clone()
                                },
                                resource: resource.clone(),
                                names: names.clone(),
                                verb,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

/// The rights `docs/rbac.md` documents: every row of its tables whose first
/// column names an operator.
fn documented() -> BTreeSet<Right> {
    let text = std::fs::read_to_string(repo().join("docs/rbac.md")).expect("docs/rbac.md");
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let cells: Vec<String> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().replace('`', ""))
            .collect();
        if cells.len() < 6 || !["kube-on-kube-operator", "node-operator"].contains(&&*cells[0]) {
            continue;
        }
        for verb in cells[5].split(',').map(str::trim).filter(|v| !v.is_empty()) {
            out.insert(Right {
                operator: cells[0].clone(),
                scope: cells[1].clone(),
                group: cells[2].clone(),
                resource: cells[3].clone(),
                names: cells[4].clone(),
                verb: verb.to_string(),
            });
        }
    }
    out
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&p).expect("read"),
            )
        })
        .collect()
}

fn check_hardened(deployment: &Value) {
    let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
    let pod = &deployment["spec"]["template"]["spec"];
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true, "{name}: pod runAsNonRoot");
    assert!(
        psc["runAsUser"].as_i64().is_some_and(|u| u > 0),
        "{name}: pod runs as a non-zero uid"
    );
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
    assert_eq!(pod["hostNetwork"], Value::Null, "{name}: no host network");
    assert_eq!(pod["hostPID"], Value::Null, "{name}: no host PID");
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{name}");
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["privileged"], Value::Null, "{name}: not privileged");
        assert_eq!(strings(&sc["capabilities"]["drop"]), vec!["ALL"], "{name}");
        assert_eq!(
            sc["capabilities"]["add"],
            Value::Null,
            "{name}: no capability added"
        );
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        let resources = &c["resources"];
        assert!(
            resources["requests"]["cpu"].is_string(),
            "{name}: cpu request"
        );
        assert!(
            resources["requests"]["memory"].is_string(),
            "{name}: memory request"
        );
        assert!(
            resources["limits"]["memory"].is_string(),
            "{name}: memory limit"
        );
        let args = strings(&c["args"]);
        assert!(
            args.iter().any(|a| a == "--leader-elect"),
            "{name}: {args:?}"
        );
        assert!(
            args.iter().any(|a| a == "--http-address=0.0.0.0:8080"),
            "{name}: {args:?}"
        );
        let env: Vec<&str> = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert!(
            env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"),
            "{name}"
        );
        assert_eq!(c["ports"][0]["name"], "http", "{name}");
        assert_eq!(c["ports"][0]["containerPort"], 8080, "{name}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
    }
}

#[test]
fn chart_lints_renders_hardened_and_grants_only_the_documented_rights() {
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path");
    for sets in [
        vec![],
        vec!["nodeOperator.enabled=true", "serviceMonitor.enabled=true"],
        vec![
            "kubeOnKubeOperator.watchNamespace=clusters",
            "kubeOnKubeOperator.addonTemplateNamespace=templates",
        ],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        for set in &sets {
            args.push("--set");
            args.push(set);
        }
        let out = ok(helm(&args, None), "helm lint");
        assert!(out.contains("0 chart(s) failed"), "{out}");
        assert!(
            !out.contains("[WARNING]") && !out.contains("[ERROR]"),
            "{out}"
        );
    }

    // The chart's CRDs are the repository's, byte for byte.
    let ours = files(&repo().join("charts/kube-on-kube/crds"));
    let generated = files(&repo().join("crds"));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        generated.keys().collect::<Vec<_>>(),
        "charts/kube-on-kube/crds must hold the files of crds/ (cp crds/*.yaml charts/kube-on-kube/crds/)"
    );
    for (name, bytes) in &generated {
        assert!(
            ours[name] == *bytes,
            "charts/kube-on-kube/crds/{name} differs from crds/{name}; copy it again"
        );
    }

    // Defaults: the kube-on-kube-operator only, two replicas, hardened.
    let defaults = render(&[]);
    let deployments = of_kind(&defaults, "Deployment");
    assert_eq!(
        deployments.len(),
        1,
        "only the kube-on-kube-operator by default"
    );
    assert_eq!(deployments[0]["metadata"]["name"], "kube-on-kube-operator");
    assert_eq!(deployments[0]["spec"]["replicas"], 2);
    // What the operator gives each Cluster's node-operator and snapshot
    // gateway: a memory limit by default, the admin's values when set (the
    // installed chart's operator below starts with them).
    let args = |objects: &[Value]| {
        strings(
            &of_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"],
        )
    };
    let default_args = args(&defaults);
    for flag in [
        "--node-operator-resources=",
        "--snapshot-gateway-resources=",
    ] {
        assert!(
            default_args
                .iter()
                .any(|a| a.starts_with(flag) && a.contains(r#""limits":{"memory":"512Mi"}"#)),
            "{flag}: {default_args:?}"
        );
    }
    let raised = args(&render(&[
        "kubeOnKubeOperator.nodeOperatorResources.limits.memory=1Gi",
    ]));
    assert!(
        raised.iter().any(|a| a.starts_with("--node-operator-resources=") && a.contains(r#""memory":"1Gi""#)),
        "{raised:?}"
    );
    assert!(of_kind(&defaults, "ServiceMonitor").is_empty());
    assert!(
        defaults.iter().all(|o| !o["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .contains("node-operator")),
        "no node-operator objects unless enabled"
    );

    let all = render(&[
        "nodeOperator.enabled=true",
        "serviceMonitor.enabled=true",
        &format!("nodeOperator.sshKeySecretNamespaces={{{RENDER_KEYS_NAMESPACE}}}"),
    ]);
    let deployments = of_kind(&all, "Deployment");
    assert_eq!(deployments.len(), 2);
    for deployment in &deployments {
        check_hardened(deployment);
        let name = deployment["metadata"]["name"].as_str().expect("name");
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        let selects = |s: &Value| {
            s.as_object()
                .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| pod_labels[k] == *v))
        };
        assert!(selects(selector), "{name}: selector matches its Pods");
        let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .expect("serviceAccountName");
        named(&all, "ServiceAccount", sa);
        let pdb = named(&all, "PodDisruptionBudget", name);
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{name}");
        assert!(
            selects(&pdb["spec"]["selector"]["matchLabels"]),
            "{name}: PDB selects its Pods"
        );
        let svc = named(&all, "Service", &format!("{name}-metrics"));
        assert!(
            selects(&svc["spec"]["selector"]),
            "{name}: metrics Service selects its Pods"
        );
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http", "{name}");
        let monitor = named(&all, "ServiceMonitor", name);
        assert_eq!(
            monitor["spec"]["endpoints"][0]["path"], "/metrics",
            "{name}"
        );
        assert!(
            monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .expect("monitor selector")
                .iter()
                .all(|(k, v)| svc["metadata"]["labels"][k] == *v),
            "{name}: ServiceMonitor selects the metrics Service"
        );
    }
    let node = named(&all, "Deployment", NODE_SA);
    let mounts = &node["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    assert_eq!(
        mounts[0]["mountPath"], "/tmp",
        "the node-operator's ssh needs a writable /tmp"
    );

    // RBAC: nothing wild, nothing that grants more RBAC, and exactly the table
    // of docs/rbac.md.
    for role in all
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in role["rules"].as_array().expect("rules") {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(!strings(&rule[field]).contains(&"*".to_string()), "{role}");
            }
            for verb in ["escalate", "bind", "impersonate", "deletecollection"] {
                assert!(
                    !strings(&rule["verbs"]).contains(&verb.to_string()),
                    "{role}"
                );
            }
        }
    }
    let granted = granted(&all);
    let documented = documented();
    let undocumented: Vec<_> = granted.difference(&documented).collect();
    let not_granted: Vec<_> = documented.difference(&granted).collect();
    assert!(
        undocumented.is_empty() && not_granted.is_empty(),
        "the chart's RBAC and docs/rbac.md disagree.\ngranted but not documented: {undocumented:#?}\ndocumented but not granted: {not_granted:#?}"
    );
    // Secrets: the node-operator may read them only where Machine keys live,
    // and touch bootstrap tokens only in kube-system.
    for right in granted.iter().filter(|r| r.resource == "secrets") {
        if right.operator == "node-operator" {
            assert_ne!(right.scope, "cluster-wide", "{right:?}");
        }
    }

    // One namespace: bound there (and templates readable in theirs), not cluster-wide.
    let scoped = render(&[
        "kubeOnKubeOperator.watchNamespace=clusters",
        "kubeOnKubeOperator.addonTemplateNamespace=templates",
    ]);
    assert!(of_kind(&scoped, "ClusterRoleBinding").is_empty());
    let args = strings(
        &named(&scoped, "Deployment", KOK_SA)["spec"]["template"]["spec"]["containers"][0]["args"],
    );
    assert!(
        args.contains(&"--namespace=clusters".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--addon-template-namespace=templates".to_string()),
        "{args:?}"
    );
    let bindings: BTreeSet<(String, String)> = of_kind(&scoped, "RoleBinding")
        .iter()
        .map(|b| {
            (
                b["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                b["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    assert!(
        bindings.contains(&("clusters".into(), KOK_SA.into())),
        "{bindings:?}"
    );
    let templates = named(&scoped, "Role", "kube-on-kube-operator-addon-templates");
    assert_eq!(templates["metadata"]["namespace"], "templates");
    assert_eq!(strings(&templates["rules"][0]["verbs"]), vec!["list"]);
}

/// A kubeconfig for `server` that authenticates with `token` only.
fn token_kubeconfig(env: &KubeEnv, token: &str, path: &Path) {
    let ca = env
        .kubeconfig()
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("the test environment's CA");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "meta", "cluster": {"server": env.api_url(), "certificate-authority-data": ca}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "meta", "user": "operator"}}],
        "current-context": "operator",
    });
    std::fs::write(path, serde_json::to_string(&config).expect("json")).expect("write kubeconfig");
}

/// A token of `service_account` from the TokenRequest API.
async fn token_of(client: &Client, namespace: &str, service_account: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create_token_request(service_account, &PostParams::default(), &request)
        .await
        .expect("token request")
        .status
        .expect("token status")
        .token
}

/// An operator binary running as a child process, killed when dropped.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Starts `binary` with the container arguments of `deployment` as the
    /// chart renders them (the HTTP endpoint on a free loopback port instead of
    /// the Pod's own port 8080), authenticating with `kubeconfig`.
    fn start(binary: &str, deployment: &Deployment, kubeconfig: &Path, log: PathBuf) -> Running {
        let container = &deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod spec")
            .containers[0];
        let args: Vec<String> = container
            .args
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|a| {
                if a.starts_with("--http-address=") {
                    "--http-address=127.0.0.1:0".to_string()
                } else {
                    a
                }
            })
            .collect();
        let namespace = deployment.namespace().unwrap_or_default();
        let file = File::create(&log).expect("log file");
        let child = Command::new(support::workspace_bin(binary))
            .args(&args)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .env("POD_NAME", format!("{binary}-chart-test"))
            .env("POD_NAMESPACE", namespace)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        println!("started {binary} {}", args.join(" "));
        Running { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log when the process has exited.
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("operator exited ({status}):\n{}", self.log());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns `Some`, failing after `timeout` with `what`
/// and the operator log.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, op: &mut Running, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        op.assert_running();
        // A refused request is the failure this test looks for: say so at once
        // rather than after the timeout.
        assert_not_forbidden(op, what);
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}; operator log:\n{}",
            op.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes `name` and waits (watching `op`) until it is gone: for objects an
/// operator holds with a finalizer, so this proves it let go.
async fn delete_and_wait<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    op: &mut Running,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    eventually(what, timeout, op, || {
        let api = api.clone();
        let name = name.to_string();
        async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn assert_not_forbidden(op: &Running, name: &str) {
    let log = op.log();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "{name}: a request was refused by RBAC ({} lines):\n{}",
        forbidden.len(),
        forbidden.join("\n")
    );
}

async fn apply_json<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = value["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply("chart-test").force(),
        &Patch::Apply(&value),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_chart_runs_both_operators_with_their_own_service_accounts() {
    // An environment of its own: the chart, not the test harness, installs the CRDs.
    let env = tokio::task::spawn_blocking(|| {
        KubeEnv::start(Options {
            controller_manager: true,
            scheduler: true,
            kwok_nodes: 2,
            install_crds: false,
            controller_manager_qps: None,
            node_monitor_grace: None,
            real_nodes: None,
        })
    })
    .await
    .expect("join")
    .expect("test environment");
    let admin = env.client().await;
    let kubeconfig = env.kubeconfig_path().to_path_buf();
    let work = tempfile::tempdir().expect("tempdir");
    let ns = "kok-system";
    let keys_ns = env.namespace("machine-keys").await;

    // Install: both operators, debug logs of our own crates (an Event that
    // cannot be published is logged at debug), text lines.
    let values = work.path().join("values.yaml");
    std::fs::write(
        &values,
        format!(
            "logFormat: text\n\
             logLevel: info,kube_on_kube_operator=debug,node_operator=debug,kok_common=debug\n\
             nodeOperator:\n  enabled: true\n  sshKeySecretNamespaces: [{keys_ns}]\n"
        ),
    )
    .expect("values");
    // The release namespace enforces the restricted Pod Security Standard:
    // Pods that are not hardened are refused and `helm install --wait` fails.
    apply_json(
        &Api::<Namespace>::all(admin.clone()),
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }},
        }),
    )
    .await;
    let chart = chart();
    let started = Instant::now();
    ok(
        helm(
            &[
                "install",
                RELEASE,
                chart.to_str().expect("utf-8"),
                "--namespace",
                ns,
                "--values",
                values.to_str().expect("utf-8"),
                "--wait",
                "--timeout",
                "180s",
            ],
            Some(&kubeconfig),
        ),
        "helm install",
    );
    println!("helm install --wait took {:?}", started.elapsed());

    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in [
        "clusters.kubeonkube.io",
        "machines.kubeonkube.io",
        "packageversions.kubeonkube.io",
        "clusterpackageversions.kubeonkube.io",
        "canaryreleases.kubeonkube.io",
    ] {
        crds.get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    }
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let kok_deployment = deployments.get(KOK_SA).await.expect("operator Deployment");
    let node_deployment = deployments
        .get(NODE_SA)
        .await
        .expect("node-operator Deployment");
    for d in [&kok_deployment, &node_deployment] {
        assert_eq!(
            d.status.as_ref().and_then(|s| s.ready_replicas),
            Some(2),
            "{}: both replicas admitted (restricted) and Ready",
            d.name_any()
        );
    }

    // The kube-on-kube-operator with its ServiceAccount's token: a Minimal
    // Cluster converges on kwok.
    let kok_config = work.path().join("kok.kubeconfig");
    token_kubeconfig(&env, &token_of(&admin, ns, KOK_SA).await, &kok_config);
    let mut kok = Running::start(
        "kube-on-kube-operator",
        &kok_deployment,
        &kok_config,
        work.path().join("kube-on-kube-operator.log"),
    );
    let clusters_ns = env.namespace("chart-clusters").await;
    let mut cluster: Value = serde_norway::from_str(
        &std::fs::read_to_string(repo().join("examples/cluster-minimal.yaml")).expect("example"),
    )
    .expect("example parses");
    cluster["metadata"]["namespace"] = json!(clusters_ns);
    let clusters: Api<Cluster> = Api::namespaced(admin.clone(), &clusters_ns);
    apply_json(&clusters, cluster).await;
    let started = Instant::now();
    let converged = [
        "CertificatesReady",
        "EtcdReady",
        "APIServerReady",
        "ControllerManagerReady",
        "SchedulerReady",
    ];
    eventually(
        "the Minimal Cluster converges",
        Duration::from_secs(300),
        &mut kok,
        || {
            let clusters = clusters.clone();
            async move {
                let c = clusters.get("ci").await.ok()?;
                let status = c.status?;
                converged
                    .iter()
                    .all(|t| condition(&status.conditions, t).is_some_and(|c| c.status == "True"))
                    .then_some(())
            }
        },
    )
    .await;
    println!("Minimal Cluster converged in {:?}", started.elapsed());
    let events: Api<Event> = Api::namespaced(admin.clone(), &clusters_ns);
    let published = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("kube-on-kube-operator"))
        .count();
    assert!(
        published > 0,
        "the operator published Events on the Cluster"
    );
    assert_not_forbidden(&kok, "kube-on-kube-operator");
    // Deleting it: the operator tears it down and releases its finalizer.
    delete_and_wait(
        &clusters,
        "ci",
        "the deleted Cluster is gone",
        Duration::from_secs(120),
        &mut kok,
    )
    .await;

    // The node-operator with its ServiceAccount's token, against a real SSH
    // host: it logs in, makes the kubelet's bootstrap token, and reports the
    // package it cannot download; a CanaryRelease claims the Machine.
    let hosts = tokio::task::spawn_blocking(|| TestHosts::start(1))
        .await
        .expect("join")
        .expect("SSH test host");
    let host = &hosts.hosts()[0];
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &keys_ns);
    apply_json(
        &secrets,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "ssh-key", "namespace": keys_ns},
            "stringData": {"ssh-privatekey": hosts.client_private_key_pem()},
        }),
    )
    .await;
    // What the bootstrap add-on writes into a business cluster.
    let ca = env
        .kubeconfig()
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .expect("CA");
    let cluster_info = serde_norway::to_string(&json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "", "cluster": {"server": env.api_url(), "certificate-authority-data": ca}}],
    }))
    .expect("yaml");
    apply_json(
        &Api::<ConfigMap>::namespaced(admin.clone(), "kube-public"),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": cluster_info},
        }),
    )
    .await;
    let pvs: Api<PackageVersion> = Api::all(admin.clone());
    for version in ["1.35.4", "1.35.5"] {
        apply_json(
            &pvs,
            json!({
                "apiVersion": "kubeonkube.io/v1alpha1", "kind": "PackageVersion",
                "metadata": {"name": format!("kubelet-{version}")},
                "spec": {
                    "package": "kubelet",
                    "version": version,
                    "artifacts": [{
                        "arch": "amd64",
                        "url": hosts.artifact_url(&format!("missing-kubelet-{version}.tar.gz")),
                        "sha256": "0000000000000000000000000000000000000000000000000000000000000000",
                    }],
                },
            }),
        )
        .await;
    }
    apply_json(
        &Api::<ClusterPackageVersion>::all(admin.clone()),
        json!({
            "apiVersion": "kubeonkube.io/v1alpha1", "kind": "ClusterPackageVersion",
            "metadata": {"name": "default"},
            "spec": {"packages": {"kubelet": "kubelet-1.35.4"}},
        }),
    )
    .await;

    let node_config = work.path().join("node.kubeconfig");
    token_kubeconfig(&env, &token_of(&admin, ns, NODE_SA).await, &node_config);
    let mut node_op = Running::start(
        "node-operator",
        &node_deployment,
        &node_config,
        work.path().join("node-operator.log"),
    );
    let machines: Api<Machine> = Api::all(admin.clone());
    apply_json(
        &machines,
        json!({
            "apiVersion": "kubeonkube.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "chart-worker", "labels": {"pool": "chart"}},
            "spec": {
                "ip": host.ip().to_string(),
                "ssh": {
                    "user": "root",
                    "port": host.port(),
                    "privateKeySecretRef": {"name": "ssh-key", "namespace": keys_ns, "key": "ssh-privatekey"},
                    "hostPublicKey": host.host_public_key(),
                },
            },
        }),
    )
    .await;
    let started = Instant::now();
    let status = eventually(
        "the Machine is reached over SSH and its download fails",
        Duration::from_secs(180),
        &mut node_op,
        || {
            let machines = machines.clone();
            async move {
                let m = machines.get("chart-worker").await.ok()?;
                let status = m.status?;
                let reachable = condition(&status.conditions, "Reachable")?;
                let packages = condition(&status.conditions, "PackagesInstalled")?;
                (reachable.status == "True" && packages.reason == "DownloadFailed")
                    .then_some(status)
            }
        },
    )
    .await;
    println!(
        "Machine reached and its download refused in {:?}: {:?}",
        started.elapsed(),
        status.conditions
    );
    // The node-operator made the Machine's bootstrap token (and wrote it to
    // the host), and deleted it when the join failed: both rights used.
    let bootstrapped = Api::<Event>::all(admin.clone())
        .list(&ListParams::default().fields("regarding.name=chart-worker"))
        .await
        .expect("events")
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("BootstrapConfigured"));
    assert!(
        bootstrapped,
        "the node-operator made the Machine's bootstrap token"
    );
    let tokens: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let machine_tokens = ListParams::default().labels("kubeonkube.io/machine=chart-worker");
    assert_eq!(
        tokens
            .list(&machine_tokens)
            .await
            .expect("tokens")
            .items
            .len(),
        0,
        "a failed join leaves no bootstrap token"
    );
    let machine = machines.get("chart-worker").await.expect("machine");
    assert!(
        machine
            .finalizers()
            .iter()
            .any(|f| f == "kubeonkube.io/machine"),
        "the Machine carries the node-operator's finalizer"
    );

    let canaries: Api<CanaryRelease> = Api::all(admin.clone());
    apply_json(
        &canaries,
        json!({
            "apiVersion": "kubeonkube.io/v1alpha1", "kind": "CanaryRelease",
            "metadata": {"name": "chart-canary"},
            "spec": {
                "selector": {"matchLabels": {"pool": "chart"}},
                "packages": {"kubelet": "kubelet-1.35.5"},
                "batches": [1],
            },
        }),
    )
    .await;
    eventually(
        "the CanaryRelease claims the Machine",
        Duration::from_secs(120),
        &mut node_op,
        || {
            let canaries = canaries.clone();
            let machines = machines.clone();
            async move {
                let c = canaries.get("chart-canary").await.ok()?;
                c.status.as_ref()?;
                let m = machines.get("chart-worker").await.ok()?;
                let claimed = m
                    .annotations()
                    .get("kubeonkube.io/canary")
                    .map(String::as_str);
                (claimed == Some("chart-canary")
                    && c.finalizers().iter().any(|f| f.contains("canary")))
                .then_some(())
            }
        },
    )
    .await;
    delete_and_wait(
        &canaries,
        "chart-canary",
        "the CanaryRelease is released and gone",
        Duration::from_secs(120),
        &mut node_op,
    )
    .await;

    // Offboarding: the host is cleaned, the token deleted, the finalizer released.
    delete_and_wait(
        &machines,
        "chart-worker",
        "the Machine is offboarded",
        Duration::from_secs(180),
        &mut node_op,
    )
    .await;
    assert!(
        tokens
            .list(&machine_tokens)
            .await
            .expect("tokens")
            .items
            .is_empty(),
        "offboarding deleted the bootstrap token"
    );
    assert_not_forbidden(&node_op, "node-operator");
    assert_not_forbidden(&kok, "kube-on-kube-operator");
    drop(node_op);
    drop(kok);

    // Uninstall: every operator object goes, the CRDs stay.
    ok(
        helm(
            &[
                "uninstall",
                RELEASE,
                "--namespace",
                ns,
                "--wait",
                "--timeout",
                "120s",
            ],
            Some(&kubeconfig),
        ),
        "helm uninstall",
    );
    let release = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let mut left = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        left.clear();
        for namespace in [ns, "kube-system", "kube-public", keys_ns.as_str()] {
            let names = |kind: &str, items: Vec<String>| -> Vec<String> {
                items
                    .into_iter()
                    .map(|n| format!("{kind} {namespace}/{n}"))
                    .collect()
            };
            macro_rules! gone {
                ($kind:ty, $label:expr) => {
                    left.extend(names(
                        $label,
                        Api::<$kind>::namespaced(admin.clone(), namespace)
                            .list(&release)
                            .await
                            .expect($label)
                            .items
                            .iter()
                            .map(|o| o.name_any())
                            .collect(),
                    ))
                };
            }
            gone!(Deployment, "Deployment");
            gone!(Service, "Service");
            gone!(ServiceAccount, "ServiceAccount");
            gone!(PodDisruptionBudget, "PodDisruptionBudget");
            gone!(Role, "Role");
            gone!(RoleBinding, "RoleBinding");
            gone!(Pod, "Pod");
        }
        left.extend(
            Api::<ClusterRole>::all(admin.clone())
                .list(&release)
                .await
                .expect("cluster roles")
                .items
                .iter()
                .map(|o| format!("ClusterRole {}", o.name_any())),
        );
        left.extend(
            Api::<ClusterRoleBinding>::all(admin.clone())
                .list(&release)
                .await
                .expect("cluster role bindings")
                .items
                .iter()
                .map(|o| format!("ClusterRoleBinding {}", o.name_any())),
        );
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(left.is_empty(), "left behind by helm uninstall: {left:?}");
    for name in ["clusters.kubeonkube.io", "machines.kubeonkube.io"] {
        crds.get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name} kept: {e}"));
    }
}
