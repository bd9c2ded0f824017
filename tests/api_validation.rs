//! The CRDs and examples against the real kube-apiserver: every CRD installs,
//! every example applies, and invalid objects are rejected by the API server with
//! the message the rule promises.

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use kube_on_kube_api::{CanaryRelease, Cluster, ClusterPackageVersion, Machine, PackageVersion};
use kube_on_kube_tests::{dynamic_api, example, example_documents, set};
use serde_json::{Value, json};

use kok_testenv::kube_env::KubeEnv;

/// How a case breaks an object.
enum Change {
    /// The object is invalid as created.
    Create(Vec<(&'static str, Value)>),
    /// The object is created valid, then updated to this.
    Update(Vec<(&'static str, Value)>),
    /// The object is created valid with the first changes, then updated
    /// with the second (for rules on a field the example leaves out).
    UpdateFrom(Vec<(&'static str, Value)>, Vec<(&'static str, Value)>),
}

/// A value that, written raw into a unit file, adds a command run as root.
const INJECTION: &str = "a\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'";

struct Case {
    name: &'static str,
    kind: &'static str,
    change: Change,
    message: &'static str,
}

fn cases() -> Vec<Case> {
    use Change::*;
    let c = |name, kind, change, message| Case {
        name,
        kind,
        change,
        message,
    };
    vec![
        // Cluster
        c(
            "version format",
            "Cluster",
            Create(vec![("spec/version", json!("v1.35"))]),
            "spec.version",
        ),
        c(
            "mode enum",
            "Cluster",
            Create(vec![("spec/mode", json!("Huge"))]),
            "Unsupported value: \"Huge\"",
        ),
        c(
            "etcd storage both",
            "Cluster",
            Create(vec![(
                "spec/etcd/storage/claimTemplate",
                json!({"resources": {"requests": {"storage": "1Gi"}}}),
            )]),
            "set exactly one of etcd.storage.claimTemplate or etcd.storage.volumeSource",
        ),
        c(
            "backup schedule both",
            "Cluster",
            Create(vec![(
                "spec/etcd/backup",
                json!({"schedule": {"every": "1h", "cron": "0 * * * *"},
                       "s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "credentialsSecret": "s3"},
                       "encryptionKeySecret": "backup-key"}),
            )]),
            "set exactly one of etcd.backup.schedule.every or etcd.backup.schedule.cron",
        ),
        c(
            "backup prefix escaping",
            "Cluster",
            Create(vec![(
                "spec/etcd/backup",
                json!({"schedule": {"every": "1h"},
                       "s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "prefix": "team-a/../team-b", "credentialsSecret": "s3"},
                       "encryptionKeySecret": "backup-key"}),
            )]),
            "etcd.backup.s3.prefix may not contain . or .. segments",
        ),
        c(
            "backup endpoint with a path",
            "Cluster",
            Create(vec![(
                "spec/etcd/backup",
                json!({"schedule": {"every": "1h"},
                       "s3": {"endpoint": "https://user@s3.example.com/x", "bucket": "etcd",
                              "credentialsSecret": "s3"},
                       "encryptionKeySecret": "backup-key"}),
            )]),
            "spec.etcd.backup.s3.endpoint",
        ),
        c(
            "backup retention zero",
            "Cluster",
            Create(vec![(
                "spec/etcd/backup",
                json!({"schedule": {"every": "1h"}, "retention": {"count": 0},
                       "s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "credentialsSecret": "s3"},
                       "encryptionKeySecret": "backup-key"}),
            )]),
            "spec.etcd.backup.retention.count",
        ),
        c(
            "restore without a prefix",
            "Cluster",
            Create(vec![(
                "spec/etcd/restoreFrom",
                json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "credentialsSecret": "s3"},
                       "snapshot": "latest", "encryptionKeySecret": "backup-key"}),
            )]),
            "etcd.restoreFrom.s3.prefix must name where the snapshots are",
        ),
        c(
            "restore added after creation",
            "Cluster",
            Update(vec![(
                "spec/etcd/restoreFrom",
                json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "prefix": "ns/c", "credentialsSecret": "s3"},
                       "snapshot": "latest", "encryptionKeySecret": "backup-key"}),
            )]),
            "etcd.restoreFrom is set when the Cluster is created and cannot change",
        ),
        c(
            "restore of a snapshot name that is not one",
            "Cluster",
            Create(vec![(
                "spec/etcd/restoreFrom",
                json!({"s3": {"endpoint": "https://s3.example.com", "bucket": "etcd",
                              "prefix": "ns/c", "credentialsSecret": "s3"},
                       "snapshot": "../x", "encryptionKeySecret": "backup-key"}),
            )]),
            "spec.etcd.restoreFrom.snapshot",
        ),
        c(
            "etcd storage none",
            "Cluster",
            Create(vec![("spec/etcd/storage/volumeSource", Value::Null)]),
            "set exactly one of etcd.storage.claimTemplate or etcd.storage.volumeSource",
        ),
        c(
            "volume source both",
            "Cluster",
            Create(vec![(
                "spec/etcd/storage/volumeSource/hostPath",
                json!({"path": "/var/lib/etcd"}),
            )]),
            "set exactly one of volumeSource.emptyDir or volumeSource.hostPath",
        ),
        c(
            "claim bound to a named volume",
            "Cluster",
            Create(vec![
                ("spec/etcd/storage/volumeSource", Value::Null),
                (
                    "spec/etcd/storage/claimTemplate",
                    json!({"volumeName": "someone-elses-pv", "accessModes": ["ReadWriteOnce"],
                           "resources": {"requests": {"storage": "1Gi"}}}),
                ),
            ]),
            "etcd.storage.claimTemplate.volumeName cannot be set",
        ),
        c(
            "claim bound by selector",
            "Cluster",
            Create(vec![
                ("spec/etcd/storage/volumeSource", Value::Null),
                (
                    "spec/etcd/storage/claimTemplate",
                    json!({"selector": {"matchLabels": {"tenant": "other"}},
                           "accessModes": ["ReadWriteOnce"],
                           "resources": {"requests": {"storage": "1Gi"}}}),
                ),
            ]),
            "etcd.storage.claimTemplate.selector cannot be set",
        ),
        c(
            "audit going nowhere",
            "Cluster",
            Create(vec![(
                "spec/apiServer/audit",
                json!({"policyConfigMap": "p"}),
            )]),
            "audit needs a log, a webhook or both",
        ),
        c(
            "audit log rotated past its range",
            "Cluster",
            Create(vec![(
                "spec/apiServer/audit",
                json!({"log": {"maxSizeMB": 4096}}),
            )]),
            "spec.apiServer.audit.log.maxSizeMB",
        ),
        c(
            "nodePort without NodePort",
            "Cluster",
            Create(vec![(
                "spec/apiServer/external",
                json!({"type": "ClusterIP", "nodePort": 30443}),
            )]),
            "nodePort can only be set when type is NodePort",
        ),
        c(
            "nodePort range",
            "Cluster",
            Create(vec![(
                "spec/apiServer/external",
                json!({"type": "NodePort", "nodePort": 80}),
            )]),
            "should be greater than or equal to 30000",
        ),
        c(
            "port range",
            "Cluster",
            Create(vec![("spec/apiServer/external/port", json!(70000))]),
            "should be less than or equal to 65535",
        ),
        c(
            "external address",
            "Cluster",
            Create(vec![(
                "spec/apiServer/external/addresses",
                json!(["api.example.com"]),
            )]),
            "every external address must be an IPv4 or IPv6 address",
        ),
        c(
            "service CIDR",
            "Cluster",
            Create(vec![("spec/network/serviceCIDR", json!("10.96.0.0"))]),
            "network.serviceCIDR must be a CIDR",
        ),
        c(
            "renewBefore < validity",
            "Cluster",
            Create(vec![(
                "spec/certificates",
                json!({"validity": "24h", "renewBefore": "48h"}),
            )]),
            "certificates.renewBefore must be shorter than certificates.validity",
        ),
        c(
            "validity format",
            "Cluster",
            Create(vec![("spec/certificates/validity", json!("1 year"))]),
            "spec.certificates.validity",
        ),
        c(
            "minor skip",
            "Cluster",
            Update(vec![("spec/version", json!("1.37.0"))]),
            "a Kubernetes upgrade may not skip a minor version",
        ),
        c(
            "minor downgrade",
            "Cluster",
            Update(vec![("spec/version", json!("1.34.2"))]),
            "downgrading the Kubernetes minor version is not supported",
        ),
        c(
            "etcd major change",
            "Cluster",
            UpdateFrom(
                vec![("spec/etcd/version", json!("3.6.16"))],
                vec![("spec/etcd/version", json!("4.0.0"))],
            ),
            "the etcd major version cannot change",
        ),
        c(
            "etcd minor skip",
            "Cluster",
            UpdateFrom(
                vec![("spec/etcd/version", json!("3.6.16"))],
                vec![("spec/etcd/version", json!("3.8.0"))],
            ),
            "an etcd upgrade may not skip a minor version",
        ),
        c(
            "etcd minor downgrade",
            "Cluster",
            UpdateFrom(
                vec![("spec/etcd/version", json!("3.6.16"))],
                vec![("spec/etcd/version", json!("3.5.21"))],
            ),
            "downgrading the etcd minor version is not supported",
        ),
        c(
            "etcd storage immutable",
            "Cluster",
            Update(vec![(
                "spec/etcd/storage/volumeSource",
                json!({"hostPath": {"path": "/var/lib/etcd"}}),
            )]),
            "etcd storage cannot be changed after the cluster is created",
        ),
        c(
            "service CIDR immutable",
            "Cluster",
            Update(vec![("spec/network/serviceCIDR", json!("10.100.0.0/16"))]),
            "network.serviceCIDR cannot be changed",
        ),
        c(
            "cluster name length",
            "Cluster",
            Create(vec![(
                "metadata/name",
                json!("a-cluster-name-that-is-far-too-long-to-use"),
            )]),
            "a Cluster name may be at most 40 characters",
        ),
        c(
            "cluster name with a dot",
            "Cluster",
            Create(vec![("metadata/name", json!("a.b"))]),
            "a Cluster name must be a DNS-1035 label",
        ),
        c(
            "cluster name starting with a digit",
            "Cluster",
            Create(vec![("metadata/name", json!("1abc"))]),
            "a Cluster name must be a DNS-1035 label",
        ),
        c(
            "cluster name ending in -etcd",
            "Cluster",
            Create(vec![("metadata/name", json!("x-etcd"))]),
            "a Cluster name may not end in -etcd or -front-proxy",
        ),
        c(
            "cluster name ending in -front-proxy",
            "Cluster",
            Create(vec![("metadata/name", json!("x-front-proxy"))]),
            "a Cluster name may not end in -etcd or -front-proxy",
        ),
        c(
            "cluster name with a kubeconfig segment",
            "Cluster",
            Create(vec![("metadata/name", json!("x-kubeconfig"))]),
            "a Cluster name may not contain the segment kubeconfig",
        ),
        // Machine
        c(
            "machine ip",
            "Machine",
            Create(vec![("spec/ip", json!("300.1.2.3"))]),
            "ip must be an IPv4 or IPv6 address",
        ),
        c(
            "machine ip link-local",
            "Machine",
            Create(vec![("spec/ip", json!("169.254.169.254"))]),
            "ip must be a unicast address of the host",
        ),
        c(
            "machine ip loopback",
            "Machine",
            Create(vec![("spec/ip", json!("127.0.0.1"))]),
            "ip must be a unicast address of the host",
        ),
        c(
            "machine ip IPv6 link-local",
            "Machine",
            Create(vec![("spec/ip", json!("fe80::1"))]),
            "ip must be a unicast address of the host",
        ),
        c(
            "machine ip unspecified",
            "Machine",
            Create(vec![("spec/ip", json!("0.0.0.0"))]),
            "ip must be a unicast address of the host",
        ),
        c(
            "machine name length",
            "Machine",
            Create(vec![("metadata/name", json!("m".repeat(64)))]),
            "a Machine name may be at most 63 characters",
        ),
        c(
            "machine ip immutable",
            "Machine",
            Update(vec![("spec/ip", json!("10.0.12.35"))]),
            "ip cannot be changed",
        ),
        c(
            "ssh port",
            "Machine",
            Create(vec![("spec/ssh/port", json!(0))]),
            "should be greater than or equal to 1",
        ),
        c(
            "host key format",
            "Machine",
            Create(vec![("spec/ssh/hostPublicKey", json!("trust-me"))]),
            "spec.ssh.hostPublicKey",
        ),
        c(
            "sysctl name",
            "Machine",
            Create(vec![("spec/sysctls", json!({"rm -rf /": "1"}))]),
            "sysctl names must be on the allowlist",
        ),
        c(
            "sysctl allowlist",
            "Machine",
            Create(vec![(
                "spec/sysctls",
                json!({"kernel.core_pattern": "|/tmp/x %p"}),
            )]),
            "sysctl names must be on the allowlist",
        ),
        c(
            "sysctl value one line",
            "Machine",
            Create(vec![(
                "spec/sysctls",
                json!({"vm.swappiness": "1\nkernel.core_pattern = |/tmp/x"}),
            )]),
            "spec.sysctls",
        ),
        c(
            "zone is a label value",
            "Machine",
            Create(vec![("spec/zone", json!(INJECTION))]),
            "spec.zone",
        ),
        c(
            "idc is a label value",
            "Machine",
            Create(vec![("spec/idc", json!("idc 1"))]),
            "spec.idc",
        ),
        c(
            "node label key",
            "Machine",
            Create(vec![("spec/kubelet/nodeLabels", json!({"pool\nx": "a"}))]),
            "node label keys are",
        ),
        c(
            "node label value",
            "Machine",
            Create(vec![(
                "spec/kubelet/nodeLabels",
                json!({"pool": INJECTION}),
            )]),
            "spec.kubelet.nodeLabels.pool in body should match",
        ),
        c(
            "taint key",
            "Machine",
            Create(vec![(
                "spec/kubelet/taints",
                json!([{"key": "a b", "effect": "NoSchedule"}]),
            )]),
            "spec.kubelet.taints[0].key in body should match",
        ),
        c(
            "taint value",
            "Machine",
            Create(vec![(
                "spec/kubelet/taints",
                json!([{"key": "dedicated", "value": INJECTION, "effect": "NoSchedule"}]),
            )]),
            "spec.kubelet.taints[0].value in body should match",
        ),
        c(
            "taint effect",
            "Machine",
            Create(vec![(
                "spec/kubelet/taints",
                json!([{"key": "dedicated", "effect": "NoSchedule\nExecStartPre=/x"}]),
            )]),
            "Unsupported value: \"NoSchedule\\nExecStartPre=/x\"",
        ),
        c(
            "kube-reserved resources",
            "Machine",
            Create(vec![("spec/kubelet/kubeReserved", json!({"gpu": "1"}))]),
            "reserved resources are cpu, memory, ephemeral-storage and pid",
        ),
        c(
            "system-reserved resources",
            "Machine",
            Create(vec![("spec/kubelet/systemReserved", json!({"cpu\n": "1"}))]),
            "reserved resources are cpu, memory, ephemeral-storage and pid",
        ),
        c(
            "eviction signal",
            "Machine",
            Create(vec![(
                "spec/kubelet/evictionHard",
                json!({"memory available": "1Gi"}),
            )]),
            "eviction signals look like memory.available",
        ),
        c(
            "eviction threshold",
            "Machine",
            Create(vec![(
                "spec/kubelet/evictionHard",
                json!({"memory.available": "1Gi\nx"}),
            )]),
            "spec.kubelet.evictionHard",
        ),
        c(
            "kubelet flag name",
            "Machine",
            Create(vec![("spec/kubelet/extraArgs", json!({"--v": "2"}))]),
            "kubelet flag names are",
        ),
        c(
            "kubelet flag value",
            "Machine",
            Create(vec![("spec/kubelet/extraArgs", json!({"v": INJECTION}))]),
            "spec.kubelet.extraArgs",
        ),
        // PackageVersion
        c(
            "sha256 format",
            "PackageVersion",
            Create(vec![(
                "spec/artifacts",
                json!([{"arch": "amd64", "url": "http://a.example/x.tgz", "sha256": "abc"}]),
            )]),
            "spec.artifacts[0].sha256",
        ),
        c(
            "artifact url scheme",
            "PackageVersion",
            Create(vec![(
                "spec/artifacts",
                json!([{"arch": "amd64", "url": "ftp://a.example/x.tgz", "sha256": "0".repeat(64)}]),
            )]),
            "artifact url must start with http:// or https://",
        ),
        c(
            "arch enum",
            "PackageVersion",
            Create(vec![(
                "spec/artifacts",
                json!([{"arch": "mips", "url": "http://a.example/x.tgz", "sha256": "0".repeat(64)}]),
            )]),
            "Unsupported value: \"mips\"",
        ),
        c(
            "health check one of",
            "PackageVersion",
            Create(vec![(
                "spec/healthCheck",
                json!({"command": ["true"], "httpGet": "http://127.0.0.1/healthz"}),
            )]),
            "a health check has exactly one of command or httpGet",
        ),
        c(
            "binary path absolute",
            "PackageVersion",
            Create(vec![(
                "spec/install/binaries",
                json!([{"path": "/usr/bin/evil"}]),
            )]),
            "spec.install.binaries[0].path",
        ),
        c(
            "binary path control characters",
            "PackageVersion",
            Create(vec![(
                "spec/install/binaries",
                json!([{"path": "bin/evil\nExecStart=/bin/sh"}]),
            )]),
            "spec.install.binaries[0].path",
        ),
        c(
            "binary path parent segment",
            "PackageVersion",
            Create(vec![(
                "spec/install/binaries",
                json!([{"path": "bin/../../../etc/cron.d/evil"}]),
            )]),
            "binary path must stay inside the version directory",
        ),
        c(
            "binary link parent segment",
            "PackageVersion",
            Create(vec![(
                "spec/install/binaries",
                json!([{"path": "bin/x", "link": "/usr/local/bin/../../../etc/passwd"}]),
            )]),
            "binary link must be an absolute path without .. segments",
        ),
        c(
            "package version immutable",
            "PackageVersion",
            Update(vec![("spec/version", json!("2.1.5"))]),
            "a PackageVersion cannot be changed",
        ),
        // ClusterPackageVersion
        c(
            "cpv name",
            "ClusterPackageVersion",
            Create(vec![("metadata/name", json!("mine"))]),
            "must be named default",
        ),
        c(
            "cpv empty packages",
            "ClusterPackageVersion",
            Create(vec![("spec/packages", json!({}))]),
            "packages must name at least one package",
        ),
        c(
            "max unavailable",
            "ClusterPackageVersion",
            Create(vec![("spec/rollout/maxUnavailable", json!("0%"))]),
            "maxUnavailable is a count of at least 1",
        ),
        // CanaryRelease
        c(
            "empty selector",
            "CanaryRelease",
            Create(vec![("spec/selector", json!({}))]),
            "selector must have at least one matchLabels entry",
        ),
        c(
            "no batches",
            "CanaryRelease",
            Create(vec![("spec/batches", json!([]))]),
            "spec.batches",
        ),
        c(
            "batch percent",
            "CanaryRelease",
            Create(vec![("spec/batches", json!([1, "150%"]))]),
            "each batch is a count of at least 1 or a percentage",
        ),
        c(
            "failure budget",
            "CanaryRelease",
            Create(vec![("spec/failureBudget", json!(-1))]),
            "failureBudget is a count of at least 0",
        ),
        c(
            "canary release name length",
            "CanaryRelease",
            Create(vec![("metadata/name", json!("c".repeat(64)))]),
            "a CanaryRelease name may be at most 63 characters",
        ),
        c(
            "action enum",
            "CanaryRelease",
            Create(vec![("spec/action", json!("Explode"))]),
            "Unsupported value: \"Explode\"",
        ),
    ]
}

fn api_for(client: &Client, kind: &str, namespace: &str) -> kube::Api<DynamicObject> {
    let c = client.clone();
    match kind {
        "Cluster" => dynamic_api::<Cluster>(c, Some(namespace)),
        "Machine" => dynamic_api::<Machine>(c, None),
        "PackageVersion" => dynamic_api::<PackageVersion>(c, None),
        "ClusterPackageVersion" => dynamic_api::<ClusterPackageVersion>(c, None),
        "CanaryRelease" => dynamic_api::<CanaryRelease>(c, None),
        other => panic!("no API for {other}"),
    }
}

/// The example of `kind`, renamed so cases do not collide (a
/// ClusterPackageVersion must keep its name, so those cases run one at a time).
fn base(kind: &str, index: usize, namespace: &str) -> Value {
    let mut doc = example(kind);
    if kind != "ClusterPackageVersion" {
        set(
            &mut doc,
            "metadata/name",
            json!(format!("case-{index}-{namespace}")),
        );
    }
    if kind == "Cluster" {
        set(&mut doc, "metadata/namespace", json!(namespace));
    }
    doc
}

fn apply_changes(doc: &mut Value, changes: &[(&'static str, Value)]) {
    for (path, value) in changes {
        set(doc, path, value.clone());
    }
}

async fn expect_rejected(
    case: &Case,
    result: Result<DynamicObject, kube::Error>,
) -> Result<(), String> {
    match result {
        Ok(_) => Err(format!("{}: the API server accepted it", case.name)),
        Err(kube::Error::Api(status)) if status.message.contains(case.message) => Ok(()),
        Err(e) => Err(format!(
            "{}: rejected, but not with {:?}: {e}",
            case.name, case.message
        )),
    }
}

async fn run_case(
    client: &Client,
    namespace: &str,
    index: usize,
    case: &Case,
) -> Result<(), String> {
    let api = api_for(client, case.kind, namespace);
    let mut doc = base(case.kind, index, namespace);
    let name = doc["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let outcome = match &case.change {
        Change::Create(changes) => {
            apply_changes(&mut doc, changes);
            let obj: DynamicObject = serde_json::from_value(doc).map_err(|e| e.to_string())?;
            expect_rejected(case, api.create(&PostParams::default(), &obj).await).await
        }
        Change::Update(changes) | Change::UpdateFrom(_, changes) => {
            if let Change::UpdateFrom(before, _) = &case.change {
                apply_changes(&mut doc, before);
            }
            let valid: DynamicObject =
                serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
            let created = api
                .create(&PostParams::default(), &valid)
                .await
                .map_err(|e| format!("{}: the valid object was refused: {e}", case.name))?;
            apply_changes(&mut doc, changes);
            let mut obj: DynamicObject = serde_json::from_value(doc).map_err(|e| e.to_string())?;
            obj.metadata.resource_version = created.metadata.resource_version;
            expect_rejected(case, api.replace(&name, &PostParams::default(), &obj).await).await
        }
    };
    let _ = api.delete(&name, &Default::default()).await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_rejected_with_their_message() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let namespace = env.namespace("validation").await;
    let cases = cases();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        if let Err(e) = run_case(&client, &namespace, index, case).await {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_applies_and_reads_back_typed() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let namespace = env.namespace("examples").await;
    let mut applied = 0;
    for (file, mut doc) in example_documents() {
        let kind = doc["kind"].as_str().expect("kind").to_string();
        if kind == "Cluster" || kind == "Secret" || kind == "ConfigMap" {
            set(&mut doc, "metadata/namespace", json!(namespace));
        }
        let name = doc["metadata"]["name"].as_str().expect("name").to_string();
        let api = match kind.as_str() {
            "Secret" => {
                dynamic_api::<k8s_openapi::api::core::v1::Secret>(client.clone(), Some(&namespace))
            }
            "ConfigMap" => dynamic_api::<k8s_openapi::api::core::v1::ConfigMap>(
                client.clone(),
                Some(&namespace),
            ),
            k => api_for(&client, k, &namespace),
        };
        let obj: DynamicObject = serde_json::from_value(doc).expect("object");
        let stored = api
            .patch(
                &name,
                &PatchParams::apply("examples-test"),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("{file}: {kind}/{name} was refused: {e}"));
        // What the API server stored (with its defaults) must parse as the typed kind.
        let value = serde_json::to_value(&stored).expect("serialize");
        let typed = match kind.as_str() {
            "Cluster" => serde_json::from_value::<Cluster>(value).map(|_| ()),
            "Machine" => serde_json::from_value::<Machine>(value).map(|_| ()),
            "PackageVersion" => serde_json::from_value::<PackageVersion>(value).map(|_| ()),
            "ClusterPackageVersion" => {
                serde_json::from_value::<ClusterPackageVersion>(value).map(|_| ())
            }
            "CanaryRelease" => serde_json::from_value::<CanaryRelease>(value).map(|_| ()),
            _ => Ok(()),
        };
        typed.unwrap_or_else(|e| panic!("{file}: stored {kind}/{name} does not parse: {e}"));
        applied += 1;
    }
    assert!(applied >= 8, "applied only {applied} documents");
}

/// The CRD's rules on Cluster names and `cluster_name_allowed` (which the
/// operator's test that no two accepted names derive the same name relies
/// on) judge names alike, and each colliding pair of names is refused its
/// second Cluster while the first stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_names_are_judged_as_cluster_name_allowed_says() {
    use kube_on_kube_api::cluster::{MAX_CLUSTER_NAME, cluster_name_allowed};
    let env = KubeEnv::shared();
    let client = env.client().await;
    let namespace = env.namespace("names").await;
    let api = api_for(&client, "Cluster", &namespace);
    let create = async |name: &str| {
        let mut doc = base("Cluster", 0, &namespace);
        set(&mut doc, "metadata/name", json!(name));
        let obj: DynamicObject = serde_json::from_value(doc).expect("cluster");
        api.create(&PostParams::default(), &obj).await
    };
    let longest = "a".repeat(MAX_CLUSTER_NAME);
    let too_long = "a".repeat(MAX_CLUSTER_NAME + 1);
    let names = [
        "x",
        "ci-1234",
        "etcd",
        "x-etcd-0",
        "x-proxy",
        "x-admin",
        "x-apiserver",
        "x-etcd-ca",
        "a.b",
        "1abc",
        "x-",
        "x_y",
        "x-etcd",
        "x-front-proxy",
        "x-kubeconfig",
        "x-kubeconfig-sa",
        "kubeconfig",
        "x-front",
        longest.as_str(),
        too_long.as_str(),
    ];
    let mut disagreements = Vec::new();
    for name in names {
        let accepted = match create(name).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 422 => false,
            Err(e) => panic!("{name}: {e}"),
        };
        if accepted != cluster_name_allowed(name) {
            disagreements.push(format!("{name}: API server accepted={accepted}"));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:?}");

    // The pairs of the issue: `x` exists, and its partner is refused.
    let first = api.get("x").await.expect("x");
    for second in ["x-etcd", "x-front-proxy", "x-kubeconfig"] {
        assert!(create(second).await.is_err(), "{second} accepted");
    }
    let after = api.get("x").await.expect("x");
    assert_eq!(
        first.metadata.resource_version,
        after.metadata.resource_version
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_fills_in_defaults() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let namespace = env.namespace("defaults").await;
    // Untyped, so that serde's own defaults cannot stand in for the server's.
    let api = dynamic_api::<Cluster>(client, Some(&namespace));
    let mut doc = example("Cluster");
    set(&mut doc, "metadata/namespace", json!(namespace));
    let cluster: Cluster = serde_json::from_value(doc).expect("typed");
    // Send only what the user wrote: the typed value would carry our defaults.
    let minimal: DynamicObject = serde_json::from_value(json!({
        "apiVersion": Cluster::api_version(&()), "kind": "Cluster",
        "metadata": {"name": "defaults", "namespace": namespace},
        "spec": {"version": cluster.spec.version, "etcd": {"storage": {"volumeSource": {"emptyDir": {}}}}}
    }))
    .expect("object");
    let stored = api
        .patch(
            "defaults",
            &PatchParams::apply("defaults-test"),
            &Patch::Apply(&minimal),
        )
        .await
        .expect("minimal cluster accepted");
    let spec = &stored.data["spec"];
    assert_eq!(spec["mode"], "Production");
    assert_eq!(spec["network"]["serviceCIDR"], "10.96.0.0/12");
    assert_eq!(spec["certificates"]["validity"], "8760h");
    assert_eq!(spec["apiServer"]["external"]["port"], 6443);
}
