//! IP networks in CIDR notation (`10.96.0.0/12`, `fd00::/8`): parsed from
//! flags, and asked whether they hold an address.

use std::net::IpAddr;

/// An IPv4 or IPv6 network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `ip` is in this network (an address of the other family
    /// never is).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(*ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(*ip) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Network {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let refused = || format!("{text:?} is not a network such as 10.96.0.0/12 or fd00::/8");
        let (addr, prefix) = text.split_once('/').ok_or_else(refused)?;
        let addr: IpAddr = addr.parse().map_err(|_| refused())?;
        let prefix: u8 = prefix.parse().map_err(|_| refused())?;
        let longest = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > longest {
            return Err(refused());
        }
        Ok(Network { addr, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_hold_their_addresses_only() {
        let services: Network = "10.96.0.0/12".parse().unwrap();
        assert!(services.contains(&ip("10.96.0.1")));
        assert!(services.contains(&ip("10.111.255.255")));
        assert!(!services.contains(&ip("10.112.0.0")));
        assert!(!services.contains(&ip("fd00::1")));
        let v6: Network = "fd00::/8".parse().unwrap();
        assert!(v6.contains(&ip("fd12::1")) && !v6.contains(&ip("fe80::1")));
        let all: Network = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(&ip("203.0.113.9")));
        let one: Network = "192.0.2.7/32".parse().unwrap();
        assert!(one.contains(&ip("192.0.2.7")) && !one.contains(&ip("192.0.2.8")));
        assert_eq!(services.to_string(), "10.96.0.0/12");
        for bad in [
            "10.96.0.0",
            "10.96.0.0/33",
            "::/129",
            "host/8",
            "10.0.0.0/x",
            "",
        ] {
            assert!(bad.parse::<Network>().is_err(), "{bad}");
        }
    }
}
