//! The node-operator binary as it runs in production, against the real API
//! server: two replicas elect a leader with the Lease `kube-system/node-operator`
//! (in the cluster it manages), only the leader reconciles Machines, /readyz
//! turns 200 once all of its controllers' caches are synced (the standby's
//! at once), `kok_machines` counts Machines by phase, and SIGTERM hands over,
//! also when it comes the moment a replica takes the Lease.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::wait::wait_for;
use kube::api::{Api, PostParams};
use kube_on_kube_api::Machine;

struct Replica {
    name: &'static str,
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Replica {
    fn start(env: &KubeEnv, name: &'static str) -> Replica {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = env.log_dir().join(format!("runtime-{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_node-operator"))
            .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
            .arg(format!("--http-address=127.0.0.1:{port}"))
            .arg("--ssh-connect-timeout=2s")
            .arg("--log-level=info")
            .env("POD_NAME", name)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the node-operator");
        Replica {
            name,
            child,
            port,
            log,
        }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        Some((status, response.split_once("\r\n\r\n")?.1.to_string()))
    }

    fn metrics(&self) -> BTreeMap<String, f64> {
        let (_, body) = self.get("/metrics").expect("scrape /metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// SIGTERM, then the process must exit 0 within 30 s.
    async fn stop(mut self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
        let what = format!("{} to exit after SIGTERM", self.name);
        let exit = wait_for(&what, Duration::from_secs(30), async || {
            self.child.try_wait().ok().flatten()
        })
        .await;
        assert!(exit.success(), "{}: exit status {exit:?}", self.name);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("{} log ({}), last lines:", self.name, self.log.display());
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
    }
}

fn sum(metrics: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    metrics
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("node-operator")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_reconciles_machines_standby_waits_and_sigterm_hands_over() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");

    let a = Replica::start(env, "node-a");
    wait_for("node-a to lead", Duration::from_secs(60), async || {
        (holder(&leases).await.as_deref() == Some("node-a")).then_some(())
    })
    .await;
    // The Lease names node-a a moment before node-a has taken the lead and
    // synced its caches; until then it answers as a standby.
    wait_for(
        "node-a /readyz 200 with its caches synced",
        Duration::from_secs(60),
        async || {
            a.get("/readyz")
                .filter(|(s, why)| *s == 200 && why.contains("caches synced"))
        },
    )
    .await;
    let b = Replica::start(env, "node-b");
    let (_, why) = wait_for("node-b /readyz 200", Duration::from_secs(60), async || {
        b.get("/readyz").filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(why.contains("standby"), "{why}");

    // A Machine whose host cannot be reached: the leader works on it.
    let machine: Machine = serde_json::from_value(serde_json::json!({
        "apiVersion": "kubeonkube.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "runtime-m1"},
        "spec": {
            "hostname": "runtime-m1",
            // TEST-NET-1: nobody answers there.
            "ip": "192.0.2.1",
            "ssh": {
                "user": "root",
                "port": 1,
                "privateKeySecretRef": {"name": "absent", "namespace": "kube-system", "key": "ssh-privatekey"},
                "hostPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDYxwD8tU1Lm2Hq7aN0WzmH0rJcKf3m9z8hQk1vYQ3sE"
            }
        }
    }))
    .expect("machine");
    Api::<Machine>::all(client.clone())
        .create(&PostParams::default(), &machine)
        .await
        .expect("create machine");
    let m = wait_for(
        "machine reconciles and kok_machines",
        Duration::from_secs(60),
        async || {
            let m = a.metrics();
            (sum(&m, "kok_reconciles_total{controller=\"machine\"}") >= 1.0
                && sum(&m, "kok_machines{") >= 1.0)
                .then_some(m)
        },
    )
    .await;
    let phases: Vec<_> = m
        .iter()
        .filter(|(k, v)| k.starts_with("kok_machines{") && **v > 0.0)
        .collect();
    println!("leader: machines by phase {phases:?}");
    assert_eq!(sum(&m, "kok_machines{"), 1.0);
    assert_eq!(m.get("kok_leader{lease=\"node-operator\"}"), Some(&1.0));
    let standby = b.metrics();
    assert_eq!(
        sum(&standby, "kok_reconciles_total"),
        0.0,
        "the standby reconciled"
    );
    assert_eq!(
        standby.get("kok_leader{lease=\"node-operator\"}"),
        Some(&0.0)
    );

    // SIGTERM: node-a releases the Lease and exits 0, node-b takes over.
    let stopped = Instant::now();
    a.stop().await;
    let took = wait_for("node-b to lead", Duration::from_secs(30), async || {
        (holder(&leases).await.as_deref() == Some("node-b")).then(|| stopped.elapsed())
    })
    .await;
    println!("node-operator handover after SIGTERM: {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    wait_for("node-b reconciles", Duration::from_secs(60), async || {
        (sum(&b.metrics(), "kok_reconciles_total{controller=\"machine\"}") >= 1.0).then_some(())
    })
    .await;

    // SIGTERM the moment a replica takes the Lease, before its controllers'
    // caches are filled: it still stops, releases the Lease and exits 0.
    let c = Replica::start(env, "node-c");
    b.stop().await;
    // Polled far more often than wait_for does: the caches fill within a
    // second of taking the Lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    while holder(&leases).await.as_deref() != Some("node-c") {
        assert!(Instant::now() < deadline, "node-c did not take the Lease");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let synced = c.get("/readyz").is_some_and(|(s, _)| s == 200);
    c.stop().await;
    println!("node-c stopped as it took the Lease (caches synced: {synced})");
    assert_eq!(holder(&leases).await, None, "node-c released the Lease");
}
