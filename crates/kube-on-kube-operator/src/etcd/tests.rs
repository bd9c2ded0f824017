//! The pure parts of the etcd step: how Pods, claims and members' answers
//! are read, and what EtcdReady and `settled` say.

use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::config::ETCD_FAILED_AFTER;
use crate::versions::{Resolved, etcd_image, etcd_version};

fn names() -> Names {
    Names {
        cluster: "c".into(),
        namespace: "ns".into(),
        meta_domain: "cluster.local".into(),
    }
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn pod(name: &str, ready: bool, restarts: i32, since: i64) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.creation_timestamp = Some(Time(at(0)));
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            last_transition_time: Some(Time(at(since))),
            ..Default::default()
        }]),
        container_statuses: Some(vec![ContainerStatus {
            name: "etcd".into(),
            restart_count: restarts,
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

#[test]
fn pods_are_read_as_the_planner_needs() {
    let now = at(10_000);
    let after = ETCD_FAILED_AFTER;
    let state = |p: Option<&Pod>| pod_state(p, now, after);
    assert_eq!(state(None), PodState::Absent);
    assert_eq!(state(Some(&pod("a", true, 0, 0))), PodState::Ready);
    // A killed process the Pod runs again: not ready for a moment only.
    assert_eq!(state(Some(&pod("a", false, 1, 9_990))), PodState::NotReady);
    // Crash-looping but only recently: still given time.
    assert_eq!(state(Some(&pod("a", false, 9, 9_990))), PodState::NotReady);
    // Crash-looping for the failure threshold: replaced; a second less: not.
    let long_ago = 10_000 - after.as_secs() as i64;
    let crashing = |since| pod("a", false, FAILED_RESTARTS, since);
    assert_eq!(state(Some(&crashing(long_ago))), PodState::Failed);
    assert_eq!(state(Some(&crashing(long_ago + 1))), PodState::NotReady);
    // One restart fewer: not failed, however long.
    let fewer = pod("a", false, FAILED_RESTARTS - 1, 0);
    assert_eq!(state(Some(&fewer)), PodState::NotReady);
    // The threshold is the operator's to set.
    let short = Duration::from_secs(30);
    let crashed_for = |secs: i64| pod_state(Some(&crashing(10_000 - secs)), now, short);
    assert_eq!(crashed_for(30), PodState::Failed);
    assert_eq!(crashed_for(29), PodState::NotReady);
    // Not ready for long without restarting (waiting for peers): not failed.
    assert_eq!(state(Some(&pod("a", false, 0, 0))), PodState::NotReady);
    let mut going = pod("a", true, 0, 0);
    going.metadata.deletion_timestamp = Some(Time(at(1)));
    assert_eq!(state(Some(&going)), PodState::Terminating);
    assert!(!pod_ready(&going));
    let mut dead = pod("a", false, 0, 0);
    dead.status.as_mut().unwrap().phase = Some("Failed".into());
    assert_eq!(state(Some(&dead)), PodState::Failed);
    // Ready but finished: failed, not ready.
    let mut done = pod("a", true, 0, 0);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(state(Some(&done)), PodState::Failed);
    assert!(!pod_ready(&done));
}

#[test]
fn a_member_settles_for_a_while_after_it_turns_ready() {
    let now = at(10_000);
    let settle = ROLL_SETTLE.as_secs() as i64;
    assert!(settling(Some(&pod("a", true, 0, 10_000 - settle + 1)), now));
    assert!(!settling(Some(&pod("a", true, 0, 10_000 - settle)), now));
    // Not ready, or ready at an unknown time: nothing to settle.
    assert!(!settling(Some(&pod("a", false, 0, 9_999)), now));
    assert!(!settling(None, now));
    let mut unknown = pod("a", true, 0, 0);
    unknown
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .last_transition_time = None;
    assert!(!settling(Some(&unknown), now));
    // The planner's slots carry it.
    let ready_now = pod(&names().etcd_member(0), true, 0, 9_999);
    let views = [SlotView {
        pod: Some(&ready_now),
        ..Default::default()
    }];
    assert!(slots(&names(), &views, false, now, ETCD_FAILED_AFTER)[0].settling);
}

#[test]
fn the_leader_is_the_one_most_answers_follow() {
    let follows = |leaders: &[u64]| -> BTreeMap<u64, Status> {
        leaders
            .iter()
            .enumerate()
            .map(|(i, &leader)| {
                (
                    i as u64 + 1,
                    Status {
                        member_id: i as u64 + 1,
                        leader,
                        version: "3.6.16".into(),
                        is_learner: false,
                        raft_index: 0,
                        raft_applied_index: 0,
                        revision: 0,
                        errors: vec![],
                    },
                )
            })
            .collect()
    };
    assert_eq!(leader(&follows(&[2, 2, 2])), Some(2));
    // A member that lost its leader, or still follows the old one.
    assert_eq!(leader(&follows(&[3, 0, 3])), Some(3));
    assert_eq!(leader(&follows(&[1, 3, 3])), Some(3));
    assert_eq!(leader(&follows(&[0, 0])), None);
    assert_eq!(leader(&BTreeMap::new()), None);
}

#[test]
fn data_without_claims_lives_as_long_as_the_pod() {
    use ClaimState::*;
    assert_eq!(claim_state(false, None, PodState::Ready), Present);
    assert_eq!(claim_state(false, None, PodState::Terminating), Present);
    assert_eq!(claim_state(false, None, PodState::Absent), Absent);
    let mut claim = PersistentVolumeClaim::default();
    assert_eq!(claim_state(true, None, PodState::Ready), Absent);
    assert_eq!(claim_state(true, Some(&claim), PodState::Absent), Present);
    claim.metadata.deletion_timestamp = Some(Time(at(1)));
    assert_eq!(
        claim_state(true, Some(&claim), PodState::Ready),
        Terminating
    );
}

#[test]
fn a_pod_with_another_hash_is_outdated() {
    let n = names();
    let mut current = pod("c-etcd-0", true, 0, 0);
    current.metadata.annotations =
        Some([(CONFIG_HASH_ANNOTATION.to_string(), "new".to_string())].into());
    let mut old = pod("c-etcd-1", true, 0, 0);
    old.metadata.annotations =
        Some([(CONFIG_HASH_ANNOTATION.to_string(), "old".to_string())].into());
    let views = [
        SlotView {
            pod: Some(&current),
            claim: None,
            hash: "new".into(),
            ..Default::default()
        },
        SlotView {
            pod: Some(&old),
            claim: None,
            hash: "new".into(),
            ..Default::default()
        },
        SlotView {
            pod: None,
            claim: None,
            hash: "new".into(),
            ..Default::default()
        },
    ];
    let s = slots(&n, &views, false, at(10), ETCD_FAILED_AFTER);
    assert_eq!(
        s.iter().map(|s| s.outdated).collect::<Vec<_>>(),
        [false, true, false]
    );
    assert_eq!(s[1].name, "c-etcd-1");
    assert_eq!(s[2].claim, ClaimState::Absent);
    assert_eq!(s[2].pod, PodState::Absent);
}

fn member(index: usize, id: u64, learner: bool, started: bool) -> Member {
    let n = names();
    let name = n.etcd_member(index);
    Member {
        id,
        name: if started { name.clone() } else { String::new() },
        peer_urls: vec![n.etcd_peer_url(&name)],
        client_urls: vec![n.etcd_client_url(&name)],
        is_learner: learner,
    }
}

fn answer(id: u64, version: &str) -> Status {
    Status {
        member_id: id,
        leader: 1,
        version: version.into(),
        is_learner: false,
        raft_index: 10,
        raft_applied_index: 10,
        revision: 10,
        errors: vec![],
    }
}

fn three_slots() -> Vec<Slot> {
    (0..3)
        .map(|i| Slot::new(&names(), i, PodState::Ready, ClaimState::Present))
        .collect()
}

#[test]
fn member_statuses_name_every_member_and_its_health() {
    let live = [
        member(0, 0xa, false, true),
        member(1, 0xb, false, true),
        member(2, 0xc, true, false),
    ];
    let answers: BTreeMap<u64, Status> = [(0xa, answer(0xa, "3.6.16"))].into_iter().collect();
    let s = member_statuses(&three_slots(), &live, &answers);
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].name, "c-etcd-0");
    assert_eq!(s[0].id.as_deref(), Some("a"));
    assert!(s[0].healthy && !s[0].learner);
    assert!(!s[1].healthy, "no answer is not healthy");
    // A learner that has not started yet is named after its slot.
    assert_eq!(s[2].name, "c-etcd-2");
    assert!(s[2].learner);
    assert_eq!(s[2].peer_url, "https://c-etcd-2.ns.svc.cluster.local:2380");
}

#[test]
fn the_running_version_is_the_one_every_healthy_member_reports() {
    let mut answers: BTreeMap<u64, Status> = [(1, answer(1, "3.6.15")), (2, answer(2, "3.6.15"))]
        .into_iter()
        .collect();
    assert_eq!(running_version(&answers).as_deref(), Some("3.6.15"));
    answers.insert(3, answer(3, "3.6.16"));
    assert_eq!(running_version(&answers), None);
    // A member without a leader does not count.
    answers.get_mut(&3).unwrap().leader = 0;
    assert_eq!(running_version(&answers).as_deref(), Some("3.6.15"));
    assert_eq!(running_version(&BTreeMap::new()), None);
}

fn statuses(healthy: &[bool], learner_at: Option<usize>) -> Vec<EtcdMemberStatus> {
    healthy
        .iter()
        .enumerate()
        .map(|(i, h)| EtcdMemberStatus {
            name: format!("m{i}"),
            id: Some(format!("{i:x}")),
            peer_url: format!("https://m{i}:2380"),
            healthy: *h,
            learner: learner_at == Some(i),
        })
        .collect()
}

#[test]
fn etcd_ready_and_settled() {
    let all = statuses(&[true, true, true], None);
    let (h, settled) = health(3, &Step::Done, &all, Some("3.6.16"), "3.6.16");
    assert!(h.ready && settled, "{h:?}");
    assert_eq!(h.reason, "MembersHealthy");
    // Healthy, but still at the old version: ready, not settled.
    let (h, settled) = health(3, &Step::Done, &all, Some("3.6.15"), "3.6.16");
    assert!(h.ready && !settled, "{h:?}");
    // Rolling: quorum serves, so ready, and not settled.
    let (h, settled) = health(3, &Step::RollMember { index: 1 }, &all, None, "3.6.16");
    assert!(h.ready && !settled);
    assert_eq!(h.reason, "Upgrading");
    // A learner being added: not settled, says so.
    let with_learner = statuses(&[true, true, true], Some(2));
    let (h, settled) = health(
        3,
        &Step::Promote { id: 2, index: 2 },
        &with_learner,
        Some("3.6.16"),
        "3.6.16",
    );
    assert!(!settled);
    assert_eq!(h.reason, "MembershipChanging");
    // Lost quorum: not ready.
    let (h, settled) = health(
        3,
        &Step::Wait {
            reason: "quorum".into(),
        },
        &statuses(&[true, false, false], None),
        Some("3.6.16"),
        "3.6.16",
    );
    assert!(!h.ready && !settled, "{h:?}");
    assert!(h.message.contains("1 of 3"), "{}", h.message);
    // Too few members for the mode: not settled even when all are healthy.
    let (_, settled) = health(
        3,
        &Step::Done,
        &statuses(&[true], None),
        Some("3.6.16"),
        "3.6.16",
    );
    assert!(!settled);
}

#[test]
fn unreachable_etcd_is_judged_by_its_pods() {
    let mut s = three_slots();
    let (h, settled, ready) = health_from_pods(3, &Step::Done, &s);
    assert!(h.ready && settled);
    assert_eq!(ready, 3);
    s[1] = s[1].clone().outdated(true);
    let (_, settled, _) = health_from_pods(3, &Step::Done, &s);
    assert!(!settled);
    s[2].pod = PodState::NotReady;
    let (h, _, ready) = health_from_pods(3, &Step::Done, &s);
    assert!(!h.ready);
    assert_eq!(ready, 2);
    // A surplus member Pod beyond the mode.
    let (h, settled, _) = health_from_pods(1, &Step::Done, &three_slots());
    assert!(!h.ready && !settled);
}

#[test]
fn the_report_decides_settled() {
    let report = Report {
        members: vec![],
        desired: 1,
        ready: 1,
        version: Some("3.6.16".into()),
        condition: Health {
            ready: true,
            reason: "MembersHealthy",
            message: String::new(),
        },
        spread: Health {
            ready: true,
            reason: "SingleMember",
            message: String::new(),
        },
        settled: true,
        pods: vec![],
        requeue: None,
    };
    assert!(settled(&report));
    assert!(!settled(&Report {
        settled: false,
        ..report
    }));
}

#[test]
fn images_follow_the_version_unless_given() {
    let mut c: Cluster =
        serde_norway::from_str(include_str!("../../../../examples/cluster-minimal.yaml"))
            .expect("example");
    let config = Config::default();
    c.spec.etcd.component.version = Some("3.6.15".into());
    c.spec.etcd.component.image = None;
    assert_eq!(etcd_version(&c, &config), "3.6.15");
    assert_eq!(etcd_image(&c, &config), "registry.k8s.io/etcd:3.6.15-0");
    c.spec.etcd.component.image = Some("mirror/etcd:x".into());
    assert_eq!(etcd_image(&c, &config), "mirror/etcd:x");
    c.spec.etcd.component.version = None;
    assert_eq!(etcd_version(&c, &config), config.etcd_version);
}

/// A hostPath member pinned to its node keeps its data past its Pod, as a
/// claim's member does; one never pinned (its Pod never scheduled) does not.
#[test]
fn a_pinned_host_path_member_keeps_its_data_without_its_pod() {
    let n = names();
    let views = [
        SlotView {
            pinned: true,
            ..Default::default()
        },
        SlotView::default(),
    ];
    let s = slots(&n, &views, false, at(10), ETCD_FAILED_AFTER);
    assert_eq!(s[0].claim, ClaimState::Present);
    assert_eq!(s[1].claim, ClaimState::Absent);
}

/// Where a hostPath member's Pod keeps its data: a member added to the
/// running cluster never reuses a directory (a removed member's data stays
/// where it was); a member that ran before goes back to its node and
/// directory; a new cluster's members use the first directory.
#[test]
fn host_path_members_start_on_their_own_data_or_on_a_fresh_directory() {
    let n = names();
    let slot = membership::Slot::new(&n, 1, PodState::Absent, ClaimState::Present);
    let member = |name: &str| Member {
        id: 0xabc,
        name: name.into(),
        peer_urls: vec![slot.peer_url.clone()],
        client_urls: vec![],
        is_learner: true,
    };
    let pinned = render::Pin {
        node: Some("node-b".into()),
        data_dir: "data".into(),
    };
    // Just added (it has no name yet): a directory of its own, any node,
    // even though the slot's previous member left a pin.
    let added = [member("")];
    assert_eq!(
        start_pin(Some(&added), &slot, Some(&pinned)),
        render::Pin {
            node: None,
            data_dir: "member-abc".into()
        }
    );
    // Started before: back to its node and directory, with or without a
    // member list.
    let started = [member("c-etcd-1")];
    assert_eq!(start_pin(Some(&started), &slot, Some(&pinned)), pinned);
    assert_eq!(start_pin(None, &slot, Some(&pinned)), pinned);
    assert_eq!(
        start_pin(None, &slot, None).data_dir,
        render::FIRST_DATA_DIR
    );
}

#[test]
fn a_pod_running_another_version_than_the_settled_one_was_rolled() {
    let mut p = pod("c-etcd-0", false, 6, 0);
    p.metadata.annotations =
        Some([(render::VERSION_ANNOTATION.to_string(), "3.6.16".to_string())].into());
    assert!(rolled(Some(&p), Some("3.6.15")));
    assert!(!rolled(Some(&p), Some("3.6.16")));
    // Before etcd ever settled, nothing was rolled.
    assert!(!rolled(Some(&p), None));
    assert!(!rolled(None, Some("3.6.15")));
}

/// A version change that skips or goes back a minor version leaves the
/// members on the version and image they run.
#[test]
fn a_refused_etcd_version_keeps_what_the_members_run() {
    let config = Config::default();
    let mut c: Cluster =
        serde_norway::from_str(include_str!("../../../../examples/cluster-production.yaml"))
            .expect("example");
    let mut running = pod("c-etcd-0", true, 0, 0);
    running.metadata.annotations =
        Some([(render::VERSION_ANNOTATION.to_string(), "3.5.21".to_string())].into());
    running.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        containers: vec![k8s_openapi::api::core::v1::Container {
            name: "etcd".into(),
            image: Some("mirror.example/etcd:3.5.21-0".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let pods = [running];
    for (to, refused) in [
        ("3.7.1", true),   // skips 3.6
        ("3.4.9", true),   // downgrade
        ("3.6.16", false), // next minor
        ("3.5.10", false), // patch downgrade: same data format
    ] {
        c.spec.etcd.component.version = Some(to.into());
        let t = target(&Resolved::of(&c, &config), &config, Some("3.5.21"), &pods);
        assert_eq!(t.refused.is_some(), refused, "{to}: {t:?}");
        if refused {
            assert_eq!(t.version, "3.5.21");
            assert_eq!(t.image, "mirror.example/etcd:3.5.21-0");
        } else {
            assert_eq!(t.version, to);
            assert_eq!(t.image, format!("registry.k8s.io/etcd:{to}-0"));
        }
    }
    // Nothing settled yet: whatever the Cluster asks.
    c.spec.etcd.component.version = Some("3.7.1".into());
    assert!(
        target(&Resolved::of(&c, &config), &config, None, &pods)
            .refused
            .is_none()
    );
}

#[test]
fn a_member_the_scheduler_cannot_place_is_named_with_its_reason() {
    let pod = |name: &str, scheduled: &str, reason: Option<&str>| {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: scheduled.into(),
                reason: reason.map(str::to_string),
                message: Some(format!(
                    "0/3 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules{}",
                    "x".repeat(400)
                )),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    };
    assert_eq!(unschedulable(&[pod("c-etcd-1", "True", None)]), None);
    let why = unschedulable(&[
        pod("c-etcd-1", "True", None),
        pod("c-etcd-0", "False", Some("Unschedulable")),
    ])
    .expect("a Pod that cannot be scheduled");
    assert!(
        why.starts_with(
            "Pod c-etcd-0 cannot be scheduled: 0/3 nodes are available: 2 node(s) didn't satisfy"
        ),
        "{why}"
    );
    assert!(why.len() < 400, "{}", why.len());
}
