//! Real etcd members over mutual TLS on loopback, for the tests that talk
//! to etcd directly (membership, snapshots): a CA and one certificate every
//! member serves and the client presents, members started with the flags the
//! operator's Pods use, and loopback ports that stay free until a member
//! starts on them.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kok_testenv::wait::wait_for;
use kube_on_kube_operator::etcd::api::{ClientTls, EtcdClient};
use kube_on_kube_operator::pki::{self, KeyCert, LeafSpec, Usage};
use tokio::process::{Child, Command};

pub struct Pki {
    pub ca: KeyCert,
    pub leaf: KeyCert,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let now = time::OffsetDateTime::now_utc();
        let ca = pki::new_ca("etcd-ca", now).unwrap();
        let spec = LeafSpec {
            common_name: "etcd".into(),
            organizations: vec![],
            dns_names: vec!["localhost".into()],
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            usage: Usage::ServerAndClient,
        };
        let leaf = pki::issue(&ca, &spec, now, Duration::from_secs(3600)).unwrap();
        let ca_file = dir.join("ca.crt");
        let cert_file = dir.join("tls.crt");
        let key_file = dir.join("tls.key");
        std::fs::write(&ca_file, &ca.cert_pem).unwrap();
        std::fs::write(&cert_file, &leaf.cert_pem).unwrap();
        std::fs::write(&key_file, &leaf.key_pem).unwrap();
        Self {
            ca,
            leaf,
            ca_file,
            cert_file,
            key_file,
        }
    }

    pub fn client_tls(&self) -> ClientTls<'_> {
        ClientTls {
            ca_pem: &self.ca.cert_pem,
            cert_pem: &self.leaf.cert_pem,
            key_pem: &self.leaf.key_pem,
        }
    }
}

/// One etcd process; killed when dropped, so a failing test leaves nothing
/// behind.
pub struct Etcd {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub child: Child,
}

impl Etcd {
    pub fn start(
        dir: &Path,
        pki: &Pki,
        name: &str,
        ports: (u16, u16),
        initial_cluster: &str,
        state: &str,
    ) -> Self {
        let client_url = format!("https://127.0.0.1:{}", ports.0);
        let peer_url = format!("https://127.0.0.1:{}", ports.1);
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(kok_testenv::bins::bin("etcd").unwrap());
        cmd.arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", dir.join(name).display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg(format!("--initial-cluster-state={state}"))
            .arg("--initial-cluster-token=etcd-api-test")
            .arg(format!("--trusted-ca-file={}", pki.ca_file.display()))
            .arg(format!("--cert-file={}", pki.cert_file.display()))
            .arg(format!("--key-file={}", pki.key_file.display()))
            .arg("--client-cert-auth")
            .arg(format!("--peer-trusted-ca-file={}", pki.ca_file.display()))
            .arg(format!("--peer-cert-file={}", pki.cert_file.display()))
            .arg(format!("--peer-key-file={}", pki.key_file.display()))
            .arg("--peer-client-cert-auth")
            // Throwaway data: durability only costs time.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap();
        Self {
            name: name.into(),
            client_url,
            peer_url,
            child,
        }
    }

    pub fn still_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// `n` distinct loopback ports nobody listens on right now, below the
/// kernel's ephemeral range: a member started minutes after its port was
/// picked must still find it free, and the outgoing connections of the other
/// members (and of this test) take their local ports from that range. All
/// are held until every one is picked, so none is handed out twice.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Below the ephemeral range (32768 and up by default); each test
    // process starts at its own offset, and each call moves on.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() % 1000) as u16 * 10,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut held = Vec::new();
    while held.len() < n {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 32_000, "no free loopback port left below 32000");
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// `n` pairs of distinct ports (client, peer).
pub fn port_pairs(n: usize) -> Vec<(u16, u16)> {
    free_ports(2 * n).chunks(2).map(|p| (p[0], p[1])).collect()
}

/// How long a member may take to become healthy.
const START: Duration = Duration::from_secs(60);

/// Members `m0`, `m1`, … of a new cluster, one on each pair of (client,
/// peer) ports.
pub fn start_new_cluster(dir: &Path, pki: &Pki, ports: &[(u16, u16)]) -> Vec<Etcd> {
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("m{i}=https://127.0.0.1:{}", p.1))
        .collect();
    let initial = initial.join(",");
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| Etcd::start(dir, pki, &format!("m{i}"), *p, &initial, "new"))
        .collect()
}

/// Waits until `member` serves linearizable reads.
pub async fn wait_healthy(client: &EtcdClient, member: &mut Etcd) {
    let what = format!("etcd {} to be healthy", member.name);
    wait_for(&what, START, async || {
        assert!(member.still_running(), "etcd {} exited", member.name);
        match client.healthy(&member.client_url).await {
            Ok(true) => Some(()),
            _ => None,
        }
    })
    .await;
}
