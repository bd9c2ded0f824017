//! Remediations for Node problems that kubelet and node-problem-detector
//! report as Node conditions: which condition gets which remedy (operator
//! flags), and the brakes that keep a fleet-wide fault from becoming a repair
//! storm — a cool-down per Machine and a cap on remediations running at once
//! across the cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kok_common::conditions::Status;

/// What to do about a Node condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// Restart a systemd unit, e.g. `containerd.service`.
    Restart(String),
    /// Run a shell command on the host, e.g. pruning images on disk pressure.
    Command(String),
    /// Install every package again and restart their services.
    Reprovision,
    /// Cordon the Node (and leave it to a person).
    Cordon,
}

impl Remedy {
    /// A short name for events and status.
    pub fn describe(&self) -> String {
        match self {
            Remedy::Restart(unit) => format!("restart {unit}"),
            Remedy::Command(_) => "run the cleanup command".into(),
            Remedy::Reprovision => "reprovision".into(),
            Remedy::Cordon => "cordon".into(),
        }
    }
}

/// One configured remediation: a Node condition type and its remedy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Node condition type, e.g. `KernelDeadlock` or `DiskPressure`.
    pub condition: String,
    pub remedy: Remedy,
}

/// Parses `CONDITION=restart:UNIT`, `CONDITION=command:SHELL`,
/// `CONDITION=reprovision` or `CONDITION=cordon`.
pub fn parse_rule(text: &str) -> Result<Rule, String> {
    let (condition, remedy) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected CONDITION=REMEDY"))?;
    let condition = condition.trim();
    if condition.is_empty() || condition == "Ready" {
        return Err(format!(
            "{text:?}: name a problem condition other than Ready"
        ));
    }
    let remedy = match remedy.split_once(':') {
        Some(("restart", unit)) if !unit.is_empty() => Remedy::Restart(unit.to_string()),
        Some(("command", cmd)) if !cmd.is_empty() => Remedy::Command(cmd.to_string()),
        None if remedy == "reprovision" => Remedy::Reprovision,
        None if remedy == "cordon" => Remedy::Cordon,
        _ => {
            return Err(format!(
                "{text:?}: remedy must be restart:UNIT, command:SHELL, reprovision or cordon"
            ));
        }
    };
    Ok(Rule {
        condition: condition.to_string(),
        remedy,
    })
}

/// The first rule whose condition is `True` on `node`. kubelet's pressure
/// conditions and node-problem-detector's problem conditions are both "True
/// means a problem".
pub fn due<'a>(rules: &'a [Rule], node: &Node) -> Option<&'a Rule> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    rules.iter().find(|rule| {
        conditions
            .iter()
            .any(|c| c.type_ == rule.condition && c.status == Status::True)
    })
}

/// Remediation bookkeeping shared by every reconcile.
#[derive(Clone, Debug)]
pub struct Remediations {
    /// Configured rules, in the order given.
    pub rules: Vec<Rule>,
    cooldown: Duration,
    max_concurrent: usize,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    last: BTreeMap<String, Instant>,
    running: BTreeSet<String>,
}

/// A running remediation; dropping it frees its slot.
#[derive(Debug)]
pub struct Slot {
    state: Arc<Mutex<State>>,
    machine: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.state).running.remove(&self.machine);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a remediation may not start now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The Machine was remedied less than the cool-down ago; retry after this.
    CoolingDown(Duration),
    /// As many remediations as allowed run elsewhere.
    AtCap(usize),
}

impl Remediations {
    pub fn new(rules: Vec<Rule>, cooldown: Duration, max_concurrent: usize) -> Self {
        Self {
            rules,
            cooldown,
            max_concurrent: max_concurrent.max(1),
            state: Arc::default(),
        }
    }

    /// Starts a remediation of `machine` at `now` if its cool-down has passed
    /// and the cluster-wide cap leaves room.
    pub fn try_start(&self, machine: &str, now: Instant) -> Result<Slot, Refusal> {
        let mut state = lock(&self.state);
        if let Some(last) = state.last.get(machine) {
            let since = now.saturating_duration_since(*last);
            if since < self.cooldown {
                return Err(Refusal::CoolingDown(self.cooldown - since));
            }
        }
        if !state.running.contains(machine) && state.running.len() >= self.max_concurrent {
            return Err(Refusal::AtCap(self.max_concurrent));
        }
        state.running.insert(machine.to_string());
        state.last.insert(machine.to_string(), now);
        Ok(Slot {
            state: Arc::clone(&self.state),
            machine: machine.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    #[test]
    fn rules_parse() {
        assert_eq!(
            parse_rule("KernelDeadlock=reprovision").unwrap().remedy,
            Remedy::Reprovision
        );
        assert_eq!(
            parse_rule("DiskPressure=command:crictl rmi --prune")
                .unwrap()
                .remedy,
            Remedy::Command("crictl rmi --prune".into())
        );
        assert_eq!(
            parse_rule("ContainerRuntimeUnhealthy=restart:containerd.service")
                .unwrap()
                .remedy,
            Remedy::Restart("containerd.service".into())
        );
        assert!(parse_rule("Ready=cordon").is_err());
        assert!(parse_rule("X=reboot").is_err());
        assert!(parse_rule("X").is_err());
    }

    #[test]
    fn the_first_true_condition_with_a_rule_is_due() {
        let rules = vec![
            parse_rule("KernelDeadlock=reprovision").unwrap(),
            parse_rule("DiskPressure=cordon").unwrap(),
        ];
        let node = |conds: &[(&str, &str)]| Node {
            status: Some(NodeStatus {
                conditions: Some(
                    conds
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            due(
                &rules,
                &node(&[("DiskPressure", "True"), ("KernelDeadlock", "False")])
            )
            .map(|r| r.condition.as_str()),
            Some("DiskPressure")
        );
        assert!(due(&rules, &node(&[("DiskPressure", "False")])).is_none());
    }

    #[test]
    fn cool_down_and_cap_hold_back_remediations() {
        let r = Remediations::new(Vec::new(), Duration::from_secs(60), 1);
        let t0 = Instant::now();
        let a = r.try_start("a", t0).unwrap();
        assert_eq!(r.try_start("b", t0).unwrap_err(), Refusal::AtCap(1));
        drop(a);
        let _b = r.try_start("b", t0).unwrap();
        assert!(matches!(
            r.try_start("a", t0 + Duration::from_secs(10)),
            Err(Refusal::CoolingDown(d)) if d == Duration::from_secs(50)
        ));
    }
}
