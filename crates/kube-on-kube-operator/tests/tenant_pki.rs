//! What a tenant can do to the PKI Secrets of their own Cluster, against a
//! real control plane and the operator run as a Pod: a kubeconfig Secret
//! rewritten to hand the operator a token file and no TLS checks sends the
//! operator's credentials nowhere (and is rewritten, with an Event); a
//! deleted CA Secret is not made again (nothing is reissued, the condition
//! says how to get out), and restoring it recovers the Cluster.

use kok_test_support as common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{grant_operator, node_operator_binary, start_runner};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::pods::PodRunner;
use kok_testenv::wait::wait_for;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::{AuthorityFingerprints, ClusterMode};
use serde_json::{Value, json};

fn runner() -> &'static PodRunner {
    static RUNNER: OnceLock<PodRunner> = OnceLock::new();
    RUNNER.get_or_init(|| start_runner(vec![("node-operator".into(), node_operator_binary())]))
}

const NODE_OPERATOR_IMAGE: &str = "example.test/kok/node-operator:dev";

/// The operator as a Pod watching `ns`, and a Minimal Cluster `name` there
/// that is Ready, add-ons included.
async fn ready_cluster(client: &Client, ns: &str, name: &str) -> Cluster {
    let runner = runner();
    grant_operator(client, ns).await;
    common::start_operator_pod_with(
        client,
        ns,
        &runner.nodes()[0],
        &[format!("--node-operator-image={NODE_OPERATOR_IMAGE}")],
    )
    .await;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    clusters
        .create(
            &PostParams::default(),
            &common::test_cluster(ns, name, ClusterMode::Minimal),
        )
        .await
        .expect("create cluster");
    common::wait_cluster(
        &clusters,
        name,
        "the Cluster to be Ready",
        Duration::from_secs(420),
        |c| common::condition(c, "Ready").as_deref() == Some("True"),
    )
    .await
}

/// The Cluster's CertificatesReady condition: (status, reason, message).
fn certificates(c: &Cluster) -> Option<(String, String, String)> {
    let c = c.status.as_ref()?.condition("CertificatesReady")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// What one connection to the fake API sent: the bytes on the wire and,
/// when the client completed the TLS handshake, what it said inside.
#[derive(Debug, Default, Clone)]
struct Connection {
    raw: Vec<u8>,
    plain: Vec<u8>,
}

impl Connection {
    /// The Authorization headers of the requests inside.
    fn authorizations(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.plain)
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .map(str::to_string)
            .collect()
    }

    fn contains(&self, needle: &[u8]) -> bool {
        [&self.raw, &self.plain]
            .iter()
            .any(|b| b.windows(needle.len()).any(|w| w == needle))
    }
}

/// A stream that keeps a copy of everything read from it.
struct Recorded<S> {
    inner: S,
    seen: Arc<Mutex<Connection>>,
}

impl<S: Read> Read for Recorded<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.seen
            .lock()
            .expect("lock")
            .raw
            .extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl<S: Write> Write for Recorded<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The tenant's fake business API: TLS with a certificate of its own for
/// the Service's names (what a client that skips verification accepts),
/// recording every connection, answering every request 401.
struct FakeApi {
    connections: Arc<Mutex<Vec<Arc<Mutex<Connection>>>>>,
}

impl FakeApi {
    fn start(listener: TcpListener, names: Vec<String>) -> Self {
        let certified = rcgen::generate_simple_self_signed(names).expect("fake certificate");
        let key =
            rustls_pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .expect("server config"),
        );
        let connections: Arc<Mutex<Vec<Arc<Mutex<Connection>>>>> = Arc::default();
        let all = connections.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::new(Mutex::new(Connection::default()));
                all.lock().expect("lock").push(seen.clone());
                let config = config.clone();
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let Ok(server) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(
                        server,
                        Recorded {
                            inner: stream,
                            seen: seen.clone(),
                        },
                    );
                    let mut buf = [0u8; 4096];
                    loop {
                        match tls.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let mut c = seen.lock().expect("lock");
                                c.plain.extend_from_slice(&buf[..n]);
                                if c.plain.windows(4).any(|w| w == b"\r\n\r\n") {
                                    drop(c);
                                    let _ = tls.write_all(
                                        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                                    );
                                    let _ = tls.flush();
                                    break;
                                }
                            }
                        }
                    }
                });
            }
        });
        FakeApi { connections }
    }

    fn seen(&self) -> Vec<Connection> {
        self.connections
            .lock()
            .expect("lock")
            .iter()
            .map(|c| c.lock().expect("lock").clone())
            .collect()
    }
}

/// The PID of the operator Pod's process watching `ns`.
fn operator_pid(ns: &str) -> u32 {
    let pids = common::pids_with(&[
        &format!("--namespace={ns}"),
        &format!("--node-operator-image={NODE_OPERATOR_IMAGE}"),
    ]);
    assert_eq!(pids.len(), 1, "operator processes for {ns}: {pids:?}");
    pids[0]
}

/// Run `ip args` in the network namespace of process `pid`.
fn ip_in(pid: u32, args: &[&str]) {
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "ip"])
        .args(args)
        .output()
        .expect("nsenter");
    assert!(
        out.status.success(),
        "ip {args:?} in {pid}'s network: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A listener on `addr` inside the network namespace of process `pid`
/// (only the bind needs to happen there: the socket stays in it).
fn listen_in(pid: u32, addr: SocketAddr) -> TcpListener {
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("netns");
        // SAFETY: setns on this short-lived thread only; the fd is valid.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        TcpListener::bind(addr).expect("bind the fake API")
    })
    .join()
    .expect("listener thread")
}

/// The tenant's edit: the admin kubeconfig keeps its certificate and server
/// but reads a token from `token_file` and skips TLS verification.
fn tampered(text: &[u8], token_file: &str) -> String {
    let mut doc: Value = serde_norway::from_slice(text).expect("kubeconfig");
    doc["users"][0]["user"]["tokenFile"] = json!(token_file);
    let cluster = &mut doc["clusters"][0]["cluster"];
    cluster["insecure-skip-tls-verify"] = json!(true);
    if let Some(c) = cluster.as_object_mut() {
        c.remove("certificate-authority-data");
    }
    serde_norway::to_string(&doc).expect("yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_kubeconfig_sends_the_operators_credentials_nowhere() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("tenant-kubeconfig").await;
    // The token a tenant would have the operator read (its own
    // ServiceAccount token in a real deployment): a marker here, where the
    // operator's Pod sees it (a Pod's /tmp is its own; the machine's other
    // top-level directories show through).
    let marker = format!("kok-marker-token-{ns}");
    let token_file = format!("/var/tmp/{ns}-token");
    std::fs::write(&token_file, &marker).expect("marker token");
    let started = Instant::now();
    ready_cluster(&client, &ns, "ci").await;
    println!("ready after {:?}", started.elapsed());
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);

    // Every connection the operator makes to the Cluster's apiserver
    // Service lands at the tenant's server: the address the Service's name
    // resolves to is taken over inside the operator's network namespace, as
    // a tenant's Pod behind the Service would be picked by kube-proxy.
    let apiserver: IpAddr = common::ready_pods(&client, &ns, "ci", "apiserver")
        .await
        .into_iter()
        .find_map(|p| p.status?.pod_ip)
        .expect("apiserver pod address")
        .parse()
        .expect("address");
    let pid = operator_pid(&ns);
    let address = format!("{apiserver}/32");
    ip_in(pid, &["addr", "add", &address, "dev", "lo"]);
    let fake = FakeApi::start(
        listen_in(pid, SocketAddr::new(apiserver, 6443)),
        vec![
            "ci-apiserver".into(),
            format!("ci-apiserver.{ns}.svc"),
            format!("ci-apiserver.{ns}.svc.cluster.local"),
        ],
    );

    let name = "ci-admin-kubeconfig";
    let issued = common::secret_value(&client, &ns, name, "kubeconfig").await;
    let mut secret = secrets.get(name).await.expect("admin kubeconfig");
    secret.data = Some(
        [(
            "kubeconfig".to_string(),
            ByteString(tampered(&issued, &token_file).into_bytes()),
        )]
        .into(),
    );
    secrets
        .replace(name, &PostParams::default(), &secret)
        .await
        .expect("the tenant's edit");

    // The operator rewrites the Secret, says so, and dials the business API
    // (the fake) again without ever sending the token.
    let rewritten = wait_for(
        "the kubeconfig Secret to be rewritten",
        Duration::from_secs(120),
        async || {
            let text = common::secret_value(&client, &ns, name, "kubeconfig").await;
            let doc: Value = serde_norway::from_slice(&text).ok()?;
            (doc["users"][0]["user"].get("tokenFile").is_none()
                && doc["clusters"][0]["cluster"]
                    .get("insecure-skip-tls-verify")
                    .is_none())
            .then_some(doc)
        },
    )
    .await;
    assert!(
        rewritten["clusters"][0]["cluster"]["certificate-authority-data"].is_string(),
        "{rewritten}"
    );
    let notes = wait_for(
        "a KubeconfigRewritten Event",
        Duration::from_secs(60),
        async || {
            let notes = common::event_notes(&client, &ns, "ci", "KubeconfigRewritten").await;
            (!notes.is_empty()).then_some(notes)
        },
    )
    .await;
    assert!(notes[0].contains(name), "{notes:?}");
    let addons = wait_for(
        "the operator to dial the fake business API and refuse it",
        Duration::from_secs(120),
        async || {
            let c = clusters.get("ci").await.ok()?;
            let a = c.status?.condition("AddonsReady").cloned()?;
            (!fake.seen().is_empty() && a.reason == "BusinessAPIUnreachable").then_some(a)
        },
    )
    .await;
    println!("AddonsReady: {}", addons.message);
    // A few more attempts, then nothing of the token may have arrived.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let seen = fake.seen();
    assert!(!seen.is_empty());
    for connection in &seen {
        assert!(
            !connection.contains(marker.as_bytes()),
            "the operator sent the tenant's token file: {:?}",
            connection.authorizations()
        );
        assert!(
            connection.authorizations().is_empty(),
            "the operator sent credentials to the fake API: {:?}",
            connection.authorizations()
        );
        // The handshake never completed: nothing was sent inside it.
        assert!(connection.plain.is_empty(), "{connection:?}");
    }
    println!(
        "{} connections to the fake API, none with a token",
        seen.len()
    );

    // The real API back: the rewritten Secret works and the add-ons recover.
    ip_in(pid, &["addr", "del", &address, "dev", "lo"]);
    common::wait_cluster(
        &clusters,
        "ci",
        "the add-ons to be applied again",
        Duration::from_secs(360),
        |c| common::condition(c, "AddonsReady").as_deref() == Some("True"),
    )
    .await;
    let _ = std::fs::remove_file(&token_file);
}

/// Every Secret of cluster `name` but `except`: name → (resourceVersion, data).
async fn secret_states(
    secrets: &Api<Secret>,
    name: &str,
    except: &str,
) -> BTreeMap<String, (Option<String>, Option<BTreeMap<String, ByteString>>)> {
    secrets
        .list(&ListParams::default().labels(&format!("kubeonkube.io/cluster={name}")))
        .await
        .expect("secrets")
        .items
        .into_iter()
        .filter(|s| s.name_any() != except)
        .map(|s| (s.name_any(), (s.resource_version(), s.data)))
        .collect()
}

fn recorded(c: &Cluster) -> AuthorityFingerprints {
    c.status
        .as_ref()
        .and_then(|s| s.certificate_authorities.clone())
        .unwrap_or_default()
}

/// The config hash of the kube-apiserver Deployment's Pods.
async fn apiserver_hash(client: &Client, ns: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("ca-apiserver")
        .await
        .ok()?;
    d.spec?
        .template
        .metadata?
        .annotations?
        .get("kubeonkube.io/config-hash")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_ca_is_not_made_again_and_restoring_it_recovers() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("tenant-ca").await;
    let ready = ready_cluster(&client, &ns, "ca").await;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);

    // The fingerprints are recorded, the cluster CA's among them.
    let record = recorded(&ready);
    let ca_pem = common::secret_value(&client, &ns, "ca-ca", "tls.crt").await;
    let fingerprint =
        kube_on_kube_operator::pki::certificate_fingerprint(&String::from_utf8_lossy(&ca_pem))
            .expect("fingerprint");
    assert_eq!(record.cluster.as_deref(), Some(fingerprint.as_str()));
    assert!(
        record.etcd.is_some() && record.front_proxy.is_some() && record.service_account.is_some(),
        "{record:?}"
    );
    let before = secret_states(&secrets, "ca", "ca-ca").await;
    let hash = apiserver_hash(&client, &ns).await;
    assert!(hash.is_some());

    // The CA Secret goes (kept aside as a backup would be).
    let mut backup = secrets.get("ca-ca").await.expect("ca secret");
    secrets
        .delete("ca-ca", &DeleteParams::default())
        .await
        .expect("delete the CA");
    let held = common::wait_cluster(
        &clusters,
        "ca",
        "CertificatesReady to say the CA is missing",
        Duration::from_secs(60),
        |c| {
            certificates(c)
                .is_some_and(|(s, r, _)| s == "False" && r == "CertificateAuthorityMissing")
        },
    )
    .await;
    let (_, _, message) = certificates(&held).expect("condition");
    for part in [
        "ca-ca",
        "restore the Secret from a backup",
        &format!("kubeonkube.io/replace-authorities={fingerprint}"),
    ] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
    assert_eq!(
        common::condition(&held, "Ready").as_deref(),
        Some("False"),
        "Ready says what is wrong"
    );
    let events = wait_for(
        "a CertificateAuthorityMissing Event",
        Duration::from_secs(30),
        async || {
            let notes =
                common::event_notes(&client, &ns, "ca", "CertificateAuthorityMissing").await;
            (!notes.is_empty()).then_some(notes)
        },
    )
    .await;
    assert!(events[0].contains("ca-ca"), "{events:?}");

    // Passes go by (a change of the Cluster wakes one each time): no CA is
    // made, no leaf reissued, nothing rolled, the record kept, and the
    // control plane keeps serving.
    for i in 0..3 {
        let patch = json!({"metadata": {"annotations": {"test/poke": i.to_string()}}});
        clusters
            .patch(
                "ca",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("poke");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            secrets.get_opt("ca-ca").await.expect("get").is_none(),
            "a new CA was made"
        );
    }
    assert_eq!(secret_states(&secrets, "ca", "ca-ca").await, before);
    assert_eq!(apiserver_hash(&client, &ns).await, hash);
    let still = clusters.get("ca").await.expect("cluster");
    assert_eq!(recorded(&still), record);
    for t in ["EtcdReady", "APIServerReady"] {
        assert_eq!(common::condition(&still, t).as_deref(), Some("True"), "{t}");
    }

    // Restored from the backup: Ready again, with the same CA and leaves.
    backup.metadata.resource_version = None;
    backup.metadata.uid = None;
    backup.metadata.creation_timestamp = None;
    backup.metadata.managed_fields = None;
    secrets
        .create(&PostParams::default(), &backup)
        .await
        .expect("restore the CA");
    let recovered = common::wait_cluster(
        &clusters,
        "ca",
        "the Cluster to be Ready again",
        Duration::from_secs(180),
        |c| {
            common::condition(c, "Ready").as_deref() == Some("True")
                && common::condition(c, "CertificatesReady").as_deref() == Some("True")
        },
    )
    .await;
    assert_eq!(recorded(&recovered), record);
    assert_eq!(secret_states(&secrets, "ca", "ca-ca").await, before);
    assert_eq!(apiserver_hash(&client, &ns).await, hash);
}
