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
        }
    }
}

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
    /// Deployment of a stateless component.
    pub fn deployment(&self, component: Component) -> String {
        self.prefixed(component.as_str())
    }
    /// Internal Service of kube-apiserver (used by the other components).
    pub fn apiserver_service(&self) -> String {
        self.prefixed("apiserver")
    }
    /// External Service of kube-apiserver (used by kubelets and users).
    pub fn apiserver_external_service(&self) -> String {
        self.prefixed("apiserver-external")
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

#[cfg(test)]
mod tests {
    use super::*;

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
