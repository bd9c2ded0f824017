//! A Machine whose host cannot be logged in to is tried again with backoff
//! (`--retry-backoff`, doubling), however often something wakes it: its own
//! failed status and every retry's status write are updates of the Machine,
//! and used to start the next attempt at once, so an unreachable host was
//! dialled again and again as fast as the operator could fail.
//!
//! The host is a TCP listener of the test that counts connections and
//! closes each after a second and a half without a word, as an overloaded
//! host's sshd may. (Each failure then ends in another second than the
//! last, so each failed status differs from the one before and is written.)

mod support;

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kok_testenv::wait::wait_for;
use kube::api::Api;
use kube_on_kube_api::Machine;
use kube_on_kube_api::machine::MachinePhase;
use support::*;

/// Counts the connections to a port of `ip` (an address of this machine),
/// closing each after 1.5 s.
fn refusing_host(ip: std::net::IpAddr) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                drop(stream);
            });
        }
    });
    (port, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_host_is_retried_with_backoff() {
    let h = Harness::start(HarnessOptions { hosts: 1 }).await;
    // The test hosts' gateway: an address of this machine a Machine may
    // name (the API server refuses loopback ones).
    let gateway = h.hosts.gateway_ip();
    let (port, connections) = refusing_host(gateway);
    let host = &h.hosts.hosts()[0];
    let mut m = machine(host, host.host_public_key(), 0);
    m.metadata.name = Some("refusing".into());
    m.spec.ip = gateway.to_string();
    m.spec.ssh.port = port.into();
    let machines: Api<Machine> = h.machines();
    apply(&machines, &m).await;
    let _operator = h.operator();

    wait_for(
        "the Machine failed as unreachable",
        Duration::from_secs(60),
        async || {
            let m = machine_status(&machines, "refusing").await?;
            (phase(&m) == Some(MachinePhase::Failed)
                && condition(&m, "Reachable") == Some(("False", "Unreachable")))
            .then_some(())
        },
    )
    .await;
    let first = Instant::now();
    let at_first = connections.load(Ordering::SeqCst);
    // Backoff 1, 2 and 4 s (RETRY_BACKOFF doubling; each attempt also takes
    // 1.5 s): three more attempts start within 12 s, at about 1, 4.5 and
    // 10 s, four if one started just before the clock did. Without backoff
    // it would be one every 1.5 s or so, eight in 12 s.
    let window = RETRY_BACKOFF * 12;
    tokio::time::sleep(window).await;
    let attempts = connections.load(Ordering::SeqCst) - at_first;
    eprintln!(
        "{attempts} connection attempts in {:?} after the first failure ({at_first} before)",
        first.elapsed()
    );
    assert!(
        (2..=4).contains(&attempts),
        "{attempts} attempts in {window:?}: retried without backoff, or not at all"
    );
    assert!(
        has_event(&h.client, "refusing", "Unreachable").await,
        "a Warning Event says why"
    );
}
