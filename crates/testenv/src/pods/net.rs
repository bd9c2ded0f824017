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

fn ip(args: &[&str]) -> Result<(), NetError> {
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
    used: Mutex<[bool; 256]>,
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
            used: Mutex::new(used),
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
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            let free = used.iter().position(|u| !u).ok_or_else(|| NetError {
                args: String::new(),
                message: "no free Pod address on the runner's /24".into(),
            })?;
            used[free] = true;
            free as u8
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
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used[addr.octets()[3] as usize] = false;
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let used = *self.used.lock().unwrap_or_else(|p| p.into_inner());
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
pub fn run_id() -> String {
    format!("{:x}", std::process::id())
}

/// Delete bridges and namespaces of runs whose process no longer exists.
pub fn sweep_stale() {
    let alive = |id: &str| {
        u32::from_str_radix(id, 16)
            .map(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .unwrap_or(true)
    };
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(id) = name
                .strip_prefix("kp")
                .and_then(|r| r.split_once('-'))
                .map(|(id, _)| id)
                && !alive(id)
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
                && !alive(id)
            {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}
