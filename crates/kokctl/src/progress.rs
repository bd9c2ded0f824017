//! Progress of a wait, worked out from successive observations: which
//! conditions turned True (or stopped being True) since the last look, and on
//! timeout which ones hold the object back. Pure, so it is tested with plain
//! inputs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Remembers the status of every condition seen so far.
#[derive(Debug, Default)]
pub struct Conditions {
    seen: BTreeMap<String, String>,
}

/// A change worth a progress line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The condition became True.
    BecameTrue(String),
    /// The condition was True and no longer is; with its reason and message.
    Lost {
        type_: String,
        reason: String,
        message: String,
    },
}

impl Conditions {
    /// Record `conditions` and return what changed, in the order they are
    /// listed. Conditions seen False for the first time are not changes.
    pub fn update(&mut self, conditions: &[Condition]) -> Vec<Change> {
        let mut changes = Vec::new();
        for c in conditions {
            let before = self.seen.insert(c.type_.clone(), c.status.clone());
            let was_true = before.as_deref() == Some("True");
            let is_true = c.status == "True";
            if is_true && !was_true {
                changes.push(Change::BecameTrue(c.type_.clone()));
            } else if was_true && !is_true {
                changes.push(Change::Lost {
                    type_: c.type_.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                });
            }
        }
        changes
    }
}

/// `[  12.3s] ` prefix of a progress line.
pub fn stamp(elapsed: Duration) -> String {
    format!("[{:>6.1}s]", elapsed.as_secs_f64())
}

/// One progress line for `change`.
pub fn line(elapsed: Duration, change: &Change) -> String {
    match change {
        Change::BecameTrue(t) => format!("{} {t} is True", stamp(elapsed)),
        Change::Lost {
            type_,
            reason,
            message,
        } => format!(
            "{} {type_} is no longer True ({reason}): {message}",
            stamp(elapsed)
        ),
    }
}

/// Why an object is not ready: every condition that is not True, with its
/// reason and message, one per line. Empty when all are True.
pub fn failing(conditions: &[Condition]) -> String {
    let mut out = String::new();
    for c in conditions.iter().filter(|c| c.status != "True") {
        let _ = writeln!(
            out,
            "  {}={} ({}): {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    out
}

/// `Type=Status Reason: message`, as a wait shows a condition that holds it.
pub fn condition_text(c: &Condition) -> String {
    format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)
}

/// What holds a Cluster back from Ready: the first condition, in the order
/// the operator lists them, that is not True, leaving out the summaries
/// (`Ready` says that something else is not; `Progressing` True is work
/// under way, not a hold-up).
pub fn holding(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .filter(|c| c.type_ != "Ready" && c.type_ != "Progressing")
        .find(|c| c.status != "True")
}

/// Remembers the hold-up shown last, so a wait prints it only as it changes.
#[derive(Debug, Default)]
pub struct Holding {
    shown: Option<String>,
}

impl Holding {
    /// The line to print for `conditions` if their hold-up is not the one
    /// shown last.
    pub fn update(&mut self, elapsed: Duration, conditions: &[Condition]) -> Option<String> {
        let now = holding(conditions).map(condition_text);
        if now.is_none() || now == self.shown {
            return None;
        }
        self.shown = now.clone();
        now.map(|text| format!("{} waiting on {text}", stamp(elapsed)))
    }
}

/// Count objects by kind for a progress line: `3 Pods, 1 Service`.
pub fn remaining(counts: &BTreeMap<&'static str, usize>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(kind, n)| format!("{n} {kind}{}", if *n == 1 { "" } else { "s" }))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn c(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: format!("{type_}{status}"),
            message: format!("{type_} says {status}"),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn reports_each_condition_once_as_it_turns_true() {
        let mut seen = Conditions::default();
        assert_eq!(
            seen.update(&[c("EtcdReady", "False"), c("Ready", "False")]),
            vec![]
        );
        assert_eq!(
            seen.update(&[c("EtcdReady", "True"), c("Ready", "False")]),
            vec![Change::BecameTrue("EtcdReady".into())]
        );
        assert_eq!(
            seen.update(&[c("EtcdReady", "True"), c("Ready", "False")]),
            vec![]
        );
        assert_eq!(
            seen.update(&[c("EtcdReady", "False"), c("Ready", "True")]),
            vec![
                Change::Lost {
                    type_: "EtcdReady".into(),
                    reason: "EtcdReadyFalse".into(),
                    message: "EtcdReady says False".into()
                },
                Change::BecameTrue("Ready".into())
            ]
        );
    }

    #[test]
    fn true_at_first_sight_is_reported() {
        let mut seen = Conditions::default();
        assert_eq!(
            seen.update(&[c("CertificatesReady", "True")]),
            vec![Change::BecameTrue("CertificatesReady".into())]
        );
    }

    #[test]
    fn lines_carry_the_elapsed_time() {
        assert_eq!(
            line(
                Duration::from_millis(12_340),
                &Change::BecameTrue("EtcdReady".into())
            ),
            "[  12.3s] EtcdReady is True"
        );
    }

    #[test]
    fn failing_lists_only_conditions_that_are_not_true() {
        let out = failing(&[
            c("EtcdReady", "True"),
            c("AddonsReady", "False"),
            c("Ready", "Unknown"),
        ]);
        assert_eq!(
            out,
            "  AddonsReady=False (AddonsReadyFalse): AddonsReady says False\n  Ready=Unknown (ReadyUnknown): Ready says Unknown\n"
        );
    }

    #[test]
    fn a_wait_shows_what_holds_it_each_time_that_changes() {
        let mut held = Holding::default();
        let t = Duration::from_secs(3);
        let mut etcd = c("EtcdReady", "False");
        etcd.reason = "Bootstrapping".into();
        etcd.message = "creating 3 etcd members".into();
        let ready = c("Ready", "False");
        let progressing = c("Progressing", "True");
        assert_eq!(
            held.update(t, &[ready.clone(), progressing.clone(), etcd.clone()]),
            Some(
                "[   3.0s] waiting on EtcdReady=False Bootstrapping: creating 3 etcd members"
                    .into()
            )
        );
        // The same hold-up again is not repeated.
        assert_eq!(held.update(t, &[ready.clone(), etcd.clone()]), None);
        // The next one is shown as the first clears.
        let addons = c("AddonsReady", "False");
        assert_eq!(
            held.update(t, &[c("EtcdReady", "True"), addons.clone(), ready.clone()]),
            Some(
                "[   3.0s] waiting on AddonsReady=False AddonsReadyFalse: AddonsReady says False"
                    .into()
            )
        );
        // Only the summaries are not True: nothing to show.
        assert_eq!(
            held.update(t, &[c("AddonsReady", "True"), ready, progressing]),
            None
        );
    }

    #[test]
    fn remaining_counts_skip_zero_and_pluralise() {
        let counts = [("Pod", 3), ("Secret", 0), ("Service", 1)].into();
        assert_eq!(remaining(&counts), "3 Pods, 1 Service");
        assert_eq!(remaining(&BTreeMap::new()), "none");
    }
}
