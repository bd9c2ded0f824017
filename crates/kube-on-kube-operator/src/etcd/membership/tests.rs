//! Plans for hand-written states, and whole sequences run against a model of
//! etcd, Pods and claims that checks every step for what must never happen.

use super::*;

use PodState::{Absent as NoPod, Failed, NotReady, Ready, Terminating as PodGoing};

const SLOTS: usize = 3;

fn names() -> Names {
    Names {
        cluster: "c".into(),
        namespace: "ns".into(),
        meta_domain: "cluster.local".into(),
    }
}

fn peer(index: usize) -> String {
    let n = names();
    n.etcd_peer_url(&n.etcd_member(index))
}

fn id_of(index: usize) -> u64 {
    100 + index as u64
}

/// A voter of slot `index` that has started.
fn voter(index: usize) -> Member {
    Member {
        id: id_of(index),
        name: names().etcd_member(index),
        peer_urls: vec![peer(index)],
        client_urls: vec![format!("https://{index}:2379")],
        is_learner: false,
    }
}

fn learner(index: usize, started: bool) -> Member {
    Member {
        is_learner: true,
        name: if started {
            names().etcd_member(index)
        } else {
            String::new()
        },
        client_urls: vec![],
        ..voter(index)
    }
}

fn slots(states: &[(PodState, ClaimState)]) -> Vec<Slot> {
    let mut all: Vec<Slot> = states
        .iter()
        .enumerate()
        .map(|(i, (pod, claim))| Slot::new(&names(), i, *pod, *claim))
        .collect();
    for i in all.len()..SLOTS {
        all.push(Slot::new(&names(), i, NoPod, ClaimState::Absent));
    }
    all
}

const UP: (PodState, ClaimState) = (Ready, ClaimState::Present);
const NONE: (PodState, ClaimState) = (NoPod, ClaimState::Absent);

fn plan_for(
    desired: usize,
    states: &[(PodState, ClaimState)],
    live: Option<&[Member]>,
    recorded: Option<&Step>,
) -> Step {
    plan(&Observed {
        desired,
        slots: &slots(states),
        live,
        recorded,
        data_outlives_pod: true,
        leader: None,
        from_snapshot: false,
    })
}

fn is_wait(step: &Step, containing: &str) -> bool {
    matches!(step, Step::Wait { reason } if reason.contains(containing))
}

#[test]
fn fresh_cluster_bootstraps_every_wanted_member_as_new() {
    for desired in [1, 3] {
        let step = plan_for(desired, &[], None, None);
        let Step::Bootstrap { initial_cluster } = step else {
            panic!("{step:?}")
        };
        assert_eq!(initial_cluster.len(), desired);
        assert_eq!(initial_cluster[0].name, "c-etcd-0");
        assert_eq!(initial_cluster[0].peer_url, peer(0));
    }
    let flag = initial_cluster_flag(&[
        Peer {
            name: "a".into(),
            peer_url: "https://a:2380".into(),
        },
        Peer {
            name: "b".into(),
            peer_url: "https://b:2380".into(),
        },
    ]);
    assert_eq!(flag, "a=https://a:2380,b=https://b:2380");
}

#[test]
fn table() {
    let v = [voter(0), voter(1), voter(2)];
    let full = &v[..];
    let two = &v[..2];
    let bootstrap = plan_for(3, &[], None, None);
    struct Case<'a> {
        name: &'a str,
        desired: usize,
        states: Vec<(PodState, ClaimState)>,
        live: Option<Vec<Member>>,
        recorded: Option<Step>,
        expect: &'a dyn Fn(&Step) -> bool,
    }
    let cases = [
        Case {
            name: "healthy steady state",
            desired: 3,
            states: vec![UP, UP, UP],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| *s == Step::Done,
        },
        Case {
            name: "bootstrap interrupted after one pod resumes bootstrap",
            desired: 3,
            states: vec![(NotReady, ClaimState::Present)],
            live: None,
            recorded: Some(bootstrap.clone()),
            expect: &|s| matches!(s, Step::Bootstrap { initial_cluster } if initial_cluster.len() == 3),
        },
        Case {
            name: "bootstrap with every pod created waits",
            desired: 3,
            states: vec![(NotReady, ClaimState::Present); 3],
            live: None,
            recorded: Some(bootstrap.clone()),
            expect: &|s| is_wait(s, "bootstrapping"),
        },
        Case {
            name: "unreachable without a record never bootstraps over data",
            desired: 3,
            states: vec![(NotReady, ClaimState::Present), NONE, NONE],
            live: None,
            recorded: None,
            expect: &|s| is_wait(s, "no etcd member answers"),
        },
        Case {
            name: "every pod deleted: restart one on its data",
            desired: 3,
            states: vec![(NoPod, ClaimState::Present); 3],
            live: None,
            recorded: None,
            expect: &|s| matches!(s, Step::StartMember { index: 0, state: ClusterState::Existing, initial_cluster } if initial_cluster.len() == 3),
        },
        Case {
            name: "unreachable mid scale-in: never restart the removed member",
            desired: 1,
            states: vec![
                (NotReady, ClaimState::Present),
                (NotReady, ClaimState::Present),
                (NoPod, ClaimState::Present),
            ],
            live: None,
            recorded: Some(Step::DeleteClaim { index: 2 }),
            expect: &|s| is_wait(s, "no etcd member answers"),
        },
        Case {
            name: "unreachable right after a removal: the removed slot stays down",
            desired: 3,
            states: vec![
                (NotReady, ClaimState::Present),
                (NotReady, ClaimState::Present),
                (NoPod, ClaimState::Present),
            ],
            live: None,
            recorded: Some(Step::RemoveMember {
                id: id_of(2),
                index: Some(2),
            }),
            expect: &|s| is_wait(s, "no etcd member answers"),
        },
        Case {
            name: "pod deleted, claim kept: restart it on its data",
            desired: 3,
            states: vec![UP, (NoPod, ClaimState::Present), UP],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| matches!(s, Step::StartMember { index: 1, state: ClusterState::Existing, initial_cluster } if initial_cluster.len() == 3),
        },
        Case {
            name: "pod and claim deleted: remove the member",
            desired: 3,
            states: vec![UP, NONE, UP],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(1),
                    index: Some(1),
                }
            },
        },
        Case {
            name: "claim being deleted under a running member: replace it",
            desired: 3,
            states: vec![UP, UP, (Ready, ClaimState::Terminating)],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(2),
                    index: Some(2),
                }
            },
        },
        Case {
            name: "failed pod: remove the member",
            desired: 3,
            states: vec![UP, UP, (Failed, ClaimState::Present)],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(2),
                    index: Some(2),
                }
            },
        },
        Case {
            name: "quorum protection: two of three down",
            desired: 3,
            states: vec![
                UP,
                (NotReady, ClaimState::Present),
                (Failed, ClaimState::Present),
            ],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| is_wait(s, "short of a quorum of 2"),
        },
        Case {
            name: "quorum protection: the only member",
            desired: 1,
            states: vec![(Failed, ClaimState::Present)],
            live: Some(vec![voter(0)]),
            recorded: None,
            expect: &|s| is_wait(s, "quorum"),
        },
        Case {
            name: "removed member's pod still running: delete it",
            desired: 3,
            states: vec![UP, UP, (NotReady, ClaimState::Present)],
            live: Some(two.to_vec()),
            recorded: Some(Step::RemoveMember {
                id: id_of(2),
                index: Some(2),
            }),
            expect: &|s| *s == Step::DeletePod { index: 2 },
        },
        Case {
            name: "removed member's pod terminating: wait",
            desired: 3,
            states: vec![UP, UP, (PodGoing, ClaimState::Present)],
            live: Some(two.to_vec()),
            recorded: Some(Step::DeletePod { index: 2 }),
            expect: &|s| is_wait(s, "terminating"),
        },
        Case {
            name: "removed member's old claim: wipe it before re-adding",
            desired: 3,
            states: vec![UP, UP, (NoPod, ClaimState::Present)],
            live: Some(two.to_vec()),
            recorded: Some(Step::DeletePod { index: 2 }),
            expect: &|s| *s == Step::DeleteClaim { index: 2 },
        },
        Case {
            name: "claim being deleted: wait",
            desired: 3,
            states: vec![UP, UP, (NoPod, ClaimState::Terminating)],
            live: Some(two.to_vec()),
            recorded: Some(Step::DeleteClaim { index: 2 }),
            expect: &|s| is_wait(s, "being deleted"),
        },
        Case {
            name: "slot clean: add it back as a learner",
            desired: 3,
            states: vec![UP, UP, NONE],
            live: Some(two.to_vec()),
            recorded: Some(Step::DeleteClaim { index: 2 }),
            expect: &|s| *s == Step::AddLearner { index: 2 },
        },
        Case {
            name: "no new member while a voter is not ready",
            desired: 3,
            states: vec![UP, (NotReady, ClaimState::Present), NONE],
            live: Some(two.to_vec()),
            recorded: None,
            expect: &|s| is_wait(s, "c-etcd-1 is not ready"),
        },
        Case {
            name: "learner added (crash after the call): start it, do not add again",
            desired: 3,
            states: vec![UP, UP, NONE],
            live: Some(vec![voter(0), voter(1), learner(2, false)]),
            recorded: Some(Step::AddLearner { index: 2 }),
            expect: &|s| {
                matches!(s, Step::StartMember { index: 2, state: ClusterState::Existing, initial_cluster }
                    if initial_cluster.iter().any(|p| p.name == "c-etcd-2" && p.peer_url == peer(2))
                    && initial_cluster.len() == 3)
            },
        },
        Case {
            name: "learner started and ready: promote",
            desired: 3,
            states: vec![UP, UP, UP],
            live: Some(vec![voter(0), voter(1), learner(2, true)]),
            recorded: Some(Step::StartMember {
                index: 2,
                initial_cluster: vec![],
                state: ClusterState::Existing,
            }),
            expect: &|s| {
                *s == Step::Promote {
                    id: id_of(2),
                    index: 2,
                }
            },
        },
        Case {
            name: "learner catching up: wait",
            desired: 3,
            states: vec![UP, UP, (NotReady, ClaimState::Present)],
            live: Some(vec![voter(0), voter(1), learner(2, true)]),
            recorded: None,
            expect: &|s| is_wait(s, "catching up"),
        },
        Case {
            name: "learner failed: remove it without a quorum check",
            desired: 3,
            states: vec![
                UP,
                (NotReady, ClaimState::Present),
                (Failed, ClaimState::Present),
            ],
            live: Some(vec![voter(0), voter(1), learner(2, true)]),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(2),
                    index: Some(2),
                }
            },
        },
        Case {
            name: "scale out 1 to 3: add slot 1 first",
            desired: 3,
            states: vec![UP],
            live: Some(vec![voter(0)]),
            recorded: None,
            expect: &|s| *s == Step::AddLearner { index: 1 },
        },
        Case {
            name: "scale in 3 to 1: remove the highest member first",
            desired: 1,
            states: vec![UP, UP, UP],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(2),
                    index: Some(2),
                }
            },
        },
        Case {
            name: "scale in: an unwanted learner goes first",
            desired: 1,
            states: vec![UP, (NotReady, ClaimState::Present)],
            live: Some(vec![voter(0), learner(1, true)]),
            recorded: None,
            expect: &|s| {
                *s == Step::RemoveMember {
                    id: id_of(1),
                    index: Some(1),
                }
            },
        },
        Case {
            name: "scale in: leftovers of a removed surplus member are deleted",
            desired: 1,
            states: vec![UP, (NoPod, ClaimState::Present)],
            live: Some(vec![voter(0)]),
            recorded: None,
            expect: &|s| *s == Step::DeleteClaim { index: 1 },
        },
        Case {
            name: "scale in refused when the rest would lose quorum",
            desired: 1,
            states: vec![(NotReady, ClaimState::Present), UP, UP],
            live: Some(full.to_vec()),
            recorded: None,
            expect: &|s| is_wait(s, "not ready"),
        },
        Case {
            name: "a member no slot owns is removed",
            desired: 3,
            states: vec![UP, UP, UP],
            live: Some(vec![
                voter(0),
                voter(1),
                voter(2),
                Member {
                    id: 7,
                    name: "stranger".into(),
                    peer_urls: vec!["https://stranger:2380".into()],
                    client_urls: vec![],
                    is_learner: false,
                },
            ]),
            recorded: None,
            expect: &|s| *s == Step::RemoveMember { id: 7, index: None },
        },
    ];
    for case in cases {
        let step = plan_for(
            case.desired,
            &case.states,
            case.live.as_deref(),
            case.recorded.as_ref(),
        );
        assert!((case.expect)(&step), "{}: got {step:?}", case.name);
    }
}

#[test]
fn steps_round_trip_as_json() {
    let step = Step::StartMember {
        index: 1,
        initial_cluster: vec![Peer {
            name: "a".into(),
            peer_url: "https://a:2380".into(),
        }],
        state: ClusterState::Existing,
    };
    let json = serde_json::to_string(&step).unwrap();
    assert_eq!(
        json,
        r#"{"step":"startMember","index":1,"initialCluster":[{"name":"a","peerUrl":"https://a:2380"}],"state":"existing"}"#
    );
    assert_eq!(serde_json::from_str::<Step>(&json).unwrap(), step);
    assert!(step.is_change());
    assert!(!Step::Done.is_change());
}

/// A model of one cluster's etcd, Pods and claims that carries out steps and
/// fails the test on anything a correct operator must never do.
#[derive(Debug, Clone)]
struct World {
    members: Vec<Member>,
    pods: Vec<PodState>,
    claims: Vec<ClaimState>,
    /// Slots whose claim holds data of a member etcd has removed.
    stale_data: Vec<bool>,
    next_id: u64,
    recorded: Option<Step>,
    /// Every member ID ever added, to count additions.
    added: Vec<u64>,
    /// Pods running an outdated template.
    outdated: Vec<bool>,
    /// Pods ready only moments ago.
    settling: Vec<bool>,
    /// The member the others follow.
    leader: Option<u64>,
    /// Whether data survives a Pod (claims) or goes with it (emptyDir).
    durable: bool,
    /// Pod (re)starts of members that kept their ID, to count restarts.
    restarts: usize,
    /// The members start from a snapshot.
    from_snapshot: bool,
}

impl World {
    fn empty() -> Self {
        Self {
            members: vec![],
            pods: vec![NoPod; SLOTS],
            claims: vec![ClaimState::Absent; SLOTS],
            stale_data: vec![false; SLOTS],
            next_id: 1000,
            recorded: None,
            added: vec![],
            outdated: vec![false; SLOTS],
            settling: vec![false; SLOTS],
            leader: None,
            durable: true,
            restarts: 0,
            from_snapshot: false,
        }
    }

    fn healthy(n: usize) -> Self {
        let mut w = Self::empty();
        for i in 0..n {
            w.members.push(voter(i));
            w.pods[i] = Ready;
            w.claims[i] = ClaimState::Present;
        }
        w
    }

    fn slot_of(&self, m: &Member) -> Option<usize> {
        (0..SLOTS).find(|&i| m.peer_urls.contains(&peer(i)))
    }

    fn live(&self) -> Option<Vec<Member>> {
        let voters: Vec<_> = self.members.iter().filter(|m| !m.is_learner).collect();
        let serving = voters
            .iter()
            .filter(|m| self.slot_of(m).is_some_and(|i| self.pods[i] == Ready))
            .count();
        (serving > voters.len() / 2).then(|| self.members.clone())
    }

    fn plan(&self, desired: usize) -> Step {
        let slots: Vec<Slot> = (0..SLOTS)
            .map(|i| {
                Slot::new(&names(), i, self.pods[i], self.claims[i])
                    .outdated(self.outdated[i])
                    .settling(self.settling[i])
            })
            .collect();
        let live = self.live();
        plan(&Observed {
            desired,
            slots: &slots,
            live: live.as_deref(),
            recorded: self.recorded.as_ref(),
            data_outlives_pod: self.durable,
            leader: self.leader,
            from_snapshot: self.from_snapshot,
        })
    }

    fn quorum_kept_after_removing(&self, id: u64) -> bool {
        let remaining: Vec<_> = self
            .members
            .iter()
            .filter(|m| !m.is_learner && m.id != id)
            .collect();
        let healthy = remaining
            .iter()
            .filter(|m| self.slot_of(m).is_some_and(|i| self.pods[i] == Ready))
            .count();
        healthy > remaining.len() / 2
    }

    /// Carry out `step` the way the operator would, checking it first.
    fn apply(&mut self, step: &Step) {
        if step.is_change() {
            self.recorded = Some(step.clone());
        }
        match step {
            Step::Bootstrap { initial_cluster } => {
                assert!(
                    self.members.is_empty(),
                    "bootstrap over a live cluster: {self:?}"
                );
                for p in initial_cluster {
                    let i = (0..SLOTS).find(|&i| peer(i) == p.peer_url).unwrap();
                    if self.pods[i] == NoPod {
                        self.pods[i] = Ready;
                        self.claims[i] = ClaimState::Present;
                    }
                }
                if initial_cluster
                    .iter()
                    .all(|p| (0..SLOTS).any(|i| peer(i) == p.peer_url && self.pods[i] == Ready))
                {
                    self.members = (0..initial_cluster.len()).map(voter).collect();
                }
            }
            Step::AddLearner { index } => {
                let i = *index;
                assert!(
                    self.members.iter().all(|m| self.slot_of(m) != Some(i)),
                    "slot {i} added twice: {self:?}"
                );
                assert!(
                    self.members.iter().all(|m| !m.is_learner),
                    "second learner: {self:?}"
                );
                assert_eq!(self.pods[i], NoPod, "added while its old pod exists");
                assert_eq!(
                    self.claims[i],
                    ClaimState::Absent,
                    "added on old data: {self:?}"
                );
                self.next_id += 1;
                self.added.push(self.next_id);
                self.members.push(Member {
                    id: self.next_id,
                    ..learner(i, false)
                });
            }
            Step::StartMember {
                index,
                initial_cluster,
                state,
            } => {
                let i = *index;
                assert_eq!(*state, ClusterState::Existing);
                assert!(!self.stale_data[i], "started on a removed member's data");
                assert!(matches!(self.pods[i], NoPod), "pod {i} exists");
                if self.claims[i] == ClaimState::Absent {
                    self.claims[i] = ClaimState::Present;
                }
                if let Some(m) = self.members.iter_mut().find(|m| m.peer_urls == [peer(i)]) {
                    assert!(
                        initial_cluster.iter().any(|p| p.peer_url == peer(i)),
                        "{initial_cluster:?}"
                    );
                    if !m.name.is_empty() {
                        self.restarts += 1;
                    }
                    m.name = names().etcd_member(i);
                }
                self.pods[i] = Ready;
                self.outdated[i] = false;
            }
            Step::Promote { id, .. } => {
                let m = self.members.iter_mut().find(|m| m.id == *id).unwrap();
                assert!(m.is_learner);
                m.is_learner = false;
            }
            Step::RemoveMember { id, index } => {
                assert!(
                    self.quorum_kept_after_removing(*id)
                        || self.members.iter().any(|m| m.id == *id && m.is_learner),
                    "removal of {id} breaks quorum: {self:?}"
                );
                self.members.retain(|m| m.id != *id);
                if let Some(i) = index {
                    // A removed member stops serving, and its data is stale.
                    if self.pods[*i] == Ready {
                        self.pods[*i] = NotReady;
                    }
                    if self.claims[*i] == ClaimState::Present {
                        self.stale_data[*i] = true;
                    }
                }
            }
            Step::DeletePod { index } => self.delete_pod(*index),
            Step::RollMember { index } => {
                let i = *index;
                assert!(self.durable, "rolled a member whose data goes with its pod");
                assert_eq!(self.pods[i], Ready, "rolled a member that is not serving");
                let voters: Vec<_> = self.members.iter().filter(|m| !m.is_learner).collect();
                assert!(
                    voters.iter().any(|m| self.slot_of(m) == Some(i)),
                    "rolled a non-voter: {self:?}"
                );
                let others = voters
                    .iter()
                    .filter(|m| self.slot_of(m) != Some(i))
                    .filter(|m| self.slot_of(m).is_some_and(|j| self.pods[j] == Ready))
                    .count();
                assert!(
                    voters.len() == 1 || others > voters.len() / 2,
                    "rolling {i} breaks quorum: {self:?}"
                );
                self.delete_pod(i);
            }
            Step::DeleteClaim { index } => {
                assert_eq!(self.pods[*index], NoPod, "claim deleted under its pod");
                self.claims[*index] = ClaimState::Absent;
                self.stale_data[*index] = false;
            }
            Step::Wait { reason } | Step::RollFailed { reason, .. } => {
                panic!("model never waits, got: {reason} in {self:?}")
            }
            Step::Done => self.recorded = None,
        }
    }

    fn delete_pod(&mut self, index: usize) {
        self.pods[index] = NoPod;
        if !self.durable {
            self.claims[index] = ClaimState::Absent;
            self.stale_data[index] = false;
        }
    }

    /// Plan and apply until `Done`; returns the steps taken.
    fn converge(&mut self, desired: usize) -> Vec<Step> {
        let mut steps = vec![];
        for _ in 0..40 {
            let step = self.plan(desired);
            self.apply(&step);
            if step == Step::Done {
                self.check_converged(desired);
                return steps;
            }
            steps.push(step);
        }
        panic!("no convergence after {steps:?}: {self:?}");
    }

    fn check_converged(&self, desired: usize) {
        let mut slots: Vec<_> = self.members.iter().map(|m| self.slot_of(m)).collect();
        slots.sort();
        assert_eq!(
            slots,
            (0..desired).map(Some).collect::<Vec<_>>(),
            "{self:?}"
        );
        assert!(self.members.iter().all(|m| !m.is_learner));
        assert!((0..desired).all(|i| self.pods[i] == Ready));
        assert!((0..desired).all(|i| !self.outdated[i]), "{self:?}");
        assert!(
            (desired..SLOTS).all(|i| self.pods[i] == NoPod && self.claims[i] == ClaimState::Absent)
        );
    }
}

impl World {
    /// `n` healthy voters whose Pods all run an outdated template.
    fn outdated(n: usize, durable: bool) -> Self {
        let mut w = Self::healthy(n);
        w.durable = durable;
        for i in 0..n {
            w.outdated[i] = true;
        }
        w
    }
}

/// The steps that replace a member whose Pod still exists with one on
/// empty data.
const REPLACED_ON_EMPTY_DATA: [&str; 6] = [
    "remove",
    "delete-pod",
    "delete-claim",
    "add",
    "start",
    "promote",
];

fn kinds(steps: &[Step]) -> Vec<&'static str> {
    steps.iter().map(Step::kind).collect()
}

#[test]
fn bootstrap_converges() {
    for desired in [1, 3] {
        let mut w = World::empty();
        assert_eq!(kinds(&w.converge(desired)), ["bootstrap"]);
    }
}

/// From a snapshot, one member bootstraps on its data and the others join
/// it as learners, one at a time: never two members restored apart.
#[test]
fn a_bootstrap_from_a_snapshot_starts_one_member_and_adds_the_others_as_learners() {
    let mut w = World::empty();
    w.from_snapshot = true;
    let steps = w.converge(3);
    assert_eq!(
        kinds(&steps),
        [
            "bootstrap",
            "add",
            "start",
            "promote",
            "add",
            "start",
            "promote"
        ]
    );
    let Step::Bootstrap { initial_cluster } = &steps[0] else {
        panic!("{steps:?}")
    };
    assert_eq!(
        initial_cluster
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["c-etcd-0"]
    );
    // A single member restores as it always did.
    let mut w = World::empty();
    w.from_snapshot = true;
    assert_eq!(kinds(&w.converge(1)), ["bootstrap"]);
}

/// The bootstrapping member's Pod lost before it ever answered (the
/// operator or its node restarted mid-restore): it is started again from
/// the snapshot, alone; the others still wait for it.
#[test]
fn a_bootstrap_from_a_snapshot_interrupted_starts_the_first_member_again() {
    let mut w = World::empty();
    w.from_snapshot = true;
    let first = w.plan(3);
    w.recorded = Some(first.clone());
    // Its Pod was made and is gone; its claim is there, half-filled.
    w.claims[0] = ClaimState::Present;
    assert_eq!(w.plan(3), first);
    // Its Pod is back and starting: nothing else happens until it serves.
    w.pods[0] = NotReady;
    assert!(is_wait(&w.plan(3), "bootstrapping"), "{:?}", w.plan(3));
}

#[test]
fn pod_and_claim_deleted_replace_sequence() {
    let mut w = World::healthy(3);
    w.pods[1] = NoPod;
    w.claims[1] = ClaimState::Absent;
    let steps = w.converge(3);
    assert_eq!(kinds(&steps), ["remove", "add", "start", "promote"]);
    // The member came back with a new ID.
    assert!(w.members.iter().all(|m| m.id != id_of(1)));
}

#[test]
fn failed_member_replace_sequence_wipes_its_data() {
    let mut w = World::healthy(3);
    w.pods[2] = Failed;
    let steps = w.converge(3);
    assert_eq!(kinds(&steps), REPLACED_ON_EMPTY_DATA);
}

#[test]
fn pod_deleted_restarts_on_its_data() {
    let mut w = World::healthy(3);
    w.pods[0] = NoPod;
    assert_eq!(kinds(&w.converge(3)), ["start"]);
    assert!(w.members.iter().any(|m| m.id == id_of(0)));
}

#[test]
fn scale_out_and_in_one_member_at_a_time() {
    let mut w = World::healthy(1);
    let out = w.converge(3);
    assert_eq!(
        kinds(&out),
        ["add", "start", "promote", "add", "start", "promote"]
    );
    let back = w.converge(1);
    assert_eq!(
        kinds(&back),
        [
            "remove",
            "delete-pod",
            "delete-claim",
            "remove",
            "delete-pod",
            "delete-claim"
        ]
    );
    assert!(matches!(back[0], Step::RemoveMember { index: Some(2), .. }));
}

#[test]
fn quorum_protection_blocks_until_a_voter_recovers() {
    let mut w = World::healthy(3);
    w.pods[1] = Failed;
    w.pods[2] = NotReady;
    // etcd still answers in this state only when reads are served by a
    // quorum; model it as reachable to check the planner itself.
    let slots: Vec<Slot> = (0..SLOTS)
        .map(|i| Slot::new(&names(), i, w.pods[i], w.claims[i]))
        .collect();
    let step = plan(&Observed {
        desired: 3,
        slots: &slots,
        live: Some(&w.members),
        recorded: None,
        data_outlives_pod: true,
        leader: None,
        from_snapshot: false,
    });
    assert!(is_wait(&step, "quorum"), "{step:?}");
    w.pods[2] = Ready;
    assert_eq!(kinds(&w.converge(3)), REPLACED_ON_EMPTY_DATA);
}

/// Crash before or after carrying out each step of the longest sequences:
/// the restarted planner, seeing only the record and the world, finishes
/// without the model catching a duplicate or a member on old data.
#[test]
fn crash_at_any_step_converges() {
    let scenarios: Vec<(&str, World, usize)> = vec![
        ("bootstrap", World::empty(), 3),
        (
            "replace failed",
            {
                let mut w = World::healthy(3);
                w.pods[2] = Failed;
                w
            },
            3,
        ),
        (
            "replace lost data",
            {
                let mut w = World::healthy(3);
                w.pods[0] = NoPod;
                w.claims[0] = ClaimState::Absent;
                w
            },
            3,
        ),
        ("scale out", World::healthy(1), 3),
        ("scale in", World::healthy(3), 1),
        ("roll", World::outdated(3, true), 3),
        ("roll without claims", World::outdated(3, false), 3),
        ("roll the only member", World::outdated(1, true), 1),
    ];
    for (name, world, desired) in scenarios {
        let full = world.clone().converge(desired);
        for crash_at in 0..full.len() {
            for applied in [false, true] {
                let mut w = world.clone();
                for step in &full[..crash_at] {
                    w.apply(step);
                }
                let step = w.plan(desired);
                assert_eq!(step, full[crash_at], "{name}: replay diverged");
                if applied {
                    w.apply(&step);
                } else {
                    // Recorded, then the process died before acting.
                    w.recorded = Some(step);
                }
                w.converge(desired);
                let adds = kinds(&full).iter().filter(|k| **k == "add").count();
                assert_eq!(w.added.len(), adds, "{name}: a member was added twice");
            }
        }
    }
}

#[test]
fn bootstrap_interrupted_part_way_resumes() {
    let mut w = World::empty();
    // Crash after creating only the first Pod of three.
    w.recorded = Some(w.plan(3));
    w.pods[0] = NotReady;
    w.claims[0] = ClaimState::Present;
    assert!(w.live().is_none());
    let step = w.plan(3);
    assert!(matches!(step, Step::Bootstrap { .. }), "{step:?}");
    w.pods[0] = Ready;
    assert_eq!(kinds(&w.converge(3)), ["bootstrap"]);
}

#[test]
fn outdated_members_roll_one_at_a_time_on_their_data() {
    let mut w = World::outdated(3, true);
    let steps = w.converge(3);
    assert_eq!(
        kinds(&steps),
        ["roll", "start", "roll", "start", "roll", "start"]
    );
    // Each restarted on its data, as the same member.
    assert_eq!(w.restarts, 3);
    assert!(w.added.is_empty());
    for (i, step) in steps.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        let Step::StartMember { index, state, .. } = step else {
            panic!("{step:?}")
        };
        assert_eq!(*index, i / 2);
        assert_eq!(*state, ClusterState::Existing);
    }
}

#[test]
fn the_leader_rolls_last() {
    for leader in 0..3 {
        let mut w = World::outdated(3, true);
        w.leader = Some(id_of(leader));
        let rolled: Vec<usize> = w
            .converge(3)
            .iter()
            .filter_map(|s| match s {
                Step::RollMember { index } => Some(*index),
                _ => None,
            })
            .collect();
        let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        assert_eq!(rolled, [others[0], others[1], leader], "leader {leader}");
    }
}

#[test]
fn a_roll_waits_while_another_voter_is_down() {
    let mut w = World::outdated(3, true);
    w.pods[1] = NotReady;
    let step = w.plan(3);
    assert!(is_wait(&step, "not ready"), "{step:?}");
    // Only the slots marked outdated roll.
    let mut w = World::healthy(3);
    w.outdated[2] = true;
    assert_eq!(kinds(&w.converge(3)), ["roll", "start"]);
}

#[test]
fn a_roll_waits_until_the_member_restarted_before_has_settled() {
    for durable in [true, false] {
        let mut w = World::outdated(3, durable);
        w.outdated[0] = false;
        w.settling[0] = true;
        let step = w.plan(3);
        assert!(
            is_wait(&step, "etcd-0 is ready again; its clients reconnect"),
            "{step:?}"
        );
        // The member to roll may itself be settling: only the others count.
        w.settling = vec![false, true, false];
        w.outdated = vec![false, true, false];
        assert_ne!(w.plan(3), Step::Done);
        assert!(!matches!(w.plan(3), Step::Wait { .. }), "{:?}", w.plan(3));
        w.settling[1] = false;
        w.outdated[2] = true;
        w.settling[0] = true;
        assert!(matches!(w.plan(3), Step::Wait { .. }));
        w.settling[0] = false;
        assert!(!matches!(w.plan(3), Step::Wait { .. }), "{:?}", w.plan(3));
    }
    // A cluster of one waits on nobody.
    let mut w = World::outdated(1, true);
    w.settling[0] = true;
    assert_eq!(w.plan(1), Step::RollMember { index: 0 });
}

#[test]
fn without_claims_rolling_replaces_and_never_restarts_the_only_member() {
    let mut w = World::outdated(3, false);
    let steps = kinds(&w.converge(3));
    assert_eq!(
        steps[..5],
        ["remove", "delete-pod", "add", "start", "promote"]
    );
    assert_eq!(w.added.len(), 3);
    let w = World::outdated(1, false);
    let step = w.plan(1);
    assert!(is_wait(&step, "only member"), "{step:?}");
}

#[test]
fn a_roll_interrupted_by_a_crash_restarts_the_member_even_without_a_quorum() {
    // The only member's Pod was deleted for a roll; etcd is unreachable.
    let mut w = World::outdated(1, true);
    let roll = w.plan(1);
    assert_eq!(roll, Step::RollMember { index: 0 });
    w.apply(&roll);
    assert!(w.live().is_none());
    let step = w.plan(1);
    assert!(
        matches!(
            step,
            Step::StartMember {
                index: 0,
                state: ClusterState::Existing,
                ..
            }
        ),
        "{step:?}"
    );
}

/// A member that fails on the version a roll gave it is left alone while
/// the others serve: neither removed (its data wiped) nor the roll carried
/// further. The same failure of a member a roll did not touch is replaced.
#[test]
fn a_member_failing_right_after_a_version_roll_is_not_replaced() {
    let v = [voter(0), voter(1), voter(2)];
    let states = [(Failed, ClaimState::Present), UP, UP];
    let plan_on = |s: &[Slot], live: &[Member], data_outlives_pod: bool| {
        plan(&Observed {
            desired: 3,
            slots: s,
            live: Some(live),
            recorded: None,
            data_outlives_pod,
            leader: None,
            from_snapshot: false,
        })
    };
    let observe = |rolled: bool, outdated: bool| {
        let mut s = slots(&states);
        s[0] = s[0].clone().rolled(rolled);
        for slot in &mut s[1..] {
            slot.outdated = outdated;
        }
        plan_on(&s, &v, true)
    };
    // Rolled, the two others still to roll: the roll stops there.
    let step = observe(true, true);
    let Step::RollFailed { index, reason } = &step else {
        panic!("{step:?}")
    };
    assert_eq!(*index, 0);
    assert!(reason.contains("c-etcd-0"), "{reason}");
    assert!(!step.is_change());
    // The version set back (its template changes again): restarted on its
    // data with the template wanted now.
    let mut s = slots(&states);
    s[0] = s[0].clone().rolled(true).outdated(true);
    assert_eq!(plan_on(&s, &v, true), Step::RollMember { index: 0 });
    // Not rolled: a failed member is replaced, as before.
    assert_eq!(
        observe(false, false),
        Step::RemoveMember {
            id: id_of(0),
            index: Some(0)
        }
    );
    // A learner added by a roll (data that goes with its Pod) that fails on
    // the new version is not removed and added back over and over.
    let l = [voter(1), voter(2), learner(0, true)];
    let mut s = slots(&states);
    s[0] = s[0].clone().rolled(true);
    let step = plan_on(&s, &l, false);
    assert!(
        matches!(step, Step::RollFailed { index: 0, .. }),
        "{step:?}"
    );
}

/// A meta worker's Machine deleted: its member's Pod was evicted, and its
/// data stays on a node that is gone (or cordoned). Started again it would
/// wait there forever; it is replaced on empty data elsewhere instead.
#[test]
fn a_member_whose_data_is_stranded_on_a_gone_node_is_replaced() {
    let mut w = World::healthy(3);
    w.pods[1] = NoPod;
    w.claims[1] = ClaimState::Stranded;
    assert!(matches!(
        w.plan(3),
        Step::RemoveMember { index: Some(1), .. }
    ));
    assert_eq!(
        kinds(&w.converge(3)),
        ["remove", "delete-claim", "add", "start", "promote"]
    );
    assert!(w.members.iter().all(|m| m.id != id_of(1)));

    // Its Pod was made again and waits, unschedulable, for the gone node.
    let mut w = World::healthy(3);
    w.pods[2] = NotReady;
    w.claims[2] = ClaimState::Stranded;
    assert_eq!(kinds(&w.converge(3)), REPLACED_ON_EMPTY_DATA);
}

#[test]
fn stranded_members_are_replaced_only_while_a_quorum_is_kept() {
    let v = [voter(0), voter(1), voter(2)];
    let stranded = (NoPod, ClaimState::Stranded);
    let step = plan_for(3, &[UP, stranded, stranded], Some(&v), None);
    assert!(is_wait(&step, "takes no more Pods"), "{step:?}");
    assert!(is_wait(&step, "short of a quorum"), "{step:?}");
    // The only member: replacing it would lose the cluster.
    let step = plan_for(1, &[stranded], Some(&v[..1]), None);
    assert!(is_wait(&step, "short of a quorum"), "{step:?}");
    // Unreachable etcd never restarts a member where its data cannot be.
    let step = plan_for(3, &[(NotReady, ClaimState::Present), stranded], None, None);
    assert!(is_wait(&step, "no etcd member answers"), "{step:?}");
}

#[test]
fn a_learner_whose_new_data_is_stranded_is_removed() {
    let live = [voter(0), voter(1), learner(2, false)];
    for pod in [NoPod, NotReady] {
        let step = plan_for(3, &[UP, UP, (pod, ClaimState::Stranded)], Some(&live), None);
        assert!(
            matches!(step, Step::RemoveMember { index: Some(2), .. }),
            "{step:?}"
        );
    }
}
