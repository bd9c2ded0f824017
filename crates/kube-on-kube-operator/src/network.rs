//! Addresses the business cluster's Services get from its Service CIDR, as
//! kube-apiserver and kubeadm allot them: the `kubernetes` Service's (the
//! first), which the serving certificate names and the add-ons dial, and
//! cluster DNS's (the tenth), where CoreDNS answers (kubelets'
//! `clusterDNS`). Pure functions of the spec's `network.serviceCIDR`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The first address of the Service CIDR: the `kubernetes` Service's. None
/// when the CIDR does not parse or holds no such address.
pub fn kubernetes_service_ip(service_cidr: &str) -> Option<IpAddr> {
    nth_address(service_cidr, 1)
}

/// The tenth address of the Service CIDR, where CoreDNS answers. None when
/// the CIDR does not parse or is too small to hold it.
pub fn dns_service_ip(service_cidr: &str) -> Option<IpAddr> {
    nth_address(service_cidr, 10)
}

/// The CIDR's network address plus `n`, when the CIDR has room for it.
fn nth_address(cidr: &str, n: u32) -> Option<IpAddr> {
    let (addr, prefix) = cidr.split_once('/')?;
    let prefix: u32 = prefix.parse().ok()?;
    // Whether 2^host_bits > n, that is, `n` is an address inside.
    let room = |host_bits: u32| host_bits >= 32 || (1u32 << host_bits) > n;
    match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) if prefix <= 32 && room(32 - prefix) => {
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            Some(IpAddr::V4(Ipv4Addr::from((u32::from(v4) & mask) + n)))
        }
        IpAddr::V6(v6) if prefix <= 128 && room(128 - prefix) => {
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            Some(IpAddr::V6(Ipv6Addr::from(
                (u128::from(v6) & mask) + u128::from(n),
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(ip: Option<IpAddr>) -> Option<String> {
        ip.map(|i| i.to_string())
    }

    #[test]
    fn the_kubernetes_service_gets_the_first_address() {
        assert_eq!(
            text(kubernetes_service_ip("10.96.0.0/12")).as_deref(),
            Some("10.96.0.1")
        );
        assert_eq!(
            text(kubernetes_service_ip("10.96.5.7/16")).as_deref(),
            Some("10.96.0.1")
        );
        assert_eq!(
            text(kubernetes_service_ip("fd00::/108")).as_deref(),
            Some("fd00::1")
        );
        assert_eq!(
            text(kubernetes_service_ip("10.96.0.0/31")).as_deref(),
            Some("10.96.0.1")
        );
        assert_eq!(kubernetes_service_ip("10.96.0.0"), None);
        assert_eq!(kubernetes_service_ip("10.96.0.1/32"), None);
        assert_eq!(kubernetes_service_ip("fd00::1/128"), None);
        assert_eq!(kubernetes_service_ip("10.96.0.0/33"), None);
    }

    #[test]
    fn cluster_dns_gets_the_tenth_address() {
        assert_eq!(
            text(dns_service_ip("10.96.0.0/12")).as_deref(),
            Some("10.96.0.10")
        );
        assert_eq!(
            text(dns_service_ip("10.100.5.7/16")).as_deref(),
            Some("10.100.0.10")
        );
        assert_eq!(
            text(dns_service_ip("fd00:10::/108")).as_deref(),
            Some("fd00:10::a")
        );
        assert_eq!(
            text(dns_service_ip("10.0.0.0/28")).as_deref(),
            Some("10.0.0.10")
        );
        assert_eq!(dns_service_ip("10.0.0.0/30"), None);
        assert_eq!(dns_service_ip("fd00::/125"), None);
        assert_eq!(dns_service_ip("nonsense"), None);
    }
}
