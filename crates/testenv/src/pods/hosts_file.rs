//! Name resolution inside Pods without a DNS server: an `/etc/hosts` that maps
//! every Service name form (`svc`, `svc.ns`, `svc.ns.svc`, the FQDN) to the
//! Service's ready endpoints, and headless per-Pod names to their Pods, so
//! components can use the names they use in a real cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Every Pod's `/etc/resolv.conf`: names are in `/etc/hosts`, and the lookup
/// of any other name fails at once, as a cluster DNS server answers for a name
/// that does not exist (yet). Without it, lookups went to the machine's
/// resolver, which may never answer for a cluster name: each took the
/// resolver's 5 s timeout, and a component that looked up a Pod's name just
/// before the Pod got its address (etcd members finding their peers,
/// kube-apiserver its etcd) waited that long before it tried again. Nothing
/// listens on port 53 in a Pod's network namespace, so a query is refused
/// there and then.
pub const RESOLV_CONF: &str = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n";

/// A Service label on EndpointSlices (set by the endpointslice controller).
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Pod the file is for.
pub struct ForPod<'a> {
    pub namespace: &'a str,
    pub hostname: &'a str,
    pub ip: &'a str,
}

/// Render `/etc/hosts`. `slices` are every EndpointSlice the Pod may see;
/// `extra` adds fixed entries (for example the meta-cluster API).
pub fn render(
    pod: &ForPod<'_>,
    domain: &str,
    slices: &[EndpointSlice],
    extra: &[(String, Vec<String>)],
) -> String {
    // address -> names, kept in a stable order for stable files.
    let mut by_ip: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut add = |ip: &str, name: String| {
        let names = by_ip.entry(ip.to_string()).or_default();
        if !names.contains(&name) {
            names.push(name);
        }
    };
    add("127.0.0.1", "localhost".into());
    add("::1", "localhost ip6-localhost ip6-loopback".into());
    add(pod.ip, pod.hostname.to_string());
    for (ip, names) in extra {
        for name in names {
            add(ip, name.clone());
        }
    }
    for slice in slices {
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
        let mut service_names = vec![
            format!("{service}.{ns}"),
            format!("{service}.{ns}.svc"),
            format!("{service}.{ns}.svc.{domain}"),
        ];
        if ns == pod.namespace {
            service_names.insert(0, service.clone());
        }
        for endpoint in &slice.endpoints {
            // Not ready means "do not send traffic"; a Service that publishes
            // not-ready addresses has them marked ready by the controller.
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            // A terminating Pod takes no new connections, and its address is
            // gone as soon as it stops: a name still pointing there would
            // send dials into a void until the Pod object is deleted (kube-proxy
            // does not route new connections to it either).
            if endpoint.conditions.as_ref().and_then(|c| c.terminating) == Some(true) {
                continue;
            }
            for address in &endpoint.addresses {
                for name in &service_names {
                    add(address, name.clone());
                }
                if let Some(hostname) = &endpoint.hostname {
                    add(address, format!("{hostname}.{service}.{ns}.svc.{domain}"));
                }
            }
        }
    }
    let mut out = String::from("# Kubernetes-managed hosts file (test environment).\n");
    for (ip, names) in by_ip {
        out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(ns: &str, service: &str, endpoints: &[(&str, bool, Option<&str>)]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(ip, ready, hostname)| Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    hostname: hostname.map(str::to_string),
                    ..Default::default()
                })
                .collect(),
            ports: None,
        }
    }

    #[test]
    fn services_resolve_to_ready_endpoints_in_every_form() {
        let pod = ForPod {
            namespace: "a",
            hostname: "api-0",
            ip: "10.9.0.5",
        };
        let slices = vec![
            slice(
                "a",
                "etcd",
                &[("10.9.0.2", true, None), ("10.9.0.3", false, None)],
            ),
            slice("b", "other", &[("10.9.0.4", true, None)]),
            slice("a", "etcd-0", &[("10.9.0.2", true, Some("etcd-0"))]),
        ];
        let file = render(
            &pod,
            "cluster.local",
            &slices,
            &[("10.9.0.1".into(), vec!["kubernetes.default.svc".into()])],
        );
        let line = |ip: &str| {
            file.lines()
                .find(|l| l.starts_with(&format!("{ip}\t")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            line("10.9.0.2").contains(" etcd.a.svc.cluster.local"),
            "{file}"
        );
        assert!(
            line("10.9.0.2").split_whitespace().any(|n| n == "etcd"),
            "{file}"
        );
        assert!(
            line("10.9.0.2").contains("etcd-0.etcd-0.a.svc.cluster.local"),
            "{file}"
        );
        assert_eq!(
            line("10.9.0.3"),
            "",
            "not-ready endpoint must not resolve: {file}"
        );
        // Other namespaces' Services only resolve with their namespace.
        assert!(
            !line("10.9.0.4").split_whitespace().any(|n| n == "other"),
            "{file}"
        );
        assert!(line("10.9.0.4").contains("other.b.svc"), "{file}");
        assert!(line("10.9.0.1").contains("kubernetes.default.svc"));
        assert!(line("10.9.0.5").contains("api-0"));
    }

    #[test]
    fn terminating_endpoints_do_not_resolve() {
        let pod = ForPod {
            namespace: "a",
            hostname: "api-0",
            ip: "10.9.0.5",
        };
        // As the controller publishes a Service with publishNotReadyAddresses:
        // the stopping Pod is still marked ready, and terminating.
        let mut s = slice("a", "etcd-0", &[("10.9.0.2", true, Some("etcd-0"))]);
        s.endpoints[0].conditions = Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(true),
        });
        let file = render(&pod, "cluster.local", &[s], &[]);
        assert!(!file.contains("10.9.0.2"), "{file}");
    }
}
