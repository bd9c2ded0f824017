//! The Pod runner runs Pods as real processes: etcd with a Secret-mounted TLS
//! configuration serves on its Pod IP and passes its readiness probe; three etcd
//! Pods behind three headless Services form one cluster by DNS names; a claim's
//! data survives its Pod; deleting a Pod stops its process.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::{Options, PodRunner};
use kok_testenv::wait::wait_for;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        PodRunner::start(
            KubeEnv::shared(),
            Options {
                nodes: vec!["pods-test-0".into()],
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("the Pod runner did not start: {e}"))
    })
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When a Pod's condition last changed.
fn transition(pod: &Pod, type_: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

async fn ready_pod(client: &Client, ns: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("pod {name} to be ready"),
        Duration::from_secs(90),
        async || pods.get_opt(name).await.ok().flatten().filter(ready),
    )
    .await
}

/// Processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) && !cmdline.contains("cargo") {
                out.push(pid);
            }
        }
    }
    out
}

fn etcdctl(endpoint: &str, pki: &std::path::Path, args: &[&str]) -> std::process::Output {
    let bin = kok_testenv::bins::bin("etcdctl").expect("etcdctl");
    std::process::Command::new(bin)
        .arg(format!("--endpoints={endpoint}"))
        .arg(format!("--cacert={}", pki.join("ca.crt").display()))
        .arg(format!("--cert={}", pki.join("client.crt").display()))
        .arg(format!("--key={}", pki.join("client.key").display()))
        .arg("--dial-timeout=5s")
        .args(args)
        .output()
        .expect("run etcdctl")
}

/// A CA, a server certificate for `names` and a client certificate, written
/// to `dir` and returned as Secret data.
fn tls(dir: &std::path::Path, names: &[&str]) -> BTreeMap<String, ByteString> {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(sans).expect("params");
        params.extended_key_usages = vec![usage, ExtendedKeyUsagePurpose::ClientAuth];
        (
            params.signed_by(&key, &issuer).expect("sign").pem(),
            key.serialize_pem(),
        )
    };
    let (server_crt, server_key) = leaf(
        names.iter().map(|s| s.to_string()).collect(),
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_crt, client_key) = leaf(vec!["client".into()], ExtendedKeyUsagePurpose::ClientAuth);
    let files = [
        ("ca.crt", ca_cert.pem()),
        ("server.crt", server_crt),
        ("server.key", server_key),
        ("client.crt", client_crt),
        ("client.key", client_key),
    ];
    std::fs::create_dir_all(dir).expect("pki dir");
    files
        .into_iter()
        .map(|(k, v)| {
            std::fs::write(dir.join(k), &v).expect("write pki");
            (k.to_string(), ByteString(v.into_bytes()))
        })
        .collect()
}

fn etcd_pod(
    name: &str,
    node: &str,
    secret: &str,
    peer_scheme_host: Option<(&str, &str)>,
    extra: &[String],
) -> Pod {
    let mut args = vec![
        format!("--name={name}"),
        "--data-dir=/var/lib/etcd/data".to_string(),
        "--listen-client-urls=https://0.0.0.0:2379".to_string(),
        "--advertise-client-urls=https://$(POD_IP):2379".to_string(),
        "--listen-metrics-urls=http://0.0.0.0:2381".to_string(),
        "--cert-file=/etc/etcd/pki/server.crt".to_string(),
        "--key-file=/etc/etcd/pki/server.key".to_string(),
        "--trusted-ca-file=/etc/etcd/pki/ca.crt".to_string(),
        "--client-cert-auth=true".to_string(),
    ];
    if let Some((url, _)) = peer_scheme_host {
        args.push("--listen-peer-urls=http://0.0.0.0:2380".into());
        args.push(format!("--initial-advertise-peer-urls={url}"));
    }
    args.extend(extra.iter().cloned());
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "hostname": name,
            "subdomain": peer_scheme_host.map(|(_, svc)| svc),
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "etcd",
                "image": "registry.k8s.io/etcd:3.6.16-0",
                "command": ["etcd"],
                "args": args,
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "metrics", "containerPort": 2381}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "pki", "mountPath": "/etc/etcd/pki", "readOnly": true},
                    {"name": "data", "mountPath": "/var/lib/etcd"}
                ]
            }],
            "volumes": [
                {"name": "pki", "secret": {"secretName": secret, "items": [
                    {"key": "ca.crt", "path": "ca.crt"},
                    {"key": "server.crt", "path": "server.crt"},
                    {"key": "server.key", "path": "server.key", "mode": 0o400}
                ]}},
                {"name": "data", "emptyDir": {}}
            ]
        }
    }))
    .expect("pod")
}

async fn create_secret(client: &Client, ns: &str, name: &str, data: BTreeMap<String, ByteString>) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_secret_tls_serves_on_its_pod_ip_and_stops_when_deleted() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pod-etcd").await;
    let pki = tempfile::tempdir().expect("tempdir");
    create_secret(&client, &ns, "etcd-tls", tls(pki.path(), &["localhost"])).await;
    let name = format!("solo-{ns}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &etcd_pod(&name, &runner.nodes()[0], "etcd-tls", None, &[]),
    )
    .await
    .expect("create pod");

    let pod = ready_pod(&client, &ns, &name).await;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert_ne!(ip, "127.0.0.1");
    // TLS with a client certificate, on the Pod's own address.
    let endpoint = format!("https://{ip}:2379");
    let put = etcdctl(
        &endpoint,
        pki.path(),
        &["--insecure-skip-tls-verify", "put", "greeting", "hello"],
    );
    assert!(
        put.status.success(),
        "put failed: {}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = etcdctl(
        &endpoint,
        pki.path(),
        &[
            "--insecure-skip-tls-verify",
            "get",
            "greeting",
            "--print-value-only",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "hello");
    let status = pod.status.expect("status");
    let container = &status.container_statuses.expect("container statuses")[0];
    assert!(
        container.ready
            && container
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some()
    );
    assert!(
        !processes_with(&format!("--name={name}")).is_empty(),
        "the etcd process runs"
    );

    pods.delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(
        "the pod object to go",
        Duration::from_secs(30),
        async || {
            pods.get_opt(&name)
                .await
                .ok()
                .filter(Option::is_none)
                .map(|_| ())
        },
    )
    .await;
    wait_for(
        "the etcd process to stop",
        Duration::from_secs(10),
        async || {
            processes_with(&format!("--name={name}"))
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_etcd_pods_form_one_cluster_by_service_names() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pod-etcd3").await;
    let pki = tempfile::tempdir().expect("tempdir");
    create_secret(&client, &ns, "etcd-tls", tls(pki.path(), &["localhost"])).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let members: Vec<(String, String)> = (0..3)
        .map(|i| {
            let name = format!("e{i}");
            let url = format!("http://{name}.{ns}.svc.cluster.local:2380");
            (name, url)
        })
        .collect();
    let initial = members
        .iter()
        .map(|(n, u)| format!("{n}={u}"))
        .collect::<Vec<_>>()
        .join(",");
    for (name, url) in &members {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": name},
                     "ports": [{"name": "peer", "port": 2380}]}
        }))
        .expect("service");
        services
            .create(&PostParams::default(), &svc)
            .await
            .expect("service");
        let extra = [
            format!("--initial-cluster={initial}"),
            "--initial-cluster-state=new".into(),
            format!("--initial-cluster-token={ns}"),
        ];
        pods.create(
            &PostParams::default(),
            &etcd_pod(
                name,
                &runner.nodes()[0],
                "etcd-tls",
                Some((url, name)),
                &extra,
            ),
        )
        .await
        .expect("pod");
    }
    let mut ips = Vec::new();
    for (name, _) in &members {
        let pod = ready_pod(&client, &ns, name).await;
        ips.push(pod.status.and_then(|s| s.pod_ip).expect("ip"));
    }
    let endpoint = format!("https://{}:2379", ips[0]);
    let list = etcdctl(
        &endpoint,
        pki.path(),
        &["--insecure-skip-tls-verify", "member", "list", "-w", "json"],
    );
    assert!(
        list.status.success(),
        "member list failed: {}",
        String::from_utf8_lossy(&list.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&list.stdout).expect("json");
    let peer_urls: Vec<String> = parsed["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["peerURLs"][0].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(peer_urls.len(), 3, "{parsed}");
    for (_, url) in &members {
        assert!(peer_urls.contains(url), "{url} missing from {peer_urls:?}");
    }
    // A write through one member is readable through another.
    let put = etcdctl(
        &endpoint,
        pki.path(),
        &["--insecure-skip-tls-verify", "put", "k", "v"],
    );
    assert!(put.status.success());
    let other = format!("https://{}:2379", ips[2]);
    let get = etcdctl(
        &other,
        pki.path(),
        &[
            "--insecure-skip-tls-verify",
            "get",
            "k",
            "--print-value-only",
            "--consistency=l",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "v");
    for (name, _) in &members {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_outlives_its_pod_and_goes_with_the_claim() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pod-claim").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let writer = |name: &str, script: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": runner.nodes()[0],
                "restartPolicy": "Never",
                "containers": [{"name": "sh", "image": "busybox", "command": ["/bin/sh", "-c", script],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
            }
        }))
        .expect("pod")
    };
    let phase = async |name: &str| {
        wait_for(
            &format!("pod {name} to finish"),
            Duration::from_secs(60),
            async || {
                pods.get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|p| p.status?.phase)
                    .filter(|p| p == "Succeeded" || p == "Failed")
            },
        )
        .await
    };
    pods.create(
        &PostParams::default(),
        &writer("write", "echo kept > /data/file"),
    )
    .await
    .expect("pod");
    assert_eq!(phase("write").await, "Succeeded");
    pods.create(
        &PostParams::default(),
        &writer("read", "grep -q kept /data/file"),
    )
    .await
    .expect("pod");
    assert_eq!(
        phase("read").await,
        "Succeeded",
        "the second Pod sees the first one's file"
    );
    // The volume's directory is gone once the claim is.
    let volume = claims
        .get("data")
        .await
        .expect("claim")
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound");
    let pv: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    let dir = pv
        .get(&volume)
        .await
        .expect("volume")
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .expect("host path");
    assert!(std::path::Path::new(&dir).join("file").exists());
    for name in ["write", "read"] {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_for(
        "the volume to be deleted",
        Duration::from_secs(60),
        async || {
            pv.get_opt(&volume)
                .await
                .ok()
                .filter(Option::is_none)
                .map(|_| ())
        },
    )
    .await;
    assert!(
        !std::path::Path::new(&dir).exists(),
        "{dir} outlived its claim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_probes_gate_readiness_and_a_failing_liveness_probe_restarts() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pod-probes").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Ready once /tmp/ready exists inside the container; alive while
    // /tmp/dead does not. The container creates the first after a moment and
    // the second a little later, so it must turn ready, then be restarted.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probed"},
        "spec": {
            "nodeName": runner.nodes()[0],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sh", "image": "busybox",
                "command": ["/bin/sh", "-c", "sleep 1; touch /tmp/ready; sleep 4; touch /tmp/dead; sleep 1000"],
                "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/ready"]}, "periodSeconds": 1},
                "livenessProbe": {"exec": {"command": ["/bin/sh", "-c", "test ! -f /tmp/dead"]}, "periodSeconds": 1, "failureThreshold": 2}
            }]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let first = ready_pod(&client, &ns, "probed").await;
    let first_since = |type_: &str| transition(&first, type_);
    assert_eq!(
        first
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .expect("statuses")[0]
            .restart_count,
        0
    );
    let (restarted, again) = wait_for(
        "a liveness restart, then ready again",
        Duration::from_secs(60),
        async || {
            let p = pods.get("probed").await.ok()?;
            let c = p.status.clone()?.container_statuses?.into_iter().next()?;
            (c.restart_count >= 1 && ready(&p)).then_some((c, p))
        },
    )
    .await;
    // Ready went False and back: its transition time moved on; PodScheduled
    // never changed and kept its own.
    assert!(
        transition(&again, "Ready") > first_since("Ready"),
        "{:?}",
        again.status
    );
    assert!(first_since("PodScheduled").is_some());
    assert_eq!(
        transition(&again, "PodScheduled"),
        first_since("PodScheduled")
    );
    let last = restarted
        .last_state
        .and_then(|s| s.terminated)
        .expect("last state terminated");
    assert_ne!(last.exit_code, 0, "the container was killed, not finished");
    pods.delete("probed", &DeleteParams::default())
        .await
        .expect("delete");
}

/// A name that is in no Service fails to resolve at once, as a cluster DNS
/// server answers for it, instead of waiting for a resolver that never
/// answers; Service names still resolve from `/etc/hosts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_fails_to_resolve_at_once() {
    let runner = runner();
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pod-dns").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Exit 0: the unknown name failed within 2 s and the Pod's own name
    // resolved; 3: the unknown name resolved; 4: its lookup hung.
    let script = format!(
        "getent hosts resolver-probe || exit 5; \
         timeout 2 getent hosts no-such-service.{ns}.svc.cluster.local; \
         case $? in 0) exit 3;; 124) exit 4;; *) exit 0;; esac"
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "resolver-probe"},
        "spec": {
            "nodeName": runner.nodes()[0],
            "restartPolicy": "Never",
            "containers": [{
                "name": "sh", "image": "busybox",
                "command": ["/bin/sh", "-c", script]
            }]
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let code = wait_for("the probe to finish", Duration::from_secs(60), async || {
        let p = pods.get("resolver-probe").await.ok()?;
        let c = p.status?.container_statuses?.into_iter().next()?;
        c.state?.terminated.map(|t| t.exit_code)
    })
    .await;
    assert_eq!(
        code, 0,
        "3: an unknown name resolved, 4: its lookup hung, 5: the Pod's own name did not resolve"
    );
    pods.delete("resolver-probe", &DeleteParams::default())
        .await
        .expect("delete");
}
