//! Names of everything the operator creates for a Cluster, in one place so the
//! renderers, the PKI and the status agree on them.

use kube::ResourceExt;
use kube_on_kube_api::cluster::Cluster;

/// Control-plane components, as they appear in names and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    Etcd,
    ApiServer,
    ControllerManager,
    Scheduler,
    NodeOperator,
    /// The S3 server on a claim that holds a Cluster's etcd snapshots.
    SnapshotGateway,
}

impl Component {
    /// Name used in object names and the component label.
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "apiserver",
            Component::ControllerManager => "controller-manager",
            Component::Scheduler => "scheduler",
            Component::NodeOperator => "node-operator",
            Component::SnapshotGateway => "snapshots",
        }
    }
}

/// The key of the encryption Secret ([`Names::encryption_secret`]) that
/// holds the configuration kube-apiserver reads, and its file name there.
pub const ENCRYPTION_CONFIG_KEY: &str = "encryption-config.yaml";
/// Where kube-apiserver and its KMS v2 plugin share the plugin's socket.
pub const KMS_SOCKET_DIR: &str = "/var/run/kmsplugin";
/// The socket in it.
pub const KMS_SOCKET: &str = "/var/run/kmsplugin/socket.sock";

/// Names derived from one Cluster (its name and namespace, and the
/// meta-cluster's DNS domain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub cluster: String,
    pub namespace: String,
    /// DNS domain of the meta-cluster, for fully qualified Service names.
    pub meta_domain: String,
}

impl Names {
    pub fn new(cluster: &Cluster, meta_domain: &str) -> Self {
        Self {
            cluster: cluster.name_any(),
            namespace: cluster.namespace().unwrap_or_default(),
            meta_domain: meta_domain.to_string(),
        }
    }

    fn prefixed(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.cluster)
    }

    /// `<namespace>/<cluster>`: the key of the Cluster's per-Cluster state in
    /// the operator (add-on backoff, poll interval).
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.cluster)
    }

    /// Secret of the cluster CA (signs serving and client certificates and kubelet CSRs).
    pub fn ca_secret(&self) -> String {
        self.prefixed("ca")
    }
    /// Secret of the etcd CA.
    pub fn etcd_ca_secret(&self) -> String {
        self.prefixed("etcd-ca")
    }
    /// Secret of the front-proxy CA (aggregated APIs).
    pub fn front_proxy_ca_secret(&self) -> String {
        self.prefixed("front-proxy-ca")
    }
    /// Secret of the service-account signing key pair.
    pub fn service_account_secret(&self) -> String {
        self.prefixed("sa")
    }
    /// Secret of the key kube-apiserver encrypts Secrets at rest with, and
    /// its encryption configuration (under [`ENCRYPTION_CONFIG_KEY`]).
    pub fn encryption_secret(&self) -> String {
        self.prefixed("encryption")
    }
    /// Secret holding kube-apiserver's encryption configuration with the
    /// Cluster's KMS v2 plugin first (`spec.apiServer.kms`), under
    /// [`ENCRYPTION_CONFIG_KEY`].
    pub fn encryption_kms_secret(&self) -> String {
        self.prefixed("encryption-kms")
    }
    /// Secret (type `kubernetes.io/tls`, plus `ca.crt`) of the leaf certificate
    /// `cert`, for example `apiserver-tls` or `etcd-0-peer`.
    pub fn cert_secret(&self, cert: &str) -> String {
        self.prefixed(cert)
    }
    /// Secret with the kubeconfig of a built-in identity (`admin`,
    /// `controller-manager`, `scheduler`, `node-operator`).
    pub fn kubeconfig_secret(&self, identity: &str) -> String {
        self.prefixed(&format!("{identity}-kubeconfig"))
    }
    /// Secret with the kubeconfig of an `extraUsers[]` entry.
    pub fn user_kubeconfig_secret(&self, user: &str) -> String {
        self.prefixed(&format!("kubeconfig-{user}"))
    }

    /// Name of etcd member `index` (also its Pod, PVC and headless Service).
    pub fn etcd_member(&self, index: usize) -> String {
        self.prefixed(&format!("etcd-{index}"))
    }
    /// Client Service in front of every etcd member.
    pub fn etcd_client_service(&self) -> String {
        self.prefixed("etcd")
    }
    /// PodDisruptionBudget of the etcd members.
    pub fn etcd_disruption_budget(&self) -> String {
        self.prefixed("etcd")
    }
    /// NetworkPolicy fencing the etcd members.
    pub fn etcd_network_policy(&self) -> String {
        self.prefixed("etcd")
    }
    /// NetworkPolicy fencing kube-apiserver, the controller-manager and the
    /// scheduler.
    pub fn control_plane_network_policy(&self) -> String {
        self.prefixed("control-plane")
    }
    /// Deployment of a stateless component.
    pub fn deployment(&self, component: Component) -> String {
        self.prefixed(component.as_str())
    }
    /// Deployment, Service and Secret (its keys and certificate) of the
    /// snapshot gateway on the claim a Cluster's snapshots go to.
    pub fn snapshot_gateway(&self) -> String {
        self.deployment(Component::SnapshotGateway)
    }
    /// Internal Service of kube-apiserver (used by the other components).
    pub fn apiserver_service(&self) -> String {
        self.prefixed("apiserver")
    }
    /// External Service of kube-apiserver (used by kubelets and users).
    pub fn apiserver_external_service(&self) -> String {
        self.prefixed("apiserver-external")
    }

    /// ConfigMap with kube-apiserver's authentication configuration.
    pub fn authentication_config(&self) -> String {
        self.prefixed("authentication")
    }

    /// ConfigMap with kube-apiserver's audit policy.
    pub fn audit_policy(&self) -> String {
        self.prefixed("audit-policy")
    }

    /// Secret with kube-apiserver's audit webhook kubeconfig.
    pub fn audit_webhook(&self) -> String {
        self.prefixed("audit-webhook")
    }

    /// ConfigMap with kube-apiserver's egress selector configuration.
    pub fn egress_selector_config(&self) -> String {
        self.prefixed("egress-selector")
    }

    /// Every DNS name a Service `service` of this cluster's namespace answers to.
    pub fn service_dns_names(&self, service: &str) -> Vec<String> {
        let ns = &self.namespace;
        vec![
            service.to_string(),
            format!("{service}.{ns}"),
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.{}", self.meta_domain),
        ]
    }
    /// Fully qualified DNS name of a Service of this cluster's namespace.
    pub fn service_fqdn(&self, service: &str) -> String {
        format!("{service}.{}.svc.{}", self.namespace, self.meta_domain)
    }
    /// Peer URL of an etcd member: its headless Service's DNS name, so the
    /// member's identity survives its Pod being replaced.
    pub fn etcd_peer_url(&self, member: &str) -> String {
        format!("https://{}:2380", self.service_fqdn(member))
    }
    /// Client URL of an etcd member.
    pub fn etcd_client_url(&self, member: &str) -> String {
        format!("https://{}:2379", self.service_fqdn(member))
    }
}

/// The name users know a component by.
pub fn display_name(component: Component) -> &'static str {
    match component {
        Component::Etcd => "etcd",
        Component::ApiServer => "kube-apiserver",
        Component::ControllerManager => "kube-controller-manager",
        Component::Scheduler => "kube-scheduler",
        Component::NodeOperator => "node-operator",
        Component::SnapshotGateway => "snapshot gateway",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn names() -> Names {
        Names {
            cluster: "prod".into(),
            namespace: "clusters".into(),
            meta_domain: "cluster.local".into(),
        }
    }

    #[test]
    fn names_are_prefixed_and_distinct() {
        let n = names();
        let all = [
            n.ca_secret(),
            n.etcd_ca_secret(),
            n.front_proxy_ca_secret(),
            n.service_account_secret(),
            n.cert_secret("apiserver-tls"),
            n.cert_secret("etcd-0-peer"),
            n.kubeconfig_secret("admin"),
            n.user_kubeconfig_secret("admin"),
        ];
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{all:?}");
        assert!(all.iter().all(|s| s.starts_with("prod-")));
    }

    /// Every name derived from Cluster `cluster` (Production, with the extra
    /// users `users`), by kind: the PKI's Secrets as the certificate plan
    /// has them, the Services, Deployments, etcd member Pods and claims, and
    /// the add-on inventory.
    fn derived(cluster: &str, users: &[String]) -> Vec<(&'static str, String)> {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-production.yaml"))
                .expect("example");
        c.metadata.name = Some(cluster.into());
        c.spec.extra_users = users
            .iter()
            .map(|u| kube_on_kube_api::cluster::ExtraUser {
                name: u.clone(),
                groups: vec![],
            })
            .collect();
        let n = Names::new(&c, "cluster.local");
        let mut out = Vec::new();
        for secret in [
            n.ca_secret(),
            n.etcd_ca_secret(),
            n.front_proxy_ca_secret(),
            n.service_account_secret(),
            n.encryption_secret(),
        ] {
            out.push(("Secret", secret));
        }
        for planned in crate::pki::certificates::plan(&c, &n, &[]).expect("plan") {
            out.push((
                "Secret",
                match planned.target {
                    crate::pki::certificates::Target::TlsSecret(s) => s,
                    crate::pki::certificates::Target::Kubeconfig { secret, .. } => secret,
                },
            ));
        }
        for service in [
            n.apiserver_service(),
            n.apiserver_external_service(),
            n.etcd_client_service(),
        ] {
            out.push(("Service", service));
        }
        for index in 0..crate::etcd::MAX_MEMBERS {
            for kind in ["Service", "Pod", "PersistentVolumeClaim"] {
                out.push((kind, n.etcd_member(index)));
            }
        }
        for component in [
            Component::ApiServer,
            Component::ControllerManager,
            Component::Scheduler,
            Component::NodeOperator,
            Component::SnapshotGateway,
        ] {
            out.push(("Deployment", n.deployment(component)));
        }
        out.push(("Service", n.snapshot_gateway()));
        out.push(("Secret", n.snapshot_gateway()));
        out.push(("ConfigMap", crate::addons::inventory_name(&n)));
        out.push(("ConfigMap", n.egress_selector_config()));
        out
    }

    /// Proper prefixes of `suffix` in whole `-` segments: `etcd-0-peer`
    /// gives `etcd` and `etcd-0`.
    fn segment_prefixes(suffix: &str) -> Vec<String> {
        let segments: Vec<&str> = suffix.split('-').collect();
        (1..segments.len())
            .map(|k| segments[..k].join("-"))
            .collect()
    }

    /// Two Clusters of one namespace share a derived name only if one's
    /// name is the other's followed by `-p`, where `p` begins (in whole
    /// segments) a suffix the other derives: `x` and `x-etcd` (`etcd-ca`),
    /// `x` and `x-kubeconfig` (user `sa`'s `kubeconfig-sa`). So every
    /// collision has the shape of a pair (`x`, `x-p`) over this vocabulary:
    /// each such pair, with extra users named after every suffix and prefix,
    /// is tried, and no two names the CRD accepts may share a derived name
    /// (whatever their kinds); the refused ones must include each pair of
    /// the issue.
    #[test]
    fn no_two_accepted_cluster_names_derive_the_same_name() {
        use kube_on_kube_api::cluster::cluster_name_allowed;
        let base = "x";
        let suffixes: BTreeSet<String> = derived(base, &["sa".into()])
            .into_iter()
            .map(|(_, name)| name[base.len() + 1..].to_string())
            .collect();
        let mut vocabulary: BTreeSet<String> = suffixes.clone();
        vocabulary.extend(suffixes.iter().flat_map(|s| segment_prefixes(s)));
        let users: Vec<String> = vocabulary.iter().cloned().collect();

        let mut candidates = vec![base.to_string()];
        candidates.extend(vocabulary.iter().map(|p| format!("{base}-{p}")));
        let accepted: Vec<&String> = candidates
            .iter()
            .filter(|c| cluster_name_allowed(c))
            .collect();
        for refused in ["x-etcd", "x-front-proxy", "x-kubeconfig"] {
            assert!(candidates.iter().any(|c| c == refused), "{refused}");
            assert!(!cluster_name_allowed(refused), "{refused}");
        }
        assert!(accepted.len() > 20, "{accepted:?}");

        let mut owner: BTreeMap<String, &String> = BTreeMap::new();
        for cluster in &accepted {
            let names = derived(cluster, &users);
            // Within one Cluster, one object per name and kind.
            let per_kind: BTreeSet<_> = names.iter().collect();
            assert_eq!(per_kind.len(), names.len(), "{cluster}: {names:?}");
            let distinct: BTreeSet<String> = names.into_iter().map(|(_, n)| n).collect();
            for name in distinct {
                if let Some(first) = owner.insert(name.clone(), cluster) {
                    panic!("Clusters {first} and {cluster} both derive {name}");
                }
            }
        }
        // And the pairs of the issue do collide without the rules.
        let collide = |a: &str, b: &str, users: &[String]| {
            let a: BTreeSet<String> = derived(a, users).into_iter().map(|(_, n)| n).collect();
            let b: BTreeSet<String> = derived(b, &[]).into_iter().map(|(_, n)| n).collect();
            a.intersection(&b).next().cloned()
        };
        assert_eq!(collide("x", "x-etcd", &[]).as_deref(), Some("x-etcd-ca"));
        assert_eq!(
            collide("x", "x-front-proxy", &[]).as_deref(),
            Some("x-front-proxy-ca")
        );
        assert_eq!(
            collide("x", "x-kubeconfig", &["sa".into()]).as_deref(),
            Some("x-kubeconfig-sa")
        );
    }

    /// The longest accepted Cluster name still gives Service names that are
    /// DNS-1035 labels (at most 63 characters) and Secret names within 253
    /// with the longest user name.
    #[test]
    fn the_longest_cluster_name_fits_every_derived_name() {
        use kube_on_kube_api::cluster::{MAX_CLUSTER_NAME, cluster_name_allowed};
        let longest = "a".repeat(MAX_CLUSTER_NAME);
        assert!(cluster_name_allowed(&longest));
        let user = "u".repeat(63);
        for (kind, name) in derived(&longest, &[user]) {
            let limit = match kind {
                "Service" | "Pod" => 63,
                _ => 253,
            };
            assert!(
                name.len() <= limit,
                "{kind} {name}: {} > {limit}",
                name.len()
            );
        }
    }

    #[test]
    fn peer_url_is_the_member_service() {
        let n = names();
        assert_eq!(
            n.etcd_peer_url(&n.etcd_member(2)),
            "https://prod-etcd-2.clusters.svc.cluster.local:2380"
        );
        assert_eq!(
            n.service_dns_names("prod-apiserver")[2],
            "prod-apiserver.clusters.svc"
        );
    }
}
