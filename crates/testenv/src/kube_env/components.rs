//! Command lines of the control-plane programs and the checks that tell when each
//! one is serving. Kept apart from the start sequence so the flags can be read in
//! one place.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pki::Pki;
use super::supervisor::Supervised;
use super::{Error, Options};
use crate::bins;

/// Service IPs, room for the Services of hundreds of Clusters; 10.0.0.1 (the
/// `kubernetes` service) is in the server certificate.
pub(crate) const SERVICE_CIDR: &str = "10.0.0.0/16";

/// Pod IPs handed out by kwok, apart from the service range.
const POD_CIDR: &str = "10.244.0.1/16";

pub(crate) const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Nodes carrying this annotation are run by kwok; a real kubelet joined later
/// keeps its own node.
pub(crate) const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

const POLL: Duration = Duration::from_millis(100);

/// A loopback port nobody listens on right now. Another process may take it
/// before the component binds it, which the start sequence retries.
pub(crate) fn free_port() -> Result<u16, Error> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(Error::io("finding a free loopback port"))
}

/// The binaries an environment with `opts` runs.
pub(crate) fn needed(opts: &Options) -> Vec<&'static str> {
    let mut names = vec!["etcd", "kube-apiserver"];
    if opts.controller_manager {
        names.push("kube-controller-manager");
    }
    if opts.scheduler {
        names.push("kube-scheduler");
    }
    if opts.kwok_nodes > 0 {
        names.push("kwok");
    }
    names
}

pub(crate) fn etcd(data_dir: &Path, client_port: u16, peer_port: u16) -> Result<Command, Error> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(bins::bin("etcd")?);
    cmd.arg("--name=testenv")
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=testenv={peer}"))
        // Throwaway data: durability only costs time.
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    Ok(cmd)
}

pub(crate) fn apiserver(
    pki: &Pki,
    etcd_url: &str,
    port: u16,
    cert_dir: &Path,
    real_nodes: bool,
) -> Result<Command, Error> {
    let mut cmd = Command::new(bins::bin("kube-apiserver")?);
    if real_nodes {
        // Webhooks and aggregated APIs at their Pods' addresses, which
        // this machine routes to (crate::meta_network); no kube-proxy here
        // makes Service addresses work. Kubelets by address: test hosts'
        // names resolve nowhere but on the hosts themselves.
        cmd.arg("--enable-aggregator-routing=true")
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg(format!(
                "--kubelet-client-certificate={}",
                pki.kubelet_client_cert.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                pki.kubelet_client_key.display()
            ));
    }
    cmd.arg(format!("--etcd-servers={etcd_url}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        .arg(format!("--cert-dir={}", cert_dir.display()))
        .arg(format!("--tls-cert-file={}", pki.server_cert.display()))
        .arg(format!(
            "--tls-private-key-file={}",
            pki.server_key.display()
        ))
        .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
        .arg(format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"))
        .arg(format!(
            "--service-account-key-file={}",
            pki.sa_pub.display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            pki.sa_key.display()
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg("--authorization-mode=Node,RBAC")
        .arg("--enable-bootstrap-token-auth")
        .arg("--allow-privileged=true")
        // A loopback address cannot be published as the `kubernetes` endpoint.
        .arg("--endpoint-reconciler-type=none")
        .arg("--profiling=false")
        .arg("--v=1");
    Ok(cmd)
}

/// `qps` sets its `--kube-api-qps` (and twice that as the burst);
/// `node_grace` its `--node-monitor-grace-period`, how long a Node may go
/// without a heartbeat before it is marked NotReady (None: its default).
pub(crate) fn controller_manager(
    pki: &Pki,
    kubeconfig: &Path,
    cert_dir: &Path,
    node_grace: Option<Duration>,
    qps: Option<u32>,
    pod_cidr: Option<&str>,
) -> Result<Command, Error> {
    let mut cmd = Command::new(bins::bin("kube-controller-manager")?);
    if let Some(cidr) = pod_cidr {
        // Each real Node gets a /24 its CNI routes (kube-router reads
        // `spec.podCIDR`).
        cmd.arg("--allocate-node-cidrs=true")
            .arg(format!("--cluster-cidr={cidr}"))
            .arg("--node-cidr-mask-size=24");
    }
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        // Nothing scrapes it, and a fixed default port would clash between
        // environments.
        .arg("--secure-port=0")
        .arg(format!("--cert-dir={}", cert_dir.display()))
        .arg("--leader-elect=false")
        .arg("--controllers=*,bootstrapsigner,tokencleaner")
        .arg("--use-service-account-credentials=true")
        .arg(format!(
            "--service-account-private-key-file={}",
            pki.sa_key.display()
        ))
        .arg(format!("--root-ca-file={}", pki.ca_cert.display()))
        // The CA signs approved CSRs, so certificates issued in tests are trusted
        // by this API server.
        .arg(format!(
            "--cluster-signing-cert-file={}",
            pki.ca_cert.display()
        ))
        .arg(format!(
            "--cluster-signing-key-file={}",
            pki.ca_key.display()
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg("--cluster-name=kok-testenv")
        .arg("--v=2");
    if let Some(grace) = node_grace {
        cmd.arg(format!(
            "--node-monitor-grace-period={}ms",
            grace.as_millis()
        ));
    }
    if let Some(qps) = qps {
        cmd.arg(format!("--kube-api-qps={qps}"))
            .arg(format!("--kube-api-burst={}", qps.saturating_mul(2)));
    }
    Ok(cmd)
}

pub(crate) fn scheduler(kubeconfig: &Path) -> Result<Command, Error> {
    let mut cmd = Command::new(bins::bin("kube-scheduler")?);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--secure-port=0")
        .arg("--leader-elect=false")
        .arg("--v=1");
    Ok(cmd)
}

/// kwok plays kubelet for the annotated nodes. Without a configuration it loads
/// its built-in stages: nodes turn Ready and keep a lease, pods go Running and
/// Ready, and deleted pods are released.
pub(crate) fn kwok(kubeconfig: &Path, workdir: &Path) -> Result<Command, Error> {
    let (key, value) = KWOK_NODE_ANNOTATION;
    let mut cmd = Command::new(bins::bin("kwok")?);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--manage-all-nodes=false")
        .arg(format!(
            "--manage-nodes-with-annotation-selector={key}={value}"
        ))
        .arg(format!("--cidr={POD_CIDR}"))
        // Keeps a developer's ~/.kwok/kwok.yaml out of the test environment.
        .env("KWOK_WORKDIR", workdir);
    Ok(cmd)
}

/// Polls `ready` until it says yes, failing early when `process` (the component
/// being waited for) exits, and after `timeout`.
pub(crate) async fn poll_until<F, Fut>(
    what: &str,
    timeout: Duration,
    mut process: Option<&mut Supervised>,
    mut ready: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(process) = process.as_deref_mut() {
            process.check_running()?;
        }
        if ready().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for etcd to answer its health endpoint.
pub(crate) async fn wait_etcd(
    etcd: &mut Supervised,
    port: u16,
    timeout: Duration,
) -> Result<(), Error> {
    poll_until("etcd health", timeout, Some(etcd), || async {
        Ok(etcd_healthy(port).await)
    })
    .await
}

async fn etcd_healthy(port: u16) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    match tokio::time::timeout(Duration::from_secs(2), probe).await {
        Ok(Ok(response)) => response.contains("\"health\":\"true\""),
        _ => false,
    }
}

/// Waits for `/readyz`, which covers etcd, the RBAC bootstrap roles and the other
/// start hooks.
pub(crate) async fn wait_apiserver(
    apiserver: &mut Supervised,
    client: &kube::Client,
    timeout: Duration,
) -> Result<(), Error> {
    poll_until(
        "kube-apiserver /readyz",
        timeout,
        Some(apiserver),
        || async {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Io {
                    what: "building the /readyz request".into(),
                    source: std::io::Error::other(e),
                })?;
            Ok(client.request_text(request).await.is_ok())
        },
    )
    .await
}
