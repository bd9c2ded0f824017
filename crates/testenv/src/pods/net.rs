//! Pod networking: every Pod gets a network namespace with its own address on
//! the runner's bridge, like a CNI bridge plugin would give it; the bridge's
//! gateway address belongs to the machine, so the machine reaches every Pod.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Mutex;

/// Errors from `ip`.
#[derive(Debug, thiserror::Error)]
#[error("`ip {args}` failed: {message}")]
pub struct NetError {
    pub args: String,
    pub message: String,
}

pub(crate) fn ip(args: &[&str]) -> Result<(), NetError> {
    let fail = |message: String| NetError {
        args: args.join(" "),
        message,
    };
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// The runner's bridge and its /24.
pub struct PodNetwork {
    run_id: String,
    bridge: String,
    base: [u8; 3],
    addresses: Mutex<Addresses>,
}

/// The /24's last octets: which are taken, and the one given out last.
struct Addresses {
    used: [bool; 256],
    last: u8,
}

/// The first free octet after `last`, wrapping around, as a CNI's host-local
/// IPAM hands out addresses: a deleted Pod's address is taken again only
/// once every other one has been. Given out again at once, it reached the new
/// Pod while other Pods still had the old Pod's link-layer address for it
/// (their neighbour entries outlive it by tens of seconds), and connections
/// to it went nowhere.
pub(crate) fn next_free(used: &[bool; 256], last: u8) -> Option<u8> {
    (1..=256usize)
        .map(|step| (last as usize + step) % 256)
        .find(|&i| !used[i])
        .map(|i| i as u8)
}

impl PodNetwork {
    /// Create the bridge `kpb<run_id>` with `<base>.1/24` on it.
    pub fn create(run_id: &str, base: [u8; 3]) -> Result<PodNetwork, NetError> {
        let bridge = format!("kpb{run_id}");
        let _ = ip(&["link", "del", &bridge]);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        let gateway = format!("{}/24", Ipv4Addr::new(base[0], base[1], base[2], 1));
        ip(&["addr", "add", &gateway, "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        let mut used = [false; 256];
        used[0] = true;
        used[1] = true;
        used[255] = true;
        Ok(PodNetwork {
            run_id: run_id.to_string(),
            bridge,
            base,
            addresses: Mutex::new(Addresses { used, last: 1 }),
        })
    }

    /// The machine's address on the bridge (the Pods' default gateway).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.base[0], self.base[1], self.base[2], 1)
    }

    /// Path of a Pod's network namespace.
    pub fn netns_path(name: &str) -> String {
        format!("/run/netns/{name}")
    }

    /// Give a Pod a network namespace and an address; returns (netns name, IP).
    pub fn attach(&self) -> Result<(String, Ipv4Addr), NetError> {
        let last = {
            let mut addresses = self.addresses.lock().unwrap_or_else(|p| p.into_inner());
            let free = next_free(&addresses.used, addresses.last).ok_or_else(|| NetError {
                args: String::new(),
                message: "no free Pod address on the runner's /24".into(),
            })?;
            addresses.used[free as usize] = true;
            addresses.last = free;
            free
        };
        let addr = Ipv4Addr::new(self.base[0], self.base[1], self.base[2], last);
        let ns = format!("kp{}-{last}", self.run_id);
        let host_end = format!("kv{}-{last}", self.run_id);
        let pod_end = format!("kq{}-{last}", self.run_id);
        let setup = || -> Result<(), NetError> {
            let _ = ip(&["netns", "del", &ns]);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &pod_end,
            ])?;
            ip(&["link", "set", &pod_end, "netns", &ns])?;
            ip(&["link", "set", &host_end, "master", &self.bridge, "up"])?;
            ip(&["-n", &ns, "link", "set", &pod_end, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                "default",
                "via",
                &self.gateway().to_string(),
            ])
        };
        match setup() {
            Ok(()) => Ok((ns, addr)),
            Err(e) => {
                self.detach(&ns, addr);
                Err(e)
            }
        }
    }

    /// Remove a Pod's namespace (its veth goes with it) and free its address.
    pub fn detach(&self, ns: &str, addr: Ipv4Addr) {
        let _ = ip(&["netns", "del", ns]);
        let _ = ip(&[
            "link",
            "del",
            &format!("kv{}-{}", self.run_id, addr.octets()[3]),
        ]);
        let mut addresses = self.addresses.lock().unwrap_or_else(|p| p.into_inner());
        addresses.used[addr.octets()[3] as usize] = false;
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let used = self
            .addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .used;
        for (last, taken) in used.iter().enumerate().take(255).skip(2) {
            if *taken {
                let _ = ip(&["netns", "del", &format!("kp{}-{last}", self.run_id)]);
            }
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Run id of this process: its PID in hex, so leftovers of a killed run can be
/// recognised (their PID is gone) and removed by the next run.
/// The /24s runners may have: `10.214.0.0/24` to `10.237.255.0/24`.
const SUBNETS: u32 = 24 * 256;
/// Where each claimed /24 names the process holding it (`<k>`: `pid start`).
const CLAIMS: &str = "/run/kok-testenv/pod-subnets";

/// Claims a /24 for this process's runner: the first one from a place its
/// pid picks that no live process holds (or this one already holds). Test
/// processes run side by side, and two runners on one /24 would route each
/// other's Pods to the wrong bridge.
pub(crate) fn claim_subnet() -> std::io::Result<[u8; 3]> {
    let claims = std::path::Path::new(CLAIMS);
    std::fs::create_dir_all(claims)?;
    let _lock = crate::sys::FileLock::acquire(&claims.join(".lock"))?;
    let pid = std::process::id();
    let mine = crate::sys::process_identity(pid).unwrap_or_else(|| format!("{pid} 0"));
    for step in 0..SUBNETS {
        let k = (pid + step) % SUBNETS;
        let file = claims.join(k.to_string());
        match std::fs::read_to_string(&file) {
            Ok(record)
                if record.trim() != mine && crate::sys::identity_alive(&record).is_some() =>
            {
                continue;
            }
            _ => {}
        }
        std::fs::write(&file, &mine)?;
        return Ok([10, 214 + (k / 256) as u8, (k % 256) as u8]);
    }
    Err(std::io::Error::other(format!(
        "every Pod subnet in {CLAIMS} is held by a live process"
    )))
}

pub fn run_id() -> String {
    format!("{:x}", std::process::id())
}

/// The pid whose Pod network a name belongs to: a bridge `kpb<run id>`, a
/// namespace `kp<run id>-<n>` or a veth end `kv…`/`kq…` ([`run_id`]).
pub fn owner_pid_of_name(name: &str) -> Option<u32> {
    let hex = |id: &str| {
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(id, 16).ok())
            .flatten()
    };
    if let Some(id) = name.strip_prefix("kpb")
        && !id.contains('-')
    {
        return hex(id);
    }
    let rest = ["kp", "kv", "kq"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))?;
    let (id, index) = rest.split_once('-')?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
        .then(|| hex(id))
        .flatten()
}

/// Delete bridges and namespaces of runs whose process no longer exists.
pub fn sweep_stale() {
    remove_runs(|id| {
        u32::from_str_radix(id, 16)
            .map(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(false)
    });
}

/// Delete this process's bridge and namespaces (their veths go with them):
/// at exit, for a runner that is never dropped (one held for the whole test
/// binary).
pub fn remove_own() {
    let own = run_id();
    remove_runs(|id| id == own);
}

/// Delete the bridges and namespaces of the runs whose id `gone` picks.
fn remove_runs(gone: impl Fn(&str) -> bool) {
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(id) = name
                .strip_prefix("kp")
                .and_then(|r| r.split_once('-'))
                .map(|(id, _)| id)
                && gone(id)
            {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
    if let Ok(out) = Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split(':').nth(1).map(str::trim).unwrap_or_default();
            if let Some(id) = name.strip_prefix("kpb")
                && gone(id)
            {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{next_free, owner_pid_of_name};

    #[test]
    fn names_of_a_pod_network_give_the_pid_of_their_runner() {
        assert_eq!(owner_pid_of_name("kpb1f2a"), Some(0x1f2a));
        assert_eq!(owner_pid_of_name("kp1f2a-3"), Some(0x1f2a));
        assert_eq!(owner_pid_of_name("kv1f2a-12"), Some(0x1f2a));
        assert_eq!(owner_pid_of_name("kq1f2a-12"), Some(0x1f2a));
        for other in [
            "eth0",
            "kp-3",
            "kpzz-1",
            "kv1f2a-",
            "kv1f2a-x",
            "kpb",
            "kt0a1b2cbr",
        ] {
            assert_eq!(owner_pid_of_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_freed_address_is_given_out_again_only_after_the_others() {
        let mut used = [false; 256];
        used[0] = true;
        used[1] = true;
        used[255] = true;
        assert_eq!(next_free(&used, 1), Some(2));
        used[2] = true;
        assert_eq!(next_free(&used, 2), Some(3));
        used[3] = true;
        // 2 is freed: 4 comes first all the same.
        used[2] = false;
        assert_eq!(next_free(&used, 3), Some(4));
        // At the top of the range, the search wraps around to what is free.
        assert_eq!(next_free(&used, 254), Some(2));
        let full = [true; 256];
        assert_eq!(next_free(&full, 7), None);
    }
}
