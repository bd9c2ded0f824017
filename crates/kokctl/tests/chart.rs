//! The Helm chart `charts/kube-on-kube` with the real `helm` and API server of
//! the test environment: it lints clean; what it renders runs hardened (non-root,
//! read-only root filesystem, no privilege escalation, seccomp, no capabilities)
//! and grants exactly the rights `docs/rbac.md` lists; its CRDs are the
//! repository's; it installs; each operator, run with a token of the chart's
//! ServiceAccount instead of admin, does its work without a single forbidden
//! request; and `helm uninstall` leaves nothing of the operators behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use serde_json::Value;

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
