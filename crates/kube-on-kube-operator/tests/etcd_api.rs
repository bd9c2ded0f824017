//! The etcd client against real etcd members over mutual TLS: a three-member
//! cluster on loopback, then a learner added, caught up, promoted and removed,
//! with the member list checked after every change; and the membership
//! planner's steps carried out on real members until they converge.

mod etcd_members;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_members::{Etcd, Pki, port_pairs, start_new_cluster, wait_healthy};
use kok_testenv::wait::wait_for;
use kube_on_kube_operator::etcd::api::{EtcdClient, EtcdError, Member};
use kube_on_kube_operator::etcd::membership::{
    ClaimState, ClusterState, Observed, Peer, PodState, Slot, Step, initial_cluster_flag, plan,
};

const START: Duration = Duration::from_secs(60);
const REQUEST: Duration = Duration::from_secs(5);
/// Membership changes wait for etcd's own five-second health window.
const CONVERGE: Duration = Duration::from_secs(120);

/// name -> peer URLs, sorted, for comparing member lists.
fn by_peer(members: &[Member]) -> Vec<(String, bool)> {
    let mut list: Vec<_> = members
        .iter()
        .map(|m| (m.peer_urls.join(","), m.is_learner))
        .collect();
    list.sort();
    list
}

#[tokio::test]
async fn membership_changes_on_real_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // The fifth client port is the endpoint that never answers.
    let ports = port_pairs(5);
    let started = Instant::now();
    let mut members = start_new_cluster(dir.path(), &pki, &ports[..3]);

    // The first endpoint never answers: every call must fall through to the next.
    let dead = format!("https://127.0.0.1:{}", ports[4].0);
    let mut endpoints = vec![dead];
    endpoints.extend(members.iter().map(|m| m.client_url.clone()));
    let client = EtcdClient::new(endpoints, pki.client_tls(), REQUEST).unwrap();
    for member in &mut members {
        wait_healthy(&client, member).await;
    }
    eprintln!("three members healthy after {:?}", started.elapsed());

    let list = client.member_list().await.unwrap();
    let mut names: Vec<_> = list.iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["m0", "m1", "m2"]);
    assert!(list.iter().all(|m| !m.is_learner));
    let expected: Vec<_> = members
        .iter()
        .map(|m| (m.peer_url.clone(), false))
        .collect();
    assert_eq!(by_peer(&list), {
        let mut e = expected.clone();
        e.sort();
        e
    });
    // An endpoint that accepts connections and never answers costs one
    // timeout, then the next endpoint answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("https://{}", silent.local_addr().unwrap());
    let short = Duration::from_millis(500);
    let patient = EtcdClient::new(
        vec![silent_url, members[0].client_url.clone()],
        pki.client_tls(),
        short,
    )
    .unwrap();
    let asked = Instant::now();
    assert_eq!(patient.member_list().await.unwrap().len(), 3);
    assert!(asked.elapsed() >= short, "{:?}", asked.elapsed());
    assert!(asked.elapsed() < REQUEST, "{:?}", asked.elapsed());
    drop(silent);

    let status = client.status(&members[0].client_url).await.unwrap();
    assert!(list.iter().any(|m| m.id == status.member_id));
    assert!(list.iter().any(|m| m.id == status.leader), "{status:?}");

    // Add a learner and start it with the list etcd returned.
    let peer3 = format!("https://127.0.0.1:{}", ports[3].1);
    // etcd refuses membership changes until every voter has been connected
    // for a few seconds; that refusal is transient.
    let (learner, with_learner) =
        wait_for("etcd to accept a learner", START, async || {
            match client.add_learner(std::slice::from_ref(&peer3)).await {
                Ok(added) => Some(added),
                Err(e) if e.is_transient() => None,
                Err(e) => panic!("adding a learner failed: {e}"),
            }
        })
        .await;
    eprintln!("learner added after {:?}", started.elapsed());
    assert!(learner.is_learner);
    assert_eq!(learner.peer_urls, std::slice::from_ref(&peer3));
    assert_eq!(with_learner.len(), 4);
    let listed = client.member_list().await.unwrap();
    assert_eq!(by_peer(&listed), by_peer(&with_learner));
    assert!(listed.iter().any(|m| m.id == learner.id && m.is_learner));
    // Adding the same peer URL again is refused, so a retried step cannot
    // create a second member.
    let again = client.add_learner(std::slice::from_ref(&peer3)).await;
    assert!(again.is_err(), "{again:?}");
    assert_eq!(client.member_list().await.unwrap().len(), 4);

    let cluster: Vec<String> = with_learner
        .iter()
        .map(|m| {
            let name = if m.id == learner.id { "m3" } else { &m.name };
            format!("{name}={}", m.peer_urls.join(","))
        })
        .collect();
    let mut fourth = Etcd::start(
        dir.path(),
        &pki,
        "m3",
        ports[3],
        &cluster.join(","),
        "existing",
    );
    let caught_up = Instant::now();
    let learner_status = wait_for("the learner to serve its status", START, async || {
        assert!(fourth.still_running(), "etcd m3 exited");
        client.status(&fourth.client_url).await.ok()
    })
    .await;
    assert!(learner_status.is_learner);
    // A learner answers /health too, so a readiness probe on it lets the
    // planner see the learner ready and promote it.
    wait_healthy(&client, &mut fourth).await;
    assert_eq!(learner_status.member_id, learner.id);

    // etcd refuses promotion until the learner has caught up; retry until it
    // accepts.
    let promoted = wait_for("the learner to be promoted", START, async || {
        match client.promote_member(learner.id).await {
            Ok(members) => Some(members),
            Err(e) if e.is_learner_not_ready() => None,
            Err(e) => panic!("promotion failed: {e}"),
        }
    })
    .await;
    eprintln!(
        "learner promoted {:?} after it started",
        caught_up.elapsed()
    );
    assert!(promoted.iter().all(|m| !m.is_learner), "{promoted:?}");
    let listed = client.member_list().await.unwrap();
    assert_eq!(listed.len(), 4);
    assert!(listed.iter().all(|m| !m.is_learner));
    assert!(listed.iter().any(|m| m.id == learner.id && m.name == "m3"));
    wait_healthy(&client, &mut fourth).await;

    // Remove it again.
    let remaining = client.remove_member(learner.id).await.unwrap();
    assert_eq!(remaining.len(), 3);
    assert!(remaining.iter().all(|m| m.id != learner.id));
    let listed = client.member_list().await.unwrap();
    assert_eq!(by_peer(&listed), {
        let mut e = expected;
        e.sort();
        e
    });
    // A removed member cannot be removed twice.
    let twice = client.remove_member(learner.id).await;
    assert!(twice.is_err(), "{twice:?}");
    drop(fourth);
    for member in &mut members {
        wait_healthy(&client, member).await;
    }
    eprintln!("whole test took {:?}", started.elapsed());
}

/// The planner's steps carried out on real etcd processes: a process stands
/// for a member's Pod and its data directory for its claim.
struct Driver<'a> {
    dir: &'a Path,
    pki: &'a Pki,
    client: EtcdClient,
    slots: Vec<(String, (u16, u16))>,
    running: Vec<Option<Etcd>>,
    recorded: Option<Step>,
    taken: Vec<Step>,
}

impl<'a> Driver<'a> {
    fn new(dir: &'a Path, pki: &'a Pki, count: usize) -> Self {
        let slots: Vec<_> = port_pairs(count)
            .into_iter()
            .enumerate()
            .map(|(i, ports)| (format!("s{i}"), ports))
            .collect();
        let endpoints = slots
            .iter()
            .map(|(_, ports)| format!("https://127.0.0.1:{}", ports.0))
            .collect();
        Self {
            dir,
            pki,
            client: EtcdClient::new(endpoints, pki.client_tls(), REQUEST).unwrap(),
            slots,
            running: (0..count).map(|_| None).collect(),
            recorded: None,
            taken: vec![],
        }
    }

    fn data_dir(&self, index: usize) -> PathBuf {
        self.dir.join(&self.slots[index].0)
    }

    fn peer_url(&self, index: usize) -> String {
        format!("https://127.0.0.1:{}", self.slots[index].1.1)
    }

    async fn observe(&mut self) -> (Vec<Slot>, Option<Vec<Member>>) {
        let mut slots = vec![];
        for index in 0..self.slots.len() {
            let data_dir = self.data_dir(index);
            let peer_url = self.peer_url(index);
            let pod = match self.running[index].as_mut() {
                None => PodState::Absent,
                Some(etcd) => {
                    if !etcd.still_running() {
                        // A member etcd removed exits; its Pod would crash-loop.
                        PodState::NotReady
                    } else {
                        match self.client.status(&etcd.client_url).await {
                            Ok(s) if s.leader != 0 && s.errors.is_empty() => PodState::Ready,
                            _ => PodState::NotReady,
                        }
                    }
                }
            };
            slots.push(Slot {
                name: self.slots[index].0.clone(),
                peer_url,
                pod,
                claim: if data_dir.exists() {
                    ClaimState::Present
                } else {
                    ClaimState::Absent
                },
                outdated: false,
                settling: false,
                rolled: false,
            });
        }
        (slots, self.client.member_list().await.ok())
    }

    /// Carry out one step; `false` when etcd asked to try again later.
    async fn act(&mut self, step: &Step) -> bool {
        let retry = |e: EtcdError| {
            assert!(
                e.is_transient() || e.is_learner_not_ready(),
                "{step:?} failed: {e}"
            );
            false
        };
        match step {
            Step::Bootstrap { initial_cluster } => {
                for index in 0..initial_cluster.len() {
                    if self.running[index].is_none() {
                        self.start(index, initial_cluster, ClusterState::New);
                    }
                }
            }
            Step::StartMember {
                index,
                initial_cluster,
                state,
            } => self.start(*index, initial_cluster, *state),
            Step::AddLearner { index } => {
                let peer = self.peer_url(*index);
                if let Err(e) = self.client.add_learner(&[peer]).await {
                    return retry(e);
                }
            }
            Step::Promote { id, .. } => {
                if let Err(e) = self.client.promote_member(*id).await {
                    return retry(e);
                }
            }
            Step::RemoveMember { id, .. } => {
                if let Err(e) = self.client.remove_member(*id).await {
                    return retry(e);
                }
            }
            Step::DeletePod { index } | Step::RollMember { index } => self.running[*index] = None,
            Step::DeleteClaim { index } => std::fs::remove_dir_all(self.data_dir(*index)).unwrap(),
            Step::Wait { .. } | Step::RollFailed { .. } | Step::Done => {}
        }
        true
    }

    fn start(&mut self, index: usize, peers: &[Peer], state: ClusterState) {
        let etcd = Etcd::start(
            self.dir,
            self.pki,
            &self.slots[index].0,
            self.slots[index].1,
            &initial_cluster_flag(peers),
            state.as_str(),
        );
        self.running[index] = Some(etcd);
    }

    /// Plan and act until the planner says `Done`.
    async fn converge(&mut self, desired: usize) -> Vec<Step> {
        self.converge_until(desired, None).await
    }

    /// Like `converge`, but stop right after carrying out a step of kind
    /// `stop_after`, as an operator killed at that moment would: the record
    /// of that step stays.
    async fn converge_until(&mut self, desired: usize, stop_after: Option<&str>) -> Vec<Step> {
        let started = self.taken.len();
        let deadline = Instant::now() + CONVERGE;
        loop {
            assert!(
                Instant::now() < deadline,
                "no convergence to {desired} within {CONVERGE:?}; took {:?}",
                &self.taken[started..]
            );
            let (slots, live) = self.observe().await;
            let step = plan(&Observed {
                desired,
                slots: &slots,
                live: live.as_deref(),
                recorded: self.recorded.as_ref(),
                data_outlives_pod: true,
                leader: None,
                from_snapshot: false,
            });
            match &step {
                Step::Done => {
                    self.recorded = None;
                    return self.taken[started..].to_vec();
                }
                Step::Wait { .. } => {}
                change => {
                    self.recorded = Some(change.clone());
                    if self.act(change).await {
                        self.taken.push(step.clone());
                        if stop_after == Some(step.kind()) {
                            return self.taken[started..].to_vec();
                        }
                        continue;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn members(&self) -> Vec<(String, bool)> {
        let mut list: Vec<_> = self
            .client
            .member_list()
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.name, m.is_learner))
            .collect();
        list.sort();
        list
    }
}

fn names_of(steps: &[Step]) -> Vec<&'static str> {
    steps.iter().map(Step::kind).collect()
}

#[tokio::test]
async fn planner_bootstraps_replaces_and_scales_real_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut driver = Driver::new(dir.path(), &pki, 3);
    let voters =
        |n: usize| -> Vec<(String, bool)> { (0..n).map(|i| (format!("s{i}"), false)).collect() };

    let t = Instant::now();
    let steps = driver.converge(3).await;
    eprintln!("bootstrap: {:?} in {:?}", names_of(&steps), t.elapsed());
    assert_eq!(names_of(&steps), ["bootstrap"]);
    assert_eq!(driver.members().await, voters(3));
    let old_id = driver
        .client
        .status(&format!("https://127.0.0.1:{}", driver.slots[1].1.0))
        .await
        .unwrap()
        .member_id;

    // Member 1 loses its Pod and its claim.
    driver.running[1] = None;
    std::fs::remove_dir_all(driver.data_dir(1)).unwrap();
    let t = Instant::now();
    let steps = driver.converge(3).await;
    eprintln!("replace: {:?} in {:?}", names_of(&steps), t.elapsed());
    assert_eq!(names_of(&steps), ["remove", "add", "start", "promote"]);
    assert_eq!(driver.members().await, voters(3));
    let list = driver.client.member_list().await.unwrap();
    assert!(
        list.iter().all(|m| m.id != old_id),
        "member 1 kept its old ID"
    );

    let t = Instant::now();
    let steps = driver.converge(1).await;
    eprintln!("scale in: {:?} in {:?}", names_of(&steps), t.elapsed());
    assert_eq!(
        names_of(&steps),
        [
            "remove",
            "delete-pod",
            "delete-claim",
            "remove",
            "delete-pod",
            "delete-claim"
        ]
    );
    assert_eq!(driver.members().await, voters(1));

    let t = Instant::now();
    let steps = driver.converge(3).await;
    eprintln!("scale out: {:?} in {:?}", names_of(&steps), t.elapsed());
    assert_eq!(
        names_of(&steps),
        ["add", "start", "promote", "add", "start", "promote"]
    );
    assert_eq!(driver.members().await, voters(3));

    // The operator dies right after adding a replacement learner; restarted,
    // it finds the learner by its peer URL and starts it, never adding a
    // second one.
    driver.running[2] = None;
    std::fs::remove_dir_all(driver.data_dir(2)).unwrap();
    let t = Instant::now();
    let before = driver.converge_until(3, Some("add")).await;
    assert_eq!(names_of(&before), ["remove", "add"]);
    assert_eq!(driver.recorded.as_ref().map(Step::kind), Some("add"));
    let after = driver.converge(3).await;
    eprintln!(
        "replace with a crash: {:?} then {:?} in {:?}",
        names_of(&before),
        names_of(&after),
        t.elapsed()
    );
    assert_eq!(names_of(&after), ["start", "promote"]);
    assert_eq!(driver.members().await, voters(3));
}
