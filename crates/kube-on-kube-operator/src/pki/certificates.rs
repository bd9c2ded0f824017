//! Which certificates a Cluster needs, with which names and identities: a pure
//! plan from the spec (and the Service addresses observed so far) that the PKI
//! step issues and keeps current.

use std::net::{IpAddr, Ipv4Addr};

use kube_on_kube_api::cluster::Cluster;

use crate::names::Names;
use crate::network::kubernetes_service_ip;
use crate::pki::{LeafSpec, Usage};

/// Which CA signs a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Authority {
    /// The cluster CA: apiserver serving, kubelet client, kubeconfigs.
    Cluster,
    /// The etcd CA: etcd peers and servers, and etcd clients.
    Etcd,
    /// The front-proxy CA: the aggregation layer's client.
    FrontProxy,
}

/// Where a certificate ends up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and `ca.crt`.
    TlsSecret(String),
    /// A Secret with a `kubeconfig` whose user authenticates with this certificate.
    Kubeconfig {
        secret: String,
        /// Whether the kubeconfig points at the external endpoint (users) or the
        /// internal Service (components in the meta-cluster).
        external: bool,
    },
}

/// One certificate to keep issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCert {
    pub target: Target,
    pub authority: Authority,
    pub spec: LeafSpec,
}

/// Errors in the parts of the spec the plan depends on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("network.serviceCIDR {0:?} is not a CIDR")]
    ServiceCidr(String),
    #[error("apiServer.external.addresses entry {0:?} is not an IP address")]
    Address(String),
}

fn client(common_name: &str, organizations: &[&str]) -> LeafSpec {
    LeafSpec {
        common_name: common_name.to_string(),
        organizations: organizations.iter().map(|o| o.to_string()).collect(),
        dns_names: vec![],
        ips: vec![],
        usage: Usage::Client,
    }
}

/// Built-in kubeconfig identities: (name, common name, groups, external).
pub const KUBECONFIG_IDENTITIES: [(&str, &str, &[&str], bool); 5] = [
    ("admin", "kubernetes-admin", &["system:masters"], true),
    (
        "controller-manager",
        "system:kube-controller-manager",
        &[],
        false,
    ),
    ("scheduler", "system:kube-scheduler", &[], false),
    (
        "node-operator",
        "kube-on-kube:node-operator",
        &["kube-on-kube:node-operators"],
        false,
    ),
    (
        crate::render::control_plane::KONNECTIVITY_IDENTITY,
        "system:konnectivity-server",
        &[],
        false,
    ),
];

/// Every leaf certificate the Cluster needs. `service_ips` are addresses its
/// apiserver Services were given (ClusterIP, load-balancer ingress), which
/// clients may use and so must be SANs.
pub fn plan(
    cluster: &Cluster,
    names: &Names,
    service_ips: &[IpAddr],
) -> Result<Vec<PlannedCert>, PlanError> {
    let spec = &cluster.spec;
    let mut out = Vec::new();
    let tls = |cert: &str| Target::TlsSecret(names.cert_secret(cert));

    // kube-apiserver serving certificate.
    let domain = &spec.network.dns_domain;
    let mut dns = vec![
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        format!("kubernetes.default.svc.{domain}"),
        "localhost".to_string(),
    ];
    dns.extend(names.service_dns_names(&names.apiserver_service()));
    dns.extend(names.service_dns_names(&names.apiserver_external_service()));
    dns.extend(spec.api_server.external.dns_names.iter().cloned());
    let mut ips = vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        kubernetes_service_ip(&spec.network.service_cidr)
            .ok_or_else(|| PlanError::ServiceCidr(spec.network.service_cidr.clone()))?,
    ];
    for address in &spec.api_server.external.addresses {
        ips.push(
            address
                .parse()
                .map_err(|_| PlanError::Address(address.clone()))?,
        );
    }
    ips.extend(service_ips.iter().copied());
    dedup(&mut dns);
    dedup(&mut ips);
    out.push(PlannedCert {
        target: tls("apiserver-tls"),
        authority: Authority::Cluster,
        spec: LeafSpec {
            common_name: "kube-apiserver".into(),
            organizations: vec![],
            dns_names: dns,
            ips,
            usage: Usage::Server,
        },
    });

    // kube-apiserver's client certificates.
    out.push(PlannedCert {
        target: tls("apiserver-etcd-client"),
        authority: Authority::Etcd,
        spec: client("kube-apiserver-etcd-client", &[]),
    });
    out.push(PlannedCert {
        target: tls("apiserver-kubelet-client"),
        authority: Authority::Cluster,
        spec: client("kube-apiserver-kubelet-client", &["system:masters"]),
    });
    out.push(PlannedCert {
        target: tls("front-proxy-client"),
        authority: Authority::FrontProxy,
        spec: client("front-proxy-client", &[]),
    });
    // The operator's own etcd client, for membership changes.
    out.push(PlannedCert {
        target: tls("operator-etcd-client"),
        authority: Authority::Etcd,
        spec: client("kube-on-kube-operator", &[]),
    });

    // One peer and one server certificate per etcd member.
    let client_service = names.service_dns_names(&names.etcd_client_service());
    for index in 0..spec.mode.replicas() as usize {
        let member = names.etcd_member(index);
        let member_dns = names.service_dns_names(&member);
        let mut server_dns = member_dns.clone();
        server_dns.extend(client_service.iter().cloned());
        server_dns.push("localhost".into());
        let suffix = member
            .trim_start_matches(&format!("{}-", names.cluster))
            .to_string();
        out.push(PlannedCert {
            target: tls(&format!("{suffix}-peer")),
            authority: Authority::Etcd,
            spec: LeafSpec {
                common_name: member.clone(),
                organizations: vec![],
                dns_names: member_dns,
                ips: vec![],
                usage: Usage::ServerAndClient,
            },
        });
        out.push(PlannedCert {
            target: tls(&format!("{suffix}-server")),
            authority: Authority::Etcd,
            spec: LeafSpec {
                common_name: member,
                organizations: vec![],
                dns_names: server_dns,
                ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
                usage: Usage::ServerAndClient,
            },
        });
    }

    // Kubeconfigs.
    for (identity, common_name, groups, external) in KUBECONFIG_IDENTITIES {
        out.push(PlannedCert {
            target: Target::Kubeconfig {
                secret: names.kubeconfig_secret(identity),
                external,
            },
            authority: Authority::Cluster,
            spec: client(common_name, groups),
        });
    }
    for user in &spec.extra_users {
        let groups: Vec<&str> = user.groups.iter().map(String::as_str).collect();
        out.push(PlannedCert {
            target: Target::Kubeconfig {
                secret: names.user_kubeconfig_secret(&user.name),
                external: true,
            },
            authority: Authority::Cluster,
            spec: client(&user.name, &groups),
        });
    }
    Ok(out)
}

fn dedup<T: Ord + Clone>(items: &mut Vec<T>) {
    let mut seen = std::collections::BTreeSet::new();
    items.retain(|i| seen.insert(i.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::cluster::{ClusterMode, ExtraUser};

    fn cluster(mode: ClusterMode) -> Cluster {
        let text = include_str!("../../../../examples/cluster-production.yaml");
        let mut c: Cluster = serde_norway::from_str(text).expect("example parses");
        c.spec.mode = mode;
        c
    }

    fn names(c: &Cluster) -> Names {
        Names::new(c, "cluster.local")
    }

    fn find<'a>(plan: &'a [PlannedCert], secret: &str) -> &'a PlannedCert {
        plan.iter()
            .find(|p| match &p.target {
                Target::TlsSecret(s) => s == secret,
                Target::Kubeconfig { secret: s, .. } => s == secret,
            })
            .unwrap_or_else(|| panic!("no {secret} in plan"))
    }

    #[test]
    fn apiserver_sans_cover_every_service_and_external_address() {
        let c = cluster(ClusterMode::Production);
        let n = names(&c);
        let lb: IpAddr = "203.0.113.7".parse().expect("ip");
        let plan = plan(&c, &n, &[lb]).expect("plan");
        let api = &find(&plan, "prod-east-apiserver-tls").spec;
        for name in [
            "kubernetes.default.svc.cluster.local",
            "prod-east-apiserver",
            "prod-east-apiserver.clusters.svc",
            "prod-east-apiserver-external.clusters.svc.cluster.local",
            "api.prod-east.example.com",
        ] {
            assert!(
                api.dns_names.iter().any(|d| d == name),
                "missing SAN {name}: {:?}",
                api.dns_names
            );
        }
        for ip in ["10.96.0.1", "192.0.2.10", "127.0.0.1", "203.0.113.7"] {
            assert!(
                api.ips.contains(&ip.parse().expect("ip")),
                "missing IP SAN {ip}"
            );
        }
        assert_eq!(api.usage, Usage::Server);
    }

    #[test]
    fn one_peer_and_server_cert_per_member() {
        for (mode, members) in [(ClusterMode::Production, 3), (ClusterMode::Minimal, 1)] {
            let c = cluster(mode);
            let plan = plan(&c, &names(&c), &[]).expect("plan");
            let peers = plan
                .iter()
                .filter(|p| matches!(&p.target, Target::TlsSecret(s) if s.ends_with("-peer")))
                .count();
            let servers = plan
                .iter()
                .filter(|p| matches!(&p.target, Target::TlsSecret(s) if s.ends_with("-server")))
                .count();
            assert_eq!((peers, servers), (members, members));
        }
        let c = cluster(ClusterMode::Production);
        let plan = plan(&c, &names(&c), &[]).expect("plan");
        let peer = &find(&plan, "prod-east-etcd-1-peer").spec;
        assert!(
            peer.dns_names
                .contains(&"prod-east-etcd-1.clusters.svc.cluster.local".to_string())
        );
        assert_eq!(
            find(&plan, "prod-east-etcd-1-peer").authority,
            Authority::Etcd
        );
        let server = &find(&plan, "prod-east-etcd-1-server").spec;
        assert!(
            server
                .dns_names
                .contains(&"prod-east-etcd.clusters.svc".to_string())
        );
    }

    #[test]
    fn kubeconfigs_carry_identities_and_groups() {
        let mut c = cluster(ClusterMode::Minimal);
        c.spec.extra_users = vec![ExtraUser {
            name: "dev".into(),
            groups: vec!["devs".into(), "viewers".into()],
        }];
        let n = names(&c);
        let plan = plan(&c, &n, &[]).expect("plan");
        let admin = find(&plan, "prod-east-admin-kubeconfig");
        assert_eq!(admin.spec.organizations, vec!["system:masters"]);
        assert_eq!(
            admin.target,
            Target::Kubeconfig {
                secret: "prod-east-admin-kubeconfig".into(),
                external: true
            }
        );
        let cm = find(&plan, "prod-east-controller-manager-kubeconfig");
        assert_eq!(cm.spec.common_name, "system:kube-controller-manager");
        let dev = find(&plan, "prod-east-kubeconfig-dev");
        assert_eq!(dev.spec.organizations, vec!["devs", "viewers"]);
        assert_eq!(dev.spec.usage, Usage::Client);
    }

    #[test]
    fn bad_cidr_is_an_error_not_a_panic() {
        let mut c = cluster(ClusterMode::Minimal);
        c.spec.network.service_cidr = "nonsense".into();
        assert_eq!(
            plan(&c, &names(&c), &[]),
            Err(PlanError::ServiceCidr("nonsense".into()))
        );
    }
}
