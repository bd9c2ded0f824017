//! The Cluster controller's domain metrics, registered into the process's
//! metrics (`kok_common::metrics`): certificate expiry per Secret and etcd
//! member health, recorded after every reconcile, and attempts of the
//! add-on step. A Cluster's series go with it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Secret;
use kok_common::metrics::{Labels, Metrics};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kube_on_kube_api::Cluster;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

use crate::etcd::Report;
use crate::names::Names;
use crate::pki;
use crate::pki::secrets::CERT;

/// The Cluster controller's metrics.
pub struct Domain {
    certificate_expiry: Arc<CertificateExpiry>,
    etcd_member_healthy: Family<Labels, Gauge>,
    /// Label sets of the etcd series, so a cluster's stale ones can be removed.
    etcd_series: Mutex<BTreeSet<Labels>>,
    addon_attempts: Family<Labels, Counter>,
    backups: Arc<Backups>,
    backup_failures: Family<Labels, Counter>,
}

impl Domain {
    /// The metrics, registered into `metrics`.
    pub fn new(metrics: &Metrics) -> Domain {
        let certificate_expiry = Arc::new(CertificateExpiry::default());
        metrics.register_collector(Box::new(certificate_expiry.clone()));
        let etcd_member_healthy = Family::<Labels, Gauge>::default();
        metrics.register(
            "etcd_member_healthy",
            "1 when a business-cluster etcd member answers as healthy, else 0",
            etcd_member_healthy.clone(),
        );
        let addon_attempts = Family::<Labels, Counter>::default();
        metrics.register(
            "addon_attempts",
            "Attempts of a Cluster's add-on step, by whether they ran alone (pass=alone: a retry while nothing else of the Cluster changed) or in a full reconcile (pass=full)",
            addon_attempts.clone(),
        );
        let backups = Arc::new(Backups::default());
        metrics.register_collector(Box::new(backups.clone()));
        let backup_failures = Family::<Labels, Counter>::default();
        metrics.register(
            "etcd_backup_failures",
            "Failed etcd snapshot attempts of a Cluster, by namespace, cluster and reason (the BackupReady reason)",
            backup_failures.clone(),
        );
        Domain {
            certificate_expiry,
            etcd_member_healthy,
            etcd_series: Mutex::default(),
            addon_attempts,
            backups,
            backup_failures,
        }
    }

    /// Count one attempt of a Cluster's add-on step, alone or in a full pass.
    pub fn addon_attempt(&self, alone: bool) {
        let pass = if alone { "alone" } else { "full" };
        self.addon_attempts
            .get_or_create(&vec![("pass", pass.to_string())])
            .inc();
    }

    /// Record a stored snapshot of a Cluster: taken at `taken_at`, in `took`.
    pub fn backup_taken(
        &self,
        namespace: &str,
        cluster: &str,
        taken_at: k8s_openapi::jiff::Timestamp,
        took: Duration,
    ) {
        self.backups.lock().insert(
            cluster_labels_prefix(namespace, cluster),
            (taken_at.as_second(), took.as_secs_f64()),
        );
    }

    /// Count a failed snapshot attempt of a Cluster.
    pub fn backup_failed(&self, namespace: &str, cluster: &str, reason: &str) {
        self.backup_failures
            .get_or_create(&cluster_labels(namespace, cluster, "reason", reason))
            .inc();
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
        self.replace_etcd_series(namespace, cluster, keep);
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
        self.replace_etcd_series(namespace, cluster, BTreeSet::new());
        self.backups
            .lock()
            .remove(&cluster_labels_prefix(namespace, cluster));
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
        for labels in self.backups.lock().keys() {
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

    /// Remove the etcd series of `namespace/cluster` that are not in `keep`,
    /// and remember `keep` as the cluster's series. A `Family` cannot be
    /// listed, so the label sets are tracked beside it.
    fn replace_etcd_series(&self, namespace: &str, cluster: &str, keep: BTreeSet<Labels>) {
        let mut known = self.etcd_series.lock().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<Labels> = known
            .range(cluster_labels_prefix(namespace, cluster)..)
            .take_while(|l| of_cluster(l, namespace, cluster))
            .filter(|l| !keep.contains(*l))
            .cloned()
            .collect();
        for labels in stale {
            self.etcd_member_healthy.remove(&labels);
            known.remove(&labels);
        }
        known.extend(keep);
    }
}

/// The process's Cluster metrics, registered into its metrics on first use
/// (`main` asks for them at start, so they are listed before any Cluster).
pub fn domain() -> &'static Domain {
    static DOMAIN: OnceLock<Domain> = OnceLock::new();
    DOMAIN.get_or_init(|| Domain::new(kok_common::metrics::global()))
}

/// Record what one reconcile of a Cluster saw.
pub fn record(names: &Names, secrets: &BTreeMap<String, Secret>, etcd: &Report) {
    let metrics = domain();
    let certificates = secrets.iter().filter_map(|(name, secret)| {
        let pem = secret.data.as_ref()?.get(CERT)?;
        let info = pki::inspect(std::str::from_utf8(&pem.0).ok()?).ok()?;
        Some((name.as_str(), info.not_after.unix_timestamp()))
    });
    metrics.set_certificates(&names.namespace, &names.cluster, certificates);
    metrics.set_etcd_members(
        &names.namespace,
        &names.cluster,
        etcd.members.iter().map(|m| (m.name.as_str(), m.healthy)),
    );
}

/// Every minute, drop the series of Clusters no longer in the controller's
/// cache (deleted ones are not reconciled again).
pub async fn forget_deleted_clusters(store: Store<Cluster>) {
    if !kok_common::health::wait_until_ready(&store).await {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let live: BTreeSet<(String, String)> = store
            .state()
            .iter()
            .map(|o| (o.namespace().unwrap_or_default(), o.name_any()))
            .collect();
        domain().retain_clusters(&live);
    }
}

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

fn cluster_labels(namespace: &str, cluster: &str, key: &'static str, value: &str) -> Labels {
    vec![
        ("namespace", namespace.to_string()),
        ("cluster", cluster.to_string()),
        (key, value.to_string()),
    ]
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

/// `kok_etcd_backup_age_seconds` (computed when scraped) and
/// `kok_etcd_backup_duration_seconds` of each Cluster's last stored snapshot.
#[derive(Debug, Default)]
struct Backups {
    /// Per Cluster: when the last snapshot was taken (Unix seconds), and
    /// how long taking and storing it took.
    last: Mutex<BTreeMap<Labels, (i64, f64)>>,
}

impl Backups {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Labels, (i64, f64)>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for Backups {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let map = self.lock();
        let mut age = encoder.encode_descriptor(
            "etcd_backup_age_seconds",
            "Seconds since a Cluster's last stored etcd snapshot was taken, by namespace and cluster",
            None,
            MetricType::Gauge,
        )?;
        for (labels, (at, _)) in map.iter() {
            #[allow(clippy::cast_precision_loss)]
            ConstGauge::new(now - *at as f64).encode(age.encode_family(labels)?)?;
        }
        let mut duration = encoder.encode_descriptor(
            "etcd_backup_duration_seconds",
            "Seconds the last stored etcd snapshot of a Cluster took to take, upload and apply retention, by namespace and cluster",
            None,
            MetricType::Gauge,
        )?;
        for (labels, (_, took)) in map.iter() {
            ConstGauge::new(*took).encode(duration.encode_family(labels)?)?;
        }
        Ok(())
    }
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
        let metrics = Metrics::new();
        let m = Domain::new(&metrics);
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
        let text = metrics.encode();
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
        let text = metrics.encode();
        assert_eq!(
            series(&text, "kok_certificate_expiry_seconds{").len(),
            3,
            "{text}"
        );
        m.retain_clusters(&[("ns".to_string(), "c1".to_string())].into());
        let text = metrics.encode();
        assert_eq!(
            series(&text, "kok_certificate_expiry_seconds{").len(),
            1,
            "{text}"
        );
    }

    #[test]
    fn etcd_members_replace() {
        let metrics = Metrics::new();
        let m = Domain::new(&metrics);
        m.set_etcd_members("ns", "c1", [("c1-etcd-0", true), ("c1-etcd-1", false)]);
        m.set_etcd_members("ns", "c1", [("c1-etcd-0", true)]);
        let text = metrics.encode();
        assert_eq!(
            series(&text, "kok_etcd_member_healthy{"),
            vec!["kok_etcd_member_healthy{namespace=\"ns\",cluster=\"c1\",member=\"c1-etcd-0\"} 1"]
        );
    }
}
