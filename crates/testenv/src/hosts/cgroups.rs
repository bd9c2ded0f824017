//! Each test host's own cgroup subtree, at the same path in every cgroup
//! hierarchy the machine has mounted: the v1 controllers, named v1
//! hierarchies such as `name=systemd`, and a v2 hierarchy (hybrid hosts).
//! One path for all of them is what a kubelet with the `cgroupfs` driver
//! expects of its `--cgroup-root`, and several kubelets on one machine each
//! need their own.
//!
//! The machine's side creates a host's subtree before it boots and removes
//! it (killing whatever is still in it) when the host stops; inside the host,
//! init moves itself into `<root>/init.scope` and each unit's processes into
//! `<root>/system.slice/<unit>`, as systemd lays a machine out.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys;

/// Every host's subtree is a child of this, in every hierarchy.
pub const PARENT: &str = "/kok-hosts";

/// The cgroup root of the host called `host_name`.
pub fn host_root(host_name: &str) -> String {
    format!("{PARENT}/{host_name}")
}

/// Where init and its sshd live inside a host's root.
pub fn init_scope(root: &str) -> String {
    format!("{root}/init.scope")
}

/// A unit's cgroup inside a host's root, as systemd names it.
pub fn unit_cgroup(root: &str, unit: &str) -> String {
    format!("{root}/system.slice/{unit}")
}

/// Mount points of every cgroup hierarchy mounted here, one per hierarchy
/// (a hierarchy mounted twice counts once), from `/proc/self/mountinfo`.
/// Mounts of a sub-cgroup rather than a hierarchy's root are left out: a
/// path under them would not mean the same cgroup as under the others.
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    parse_mountinfo(&mountinfo)
}

fn parse_mountinfo(mountinfo: &str) -> Vec<PathBuf> {
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - type source super-options
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let fs_type = after.split(' ').next().unwrap_or("");
        if !matches!(fs_type, "cgroup" | "cgroup2") || fields.len() < 5 {
            continue;
        }
        let (device, root, mount_point) = (fields[2], fields[3], fields[4]);
        if root != "/" || !seen.insert(device.to_owned()) {
            continue;
        }
        found.push(PathBuf::from(unescape_mount_path(mount_point)));
    }
    found
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn in_hierarchy(hierarchy: &Path, cgroup: &str) -> PathBuf {
    hierarchy.join(cgroup.trim_start_matches('/'))
}

/// CPU time used by every process that ran in `cgroup` (and its children)
/// since it was created: the v1 `cpuacct.usage` (nanoseconds), else the v2
/// `cpu.stat` `usage_usec`. `None` where neither can be read.
pub fn cpu_time(cgroup: &str) -> Option<Duration> {
    let all = hierarchies();
    all.iter()
        .find_map(|h| {
            let text = fs::read_to_string(in_hierarchy(h, cgroup).join("cpuacct.usage")).ok()?;
            text.trim().parse().ok().map(Duration::from_nanos)
        })
        .or_else(|| {
            all.iter().find_map(|h| {
                let text = fs::read_to_string(in_hierarchy(h, cgroup).join("cpu.stat")).ok()?;
                parse_usage_usec(&text).map(Duration::from_micros)
            })
        })
}

/// `usage_usec` of a v2 `cpu.stat`.
fn parse_usage_usec(cpu_stat: &str) -> Option<u64> {
    cpu_stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// Creates `cgroup` (and its missing parents) in every hierarchy. A new
/// cgroup of the v1 `cpuset` controller starts with no CPUs and no memory
/// nodes, which no process may join; it gets its parent's, as systemd and
/// runc give theirs.
pub fn create(cgroup: &str) -> io::Result<()> {
    for hierarchy in hierarchies() {
        let mut dir = hierarchy.clone();
        for part in Path::new(cgroup.trim_start_matches('/')).components() {
            let parent = dir.clone();
            dir.push(part);
            // A concurrent teardown may remove an empty PARENT between our
            // creating it and its child: try again.
            let mut tries = 0;
            loop {
                match fs::create_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 5 => {
                        tries += 1;
                        let _ = fs::create_dir(&parent);
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("creating {}: {e}", dir.display()),
                        ));
                    }
                }
            }
            inherit_cpuset(&parent, &dir)?;
        }
    }
    Ok(())
}

fn inherit_cpuset(parent: &Path, dir: &Path) -> io::Result<()> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        let Ok(current) = fs::read_to_string(&own) else {
            continue;
        };
        if !current.trim().is_empty() {
            continue;
        }
        let inherited = fs::read_to_string(parent.join(file)).unwrap_or_default();
        if inherited.trim().is_empty() {
            continue;
        }
        fs::write(&own, inherited.trim())
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", own.display())))?;
    }
    Ok(())
}

/// Moves the calling process into `cgroup` in every hierarchy, creating it
/// when missing.
pub fn join(cgroup: &str) -> io::Result<()> {
    create(cgroup)?;
    for hierarchy in hierarchies() {
        let procs = in_hierarchy(&hierarchy, cgroup).join("cgroup.procs");
        fs::write(&procs, "0")
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", procs.display())))?;
    }
    Ok(())
}

/// Moves process `pid` into `cgroup` in every hierarchy, creating it when
/// missing.
pub fn move_into(cgroup: &str, pid: u32) -> io::Result<()> {
    create(cgroup)?;
    for hierarchy in hierarchies() {
        let procs = in_hierarchy(&hierarchy, cgroup).join("cgroup.procs");
        fs::write(&procs, pid.to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", procs.display())))?;
    }
    Ok(())
}

/// The names of `cgroup`'s child cgroups, in any hierarchy.
pub fn children(cgroup: &str) -> BTreeSet<String> {
    hierarchies()
        .iter()
        .filter_map(|h| fs::read_dir(in_hierarchy(h, cgroup)).ok())
        .flat_map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Removes `cgroup` from every hierarchy where it is empty (a shared parent
/// once its last child is gone); one still in use stays.
pub fn remove_if_empty(cgroup: &str) {
    for hierarchy in hierarchies() {
        let _ = fs::remove_dir(in_hierarchy(&hierarchy, cgroup));
    }
}

/// The directories of `cgroup`'s subtree in every hierarchy, children after
/// their parents.
fn subtree(cgroup: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for hierarchy in hierarchies() {
        let top = in_hierarchy(&hierarchy, cgroup);
        if !top.is_dir() {
            continue;
        }
        let mut pending = vec![top];
        while let Some(dir) = pending.pop() {
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        pending.push(entry.path());
                    }
                }
            }
            dirs.push(dir);
        }
    }
    dirs
}

/// Pids (as this process's PID namespace numbers them) of every process in
/// `cgroup` or below it, in any hierarchy.
pub fn processes(cgroup: &str) -> BTreeSet<i32> {
    subtree(cgroup)
        .iter()
        .filter_map(|dir| fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .filter(|&pid| pid > 0)
        .collect()
}

/// Whether `cgroup` exists in any hierarchy.
pub fn exists(cgroup: &str) -> bool {
    hierarchies()
        .iter()
        .any(|h| in_hierarchy(h, cgroup).is_dir())
}

/// Kills every process left in `cgroup`'s subtree and removes the subtree
/// from every hierarchy. A cgroup can only go once the last of its
/// processes has been reaped, so this retries until `limit`.
pub fn remove(cgroup: &str, limit: Duration) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        for pid in processes(cgroup) {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        let dirs = subtree(cgroup);
        for dir in dirs.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
        if !exists(cgroup) {
            break;
        }
        if Instant::now() >= deadline {
            let left: Vec<String> = subtree(cgroup)
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            return Err(io::Error::other(format!(
                "cgroups still there after {limit:?} (processes {:?}): {}",
                processes(cgroup),
                left.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The shared parent goes with its last host; another run creating a host
    // at the same moment retries (see `create`).
    for hierarchy in hierarchies() {
        let _ = fs::remove_dir(in_hierarchy(&hierarchy, PARENT));
    }
    Ok(())
}

/// Names of the hosts that have a subtree under [`PARENT`] in any hierarchy.
pub fn host_names() -> BTreeSet<String> {
    hierarchies()
        .iter()
        .filter_map(|h| fs::read_dir(in_hierarchy(h, PARENT)).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_usage_is_read_from_cpu_stat() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n";
        assert_eq!(parse_usage_usec(stat), Some(1_234_567));
        assert_eq!(parse_usage_usec("user_usec 1\n"), None);
    }

    #[test]
    fn every_hierarchy_once_and_only_whole_ones() {
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime shared:3 - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
90 27 0:29 / /mnt/cpu\\040again rw,relatime - cgroup cgroup rw,cpu
91 27 0:30 /sub /mnt/sub rw,relatime - cgroup cgroup rw,memory
";
        assert_eq!(
            parse_mountinfo(mountinfo),
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu"),
                PathBuf::from("/sys/fs/cgroup/systemd"),
                PathBuf::from("/sys/fs/cgroup/unified"),
            ]
        );
        assert_eq!(unescape_mount_path("/mnt/a\\040b"), "/mnt/a b");
    }

    #[test]
    fn paths_follow_systemds_layout() {
        let root = host_root("kt0a1b2c-0");
        assert_eq!(root, "/kok-hosts/kt0a1b2c-0");
        assert_eq!(init_scope(&root), "/kok-hosts/kt0a1b2c-0/init.scope");
        assert_eq!(
            unit_cgroup(&root, "containerd.service"),
            "/kok-hosts/kt0a1b2c-0/system.slice/containerd.service"
        );
        assert_eq!(
            in_hierarchy(Path::new("/sys/fs/cgroup/pids"), &root),
            PathBuf::from("/sys/fs/cgroup/pids/kok-hosts/kt0a1b2c-0")
        );
    }
}
