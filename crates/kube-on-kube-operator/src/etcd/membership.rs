//! Deciding the one next change to a cluster's etcd membership from what is
//! observed (etcd's member list, the members' Pods and claims) and the step
//! recorded before the last change, so that a crash at any point converges
//! without duplicate, orphaned or recycled members.
//!
//! Pure: the caller observes, records the returned step, then carries it out.

use serde::{Deserialize, Serialize};

use crate::etcd::api::Member;
use crate::names::Names;

/// The flag values a member plan hands to its Pod, defined where the Pod is
/// rendered.
pub use crate::render::etcd::{ClusterState, Peer, initial_cluster_flag};

/// A member's Pod as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Absent,
    /// Running but not (yet) ready: starting or catching up.
    NotReady,
    Ready,
    /// Being deleted.
    Terminating,
    /// The caller judged it failed for good (crash-looping, not ready for
    /// too long): the member is replaced.
    Failed,
}

/// A member's data volume claim as observed. Members on a volume source
/// that is not a claim report `Present`: their data lives as long as they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    Absent,
    Present,
    Terminating,
    /// Present, but kept on a node that is gone or no longer takes the
    /// Cluster's Pods (`etcd::stranded`): the member cannot start on it
    /// again, so it counts as lost, and the claim (or a hostPath member's
    /// pin) is cleared for a fresh member elsewhere.
    Stranded,
}

/// One member position (index), whether wanted or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub peer_url: String,
    pub pod: PodState,
    pub claim: ClaimState,
    /// The Pod runs another image or configuration than the one wanted now
    /// (a new etcd version, renewed certificates): it is restarted on its
    /// data, one member at a time.
    pub outdated: bool,
    /// Ready only moments ago. etcd's clients (kube-apiserver) retry a
    /// member they lost with a growing backoff, so they may not be connected
    /// to it again yet: restarting another member now could leave them none
    /// to talk to, although etcd keeps its quorum.
    pub settling: bool,
    /// The Pod runs another etcd version than the one every member ran when
    /// etcd last settled: it was restarted by a version roll that is not
    /// over. Such a member that fails is not replaced: the roll stops.
    pub rolled: bool,
}

impl Slot {
    /// Slot `index` of the cluster `names` describes.
    pub fn new(names: &Names, index: usize, pod: PodState, claim: ClaimState) -> Self {
        let name = names.etcd_member(index);
        Self {
            peer_url: names.etcd_peer_url(&name),
            name,
            pod,
            claim,
            outdated: false,
            settling: false,
            rolled: false,
        }
    }

    /// The same slot, with its Pod marked as running an outdated template.
    pub fn outdated(mut self, outdated: bool) -> Self {
        self.outdated = outdated;
        self
    }

    /// The same slot, with its Pod marked as restarted by an unfinished
    /// version roll.
    pub fn rolled(mut self, rolled: bool) -> Self {
        self.rolled = rolled;
        self
    }

    /// The same slot, with its Pod marked as ready only moments ago.
    pub fn settling(mut self, settling: bool) -> Self {
        self.settling = settling;
        self
    }
}

/// The one next thing to do. Every variant but `Wait` and `Done` is a change,
/// recorded before it is carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "step",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Step {
    /// No member exists anywhere: create every wanted member's Pod (and
    /// claim) that does not exist yet, with state `new` and this cluster.
    Bootstrap {
        initial_cluster: Vec<Peer>,
    },
    /// Add the member at `index` as a learner, by its peer URL.
    AddLearner {
        index: usize,
    },
    /// Create the Pod (and a fresh claim when there is none) of the member at
    /// `index`.
    StartMember {
        index: usize,
        initial_cluster: Vec<Peer>,
        state: ClusterState,
    },
    /// Promote the learner `id` (at `index`) once etcd agrees it caught up.
    Promote {
        id: u64,
        index: usize,
    },
    /// Remove member `id`; `index` is `None` for a member no slot owns.
    RemoveMember {
        id: u64,
        index: Option<usize>,
    },
    DeletePod {
        index: usize,
    },
    /// Delete the claim, so a member added back starts from empty data.
    DeleteClaim {
        index: usize,
    },
    /// Delete the outdated Pod of the member at `index`, which stays a
    /// member: it is started again on its data with the current template.
    RollMember {
        index: usize,
    },
    Wait {
        reason: String,
    },
    /// The member at `index` failed after a version roll restarted it. It
    /// is left on its data, unreplaced, and the roll goes no further: the
    /// new version is the likely cause, and a fresh member on it would fail
    /// the same way after costing the failed member's copy of the data.
    RollFailed {
        index: usize,
        reason: String,
    },
    Done,
}

impl Step {
    /// Whether this step changes something (and so must be recorded first).
    pub fn is_change(&self) -> bool {
        !matches!(
            self,
            Step::Wait { .. } | Step::RollFailed { .. } | Step::Done
        )
    }

    /// Short static name, for logs, events and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Bootstrap { .. } => "bootstrap",
            Step::AddLearner { .. } => "add",
            Step::StartMember { .. } => "start",
            Step::Promote { .. } => "promote",
            Step::RemoveMember { .. } => "remove",
            Step::DeletePod { .. } => "delete-pod",
            Step::DeleteClaim { .. } => "delete-claim",
            Step::RollMember { .. } => "roll",
            Step::Wait { .. } => "wait",
            Step::RollFailed { .. } => "roll-failed",
            Step::Done => "done",
        }
    }
}

/// Everything the planner looks at.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// How many members are wanted (1 or 3): slots `0..desired`.
    pub desired: usize,
    /// Every slot that is wanted or may still hold something, by index.
    pub slots: &'a [Slot],
    /// etcd's member list, `None` when no endpoint answered.
    pub live: Option<&'a [Member]>,
    /// The last change recorded, cleared when a plan says `Done`.
    pub recorded: Option<&'a Step>,
    /// Whether a member's data survives its Pod (a claim). Without a claim
    /// a deleted Pod takes its data along, so rolling a member replaces it.
    pub data_outlives_pod: bool,
    /// The member ID the members that answered follow as their leader.
    pub leader: Option<u64>,
    /// The members start from a snapshot (a restore, or a rebuild after the
    /// quorum was lost): only the first bootstraps, on the snapshot's data;
    /// the others join it as learners on empty data and copy it from the
    /// leader, so no member's data is made apart from the cluster's.
    pub from_snapshot: bool,
}

fn wait(reason: impl Into<String>) -> Step {
    Step::Wait {
        reason: reason.into(),
    }
}

/// The one next step.
pub fn plan(o: &Observed<'_>) -> Step {
    match o.live {
        None => plan_unreachable(o),
        Some(live) => plan_live(o, live),
    }
}

fn wanted(o: &Observed<'_>) -> usize {
    o.desired.min(o.slots.len())
}

/// How many members the bootstrap starts: every wanted one, or only the
/// first when it starts from a snapshot.
fn bootstrapped(o: &Observed<'_>) -> usize {
    if o.from_snapshot {
        wanted(o).min(1)
    } else {
        wanted(o)
    }
}

fn bootstrap(o: &Observed<'_>) -> Step {
    Step::Bootstrap {
        initial_cluster: o.slots[..bootstrapped(o)]
            .iter()
            .map(|s| Peer {
                name: s.name.clone(),
                peer_url: s.peer_url.clone(),
            })
            .collect(),
    }
}

/// Without a member list only two things are safe: creating a brand-new
/// cluster, and restarting members on their own data until a quorum is back.
fn plan_unreachable(o: &Observed<'_>) -> Step {
    let nothing_exists = o
        .slots
        .iter()
        .all(|s| s.pod == PodState::Absent && s.claim == ClaimState::Absent);
    // A bootstrap interrupted half-way has no quorum yet; only the record
    // tells it apart from a cluster that lost its members.
    if nothing_exists || matches!(o.recorded, Some(Step::Bootstrap { .. })) {
        if o.slots[..bootstrapped(o)]
            .iter()
            .any(|s| s.pod == PodState::Absent && s.claim != ClaimState::Terminating)
        {
            return bootstrap(o);
        }
        return wait("etcd is bootstrapping");
    }
    // Restart a member on its own data: it still belongs to the cluster, and
    // the flags are ignored when the data directory exists.
    let with_data: Vec<Peer> = o
        .slots
        .iter()
        .filter(|s| s.claim == ClaimState::Present)
        .map(|s| Peer {
            name: s.name.clone(),
            peer_url: s.peer_url.clone(),
        })
        .collect();
    // The slot of a member being removed or wiped holds data etcd no longer
    // wants; starting it would only bring a removed member back.
    let being_cleared = match o.recorded {
        Some(Step::RemoveMember { index, .. }) => *index,
        Some(Step::DeletePod { index } | Step::DeleteClaim { index }) => Some(*index),
        _ => None,
    };
    if let Some(index) = o.slots.iter().enumerate().position(|(i, s)| {
        s.pod == PodState::Absent && s.claim == ClaimState::Present && being_cleared != Some(i)
    }) {
        return Step::StartMember {
            index,
            initial_cluster: with_data,
            state: ClusterState::Existing,
        };
    }
    wait("no etcd member answers")
}

/// What is known about one live member.
struct LiveMember<'a> {
    member: &'a Member,
    slot: Option<usize>,
}

impl LiveMember<'_> {
    fn ready(&self, o: &Observed<'_>) -> bool {
        self.slot.is_some_and(|i| o.slots[i].pod == PodState::Ready)
    }
    /// A member that never started has not published its name yet.
    fn started(&self) -> bool {
        !self.member.name.is_empty()
    }
}

/// The slot a live member belongs to: identity is the peer URL, never the
/// member ID, which changes every time a member is added back.
fn slot_of(o: &Observed<'_>, member: &Member) -> Option<usize> {
    o.slots
        .iter()
        .position(|s| member.peer_urls.contains(&s.peer_url))
}

fn plan_live(o: &Observed<'_>, live: &[Member]) -> Step {
    let members: Vec<LiveMember<'_>> = live
        .iter()
        .map(|member| LiveMember {
            member,
            slot: slot_of(o, member),
        })
        .collect();
    let in_list = |index: usize| members.iter().find(|m| m.slot == Some(index));
    let wanted = wanted(o);

    // 1. Finish a learner first: nothing else changes while one exists.
    if let Some(learner) = members.iter().find(|m| m.member.is_learner) {
        return finish_learner(o, live, &members, learner, wanted);
    }

    // 2. Restart members that lost only their Pod, and clear what remains
    //    of members etcd no longer has, before any new change.
    for (index, slot) in o.slots.iter().enumerate() {
        match in_list(index) {
            Some(m) if slot.pod == PodState::Absent => match slot.claim {
                ClaimState::Terminating => {
                    return wait(format!("claim of {} is being deleted", slot.name));
                }
                ClaimState::Present => return start_member(o, live, index),
                // Never started: its claim is created with its Pod.
                ClaimState::Absent if !m.started() => return start_member(o, live, index),
                // Started and lost its data, or it can never start where its
                // data is: replaced below.
                ClaimState::Absent | ClaimState::Stranded => {}
            },
            Some(_) => {}
            None => {
                if let Some(step) = clear_leftovers(index, slot) {
                    return step;
                }
            }
        }
    }

    // 3. Replace voters that failed or lost their data; not one that failed
    //    on the version a roll just gave it.
    for m in &members {
        let Some(index) = m.slot else { continue };
        let slot = &o.slots[index];
        let stranded = slot.claim == ClaimState::Stranded;
        let lost_data = stranded || m.started() && slot.claim != ClaimState::Present;
        if slot.pod == PodState::Failed && slot.rolled && !lost_data {
            // Once the template changed again (the version set back), it is
            // restarted on its data with it; until then it is left alone.
            if slot.outdated && o.data_outlives_pod {
                return Step::RollMember { index };
            }
            return roll_failed(index, slot);
        }
        if slot.pod == PodState::Failed || lost_data {
            let why = if stranded {
                "keeps its data on a node that is gone or takes no more Pods"
            } else if lost_data {
                "lost its data"
            } else {
                "failed"
            };
            return remove(o, &members, m, &format!("member {} {why}", slot.name));
        }
    }

    // 4. Nothing new while a voter is not serving.
    if let Some(m) = members.iter().find(|m| m.slot.is_some() && !m.ready(o)) {
        let name = m.slot.map(|i| o.slots[i].name.as_str()).unwrap_or("?");
        return wait(format!("member {name} is not ready"));
    }

    // 5. Scale in, and drop members no slot owns, highest index first.
    let surplus = members
        .iter()
        .filter(|m| m.slot.is_none_or(|i| i >= wanted))
        .max_by_key(|m| m.slot.map_or(usize::MAX, |i| i));
    if let Some(m) = surplus {
        let what = match m.slot {
            Some(i) => format!("scaling in: member {}", o.slots[i].name),
            None => format!("member {:x} belongs to no slot", m.member.id),
        };
        return remove(o, &members, m, &what);
    }

    // 6. Scale out (or re-add a removed member) one learner at a time.
    if let Some(index) = (0..wanted).find(|&i| in_list(i).is_none()) {
        return Step::AddLearner { index };
    }

    // 7. Roll outdated members, one at a time, only while every voter
    // serves; the leader last, so that leadership moves once, not with
    // every restart.
    if let Some(m) = members
        .iter()
        .filter(|m| m.slot.is_some_and(|i| o.slots[i].outdated))
        .min_by_key(|m| o.leader == Some(m.member.id))
    {
        return roll(o, &members, m);
    }
    Step::Done
}

/// Restart `target` (a ready voter of a wanted slot, every voter serving)
/// with the current template.
fn roll(o: &Observed<'_>, members: &[LiveMember<'_>], target: &LiveMember<'_>) -> Step {
    let Some(index) = target.slot else {
        return wait("an outdated member belongs to no slot");
    };
    let name = &o.slots[index].name;
    let voters = members.iter().filter(|m| !m.member.is_learner).count();
    // Rolling takes a member away from its clients; the one rolled before
    // it must be back in their hands first.
    if let Some(back) = members
        .iter()
        .filter(|m| m.member.id != target.member.id)
        .filter_map(|m| m.slot)
        .find(|&i| o.slots[i].settling)
    {
        return wait(format!(
            "{} is ready again; its clients reconnect before {name} restarts",
            o.slots[back].name
        ));
    }
    if !o.data_outlives_pod {
        if voters == 1 {
            return wait(format!(
                "{name} is the only member and its data does not outlive its Pod: restarting it would lose the cluster"
            ));
        }
        // Its data goes with its Pod: replace it as a member that lost its data.
        return remove(o, members, target, &format!("rolling {name}"));
    }
    // A single member cannot keep a quorum through its own restart; a
    // cluster of one has accepted that. Otherwise the others must make one.
    let others_ready = members
        .iter()
        .filter(|m| !m.member.is_learner && m.member.id != target.member.id && m.ready(o))
        .count();
    if voters > 1 && others_ready < voters / 2 + 1 {
        return wait(format!(
            "rolling {name} would leave {others_ready} of {voters} voters serving, short of a quorum"
        ));
    }
    Step::RollMember { index }
}

/// Leftover Pod or claim of slot `index`, which etcd does not list: a
/// removed member's, or one never added. Deleted so the member can never
/// come back on its old data.
fn clear_leftovers(index: usize, slot: &Slot) -> Option<Step> {
    match (slot.pod, slot.claim) {
        (PodState::Terminating, _) => Some(wait(format!("pod of {} is terminating", slot.name))),
        (PodState::Absent, ClaimState::Absent) => None,
        (PodState::Absent, ClaimState::Terminating) => {
            Some(wait(format!("claim of {} is being deleted", slot.name)))
        }
        (PodState::Absent, ClaimState::Present | ClaimState::Stranded) => {
            Some(Step::DeleteClaim { index })
        }
        _ => Some(Step::DeletePod { index }),
    }
}

fn finish_learner(
    o: &Observed<'_>,
    live: &[Member],
    members: &[LiveMember<'_>],
    learner: &LiveMember<'_>,
    wanted: usize,
) -> Step {
    let id = learner.member.id;
    let Some(index) = learner.slot.filter(|&i| i < wanted) else {
        return remove(o, members, learner, "learner is not wanted");
    };
    let slot = &o.slots[index];
    match (slot.pod, slot.claim) {
        (PodState::Terminating, ClaimState::Stranded) => {
            wait(format!("learner {} is terminating", slot.name))
        }
        (_, ClaimState::Stranded) => remove(
            o,
            members,
            learner,
            "learner's data is on a node that is gone or takes no more Pods",
        ),
        (PodState::Absent, ClaimState::Terminating) => {
            wait(format!("claim of {} is being deleted", slot.name))
        }
        (PodState::Absent, ClaimState::Absent) if learner.started() => {
            remove(o, members, learner, "learner lost its data")
        }
        // A claim of a learner can only be the fresh one made to start it.
        (PodState::Absent, _) => start_member(o, live, index),
        (PodState::Ready, _) => Step::Promote { id, index },
        (PodState::Failed, _) if slot.rolled => roll_failed(index, slot),
        (PodState::Failed, _) => remove(o, members, learner, "learner failed"),
        (PodState::NotReady | PodState::Terminating, _) => {
            wait(format!("learner {} is catching up", slot.name))
        }
    }
}

fn roll_failed(index: usize, slot: &Slot) -> Step {
    Step::RollFailed {
        index,
        reason: format!(
            "member {} keeps failing since a version roll restarted it; the roll stops and the member is left on its data, not replaced",
            slot.name
        ),
    }
}

fn start_member(o: &Observed<'_>, live: &[Member], index: usize) -> Step {
    let initial_cluster = live
        .iter()
        .flat_map(|m| {
            let slot = slot_of(o, m).map(|i| &o.slots[i]);
            // Members not started yet have no name; the slot knows it.
            let name = match (m.name.is_empty(), slot) {
                (true, Some(s)) => s.name.clone(),
                _ => m.name.clone(),
            };
            m.peer_urls.iter().map(move |u| Peer {
                name: name.clone(),
                peer_url: u.clone(),
            })
        })
        .collect();
    Step::StartMember {
        index,
        initial_cluster,
        state: ClusterState::Existing,
    }
}

/// Remove `target` if the voters left behind that are healthy still make a
/// quorum of the smaller cluster; otherwise wait and say why.
fn remove(
    o: &Observed<'_>,
    members: &[LiveMember<'_>],
    target: &LiveMember<'_>,
    why: &str,
) -> Step {
    let step = Step::RemoveMember {
        id: target.member.id,
        index: target.slot,
    };
    if target.member.is_learner {
        return step;
    }
    let remaining: Vec<_> = members
        .iter()
        .filter(|m| !m.member.is_learner && m.member.id != target.member.id)
        .collect();
    let healthy = remaining.iter().filter(|m| m.ready(o)).count();
    let quorum = remaining.len() / 2 + 1;
    if remaining.is_empty() || healthy < quorum {
        return wait(format!(
            "{why}, but removing it would leave {healthy} healthy of {} voters, short of a quorum of {quorum}",
            remaining.len()
        ));
    }
    step
}

#[cfg(test)]
mod tests;
