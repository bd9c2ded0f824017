//! A stand-in kubelet for the node-operator's tests, installed on SSH test
//! hosts as the `kubelet` package. It does what a kubelet does to join a
//! cluster, against the real API server and controller-manager: a TLS
//! bootstrap with the bootstrap kubeconfig the operator wrote (a CSR for
//! `system:node:<name>` with signer `kubernetes.io/kube-apiserver-client-kubelet`,
//! approved and signed by kube-controller-manager), its own kubeconfig, the
//! Node registered with the labels and taints it was configured with, kept
//! Ready and its Lease renewed. It runs no Pods: Pods bound to its Node that
//! are being deleted are released, as a kubelet does once they stopped.
//!
//! Like the kubelet, it renews every quarter of the configuration's
//! `nodeLeaseDurationSeconds` (40 s unless set), so tests whose
//! controller-manager marks a silent Node NotReady after a short grace give
//! it a short lease.
//!
//! It takes the real kubelet's flags (`--config`, `--bootstrap-kubeconfig`,
//! `--kubeconfig`, `--hostname-override`, `--node-ip`, `--node-labels`) and
//! ignores those it has no use for; `--version` prints the version it was
//! packaged as (`KOK_TEST_KUBELET_VERSION`, or a file `VERSION` beside it).
//! `/healthz` answers on 127.0.0.1:10248.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{AuthInfo, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedContext};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The kubelet's default `nodeLeaseDurationSeconds`.
const LEASE_DURATION: Duration = Duration::from_secs(40);

#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    bootstrap_kubeconfig: Option<PathBuf>,
    kubeconfig: PathBuf,
    hostname: Option<String>,
    node_ip: Option<String>,
    node_labels: BTreeMap<String, String>,
    version: bool,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
    let mut out = Args {
        kubeconfig: PathBuf::from("/etc/kubernetes/kubelet.conf"),
        ..Args::default()
    };
    let mut it = args.into_iter().peekable();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None if flag == "version" => ("version".to_string(), None),
            None => match it.peek() {
                Some(next) if !next.starts_with("--") => (flag.to_string(), it.next()),
                _ => (flag.to_string(), None),
            },
        };
        let value = value.unwrap_or_default();
        match name.as_str() {
            "version" => out.version = true,
            "config" => out.config = Some(value.into()),
            "bootstrap-kubeconfig" => out.bootstrap_kubeconfig = Some(value.into()),
            "kubeconfig" => out.kubeconfig = value.into(),
            "hostname-override" => out.hostname = Some(value),
            "node-ip" => out.node_ip = Some(value),
            "node-labels" => {
                for pair in value.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    out.node_labels.insert(k.to_string(), v.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// What the test kubelet takes from the KubeletConfiguration file.
#[derive(Debug)]
struct KubeletConfig {
    /// `registerWithTaints`.
    taints: Vec<Taint>,
    /// How often the Node's status and Lease are renewed: a quarter of
    /// `nodeLeaseDurationSeconds`, as the kubelet renews its Lease.
    heartbeat: Duration,
}

impl KubeletConfig {
    fn parse(config: &str) -> anyhow::Result<KubeletConfig> {
        let value: serde_json::Value =
            serde_norway::from_str(config).context("parsing the kubelet config")?;
        let taints = match value.get("registerWithTaints") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(taints) => serde_json::from_value(taints.clone()).context("registerWithTaints")?,
        };
        let lease = match value.get("nodeLeaseDurationSeconds") {
            None | Some(serde_json::Value::Null) => LEASE_DURATION,
            Some(seconds) => seconds
                .as_u64()
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .context("nodeLeaseDurationSeconds is not a positive number of seconds")?,
        };
        Ok(KubeletConfig {
            taints,
            heartbeat: lease / 4,
        })
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            taints: Vec::new(),
            heartbeat: LEASE_DURATION / 4,
        }
    }
}

fn version() -> String {
    if let Ok(v) = std::env::var("KOK_TEST_KUBELET_VERSION") {
        return v;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let exe = std::fs::canonicalize(exe).ok()?;
            std::fs::read_to_string(exe.parent()?.join("VERSION")).ok()
        })
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "0.0.0".into())
}

fn main() -> std::process::ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kok-test-kubelet: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    if args.version {
        println!("Kubernetes v{} (kok-test-kubelet)", version());
        return std::process::ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kok-test-kubelet: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kok-test-kubelet: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let name = match &args.hostname {
        Some(h) => h.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading the hostname")?
            .trim()
            .to_string(),
    };
    let ip = args.node_ip.clone().unwrap_or_default();
    let config = match &args.config {
        Some(path) => KubeletConfig::parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )?,
        None => KubeletConfig::default(),
    };
    tokio::spawn(serve_healthz());

    let client = match client_from(&args.kubeconfig).await {
        Ok(client) => client,
        Err(e) => {
            let Some(bootstrap) = &args.bootstrap_kubeconfig else {
                return Err(e.context("no usable kubeconfig and no --bootstrap-kubeconfig"));
            };
            eprintln!(
                "kok-test-kubelet: {e:#}; bootstrapping with {}",
                bootstrap.display()
            );
            tls_bootstrap(&name, bootstrap, &args.kubeconfig).await?;
            client_from(&args.kubeconfig).await?
        }
    };
    eprintln!("kok-test-kubelet: registering node {name}");
    register(&client, &name, &args.node_labels, config.taints).await?;
    loop {
        if let Err(e) = kok_testenv::pods::node::heartbeat(&client, &name, &ip).await {
            eprintln!("kok-test-kubelet: heartbeat: {e}");
        }
        if let Err(e) = release_deleted_pods(&client, &name).await {
            eprintln!("kok-test-kubelet: releasing pods: {e}");
        }
        tokio::time::sleep(config.heartbeat).await;
    }
}

async fn client_from(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    client
        .apiserver_version()
        .await
        .context("asking the API server for its version")?;
    Ok(client)
}

/// Requests a client certificate for `system:node:<name>` with the bootstrap
/// credentials, waits until it is issued and writes the node's kubeconfig.
async fn tls_bootstrap(name: &str, bootstrap: &Path, kubeconfig: &Path) -> anyhow::Result<()> {
    let mut config = Kubeconfig::read_from(bootstrap)
        .with_context(|| format!("reading {}", bootstrap.display()))?;
    let client = Client::try_from(
        Config::from_custom_kubeconfig(config.clone(), &KubeConfigOptions::default()).await?,
    )?;
    let (request, key) = kok_testenv::node_csr(name)?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let csr_name = format!("node-csr-{name}-{}", std::process::id());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(csr_name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &csr)
        .await
        .context("creating the CSR")?;
    eprintln!("kok-test-kubelet: created CSR {csr_name}");
    let certificate = loop {
        let current = csrs.get(&csr_name).await.context("reading the CSR")?;
        let status = current.status.unwrap_or_default();
        if let Some(c) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
        {
            bail!(
                "CSR {csr_name} {}: {}",
                c.type_,
                c.message.clone().unwrap_or_default()
            );
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            break cert.0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let b64 = |data: &[u8]| base64::engine::general_purpose::STANDARD.encode(data);
    let cluster = config
        .clusters
        .first()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    config.auth_infos = vec![NamedAuthInfo {
        name: "node".into(),
        auth_info: Some(AuthInfo {
            client_certificate_data: Some(b64(&certificate)),
            client_key_data: Some(b64(key.as_bytes()).into()),
            ..Default::default()
        }),
        other: Default::default(),
    }];
    config.contexts = vec![NamedContext {
        name: "node".into(),
        context: Some(Context {
            cluster,
            user: Some("node".into()),
            ..Default::default()
        }),
        other: Default::default(),
    }];
    config.current_context = Some("node".into());
    let text = serde_norway::to_string(&config)?;
    let tmp = kubeconfig.with_extension("kok-tmp");
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, kubeconfig)?;
    eprintln!("kok-test-kubelet: wrote {}", kubeconfig.display());
    Ok(())
}

async fn register(
    client: &Client,
    name: &str,
    labels: &BTreeMap<String, String>,
    taints: Vec<Taint>,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = kok_testenv::pods::node::node(name, labels);
    node.spec = Some(NodeSpec {
        taints: (!taints.is_empty()).then_some(taints),
        ..Default::default()
    });
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).context("registering the Node"),
    }
}

/// Pods of this node that are being deleted: a kubelet confirms their end;
/// with nothing running, this one does so at once.
async fn release_deleted_pods(client: &Client, name: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await?;
    for pod in list.items {
        if pod.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let (Some(ns), Some(pod_name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let _ = api
            .delete(pod_name, &DeleteParams::default().grace_period(0))
            .await;
    }
    Ok(())
}

async fn serve_healthz() {
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:10248").await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kok-test-kubelet: healthz: {e}");
            return;
        }
    };
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_the_real_kubelet_are_understood() {
        let args = parse_args(
            [
                "--config=/var/lib/kubelet/config.yaml",
                "--kubeconfig",
                "/etc/k.conf",
                "--hostname-override=n1",
                "--node-labels=a=b,topology.kubernetes.io/zone=z",
                "--unknown=1",
            ]
            .map(String::from),
        )
        .unwrap();
        assert_eq!(args.kubeconfig, PathBuf::from("/etc/k.conf"));
        assert_eq!(args.hostname.as_deref(), Some("n1"));
        assert_eq!(args.node_labels["topology.kubernetes.io/zone"], "z");
        assert!(!args.version);
    }

    #[test]
    fn taints_and_heartbeat_come_from_the_config() {
        let config = KubeletConfig::parse(
            "kind: KubeletConfiguration\nregisterWithTaints: [{\"key\":\"dedicated\",\"value\":\"batch\",\"effect\":\"PreferNoSchedule\"}]\nnodeLeaseDurationSeconds: 8\n",
        )
        .unwrap();
        assert_eq!(config.taints[0].key, "dedicated");
        assert_eq!(config.heartbeat, Duration::from_secs(2));
        let plain = KubeletConfig::parse("kind: KubeletConfiguration\n").unwrap();
        assert!(plain.taints.is_empty());
        assert_eq!(plain.heartbeat, Duration::from_secs(10));
        assert!(KubeletConfig::parse("nodeLeaseDurationSeconds: 0\n").is_err());
    }
}
