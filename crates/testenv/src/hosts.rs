//! SSH test hosts: real sshd in network, mount, UTS, IPC and PID namespaces,
//! so node-operator's installer runs against machines over SSH without
//! touching the machine that runs the tests.
//!
//! Each host of a [`TestHosts`] run has:
//! - its own address on a bridge holding a /24 of 10.213.0.0/16 that nothing
//!   else on the machine uses (the bridge's `.1` is the machine, hosts have
//!   `.2` onwards), and `eth0` with that address. Its default route leads to
//!   the machine, which forwards IPv4 to its other networks (the Pod
//!   runner's bridge, its own addresses) but never out of the machine;
//! - its own sshd with its own ed25519 host key, accepting the run's client
//!   key for root;
//! - its own hostname, and its own processes (its init is PID 1);
//! - its own, initially empty, contents of [`PRIVATE_DIRS`] (and of
//!   [`HostsOptions::extra_private_dirs`]): what one host installs there, no
//!   other host and not the machine sees. `/etc` is the machine's with the
//!   host's own changes on top (an overlay), so files a package writes
//!   there (`/etc/crictl.yaml`) stay the host's; the host has its own
//!   `/etc/hostname` and `/etc/machine-id`. Everything else of the
//!   filesystem is the machine's, shared. `/run`, `/tmp`, `/var/log` and
//!   `/root` are fresh and empty at every boot. Mounts are shared inside the
//!   host (as systemd leaves them) and never reach the machine;
//! - its own cgroup subtree, [`TestHost::cgroup_root`], at the same path in
//!   every cgroup hierarchy (v1 controllers, the named `systemd` one, a v2
//!   one): init and sshd in `<root>/init.scope` and
//!   `<root>/system.slice/ssh.service`, each unit in
//!   `<root>/system.slice/<unit>`. A kubelet given the root as its
//!   `--cgroup-root` puts its Pods in `<root>/kubepods`. The subtree is
//!   removed, after killing whatever is left in it, when the host stops;
//! - `systemctl` and `journalctl` backed by a small service manager (the
//!   host's init) that runs the units in `/etc/systemd/system`: `start`,
//!   `stop`, `restart`, `enable`, `disable`, `daemon-reload`, `is-active`,
//!   `status`, `show`, `kill`, ... with `Restart=`, `Environment=`,
//!   `EnvironmentFile=`, `ExecStartPre=` (`-` ignores a failure),
//!   `KillMode=` (`process` leaves what the main process started running),
//!   `Limit*=` resource limits, `Requires=`/`Wants=`/`After=` (a stop or
//!   restart of a required unit reaches the units requiring it), drop-ins,
//!   and the units enabled into a target started at boot.
//!
//! An HTTP server on the bridge address serves [`TestHosts::artifacts_dir`].
//!
//! A host can be cut off the network and reconnected (everything keeps
//! running), and stopped and started again. Stopping is pulling the power
//! cord: every process of the host dies at once. Starting again is a boot:
//! same name, address and host key, the private directories keep their
//! contents (they are the host's disk), the volatile directories start empty,
//! and enabled units start.
//!
//! Nothing outlives the test process: hosts die with it even when it is
//! SIGKILLed (their init has a parent-death signal, armed from a thread that
//! lives as long as the process), dropping [`TestHosts`] or leaving the
//! process normally (including by a failed test) removes the run's bridge,
//! routing rules, cgroups and files, and the next run removes what a killed
//! run could not.
//!
//! Needs root, `ip`, `ssh`, `ssh-keygen` and `/usr/sbin/sshd`
//! (`scripts/testhost-deps.sh` installs them), and the `kok-testhost` binary
//! of this crate: at `KOK_TESTHOST_BIN` if set, else next to the test binary
//! (`cargo test` of this crate or of the workspace puts it there), else
//! built there on first use.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};
use std::time::Duration;

mod artifacts;
pub(crate) mod cgroups;
mod error;
#[doc(hidden)]
pub mod guest;
mod helper;
mod launch;
mod network;
mod run_dir;
mod tools;

pub use artifacts::Request as ArtifactRequest;
pub use error::Error;
pub use helper::HELPER_ENV;

/// The test process that made the host run a name belongs to (a host's
/// name or cgroup root, a bridge or veth of the run), while the run's
/// directory is there.
pub fn owner_of(name: &str) -> Option<u32> {
    run_dir::owner(run_dir::run_id_of_name(name)?)
}

use crate::sys;
use artifacts::ArtifactServer;
use guest::BootConfig;
use launch::Running;
use network::Subnet;

/// Directories whose contents are each host's own: where packages install
/// and keep their state (a node's containerd, CNI plugins and kubelet among
/// them). Those missing on the machine are created there (empty), as mount
/// points. `/usr/local/sbin` also holds the host's `systemctl`.
pub const PRIVATE_DIRS: [&str; 11] = [
    "/opt",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/etc/kubernetes",
    "/etc/systemd/system",
    "/etc/cni",
    "/etc/containerd",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/lib/kube-on-kube",
];

/// The port every host's sshd listens on.
pub const SSH_PORT: u16 = 22;

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct HostsOptions {
    /// How many hosts; at most 253.
    pub count: usize,
    /// Absolute paths made private on every host in addition to
    /// [`PRIVATE_DIRS`].
    pub extra_private_dirs: Vec<PathBuf>,
}

impl Default for HostsOptions {
    fn default() -> Self {
        HostsOptions {
            count: 1,
            extra_private_dirs: Vec::new(),
        }
    }
}

/// A run of test hosts. Dropping it powers every host off and removes the
/// run's bridge and files.
pub struct TestHosts {
    run: Arc<Run>,
    hosts: Vec<TestHost>,
    artifacts: ArtifactServer,
    artifacts_dir: PathBuf,
    client_key: PathBuf,
    client_key_pem: String,
    client_public_key: String,
    known_hosts: PathBuf,
}

/// One test host of a [`TestHosts`].
pub struct TestHost {
    run: Arc<Run>,
    index: usize,
    name: String,
    ip: Ipv4Addr,
    public_key: String,
}

impl TestHosts {
    /// Starts `count` hosts and waits until each accepts SSH connections.
    /// Blocking; a few seconds at most for a handful of hosts.
    pub fn start(count: usize) -> Result<TestHosts, Error> {
        TestHosts::start_with(HostsOptions {
            count,
            ..HostsOptions::default()
        })
    }

    pub fn start_with(options: HostsOptions) -> Result<TestHosts, Error> {
        if options.count > network::MAX_HOSTS {
            return Err(Error::TooManyHosts {
                count: options.count,
                max: network::MAX_HOSTS,
            });
        }
        let helper = helper::path()?;
        let mut private_dirs: Vec<PathBuf> = PRIVATE_DIRS.iter().map(PathBuf::from).collect();
        private_dirs.extend(options.extra_private_dirs.iter().cloned());
        for dir in &private_dirs {
            if !dir.is_absolute() {
                return Err(Error::io(dir)(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "private directories must be absolute paths",
                )));
            }
            std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        }

        sys::raise_inotify_limits().map_err(Error::io("/proc/sys/fs/inotify"))?;
        let (id, dir, subnet) = {
            let _lock = run_dir::lock()?;
            run_dir::clean_stale()?;
            let (id, dir, subnet) =
                run_dir::create(|taken| network::choose_subnet(taken, sys::random_u64()))?;
            if let Err(e) = network::create_bridge(&id, subnet) {
                let _ = network::delete_links(&[network::bridge_name(&id)]);
                let _ = network::delete_rules(&[network::bridge_name(&id)]);
                let _ = run_dir::remove_tree(&dir);
                return Err(e);
            }
            (id, dir, subnet)
        };
        let run = Arc::new(Run {
            id,
            dir,
            subnet,
            helper,
            private_dirs,
            slots: (0..options.count).map(|_| Mutex::new(None)).collect(),
            torn_down: AtomicBool::new(false),
        });
        register(&run);
        // From here on, dropping `run` on an error cleans up.

        let client_key = run.dir.join("client_key");
        tools::keygen(&client_key, "kok-testenv")?;
        let client_key_pem = read(&client_key)?;
        let client_public_key = public_key_of(&read(&client_key.with_extension("pub"))?);
        let artifacts_dir = run.dir.join("artifacts");
        std::fs::create_dir_all(&artifacts_dir).map_err(Error::io(&artifacts_dir))?;
        let artifacts = ArtifactServer::start(IpAddr::V4(subnet.gateway()), artifacts_dir.clone())?;

        for index in 0..options.count {
            let host_dir = run.host_dir(index);
            std::fs::create_dir_all(&host_dir).map_err(Error::io(&host_dir))?;
            let authorized = host_dir.join("authorized_keys");
            std::fs::write(&authorized, format!("{client_public_key}\n"))
                .map_err(Error::io(authorized))?;
        }
        run.boot(&(0..options.count).collect::<Vec<_>>())?;

        let mut hosts = Vec::with_capacity(options.count);
        let mut known = String::new();
        for index in 0..options.count {
            let key_file = run.host_dir(index).join("ssh_host_ed25519_key.pub");
            let public_key = public_key_of(&read(&key_file)?);
            let ip = subnet.host(index);
            known.push_str(&format!("{ip} {public_key}\n"));
            hosts.push(TestHost {
                run: Arc::clone(&run),
                index,
                name: run.host_name(index),
                ip,
                public_key,
            });
        }
        let known_hosts = run.dir.join("known_hosts");
        std::fs::write(&known_hosts, known).map_err(Error::io(&known_hosts))?;

        Ok(TestHosts {
            run,
            hosts,
            artifacts,
            artifacts_dir,
            client_key,
            client_key_pem,
            client_public_key,
            known_hosts,
        })
    }

    pub fn hosts(&self) -> &[TestHost] {
        &self.hosts
    }

    /// The run's id, part of every host name and interface name.
    pub fn run_id(&self) -> &str {
        &self.run.id
    }

    /// The private key root logs in to every host with (OpenSSH format).
    pub fn client_key_path(&self) -> &Path {
        &self.client_key
    }

    /// [`Self::client_key_path`]'s contents.
    pub fn client_private_key_pem(&self) -> String {
        self.client_key_pem.clone()
    }

    /// `ssh-ed25519 AAAA...`, as in `authorized_keys`.
    pub fn client_public_key(&self) -> &str {
        &self.client_public_key
    }

    /// A `known_hosts` file pinning every host's key to its address.
    pub fn known_hosts_path(&self) -> &Path {
        &self.known_hosts
    }

    /// Files put here are served at [`Self::artifact_url`].
    pub fn artifacts_dir(&self) -> &Path {
        &self.artifacts_dir
    }

    /// `http://<bridge address>:<port>/<file>`, reachable from the hosts and
    /// the machine.
    pub fn artifact_url(&self, file: &str) -> String {
        format!(
            "http://{}/{}",
            self.artifacts.addr(),
            file.trim_start_matches('/')
        )
    }

    /// URL paths requested from the artifact server so far.
    pub fn artifact_requests(&self) -> Vec<String> {
        self.artifacts.requests()
    }

    /// Every request to the artifact server so far, in order: who asked
    /// (hosts of other runs may download here too), the path, and the bytes
    /// of the file sent. What a benchmark counts as bytes moved per host.
    pub fn artifact_log(&self) -> Vec<ArtifactRequest> {
        self.artifacts.log()
    }

    /// The machine's address on the hosts' bridge: servers the hosts should
    /// reach listen here (or on 0.0.0.0).
    pub fn gateway_ip(&self) -> IpAddr {
        IpAddr::V4(self.run.subnet.gateway())
    }

    /// The hosts' subnet, e.g. `10.213.7.0/24`.
    pub fn subnet(&self) -> String {
        self.run.subnet.to_string()
    }

    /// The name of the machine's bridge the hosts are plugged into.
    pub fn bridge(&self) -> String {
        network::bridge_name(&self.run.id)
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        self.run.teardown(true);
    }
}

impl TestHost {
    /// The hostname, also what `hostname` prints on the host.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(self.ip)
    }

    pub fn port(&self) -> u16 {
        SSH_PORT
    }

    /// The host key, `ssh-ed25519 AAAA...`. It survives stop and start.
    pub fn host_public_key(&self) -> &str {
        &self.public_key
    }

    /// `<ip> ssh-ed25519 AAAA...`, a `known_hosts` line for this host.
    pub fn known_hosts_line(&self) -> String {
        format!("{} {}", self.ip, self.public_key)
    }

    /// Runs `command` on the host as root over SSH (a 10 s connect timeout).
    pub fn ssh(&self, command: &str) -> Output {
        self.ssh_with_timeout(command, DEFAULT_CONNECT_TIMEOUT)
    }

    pub fn ssh_with_timeout(&self, command: &str, connect_timeout: Duration) -> Output {
        let mut ssh = self.ssh_command(command, connect_timeout);
        match ssh.stdin(Stdio::null()).output() {
            Ok(output) => output,
            Err(e) => Output {
                // What ssh itself exits with when it cannot do its job.
                status: std::os::unix::process::ExitStatusExt::from_raw(255 << 8),
                stdout: Vec::new(),
                stderr: format!("cannot run ssh: {e}").into_bytes(),
            },
        }
    }

    /// `/usr/bin/ssh` set up to run `command` on this host: the run's client
    /// key, the pinned host key with strict checking, no user configuration.
    pub fn ssh_command(&self, command: &str, connect_timeout: Duration) -> Command {
        let mut ssh = Command::new("/usr/bin/ssh");
        ssh.args(["-F", "/dev/null", "-i"])
            .arg(self.run.dir.join("client_key"))
            .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=yes"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.run.dir.join("known_hosts").display()
            ))
            .args([
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
            ])
            .arg("-o")
            .arg(format!(
                "ConnectTimeout={}",
                connect_timeout.as_secs().max(1)
            ))
            .args(["-p", &SSH_PORT.to_string()])
            .arg(format!("root@{}", self.ip))
            .arg("--")
            .arg(command);
        ssh
    }

    /// Where `path` (under one of the host's private directories) is on the
    /// machine, for putting files on the host or looking at them directly.
    pub fn path_on_host(&self, path: impl AsRef<Path>) -> Option<PathBuf> {
        let path = path.as_ref();
        if !self
            .run
            .private_dirs
            .iter()
            .any(|dir| path.starts_with(dir))
        {
            return None;
        }
        let relative = path.strip_prefix("/").ok()?;
        Some(self.run.host_dir(self.index).join("root").join(relative))
    }

    /// The host's cgroup root, e.g. `/kok-hosts/kt0a1b2c-0`: the same path
    /// in every cgroup hierarchy of the machine (under `/sys/fs/cgroup/*/`),
    /// holding every process of the host while it runs. Give it to a
    /// kubelet as its `--cgroup-root` (with `cgroupDriver: cgroupfs`).
    pub fn cgroup_root(&self) -> String {
        self.run.cgroup_root(self.index)
    }

    /// CPU time everything in the host has used since it booted (its
    /// cgroup root's accounting: sshd, what runs over SSH, its units,
    /// containerd's containers), `None` when the host is off or the machine
    /// has no CPU accounting.
    pub fn cpu_time(&self) -> Option<Duration> {
        if !self.is_running() {
            return None;
        }
        cgroups::cpu_time(&self.cgroup_root())
    }

    /// The host's init and sshd log on the machine.
    pub fn log_path(&self) -> PathBuf {
        self.run.host_dir(self.index).join("log")
    }

    /// The pid, on the machine, of the host's init (PID 1 inside the host),
    /// while the host runs. `nsenter -t PID -a` enters the host.
    pub fn init_pid(&self) -> Option<u32> {
        self.run
            .slot(self.index)
            .as_ref()
            .and_then(Running::init_pid)
    }

    pub fn is_running(&self) -> bool {
        self.run.slot(self.index).is_some()
    }

    /// Powers the host off: all its processes die at once. Its private
    /// directories keep their contents.
    pub fn stop(&self) {
        let running = self.run.slot(self.index).take();
        drop(running);
        self.run.remove_cgroup(self.index);
        // Its end of the veth goes with the namespace, but asynchronously;
        // deleting it now lets `start` create it again at once.
        let _ = network::delete_links(&[network::veth_name(&self.run.id, self.index)]);
    }

    /// Boots the host again after [`Self::stop`] and waits for sshd; a no-op
    /// when it runs.
    pub fn start(&self) -> Result<(), Error> {
        if self.is_running() {
            return Ok(());
        }
        self.run.boot(&[self.index])
    }

    /// Takes the host's link down: it keeps running but nothing reaches it.
    pub fn cut_off(&self) -> Result<(), Error> {
        network::set_link(&network::veth_name(&self.run.id, self.index), false)
    }

    /// Undoes [`Self::cut_off`] and waits until sshd is reachable again.
    pub fn reconnect(&self) -> Result<(), Error> {
        network::set_link(&network::veth_name(&self.run.id, self.index), true)?;
        let addr = SocketAddr::from((self.ip, SSH_PORT));
        if network::wait_until_listening(addr, Duration::from_secs(10)) {
            return Ok(());
        }
        Err(Error::Unreachable {
            host: self.name.clone(),
            what: "reconnecting it",
        })
    }
}

/// Removes what runs of test processes that have died left behind (their
/// bridge, interfaces and files); [`TestHosts::start`] does it first thing.
/// Returns the ids of the runs cleaned.
pub fn clean_stale_runs() -> Result<Vec<String>, Error> {
    let _lock = run_dir::lock()?;
    run_dir::clean_stale()
}

/// What a run's hosts share, and what the exit hook needs to tear it down.
struct Run {
    id: String,
    dir: PathBuf,
    subnet: Subnet,
    helper: PathBuf,
    private_dirs: Vec<PathBuf>,
    slots: Vec<Mutex<Option<Running>>>,
    torn_down: AtomicBool,
}

impl Run {
    fn host_dir(&self, index: usize) -> PathBuf {
        self.dir.join("hosts").join(index.to_string())
    }

    fn host_name(&self, index: usize) -> String {
        format!("kt{}-{index}", self.id)
    }

    fn cgroup_root(&self, index: usize) -> String {
        cgroups::host_root(&self.host_name(index))
    }

    /// Kills whatever is left in a stopped host's cgroups and removes them.
    fn remove_cgroup(&self, index: usize) {
        if let Err(e) = cgroups::remove(&self.cgroup_root(index), Duration::from_secs(10)) {
            eprintln!("kok-testenv: host {}: {e}", self.host_name(index));
        }
    }

    fn slot(&self, index: usize) -> MutexGuard<'_, Option<Running>> {
        self.slots[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn boot(&self, indices: &[usize]) -> Result<(), Error> {
        for &index in indices {
            let root = self.cgroup_root(index);
            if let Err(source) = cgroups::create(&root) {
                for &created in indices {
                    self.remove_cgroup(created);
                }
                return Err(Error::HostSetup {
                    step: format!("create the cgroup {root}"),
                    source,
                });
            }
        }
        let plans: Vec<launch::Plan> = indices
            .iter()
            .map(|&index| launch::Plan {
                index,
                config: BootConfig {
                    hostname: self.host_name(index),
                    state_dir: self.host_dir(index),
                    private_dirs: self.private_dirs.clone(),
                    address: self.subnet.host(index),
                    prefix_len: 24,
                    gateway: self.subnet.gateway(),
                    cgroup_root: Some(self.cgroup_root(index)),
                },
                log: self.host_dir(index).join("log"),
            })
            .collect();
        let running = match launch::boot(&self.helper, &self.id, self.subnet, &plans) {
            Ok(running) => running,
            Err(e) => {
                for &index in indices {
                    self.remove_cgroup(index);
                }
                return Err(e);
            }
        };
        for (&index, running) in indices.iter().zip(running) {
            *self.slot(index) = Some(running);
        }
        Ok(())
    }

    /// Powers every host off and removes the bridge, interfaces and files.
    /// `wait_for_locks` is false in the exit hook, where a lock held by a
    /// thread that will never run again must not hang the exit; a host
    /// skipped then dies by its parent-death signal instead.
    fn teardown(&self, wait_for_locks: bool) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut hosts = Vec::new();
        for slot in &self.slots {
            let guard = if wait_for_locks {
                Some(slot.lock().unwrap_or_else(|p| p.into_inner()))
            } else {
                slot.try_lock().ok()
            };
            if let Some(mut running) = guard.and_then(|mut g| g.take()) {
                running.kill();
                hosts.push(running);
            }
        }
        // Killed all at once above, waited for one by one here.
        drop(hosts);
        for index in 0..self.slots.len() {
            self.remove_cgroup(index);
        }
        let links: Vec<String> = std::iter::once(network::bridge_name(&self.id))
            .chain((0..self.slots.len()).map(|i| network::veth_name(&self.id, i)))
            .collect();
        let _ = network::delete_links(&links);
        let _ = network::delete_rules(&[network::bridge_name(&self.id)]);
        let _ = run_dir::remove_tree(&self.dir);
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.teardown(true);
        live_runs().retain(|run| run.strong_count() > 0);
    }
}

static LIVE_RUNS: Mutex<Vec<Weak<Run>>> = Mutex::new(Vec::new());

fn live_runs() -> MutexGuard<'static, Vec<Weak<Run>>> {
    LIVE_RUNS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Remembers `run` for the exit hook, which tears down the runs nobody
/// dropped: those in statics, or leaked.
fn register(run: &Arc<Run>) {
    crate::watchdog::arm();
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain function; it runs when the process
        // exits normally (which a failing libtest run does too).
        unsafe { libc::atexit(tear_down_live_runs) };
    });
    live_runs().push(Arc::downgrade(run));
}

extern "C" fn tear_down_live_runs() {
    // A panic must not unwind into libc.
    let _ = std::panic::catch_unwind(|| {
        let runs: Vec<Arc<Run>> = match LIVE_RUNS.try_lock() {
            Ok(live) => live.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => return,
        };
        for run in &runs {
            run.teardown(false);
        }
        // The last reference may be ours; dropping it must not wait on the
        // registry lock a dying thread might hold.
        std::mem::forget(runs);
    });
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(Error::io(path))
}

/// `ssh-ed25519 AAAA...` without the comment.
fn public_key_of(line: &str) -> String {
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}
