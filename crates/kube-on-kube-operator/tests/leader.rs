//! Two replicas of the kube-on-kube-operator binary against the real API
//! server: only the Lease holder reconciles (seen in its /metrics and not in
//! the standby's), a leader killed with SIGKILL is replaced within the lease
//! duration, a leader stopped with SIGTERM hands over at once, /readyz and
//! /healthz answer on both, the domain metrics carry real certificate expiry
//! values, and the log filter can be changed at run time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kok_testenv::kube_env::KubeEnv;
use kok_testenv::operator_http::{http, logged_port, parse_metrics, sum};
use kok_testenv::wait::wait_for;
use kube::api::{Api, PostParams};
use kube_on_kube_api::Cluster;

/// Lease duration the replicas run with (the default).
const LEASE: Duration = Duration::from_secs(15);

struct Replica {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Replica {
    fn start(env: &KubeEnv, ns: &str, name: &'static str) -> Replica {
        let log = env.log_dir().join(format!("leader-{ns}-{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kube-on-kube-operator"))
            .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
            .arg(format!("--namespace={ns}"))
            .arg(format!("--leader-election-namespace={ns}"))
            // The port the replica binds is read from its log: a port
            // picked here could be taken before it binds (by the other
            // replica, even).
            .arg("--http-address=127.0.0.1:0")
            .arg("--log-level=info")
            .env("POD_NAME", name)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the operator");
        Replica { name, child, log }
    }

    /// The port the replica serves HTTP on, once it logged it.
    fn port(&self) -> Option<u16> {
        logged_port(&self.log)
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http(self.port()?, "GET", path, "")
    }

    fn put(&self, path: &str, body: &str) -> Option<(u16, String)> {
        http(self.port()?, "PUT", path, body)
    }

    fn metrics(&self) -> BTreeMap<String, f64> {
        let (_, body) = self.get("/metrics").expect("scrape /metrics");
        parse_metrics(&body)
    }

    fn signal(&mut self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal}");
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; log {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{} log: {}", self.name, self.log.display());
        }
    }
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

fn cluster(ns: &str, name: &str) -> Cluster {
    let mut c: Cluster =
        serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
            .expect("example");
    c.metadata.namespace = Some(ns.into());
    c.metadata.name = Some(name.into());
    c.spec.placement = None;
    c.spec.etcd.storage =
        serde_json::from_value(serde_json::json!({"volumeSource": {"emptyDir": {}}}))
            .expect("storage");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_reconciles_and_hands_over_on_kill_and_on_sigterm() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("leader").await;
    let lease_name = format!("kube-on-kube-operator-{ns}");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);

    let mut a = Replica::start(env, &ns, "replica-a");
    let mut b = Replica::start(env, &ns, "replica-b");
    let first = wait_for("a leader", Duration::from_secs(60), async || {
        holder(&leases, &lease_name).await
    })
    .await;
    println!("first leader: {first}");
    let (leader, standby) = if first == a.name {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    // Both serve; both are ready (the standby as a standby).
    for r in [&*leader, &*standby] {
        wait_for("/readyz 200", Duration::from_secs(60), async || {
            r.get("/readyz").filter(|(s, _)| *s == 200)
        })
        .await;
        assert_eq!(r.get("/healthz").map(|(s, _)| s), Some(200));
    }
    let (_, why) = standby.get("/readyz").expect("readyz");
    assert!(why.contains("standby"), "standby readiness: {why}");

    // Only the leader reconciles a Cluster.
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, "c1"))
        .await
        .expect("create cluster");
    wait_for(
        "the Cluster's status",
        Duration::from_secs(120),
        async || clusters.get("c1").await.ok()?.status?.observed_generation,
    )
    .await;
    let secret = wait_for(
        "certificate metrics",
        Duration::from_secs(120),
        async || {
            let m = leader.metrics();
            m.iter()
                .find(|(k, _)| {
                    k.starts_with("kok_certificate_expiry_seconds{")
                        && k.contains("secret=\"c1-apiserver-tls\"")
                })
                .map(|(k, v)| (k.clone(), *v))
        },
    )
    .await;
    println!("{} = {}", secret.0, secret.1);
    // The example asks for one-year leaf certificates: between 364 and 366 days left.
    assert!(
        secret.1 > 364.0 * 86400.0 && secret.1 < 366.0 * 86400.0,
        "{secret:?}"
    );
    let lm = leader.metrics();
    let sm = standby.metrics();
    let reconciles = sum(&lm, "kok_reconciles_total{controller=\"cluster\"}");
    assert!(reconciles >= 1.0, "leader reconciles: {reconciles}");
    assert!(
        lm.keys()
            .any(|k| k.starts_with("kok_reconcile_duration_seconds_count"))
    );
    assert_eq!(
        lm.get(&format!("kok_leader{{lease=\"{lease_name}\"}}")),
        Some(&1.0)
    );
    assert_eq!(
        sum(&sm, "kok_reconciles_total"),
        0.0,
        "the standby reconciled"
    );
    assert_eq!(
        sm.get(&format!("kok_leader{{lease=\"{lease_name}\"}}")),
        Some(&0.0)
    );
    println!("leader reconciles: {reconciles}; standby: 0");

    // The log filter changes at run time.
    assert_eq!(
        leader.put("/debug/loglevel", "debug").map(|(s, _)| s),
        Some(200)
    );
    assert_eq!(
        leader
            .get("/debug/loglevel")
            .map(|(_, b)| b.trim().to_string()),
        Some("debug".to_string())
    );
    assert_eq!(
        leader
            .put("/debug/loglevel", "info,foo=verbose")
            .map(|(s, _)| s),
        Some(400)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = std::fs::read_to_string(&leader.log).expect("log");
    assert!(
        log.contains("DEBUG"),
        "no debug lines after PUT /debug/loglevel debug"
    );
    leader.put("/debug/loglevel", "info");

    // kill -9: the standby takes over within the lease duration (plus one
    // retry period and scheduling slack on a loaded machine).
    let killed = Instant::now();
    leader.signal("KILL");
    leader.wait_exit(Duration::from_secs(10));
    let standby_name = standby.name;
    let took = wait_for(
        "takeover after SIGKILL",
        LEASE + Duration::from_secs(30),
        async || {
            (holder(&leases, &lease_name).await.as_deref() == Some(standby_name))
                .then(|| killed.elapsed())
        },
    )
    .await;
    println!("takeover after SIGKILL of the leader: {took:?} (lease duration {LEASE:?})");
    // A standby counts the lease duration from when it first saw the last
    // renewal (up to one retry period late) and notices expiry at its next
    // retry: lease duration + 2 retry periods (19 s), plus slack for load.
    assert!(
        took <= LEASE + Duration::from_secs(9),
        "takeover took {took:?}"
    );
    // The new leader reconciles.
    wait_for(
        "the new leader to reconcile",
        Duration::from_secs(60),
        async || {
            (sum(
                &standby.metrics(),
                "kok_reconciles_total{controller=\"cluster\"}",
            ) >= 1.0)
                .then_some(())
        },
    )
    .await;

    // A fresh standby, then SIGTERM to the leader: handover at once.
    let mut c = Replica::start(env, &ns, "replica-c");
    wait_for(
        "/readyz of the new standby",
        Duration::from_secs(60),
        async || c.get("/readyz").filter(|(s, _)| *s == 200),
    )
    .await;
    let stopped = Instant::now();
    standby.signal("TERM");
    let status = standby.wait_exit(Duration::from_secs(60));
    assert!(
        status.success(),
        "the leader exits 0 on SIGTERM: {status:?}"
    );
    let took = wait_for(
        "handover after SIGTERM",
        Duration::from_secs(30),
        async || {
            (holder(&leases, &lease_name).await.as_deref() == Some("replica-c"))
                .then(|| stopped.elapsed())
        },
    )
    .await;
    println!("handover after SIGTERM of the leader: {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "SIGTERM handover took {took:?}, expected about one retry period (2 s)"
    );
    wait_for(
        "replica-c to reconcile",
        Duration::from_secs(60),
        async || {
            (sum(&c.metrics(), "kok_reconciles_total{controller=\"cluster\"}") >= 1.0).then_some(())
        },
    )
    .await;
    let lease = leases.get(&lease_name).await.expect("lease");
    let transitions = lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    println!("lease transitions: {transitions}");
    assert!(transitions >= 2, "two handovers, {transitions} transitions");
    c.signal("TERM");
    assert!(c.wait_exit(Duration::from_secs(60)).success());
}
