//! The machine's side of the test hosts' network: one bridge per run holding
//! a /24 nobody else on the machine uses, and one veth pair per host whose
//! inner end is the host's `eth0`.
//!
//! Hosts have their default route via the bridge's address, and the machine
//! forwards IPv4 (`net.ipv4.ip_forward=1`) between the bridge and its other
//! networks: the Pod runner's bridge, other runs' bridges, addresses of its
//! own. Nothing a host sends leaves the machine: policy-routing rules per
//! bridge let packets arriving on it use every route of the main table but
//! the default one and those to the networks the default route leads
//! through, and answer the rest with "network unreachable".

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use super::error::Error;
use super::tools;

/// Test subnets are /24s inside this /16.
const POOL: [u8; 2] = [10, 213];

/// Addresses .2 to .254 of the /24 go to hosts.
pub const MAX_HOSTS: usize = 253;

/// One run's /24: the bridge has .1, host `i` has `.(i + 2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subnet {
    third_octet: u8,
}

impl Subnet {
    pub fn from_third_octet(third_octet: u8) -> Subnet {
        Subnet { third_octet }
    }

    pub fn third_octet(self) -> u8 {
        self.third_octet
    }

    pub fn network(self) -> Ipv4Addr {
        Ipv4Addr::new(POOL[0], POOL[1], self.third_octet, 0)
    }

    pub fn gateway(self) -> Ipv4Addr {
        Ipv4Addr::new(POOL[0], POOL[1], self.third_octet, 1)
    }

    /// A fixed MAC address for `ip`, so that a rebooted host (or a bridge
    /// whose ports changed) keeps its address and nobody's ARP cache goes
    /// stale: locally administered, then the address's last three bytes.
    pub fn mac(ip: Ipv4Addr) -> String {
        let [_, b, c, d] = ip.octets();
        format!("02:6b:74:{b:02x}:{c:02x}:{d:02x}")
    }

    pub fn host(self, index: usize) -> Ipv4Addr {
        // Callers keep index below MAX_HOSTS, so this stays in .2..=.254.
        let last = u8::try_from(index + 2).unwrap_or(254);
        Ipv4Addr::new(POOL[0], POOL[1], self.third_octet, last)
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/24", self.network())
    }
}

/// An IPv4 prefix as `ip` prints it (`10.0.0.0/8`, or a bare address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefix {
    addr: u32,
    len: u32,
}

impl Prefix {
    fn parse(text: &str) -> Option<Prefix> {
        let (addr, len) = match text.split_once('/') {
            Some((addr, len)) => (addr, len.parse().ok()?),
            None => (text, 32),
        };
        let addr: Ipv4Addr = addr.parse().ok()?;
        (len <= 32).then_some(Prefix {
            addr: u32::from(addr),
            len,
        })
    }

    fn mask(len: u32) -> u32 {
        u32::MAX.checked_shl(32 - len).unwrap_or(0)
    }

    fn overlaps(self, other: Prefix) -> bool {
        let mask = Self::mask(self.len.min(other.len));
        self.addr & mask == other.addr & mask
    }
}

/// The prefixes of every IPv4 address and route on the machine, except the
/// default route, which overlaps everything without being in the way.
fn prefixes_in_use() -> Result<Vec<Prefix>, Error> {
    let addrs = ip_output(&["-o", "-4", "addr", "show"])?;
    let routes = ip_output(&["-4", "route", "show", "table", "all"])?;
    let from_addrs = addrs.lines().filter_map(|line| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "inet")?;
        Prefix::parse(words.next()?)
    });
    let from_routes = routes.lines().filter_map(|line| {
        // Route lines may start with a type (`local`, `broadcast`, ...).
        line.split_whitespace().take(2).find_map(Prefix::parse)
    });
    Ok(from_addrs.chain(from_routes).collect())
}

/// Picks a random /24 of the pool that overlaps nothing on the machine and no
/// subnet of another live run (`taken`). Callers hold the run lock so two runs
/// cannot pick the same one between this check and creating the bridge.
pub fn choose_subnet(taken: &[Subnet], random: u64) -> Result<Subnet, Error> {
    let in_use = prefixes_in_use()?;
    let start = (random % 256) as u16;
    (0..256u16)
        .map(|offset| Subnet::from_third_octet(((start + offset) % 256) as u8))
        .find(|candidate| {
            let prefix = Prefix {
                addr: u32::from(candidate.network()),
                len: 24,
            };
            !taken.contains(candidate) && !in_use.iter().any(|p| p.overlaps(prefix))
        })
        .ok_or(Error::NoSubnet)
}

pub fn bridge_name(run_id: &str) -> String {
    format!("kt{run_id}br")
}

/// The machine-side end of host `index`'s veth pair (at most 12 characters
/// with a 6-character run id, under the kernel's 15).
pub fn veth_name(run_id: &str, index: usize) -> String {
    format!("kt{run_id}v{index}")
}

/// The run id in an interface name made by [`bridge_name`] or [`veth_name`].
pub fn run_id_of_interface(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("kt")?;
    let (id, suffix) = rest.split_at_checked(6)?;
    let ours = suffix == "br"
        || suffix
            .strip_prefix('v')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (ours && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Priorities of a bridge's policy-routing rules: the machine's external
/// networks unreachable, then any route of the main table but its default
/// route, else unreachable.
const RULE_EXTERNAL: u32 = 999;
const RULE_ROUTES: u32 = 1000;
const RULE_UNREACHABLE: u32 = 1001;
/// At most this many external networks are fenced off per bridge.
const MAX_EXTERNAL: usize = 16;

fn rules(bridge: &str, external: &[String]) -> String {
    let mut batch: String = external
        .iter()
        .take(MAX_EXTERNAL)
        .map(|net| format!("rule add priority {RULE_EXTERNAL} iif {bridge} to {net} unreachable\n"))
        .collect();
    batch.push_str(&format!(
        "rule add priority {RULE_ROUTES} iif {bridge} lookup main suppress_prefixlength 0\n\
         rule add priority {RULE_UNREACHABLE} iif {bridge} unreachable\n"
    ));
    batch
}

/// The networks of the interfaces the machine's default routes go through
/// (its LAN): as much "off the machine" as the default route itself.
fn external_networks() -> Result<Vec<String>, Error> {
    let routes = ip_output(&["-4", "route", "show", "default"])?;
    let devices: Vec<&str> = routes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "dev")?;
            words.next()
        })
        .collect();
    let mut networks = Vec::new();
    for device in devices {
        let addrs = ip_output(&["-o", "-4", "addr", "show", "dev", device])?;
        for prefix in addrs.lines().filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            Prefix::parse(words.next()?)
        }) {
            let network = Ipv4Addr::from(prefix.addr & Prefix::mask(prefix.len));
            networks.push(format!("{network}/{}", prefix.len));
        }
    }
    networks.sort();
    networks.dedup();
    Ok(networks)
}

/// Removes the policy-routing rules of `bridges`, ignoring those gone.
pub fn delete_rules(bridges: &[String]) -> Result<(), Error> {
    if bridges.is_empty() {
        return Ok(());
    }
    let mut batch = String::new();
    for bridge in bridges {
        for _ in 0..MAX_EXTERNAL {
            batch.push_str(&format!("rule del priority {RULE_EXTERNAL} iif {bridge}\n"));
        }
        for priority in [RULE_ROUTES, RULE_UNREACHABLE] {
            batch.push_str(&format!("rule del priority {priority} iif {bridge}\n"));
        }
    }
    ip_batch(&batch, true)
}

/// The bridges (by name, which may be gone) that have rules of ours.
pub fn bridges_with_rules() -> Result<Vec<String>, Error> {
    let out = ip_output(&["-4", "rule", "show"])?;
    let mut found: Vec<String> = out
        .lines()
        .filter(|line| {
            line.split(':').next().is_some_and(|p| {
                [RULE_EXTERNAL, RULE_ROUTES, RULE_UNREACHABLE]
                    .iter()
                    .any(|r| p.trim() == r.to_string())
            })
        })
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "iif")?;
            words.next().map(str::to_owned)
        })
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

/// Turns on IPv4 forwarding on the machine, which stays on: other runs and
/// the Pod runner may rely on it by then.
fn enable_forwarding() -> Result<(), Error> {
    let path = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(Error::io(path))
}

pub fn create_bridge(run_id: &str, subnet: Subnet) -> Result<(), Error> {
    let bridge = bridge_name(run_id);
    enable_forwarding()?;
    // Hosts talk IPv4 only; without IPv6 the bridge sends no router
    // solicitations or MLD reports.
    ip_batch(
        &format!(
            "link add {bridge} address {mac} type bridge forward_delay 0 stp_state 0\n\
             addr add {gateway}/24 dev {bridge}\n",
            gateway = subnet.gateway(),
            mac = Subnet::mac(subnet.gateway()),
        ),
        false,
    )?;
    disable_ipv6(&bridge);
    ip_batch(&rules(&bridge, &external_networks()?), false)?;
    ip_batch(&format!("link set {bridge} up\n"), false)
}

/// Connects hosts to the bridge: `(index, pid)` where `pid` is a process in
/// the host's network namespace. One `ip` call for all of them, because 200
/// separate calls would dominate the start time of a large run.
pub fn connect_hosts(run_id: &str, subnet: Subnet, hosts: &[(usize, u32)]) -> Result<(), Error> {
    let bridge = bridge_name(run_id);
    let mut create = String::new();
    let mut attach = String::new();
    for &(index, pid) in hosts {
        let veth = veth_name(run_id, index);
        let mac = Subnet::mac(subnet.host(index));
        create.push_str(&format!(
            "link add {veth} type veth peer name eth0 address {mac} netns {pid}\n"
        ));
        attach.push_str(&format!("link set {veth} master {bridge} up\n"));
    }
    retry_while_busy(|| ip_batch(&create, false))?;
    for &(index, _) in hosts {
        disable_ipv6(&veth_name(run_id, index));
    }
    ip_batch(&attach, false)
}

/// A veth of a host that was just stopped may still be on its way out while
/// the same name is created again.
fn retry_while_busy(mut op: impl FnMut() -> Result<(), Error>) -> Result<(), Error> {
    let mut tries = 0;
    loop {
        match op() {
            Err(Error::Command { detail, .. }) if detail.contains("File exists") && tries < 40 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

pub fn set_link(name: &str, up: bool) -> Result<(), Error> {
    let state = if up { "up" } else { "down" };
    ip_batch(&format!("link set {name} {state}\n"), false)
}

/// Deletes interfaces, ignoring those already gone.
pub fn delete_links(names: &[String]) -> Result<(), Error> {
    if names.is_empty() {
        return Ok(());
    }
    let batch: String = names.iter().map(|n| format!("link del {n}\n")).collect();
    ip_batch(&batch, true)
}

/// Names of every interface on the machine.
pub fn link_names() -> Result<Vec<String>, Error> {
    let out = ip_output(&["-o", "link", "show"])?;
    Ok(out
        .lines()
        .filter_map(|line| {
            let name = line.split(':').nth(1)?.trim();
            // A veth prints as `name@peer`.
            Some(name.split('@').next().unwrap_or(name).to_owned())
        })
        .collect())
}

fn disable_ipv6(interface: &str) {
    // Missing when IPv6 is off in the kernel, which is just as good.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{interface}/disable_ipv6"),
        "1",
    );
}

fn ip_output(args: &[&str]) -> Result<String, Error> {
    tools::run(
        Command::new("ip").args(args),
        "",
        &format!("ip {}", args.join(" ")),
    )
}

/// Runs `ip -batch -` over `script`. With `force`, `ip` carries on past
/// failing lines and failures are ignored.
pub fn ip_batch(script: &str, force: bool) -> Result<(), Error> {
    let mut command = Command::new("ip");
    if force {
        command.arg("-force");
    }
    command.args(["-batch", "-"]);
    let what = format!("ip -batch ({})", script.lines().next().unwrap_or(""));
    match tools::run(&mut command, script, &what) {
        Err(Error::Command { .. }) if force => Ok(()),
        other => other.map(drop),
    }
}

/// Polls until something accepts TCP connections at `addr`; false if nothing
/// does within `limit`.
pub fn wait_until_listening(addr: SocketAddr, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_overlap_when_one_contains_the_other() {
        let p = |s| Prefix::parse(s).unwrap();
        assert!(p("10.0.0.0/8").overlaps(p("10.213.7.0/24")));
        assert!(p("10.213.7.9").overlaps(p("10.213.7.0/24")));
        assert!(!p("10.213.8.0/24").overlaps(p("10.213.7.0/24")));
        assert!(!p("192.0.2.0/24").overlaps(p("10.213.7.0/24")));
    }

    #[test]
    fn interface_names_fit_and_parse_back() {
        let id = "0a1b2c";
        assert_eq!(run_id_of_interface(&bridge_name(id)), Some(id));
        let veth = veth_name(id, MAX_HOSTS - 1);
        assert!(veth.len() <= 15);
        assert_eq!(run_id_of_interface(&veth), Some(id));
        assert_eq!(run_id_of_interface("eth0"), None);
        assert_eq!(run_id_of_interface("kt0a1b2cvx"), None);
    }

    #[test]
    fn host_addresses_start_after_the_gateway() {
        let s = Subnet::from_third_octet(7);
        assert_eq!(s.gateway(), Ipv4Addr::new(10, 213, 7, 1));
        assert_eq!(s.host(0), Ipv4Addr::new(10, 213, 7, 2));
        assert_eq!(s.host(MAX_HOSTS - 1), Ipv4Addr::new(10, 213, 7, 254));
        assert_eq!(s.to_string(), "10.213.7.0/24");
        assert_eq!(Subnet::mac(s.host(0)), "02:6b:74:d5:07:02");
    }
}
