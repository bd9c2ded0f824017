//! The node-operator's domain metrics, registered into the process's metrics
//! (`kok_common::metrics`): how long each step on a host took, and Machines
//! by phase.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use kok_common::metrics::{Labels, Metrics};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn ssh_buckets() -> Histogram {
    // 10 ms .. ~5.5 min: a `test -f` up to a large download.
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

/// Machine phases always present in `kok_machines` (0 when none).
const KNOWN_PHASES: [&str; 7] = [
    "Pending",
    "Provisioning",
    "Ready",
    "Upgrading",
    "Repairing",
    "Failed",
    "Deleting",
];

/// The node-operator's metrics.
pub struct Domain {
    ssh_step_duration: HistogramFamily,
    machines: Family<Labels, Gauge>,
}

impl Domain {
    /// The metrics, registered into `metrics`.
    pub fn new(metrics: &Metrics) -> Domain {
        let ssh_step_duration = HistogramFamily::new_with_constructor(ssh_buckets);
        metrics.register(
            "ssh_step_duration_seconds",
            "Time one step on a host over SSH took, by step and result",
            ssh_step_duration.clone(),
        );
        let machines = Family::<Labels, Gauge>::default();
        metrics.register("machines", "Machines by phase", machines.clone());
        Domain {
            ssh_step_duration,
            machines,
        }
    }

    /// Record one step run on a host over SSH.
    pub fn observe_ssh_step(&self, step: &str, ok: bool, took: Duration) {
        self.ssh_step_duration
            .get_or_create(&vec![
                ("step", step.to_string()),
                ("result", if ok { "success" } else { "error" }.to_string()),
            ])
            .observe(took.as_secs_f64());
    }

    /// Replace the Machines-by-phase counts; phases absent from `counts`
    /// report 0 so a phase that empties does not keep its last value.
    pub fn set_machines_by_phase<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        let counts: Vec<(&str, i64)> = counts.into_iter().collect();
        for phase in KNOWN_PHASES {
            if !counts.iter().any(|(p, _)| *p == phase) {
                self.machines
                    .get_or_create(&vec![("phase", phase.to_string())])
                    .set(0);
            }
        }
        for (phase, n) in counts {
            self.machines
                .get_or_create(&vec![("phase", phase.to_string())])
                .set(n);
        }
    }
}

/// The process's node-operator metrics, registered into its metrics on
/// first use (`main` asks for them at start).
pub fn domain() -> &'static Domain {
    static DOMAIN: OnceLock<Domain> = OnceLock::new();
    DOMAIN.get_or_init(|| Domain::new(kok_common::metrics::global()))
}

/// Keep `kok_machines` up to date from a cache of Machines: every 10 s,
/// count them by `phase` (no phase yet counts as Pending).
pub fn count_by_phase<K>(store: kube::runtime::reflector::Store<K>, phase: fn(&K) -> Option<String>)
where
    K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        if !kok_common::health::wait_until_ready(&store).await {
            return;
        }
        loop {
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for object in store.state() {
                let p = phase(&object).unwrap_or_else(|| "Pending".to_string());
                *counts.entry(p).or_default() += 1;
            }
            domain().set_machines_by_phase(counts.iter().map(|(p, n)| (p.as_str(), *n)));
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_by_phase_report_every_known_phase() {
        let metrics = Metrics::new();
        let m = Domain::new(&metrics);
        m.set_machines_by_phase([("Ready", 3)]);
        let text = metrics.encode();
        assert!(text.contains("kok_machines{phase=\"Ready\"} 3"), "{text}");
        assert!(text.contains("kok_machines{phase=\"Failed\"} 0"), "{text}");
        m.observe_ssh_step("install", true, Duration::from_millis(20));
        assert!(metrics.encode().contains(
            "kok_ssh_step_duration_seconds_count{step=\"install\",result=\"success\"} 1"
        ));
    }
}
