//! The load balancer's addresses: a /24 of 10.212.0.0/16 that no address or
//! route on the machine overlaps, routed to an interface of its own (a bridge
//! with no port: this machine's kernel has no `dummy` links). An
//! address given to a Service is put on that interface, so the machine owns
//! it: the machine reaches it, and so does every network namespace whose
//! default route goes via the machine (Pods, SSH test hosts). An address not
//! given out goes nowhere, as on a real network.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::Error;
use crate::pods::net::{NetError, ip, next_free};
use crate::sys::{self, FileLock};

/// Pools are /24s inside this /16 (the SSH test hosts use 10.213, the Pod
/// runners 10.214 to 10.237).
const POOL: [u8; 2] = [10, 212];

/// Serializes choosing a /24 between test processes: a /24 is taken once its
/// route exists, and the lock covers the time between checking and routing.
const LOCK: &str = "/run/kok-testenv-lb.lock";

/// The last octet of the interface's own address, whose /24 prefix routes
/// the pool to the interface. Without an address of its own, the interface
/// would lose that route with the last Service address taken off it (the
/// kernel flushes a device's routes when its last IPv4 address goes), and
/// an address given to nobody would be routed out of the machine.
const ANCHOR: u8 = 254;

/// Interfaces of live pools, removed by the exit hook: a test binary's
/// statics are never dropped.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One load balancer's /24 and the addresses it has given out.
pub struct Pool {
    interface: String,
    base: [u8; 3],
    used: [bool; 256],
    last: u8,
}

/// `klb<pid in hex>n<count>`: the pid lets a later run find the interfaces
/// of a killed one (at most 15 characters while pids stay under 2^24).
fn interface_name() -> String {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    format!(
        "klb{:x}n{}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::SeqCst)
    )
}

/// The pid in a name made by [`interface_name`].
pub fn owner_of(interface: &str) -> Option<u32> {
    let (pid, count) = interface.strip_prefix("klb")?.split_once('n')?;
    count.parse::<u32>().ok()?;
    u32::from_str_radix(pid, 16).ok()
}

fn ip_output(args: &[&str]) -> Result<String, NetError> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| NetError {
            args: args.join(" "),
            message: e.to_string(),
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether no address or route of the machine falls inside `network` or
/// covers it (the default route aside).
fn free(network: &str) -> Result<bool, NetError> {
    let inside = ip_output(&["-4", "route", "show", "table", "all", "root", network])?;
    let covering = ip_output(&["-4", "route", "show", "table", "all", "match", network])?;
    Ok(inside.trim().is_empty()
        && covering
            .lines()
            .all(|line| line.trim().is_empty() || line.starts_with("default")))
}

impl Pool {
    /// Chooses a free /24 and routes it to a new interface.
    pub fn create() -> Result<Pool, Error> {
        sweep_stale();
        let _lock = FileLock::acquire(Path::new(LOCK)).map_err(|source| Error::Io {
            what: format!("locking {LOCK}"),
            source,
        })?;
        let start = std::process::id() % 256;
        let mut third = None;
        for offset in 0..256 {
            let candidate = ((start + offset) % 256) as u8;
            let network = format!("{}.{}.{candidate}.0/24", POOL[0], POOL[1]);
            if free(&network)? {
                third = Some(candidate);
                break;
            }
        }
        let third = third.ok_or(Error::NoPool)?;
        let interface = interface_name();
        let pool = Pool {
            interface: interface.clone(),
            base: [POOL[0], POOL[1], third],
            // .0 and .255 are the network's and broadcast addresses, .254
            // the anchor.
            used: std::array::from_fn(|i| i == 0 || i == ANCHOR as usize || i == 255),
            last: 0,
        };
        ip(&["link", "add", &interface, "type", "bridge"])?;
        LIVE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(interface.clone());
        install_exit_hook();
        ip(&["link", "set", &interface, "up"])?;
        let anchor = Ipv4Addr::new(POOL[0], POOL[1], third, ANCHOR);
        ip(&["addr", "add", &format!("{anchor}/24"), "dev", &interface])?;
        Ok(pool)
    }

    /// The interface the given-out addresses are on.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The /24, as `10.212.X.0/24`.
    pub fn network(&self) -> String {
        format!(
            "{}/24",
            Ipv4Addr::new(self.base[0], self.base[1], self.base[2], 0)
        )
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        addr.octets()[..3] == self.base
    }

    /// Gives out `wanted` when it is in the pool and free, else the next
    /// free address, and puts it on the interface.
    pub fn take(&mut self, wanted: Option<Ipv4Addr>) -> Result<Ipv4Addr, NetError> {
        let last = match wanted {
            Some(a) if self.contains(a) && !self.used[a.octets()[3] as usize] => a.octets()[3],
            _ => next_free(&self.used, self.last).ok_or_else(|| NetError {
                args: String::new(),
                message: format!("no free address left in {}", self.network()),
            })?,
        };
        let addr = Ipv4Addr::new(self.base[0], self.base[1], self.base[2], last);
        ip(&["addr", "add", &format!("{addr}/32"), "dev", &self.interface])?;
        self.used[last as usize] = true;
        self.last = last;
        Ok(addr)
    }

    /// Gives out exactly `addr`, as a load balancer does for a Service's
    /// `spec.loadBalancerIP`: an error when it is outside the pool or
    /// given to another Service.
    pub fn take_exact(&mut self, addr: Ipv4Addr) -> Result<Ipv4Addr, NetError> {
        let refused = |why: String| NetError {
            args: String::new(),
            message: format!("the requested address {addr} {why}"),
        };
        if !self.contains(addr) {
            return Err(refused(format!("is outside {}", self.network())));
        }
        if self.used[addr.octets()[3] as usize] {
            return Err(refused("is taken (or reserved)".into()));
        }
        self.take(Some(addr))
    }

    /// Takes `addr` off the interface and frees it.
    pub fn release(&mut self, addr: Ipv4Addr) {
        let _ = ip(&["addr", "del", &format!("{addr}/32"), "dev", &self.interface]);
        if self.contains(addr) {
            self.used[addr.octets()[3] as usize] = false;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Its addresses and route go with it.
        let _ = ip(&["link", "del", &self.interface]);
        LIVE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|i| *i != self.interface);
    }
}

fn install_exit_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function with no arguments.
        unsafe { libc::atexit(remove_live_at_exit) };
    });
}

extern "C" fn remove_live_at_exit() {
    // Never block at exit: a pool being made right now is left to the sweep.
    let Ok(live) = LIVE.try_lock() else { return };
    for interface in live.iter() {
        let _ = ip(&["link", "del", interface]);
    }
}

/// Deletes the interfaces (with their addresses and routes) of load
/// balancers whose process is gone.
pub fn sweep_stale() {
    let Ok(out) = ip_output(&["-o", "link", "show", "type", "bridge"]) else {
        return;
    };
    for line in out.lines() {
        let name = line.split(':').nth(1).map(str::trim).unwrap_or_default();
        if let Some(pid) = owner_of(name)
            && !sys::is_running(pid)
        {
            let _ = ip(&["link", "del", name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_fit_and_name_their_process() {
        let name = interface_name();
        assert!(name.len() <= 15, "{name}");
        assert_eq!(owner_of(&name), Some(std::process::id()));
        assert_eq!(owner_of("klb3fffffn12"), Some(0x3fffff));
        assert_eq!(owner_of("klbxyzn1"), None);
        assert_eq!(owner_of("klb12"), None);
        assert_eq!(owner_of("eth0"), None);
    }
}
