//! `metav1.Condition` bookkeeping: a condition's `lastTransitionTime` moves only
//! when its status changes, so users can tell how long something has been true.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The status of a condition (of any kind: a Cluster's, a Pod's, a Node's),
/// typed: the API carries it as the string `True`, `False` or `Unknown`.
/// A `String` from the API compares with it directly
/// (`condition.status == Status::True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    /// The string the API carries.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(holds: bool) -> Self {
        if holds { Status::True } else { Status::False }
    }
}

impl From<Status> for String {
    fn from(status: Status) -> Self {
        status.as_str().to_string()
    }
}

impl PartialEq<Status> for String {
    fn eq(&self, status: &Status) -> bool {
        self == status.as_str()
    }
}

impl PartialEq<Status> for str {
    fn eq(&self, status: &Status) -> bool {
        self == status.as_str()
    }
}

/// A condition as a controller computes it, before timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired<'a> {
    /// Condition type, for example `Ready`.
    pub type_: &'a str,
    pub status: Status,
    /// CamelCase reason.
    pub reason: &'a str,
    /// Human-readable detail.
    pub message: String,
}

/// Insert or update `desired` in `conditions`. The transition time is `now` when
/// the condition is new or its status changed, and kept otherwise.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: Desired<'_>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let existing = conditions.iter_mut().find(|c| c.type_ == desired.type_);
    let transition = match &existing {
        Some(c) if c.status == desired.status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: desired.type_.to_string(),
        status: desired.status.into(),
        reason: desired.reason.to_string(),
        message: desired.message,
        observed_generation: generation,
        last_transition_time: transition,
    };
    match existing {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == Status::True)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid timestamp")
    }

    fn ready(status: Status) -> Desired<'static> {
        Desired {
            type_: "Ready",
            status,
            reason: "Test",
            message: format!("is {}", status.as_str()),
        }
    }

    #[test]
    fn new_condition_gets_now() {
        let mut c = Vec::new();
        set(&mut c, ready(Status::False), Some(1), ts(10));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, Time(ts(10)));
        assert_eq!(c[0].observed_generation, Some(1));
    }

    #[test]
    fn same_status_keeps_transition_time() {
        let mut c = Vec::new();
        set(&mut c, ready(Status::False), Some(1), ts(10));
        set(&mut c, ready(Status::False), Some(2), ts(20));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, Time(ts(10)));
        assert_eq!(c[0].observed_generation, Some(2));
    }

    #[test]
    fn changed_status_moves_transition_time() {
        let mut c = Vec::new();
        set(&mut c, ready(Status::False), Some(1), ts(10));
        set(&mut c, ready(Status::True), Some(1), ts(30));
        assert_eq!(c[0].last_transition_time, Time(ts(30)));
        assert!(is_true(&c, "Ready"));
        assert_eq!(c[0].status, "True", "as the API carries it");
        assert!(!is_true(&c, "EtcdReady"));
    }
}
