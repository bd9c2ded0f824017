//! The Prometheus metrics both operators publish on `/metrics`: reconcile
//! counts, failures by category, durations and in-flight reconciles for every
//! controller, leadership, and the domain metrics the operators set
//! (certificate expiry, etcd member health, SSH step durations, Machines by
//! phase). One registry per process, reachable from anywhere with [`global`],
//! so a reconciler can record a value without threading a handle through
//! every function.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

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
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    duration: HistogramFamily,
    in_flight: Family<Labels, Gauge>,
    leading: Family<Labels, Gauge>,
    certificate_expiry: Arc<CertificateExpiry>,
    etcd_member_healthy: Family<Labels, Gauge>,
    ssh_step_duration: HistogramFamily,
    machines: Family<Labels, Gauge>,
    watch_events: Family<Labels, Counter>,
    addon_attempts: Family<Labels, Counter>,
    api_requests: Family<Labels, Counter>,
    /// Label sets of the per-cluster series, so a cluster's stale ones can be removed.
    etcd_series: Mutex<BTreeSet<Labels>>,
}

fn reconcile_buckets() -> Histogram {
    // 5 ms .. ~82 s: a no-op reconcile up to a slow SSH install.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn ssh_buckets() -> Histogram {
    // 10 ms .. ~5.5 min: a `test -f` up to a large download.
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
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
        let certificate_expiry = Arc::new(CertificateExpiry::default());
        registry.register_collector(Box::new(certificate_expiry.clone()));
        let etcd_member_healthy = Family::<Labels, Gauge>::default();
        registry.register(
            "etcd_member_healthy",
            "1 when a business-cluster etcd member answers as healthy, else 0",
            etcd_member_healthy.clone(),
        );
        let ssh_step_duration = HistogramFamily::new_with_constructor(ssh_buckets);
        registry.register(
            "ssh_step_duration_seconds",
            "Time one step on a host over SSH took, by step and result",
            ssh_step_duration.clone(),
        );
        let machines = Family::<Labels, Gauge>::default();
        registry.register("machines", "Machines by phase", machines.clone());
        let watch_events = Family::<Labels, Counter>::default();
        registry.register(
            "watch_events",
            "Watch events of owned objects, by kind and whether they woke a reconcile (woke=false: nothing the reconcile reads changed)",
            watch_events.clone(),
        );
        let addon_attempts = Family::<Labels, Counter>::default();
        registry.register(
            "addon_attempts",
            "Attempts of a Cluster's add-on step, by whether they ran alone (pass=alone: a retry while nothing else of the Cluster changed) or in a full reconcile (pass=full)",
            addon_attempts.clone(),
        );
        let api_requests = Family::<Labels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests the process sent to its own cluster's API server, by HTTP method (WATCH: watch requests)",
            api_requests.clone(),
        );
        Metrics {
            registry,
            reconciles,
            failures,
            duration,
            in_flight,
            leading,
            certificate_expiry,
            etcd_member_healthy,
            ssh_step_duration,
            machines,
            watch_events,
            addon_attempts,
            api_requests,
            etcd_series: Mutex::default(),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
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

    /// Count one attempt of a Cluster's add-on step, alone or in a full pass.
    pub fn addon_attempt(&self, alone: bool) {
        let pass = if alone { "alone" } else { "full" };
        self.addon_attempts
            .get_or_create(&vec![("pass", pass.to_string())])
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

    /// Replace the certificates of one Cluster reported in
    /// `kok_certificate_expiry_seconds`: for each Secret holding a
    /// certificate, its notAfter in seconds since the Unix epoch. The metric
    /// is the time left at scrape time (negative once expired), so it stays
    /// true between reconciles. Secrets not listed stop being reported.
    pub fn set_certificates<'a>(
        &self,
        namespace: &str,
        cluster: &str,
        not_after: impl IntoIterator<Item = (&'a str, i64)>,
    ) {
        let mut map = self.certificate_expiry.lock();
        let stale: Vec<Labels> = series_of_cluster(&map, namespace, cluster);
        for labels in stale {
            map.remove(&labels);
        }
        for (secret, at) in not_after {
            map.insert(cluster_labels(namespace, cluster, "secret", secret), at);
        }
    }

    /// Replace the etcd member health series of one Cluster: for each member
    /// (by name), whether it answers as healthy.
    pub fn set_etcd_members<'a>(
        &self,
        namespace: &str,
        cluster: &str,
        members: impl IntoIterator<Item = (&'a str, bool)>,
    ) {
        let series: Vec<(Labels, bool)> = members
            .into_iter()
            .map(|(member, ok)| (cluster_labels(namespace, cluster, "member", member), ok))
            .collect();
        let keep: BTreeSet<Labels> = series.iter().map(|(l, _)| l.clone()).collect();
        self.replace_cluster_series(
            &self.etcd_member_healthy,
            &self.etcd_series,
            namespace,
            cluster,
            keep,
        );
        for (labels, ok) in series {
            self.etcd_member_healthy
                .get_or_create(&labels)
                .set(i64::from(ok));
        }
    }

    /// Drop every per-cluster series of a Cluster that is gone.
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        self.certificate_expiry
            .lock()
            .retain(|labels, _| !of_cluster(labels, namespace, cluster));
        self.replace_cluster_series(
            &self.etcd_member_healthy,
            &self.etcd_series,
            namespace,
            cluster,
            BTreeSet::new(),
        );
    }

    /// Drop the per-cluster series of every Cluster not in `live`
    /// (`(namespace, name)` pairs).
    pub fn retain_clusters(&self, live: &BTreeSet<(String, String)>) {
        let mut gone = BTreeSet::new();
        let key = |labels: &Labels| match (labels.first(), labels.get(1)) {
            (Some(("namespace", ns)), Some(("cluster", name))) => Some((ns.clone(), name.clone())),
            _ => None,
        };
        for labels in self.certificate_expiry.lock().keys() {
            gone.extend(key(labels));
        }
        for labels in self
            .etcd_series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            gone.extend(key(labels));
        }
        for (ns, name) in gone.difference(live) {
            self.forget_cluster(ns, name);
        }
    }

    /// Remove the series of `namespace/cluster` in `family` that are not in
    /// `keep`, and remember `keep` as the cluster's series. A `Family` cannot
    /// be listed, so the label sets are tracked beside it.
    fn replace_cluster_series<M, C>(
        &self,
        family: &Family<Labels, M, C>,
        known: &Mutex<BTreeSet<Labels>>,
        namespace: &str,
        cluster: &str,
        keep: BTreeSet<Labels>,
    ) where
        C: prometheus_client::metrics::family::MetricConstructor<M>,
    {
        let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<Labels> = known
            .range(cluster_labels_prefix(namespace, cluster)..)
            .take_while(|l| of_cluster(l, namespace, cluster))
            .filter(|l| !keep.contains(*l))
            .cloned()
            .collect();
        for labels in stale {
            family.remove(&labels);
            known.remove(&labels);
        }
        known.extend(keep);
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

/// The two leading labels of a Cluster's series. Sorted, its series follow
/// them and one another: one Cluster's series are found without going
/// through every Cluster's (a reconcile replaces them every time).
fn cluster_labels_prefix(namespace: &str, cluster: &str) -> Labels {
    vec![
        ("namespace", namespace.to_string()),
        ("cluster", cluster.to_string()),
    ]
}

/// The label sets of one Cluster's series in `map`.
fn series_of_cluster<V>(map: &BTreeMap<Labels, V>, namespace: &str, cluster: &str) -> Vec<Labels> {
    map.range(cluster_labels_prefix(namespace, cluster)..)
        .map(|(labels, _)| labels)
        .take_while(|labels| of_cluster(labels, namespace, cluster))
        .cloned()
        .collect()
}

fn of_cluster(labels: &Labels, namespace: &str, cluster: &str) -> bool {
    matches!((labels.first(), labels.get(1)),
        (Some(("namespace", ns)), Some(("cluster", name))) if ns == namespace && name == cluster)
}

/// `kok_certificate_expiry_seconds`, computed from each certificate's
/// notAfter when scraped.
#[derive(Debug, Default)]
struct CertificateExpiry {
    not_after: Mutex<BTreeMap<Labels, i64>>,
}

impl CertificateExpiry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Labels, i64>> {
        self.not_after.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for CertificateExpiry {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let map = self.lock();
        let mut family = encoder.encode_descriptor(
            "certificate_expiry_seconds",
            "Seconds until a business-cluster certificate's notAfter (negative once expired), by namespace, cluster and Secret",
            None,
            MetricType::Gauge,
        )?;
        for (labels, at) in map.iter() {
            #[allow(clippy::cast_precision_loss)]
            let left = *at as f64 - now;
            ConstGauge::new(left).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

fn cluster_labels(namespace: &str, cluster: &str, key: &'static str, value: &str) -> Labels {
    vec![
        ("namespace", namespace.to_string()),
        ("cluster", cluster.to_string()),
        (key, value.to_string()),
    ]
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

/// Keep `kok_machines` up to date from a cache of Machines: every 10 s,
/// count them by `phase` (no phase yet counts as Pending).
pub fn count_by_phase<K>(store: kube::runtime::reflector::Store<K>, phase: fn(&K) -> Option<String>)
where
    K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        if !crate::health::wait_until_ready(&store).await {
            return;
        }
        loop {
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for object in store.state() {
                let p = phase(&object).unwrap_or_else(|| "Pending".to_string());
                *counts.entry(p).or_default() += 1;
            }
            global().set_machines_by_phase(counts.iter().map(|(p, n)| (p.as_str(), *n)));
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    });
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn certificate_expiry_is_time_left_at_scrape_and_stale_series_go() {
        let m = Metrics::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        m.set_certificates(
            "ns",
            "c1",
            [("c1-apiserver-tls", now + 3600), ("c1-ca", now - 10)],
        );
        m.set_certificates("ns", "c2", [("c2-apiserver-tls", now + 60)]);
        let text = m.encode();
        let c1 = series(
            &text,
            "kok_certificate_expiry_seconds{namespace=\"ns\",cluster=\"c1\"",
        );
        assert_eq!(c1.len(), 2, "{text}");
        let left: f64 = c1
            .iter()
            .find(|l| l.contains("c1-apiserver-tls"))
            .and_then(|l| l.rsplit_once(' '))
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        assert!((3590.0..=3600.0).contains(&left), "{left}");
        assert!(
            c1.iter().any(|l| l.contains("c1-ca") && l.contains(" -")),
            "{c1:?}"
        );
        // A reissue replaces the cluster's set, and only its (c10's sort
        // next to c1's); a deleted cluster goes.
        m.set_certificates("ns", "c10", [("c10-ca", now + 60)]);
        m.set_certificates("ns", "c1", [("c1-apiserver-tls", now + 7200)]);
        let text = m.encode();
        assert_eq!(
            series(&text, "kok_certificate_expiry_seconds{").len(),
            3,
            "{text}"
        );
        m.retain_clusters(&[("ns".to_string(), "c1".to_string())].into());
        let text = m.encode();
        assert_eq!(
            series(&text, "kok_certificate_expiry_seconds{").len(),
            1,
            "{text}"
        );
    }

    #[test]
    fn etcd_members_replace_and_reconcile_outcomes_count() {
        let m: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        m.set_etcd_members("ns", "c1", [("c1-etcd-0", true), ("c1-etcd-1", false)]);
        m.set_etcd_members("ns", "c1", [("c1-etcd-0", true)]);
        let text = m.encode();
        assert_eq!(
            series(&text, "kok_etcd_member_healthy{"),
            vec!["kok_etcd_member_healthy{namespace=\"ns\",cluster=\"c1\",member=\"c1-etcd-0\"} 1"]
        );
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
        m.set_machines_by_phase([("Ready", 3)]);
        let text = m.encode();
        assert!(text.contains("kok_machines{phase=\"Ready\"} 3"), "{text}");
        assert!(text.contains("kok_machines{phase=\"Failed\"} 0"), "{text}");
    }
}
