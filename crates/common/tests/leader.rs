//! Leader election against the real API server: candidates racing for a new
//! or an expired Lease never both win (the resourceVersion-conditional writes
//! let exactly one through), a released Lease is taken at once, and a leader
//! whose Lease was taken notices at its next renewal.

use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use kok_common::leader::{Attempt, Elector, LeaderArgs, Lost};
use kok_testenv::kube_env::KubeEnv;
use kube::Client;
use kube::api::{Api, PostParams};

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    leader: LeaderArgs,
}

fn elector(client: &Client, ns: &str, lease: &str, identity: &str, duration: &str) -> Elector {
    let flags = Flags::parse_from([
        "test",
        &format!("--leader-election-lease-duration={duration}"),
        "--leader-election-renew-deadline=1s",
        "--leader-election-retry-period=200ms",
    ]);
    let mut e = flags
        .leader
        .elector(client.clone(), ns, lease)
        .expect("elector");
    e.identity = identity.to_string();
    e
}

async fn holder(api: &Api<Lease>, name: &str) -> Option<String> {
    api.get(name).await.ok()?.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_candidates_never_both_win() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease-race").await;
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    for round in 0..5 {
        let lease = format!("race-{round}");
        let mut candidates: Vec<Elector> = (0..4)
            .map(|i| elector(&client, &ns, &lease, &format!("c{i}"), "15s"))
            .collect();
        let attempts =
            futures::future::join_all(candidates.iter_mut().map(|c| c.try_acquire_or_renew()))
                .await;
        let won: Vec<usize> = attempts
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Ok(Attempt::Held)))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {attempts:?}");
        let winner = format!("c{}", won[0]);
        assert_eq!(holder(&api, &lease).await, Some(winner.clone()));
        for (i, c) in candidates.iter_mut().enumerate() {
            let again = c.try_acquire_or_renew().await.expect("attempt");
            if i == won[0] {
                assert_eq!(again, Attempt::Held, "the winner renews");
            } else {
                assert_eq!(again, Attempt::HeldBy(winner.clone()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_goes_to_exactly_one_and_a_released_one_at_once() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease-expiry").await;
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut a = elector(&client, &ns, "l", "a", "2s");
    assert_eq!(a.try_acquire_or_renew().await.expect("a"), Attempt::Held);
    // a stops renewing (it "died"). b and c poll together.
    let mut b = elector(&client, &ns, "l", "b", "2s");
    let mut c = elector(&client, &ns, "l", "c", "2s");
    let died = Instant::now();
    let (winner, took) = loop {
        let (rb, rc) = tokio::join!(b.try_acquire_or_renew(), c.try_acquire_or_renew());
        let (rb, rc) = (rb.expect("b"), rc.expect("c"));
        assert!(
            !(rb == Attempt::Held && rc == Attempt::Held),
            "both took the lease"
        );
        if rb == Attempt::Held {
            break ("b", died.elapsed());
        }
        if rc == Attempt::Held {
            break ("c", died.elapsed());
        }
        assert!(died.elapsed() < Duration::from_secs(30), "nobody took it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("{winner} took the expired lease after {took:?}");
    assert!(
        took >= Duration::from_secs(2),
        "taken before it expired: {took:?}"
    );
    let spec = api.get("l").await.expect("lease").spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(winner));
    assert_eq!(spec.lease_transitions, Some(1));
    // The old leader finds out at once.
    assert_eq!(
        a.try_acquire_or_renew().await.expect("a"),
        Attempt::HeldBy(winner.into())
    );

    // Released: the other takes it on its next attempt.
    let (leader, other) = if winner == "b" {
        (&mut b, &mut c)
    } else {
        (&mut c, &mut b)
    };
    leader.release().await;
    assert_eq!(holder(&api, "l").await, None);
    assert_eq!(
        other.try_acquire_or_renew().await.expect("other"),
        Attempt::Held
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_was_taken_stops_holding() {
    let env = KubeEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease-taken").await;
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut a = elector(&client, &ns, "l", "a", "15s");
    assert_eq!(a.try_acquire_or_renew().await.expect("a"), Attempt::Held);
    let hold = tokio::spawn(async move { a.hold().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Somebody overwrites the Lease (a forced takeover). The holder renews
    // it meanwhile: a write that meets a renewal (409) reads it again.
    let mut attempts = 0;
    loop {
        let mut lease = api.get("l").await.expect("lease");
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        match api.replace("l", &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 10 => attempts += 1,
            Err(e) => panic!("overwrite: {e}"),
        }
    }
    let lost = tokio::time::timeout(Duration::from_secs(10), hold)
        .await
        .expect("hold returns")
        .expect("join");
    assert!(
        matches!(&lost, Lost::TakenBy(h) if h == "intruder"),
        "{lost:?}"
    );
}
