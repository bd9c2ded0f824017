//! Each run of test hosts has a directory under `/run/kok-testenv` naming the
//! process that owns it. That record is what lets a later run clean up after
//! one that was SIGKILLed, when no code of the dead run could.
//!
//! Layout of `/run/kok-testenv/<id>/`: `owner` (pid and start time of the test
//! process), `subnet`, the client key, `known_hosts`, `artifacts/`, and
//! `hosts/<index>/` per host (its `init` pid record, host key, log, `root/`
//! holding the contents of its private directories, and `etc/` the upper
//! layer of its `/etc`). Its cgroups and the bridge's routing rules carry
//! the run id in their names, which is how a later run finds them.

use std::fs;
use std::path::{Path, PathBuf};

use std::time::Duration;

use super::cgroups;
use super::error::Error;
use super::network::{self, Subnet};
use crate::sys::{self, FileLock};

const ROOT: &str = "/run/kok-testenv";

/// Serializes run creation and stale cleanup between test processes.
pub fn lock() -> Result<FileLock, Error> {
    fs::create_dir_all(ROOT).map_err(Error::io(ROOT))?;
    let path = Path::new(ROOT).join(".lock");
    FileLock::acquire(&path).map_err(Error::io(path))
}

/// True if the process recorded in `file` (by [`record_process`]) still runs.
fn recorded_process_alive(file: &Path) -> Option<u32> {
    sys::identity_alive(&fs::read_to_string(file).ok()?)
}

pub fn record_process(file: &Path, pid: u32) -> Result<(), Error> {
    let record = sys::process_identity(pid).unwrap_or_else(|| format!("{pid} 0"));
    fs::write(file, record).map_err(Error::io(file))
}

/// Creates the directory of a new run owned by this process. The caller holds
/// the lock, so nobody sees it half made.
pub fn create(
    subnet_for: impl FnOnce(&[Subnet]) -> Result<Subnet, Error>,
) -> Result<(String, PathBuf, Subnet), Error> {
    let taken = live_subnets();
    let subnet = subnet_for(&taken)?;
    loop {
        let id = format!("{:06x}", sys::random_u64() & 0xff_ffff);
        let dir = Path::new(ROOT).join(&id);
        match fs::create_dir(&dir) {
            Ok(()) => {
                record_process(&dir.join("owner"), std::process::id())?;
                let subnet_file = dir.join("subnet");
                fs::write(&subnet_file, subnet.third_octet().to_string())
                    .map_err(Error::io(subnet_file))?;
                return Ok((id, dir, subnet));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(dir)(e)),
        }
    }
}

fn run_dirs() -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(ROOT) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            (!name.starts_with('.') && e.path().is_dir()).then(|| (name, e.path()))
        })
        .collect()
}

fn owner_alive(dir: &Path) -> bool {
    recorded_process_alive(&dir.join("owner")).is_some()
}

/// The process that made run `id`, live or not, while its directory is
/// there.
pub fn owner(id: &str) -> Option<u32> {
    let record = fs::read_to_string(Path::new(ROOT).join(id).join("owner")).ok()?;
    record.split_whitespace().next()?.parse().ok()
}

/// The run id in a name made for a run's host (`kt<run id>-<index>`, its
/// cgroup root's last part) or interface ([`network::run_id_of_interface`]).
pub fn run_id_of_name(name: &str) -> Option<&str> {
    network::run_id_of_interface(name).or_else(|| {
        let (id, index) = name.strip_prefix("kt")?.split_once('-')?;
        let ours = id.len() == 6
            && id.bytes().all(|b| b.is_ascii_hexdigit())
            && !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit());
        ours.then_some(id)
    })
}

fn live_subnets() -> Vec<Subnet> {
    run_dirs()
        .into_iter()
        .filter(|(_, dir)| owner_alive(dir))
        .filter_map(|(_, dir)| {
            let text = fs::read_to_string(dir.join("subnet")).ok()?;
            text.trim().parse().ok().map(Subnet::from_third_octet)
        })
        .collect()
}

/// Removes what runs whose test process has died left behind: their hosts'
/// processes (normally already gone with the test process), interfaces and
/// directories. Returns the ids cleaned. The caller holds the lock.
pub fn clean_stale() -> Result<Vec<String>, Error> {
    let mut cleaned = Vec::new();
    let mut live = Vec::new();
    for (id, dir) in run_dirs() {
        if owner_alive(&dir) {
            live.push(id);
            continue;
        }
        let hosts = dir.join("hosts");
        for host in fs::read_dir(&hosts).into_iter().flatten().flatten() {
            if let Some(pid) = recorded_process_alive(&host.path().join("init")) {
                // Init is PID 1 of the host's PID namespace: killing it kills
                // every process of the host.
                let _ = sys::kill(pid as i32, libc::SIGKILL);
            }
        }
        remove_tree(&dir)?;
        cleaned.push(id);
    }
    let dead = |name: &str| {
        network::run_id_of_interface(name).is_some_and(|id| !live.iter().any(|l| l == id))
    };
    let leftovers: Vec<String> = network::link_names()?
        .into_iter()
        .filter(|name| dead(name))
        .collect();
    network::delete_links(&leftovers)?;
    let rules: Vec<String> = network::bridges_with_rules()?
        .into_iter()
        .filter(|name| dead(name))
        .collect();
    network::delete_rules(&rules)?;
    for host in cgroups::host_names() {
        if run_id_of_name(&host).is_some_and(|id| !live.iter().any(|l| l == id)) {
            cgroups::remove(&cgroups::host_root(&host), Duration::from_secs(10))
                .map_err(Error::io(cgroups::PARENT))?;
        }
    }
    Ok(cleaned)
}

pub fn remove_tree(dir: &Path) -> Result<(), Error> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(dir)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::run_id_of_name;

    #[test]
    fn names_of_a_run_give_its_id() {
        assert_eq!(run_id_of_name("kt0a1b2c-0"), Some("0a1b2c"));
        assert_eq!(run_id_of_name("kt0a1b2c-17"), Some("0a1b2c"));
        assert_eq!(run_id_of_name("kt0a1b2cbr"), Some("0a1b2c"));
        assert_eq!(run_id_of_name("kt0a1b2cv3"), Some("0a1b2c"));
        for other in [
            "kt0a1b2c-",
            "kt0a1b-0",
            "ktzzzzzz-1",
            "kt0a1b2c-x",
            "worker-a1",
        ] {
            assert_eq!(run_id_of_name(other), None, "{other}");
        }
    }
}
