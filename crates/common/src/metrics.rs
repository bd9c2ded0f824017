//! The Prometheus metrics both operators publish on `/metrics`: reconcile
//! counts, failures by category, durations and in-flight reconciles for every
//! controller, leadership, watch events and API requests. One registry per
//! process, reachable from anywhere with [`global`], so a reconciler can
//! record a value without threading a handle through every function; each
//! operator registers its own domain metrics into it ([`Metrics::register`]).

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::registry::Metric;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set of a series: `(name, value)` pairs in a fixed order.
pub type Labels = Vec<(&'static str, String)>;

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Every metric of the process.
pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    duration: HistogramFamily,
    in_flight: Family<Labels, Gauge>,
    leading: Family<Labels, Gauge>,
    watch_events: Family<Labels, Counter>,
    api_requests: Family<Labels, Counter>,
}

fn reconcile_buckets() -> Histogram {
    // 5 ms .. ~82 s: a no-op reconcile up to a slow SSH install.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (prefix `kok_`).
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kok");
        let reconciles = Family::<Labels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles run, by controller",
            reconciles.clone(),
        );
        let failures = Family::<Labels, Counter>::default();
        registry.register(
            "reconcile_failures",
            "Reconciles that returned an error, by controller and error category",
            failures.clone(),
        );
        let duration = HistogramFamily::new_with_constructor(reconcile_buckets);
        registry.register(
            "reconcile_duration_seconds",
            "Time one reconcile took, by controller",
            duration.clone(),
        );
        let in_flight = Family::<Labels, Gauge>::default();
        registry.register(
            "reconciles_in_flight",
            "Reconciles running right now, by controller (the work queue being drained)",
            in_flight.clone(),
        );
        let leading = Family::<Labels, Gauge>::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader-election Lease (and runs the controllers), else 0",
            leading.clone(),
        );
        let watch_events = Family::<Labels, Counter>::default();
        registry.register(
            "watch_events",
            "Watch events of owned objects, by kind and whether they woke a reconcile (woke=false: nothing the reconcile reads changed)",
            watch_events.clone(),
        );
        let api_requests = Family::<Labels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests the process sent to its own cluster's API server, by HTTP method (WATCH: watch requests)",
            api_requests.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            reconciles,
            failures,
            duration,
            in_flight,
            leading,
            watch_events,
            api_requests,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Add an operator's own metric (named without the `kok_` prefix, which
    /// the registry adds). Handles of a metric share its values, so the
    /// caller keeps a clone to record into.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry().register(name, help, metric);
    }

    /// Add a collector: metrics computed when scraped.
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry().register_collector(collector);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry());
        out
    }

    /// Count one watch event of an owned object of `kind`, and whether it was
    /// passed on to wake a reconcile.
    pub fn watch_event(&self, kind: &str, woke: bool) {
        let labels = vec![("kind", kind.to_string()), ("woke", woke.to_string())];
        self.watch_events.get_or_create(&labels).inc();
    }

    /// Count one request to the API server (`method`: its HTTP method, or
    /// WATCH).
    pub fn api_request(&self, method: &str) {
        self.api_requests
            .get_or_create(&vec![("method", method.to_string())])
            .inc();
    }

    /// Mark the start of one reconcile of `controller`; the returned guard
    /// records its outcome with [`Reconcile::finish`] (a dropped guard, as when
    /// the reconcile is cancelled at shutdown, only ends the in-flight count).
    pub fn reconcile(&'static self, controller: &'static str) -> Reconcile {
        let labels = vec![("controller", controller.to_string())];
        self.in_flight.get_or_create(&labels).inc();
        Reconcile {
            metrics: self,
            labels,
            started: Instant::now(),
        }
    }

    /// Set whether this replica leads for `lease`.
    pub fn set_leading(&self, lease: &str, leading: bool) {
        self.leading
            .get_or_create(&vec![("lease", lease.to_string())])
            .set(i64::from(leading));
    }
}

/// One reconcile being timed; see [`Metrics::reconcile`].
pub struct Reconcile {
    metrics: &'static Metrics,
    labels: Labels,
    started: Instant,
}

impl Reconcile {
    /// Record the outcome: `Err(category)` for a failure.
    pub fn finish(self, outcome: Result<(), &'static str>) {
        let m = self.metrics;
        m.reconciles.get_or_create(&self.labels).inc();
        m.duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
        if let Err(category) = outcome {
            let mut labels = self.labels.clone();
            labels.push(("category", category.to_string()));
            m.failures.get_or_create(&labels).inc();
        }
    }
}

impl Drop for Reconcile {
    fn drop(&mut self) {
        self.metrics.in_flight.get_or_create(&self.labels).dec();
    }
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_outcomes_count() {
        let m: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        m.reconcile("cluster").finish(Ok(()));
        m.reconcile("cluster").finish(Err("kube"));
        let running = m.reconcile("cluster");
        let text = m.encode();
        assert!(
            text.contains("kok_reconciles_total{controller=\"cluster\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "kok_reconcile_failures_total{controller=\"cluster\",category=\"kube\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("kok_reconcile_duration_seconds_count{controller=\"cluster\"} 2"));
        assert!(
            text.contains("kok_reconciles_in_flight{controller=\"cluster\"} 1"),
            "{text}"
        );
        drop(running);
        assert!(
            m.encode()
                .contains("kok_reconciles_in_flight{controller=\"cluster\"} 0")
        );
    }
}
