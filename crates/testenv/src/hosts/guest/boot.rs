//! How a test host comes up: a launcher process creates the host's
//! namespaces and forks the host's init (PID 1 inside them), which lays out
//! the host's private filesystem, configures `eth0`, starts sshd and the
//! enabled units, and then serves as the host's service manager.
//!
//! The launcher and the test process talk over the launcher's stdin and
//! stdout, one line at a time:
//! launcher → `pid N` (init's pid on the machine; the network namespace
//! exists), test → `net` (the veth is in place), init → `up` (sshd accepts
//! connections) or `error ...`. The test process then keeps stdin open for as
//! long as the host should live; end of file on it ends the host.

use std::convert::Infallible;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::manager::Manager;
use super::{LOG_DIR, STATE_MOUNT};
use crate::hosts::error::Error;
use crate::hosts::{cgroups, network, sys, tools};

/// Everything a host needs to know to boot, passed as JSON on the command line.
#[derive(Debug, Serialize, Deserialize)]
pub struct BootConfig {
    pub hostname: String,
    /// The host's directory on the machine.
    pub state_dir: PathBuf,
    /// Directories that get the host's own (initially empty) contents.
    pub private_dirs: Vec<PathBuf>,
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    /// The machine's address on the bridge: the host's default gateway.
    pub gateway: Ipv4Addr,
    /// The host's cgroup root (the same path in every hierarchy), which the
    /// machine created; init moves into `<root>/init.scope`.
    pub cgroup_root: Option<String>,
}

/// Directories every host gets fresh and empty at each boot, as a machine's
/// volatile directories are, and so that nothing a host writes there reaches
/// the machine.
const VOLATILE_DIRS: [(&str, &str); 4] = [
    ("/run", "mode=755"),
    ("/tmp", "mode=1777"),
    ("/var/log", "mode=755"),
    ("/root", "mode=700"),
];

/// Where the host's `systemctl` and `journalctl` go: first on `PATH`. One of
/// the host's private directories, so it is put there again at each boot.
const TOOL_DIR: &str = "/usr/local/sbin";

/// Tools the host's service manager answers for.
const TOOLS: [&str; 2] = ["systemctl", "journalctl"];

/// The launcher: `kok-testhost boot CONFIG`.
pub fn main(config: Option<&OsString>) -> ExitCode {
    let config = match config
        .and_then(|c| c.to_str())
        .map(serde_json::from_str::<BootConfig>)
    {
        Some(Ok(config)) => config,
        other => {
            eprintln!("kok-testhost boot: bad or missing configuration: {other:?}");
            return ExitCode::from(2);
        }
    };
    // Only the launcher's children enter the new PID namespace, so init must
    // be a child; the launcher stays behind as its parent so that the test
    // process can wait for the whole host.
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWPID;
    if let Err(e) = sys::unshare(flags) {
        println!(
            "error unshare(CLONE_NEWNS|CLONE_NEWUTS|CLONE_NEWIPC|CLONE_NEWNET|CLONE_NEWPID): {e}"
        );
        return ExitCode::from(1);
    }
    let (alive_read, alive_write) = match sys::pipe() {
        Ok(pipe) => pipe,
        Err(e) => {
            println!("error pipe: {e}");
            return ExitCode::from(1);
        }
    };
    let _ = std::io::stdout().flush();
    // The launcher has not started any thread, so forking is sound.
    match sys::fork() {
        Err(e) => {
            println!("error fork: {e}");
            ExitCode::from(1)
        }
        Ok(sys::Forked::Child) => {
            drop(alive_write);
            let code = init(config, alive_read);
            std::process::exit(code)
        }
        Ok(sys::Forked::Parent(pid)) => {
            drop(alive_read);
            println!("pid {pid}");
            let _ = std::io::stdout().flush();
            // From here on only init talks to the test process.
            if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
                let _ = sys::dup_onto(&null, 0);
                let _ = sys::dup_onto(&null, 1);
            }
            let code = wait_for(pid);
            drop(alive_write);
            ExitCode::from(code)
        }
    }
}

fn wait_for(pid: i32) -> u8 {
    let mut status = 0;
    loop {
        // SAFETY: waitpid with a valid pointer to an int.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret == pid {
            break;
        }
        if ret == -1 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return 1;
        }
    }
    if libc::WIFEXITED(status) {
        u8::try_from(libc::WEXITSTATUS(status)).unwrap_or(1)
    } else {
        128u8.saturating_add(u8::try_from(libc::WTERMSIG(status)).unwrap_or(0))
    }
}

/// The host's PID 1. Returns only on failure or when the test process lets
/// go of the host.
fn init(config: BootConfig, alive: std::os::fd::OwnedFd) -> i32 {
    if sys::die_with_parent().is_err() {
        return 1;
    }
    // The launcher may have died before prctl took effect, in which case no
    // signal will come: its end of the pipe is then already closed.
    if sys::wait_readable(&alive, Duration::ZERO).unwrap_or(true) {
        return 1;
    }
    drop(alive);
    let (control_in, mut control_out) = match take_control_pipes(&config) {
        Ok(pipes) => pipes,
        Err(e) => {
            println!("error {e}");
            return 1;
        }
    };
    match run(&config, control_in, &mut control_out) {
        Ok(never) => match never {},
        Err(e) => {
            let _ = writeln!(control_out, "error {e}");
            eprintln!("kok-testhost init: {e}");
            1
        }
    }
}

/// Moves the control pipes off stdin and stdout, which from then on are
/// /dev/null and the host's log, so that no process of the host inherits
/// them and keeps the test process waiting.
fn take_control_pipes(config: &BootConfig) -> Result<(File, File), Error> {
    let log_path = config.state_dir.join("log");
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(Error::io(&log_path))?;
    let null = File::options()
        .read(true)
        .open("/dev/null")
        .map_err(Error::io("/dev/null"))?;
    let setup = |step: &'static str| {
        move |source| Error::HostSetup {
            step: step.into(),
            source,
        }
    };
    let input = sys::dup_cloexec(0).map_err(setup("duplicate stdin"))?;
    let output = sys::dup_cloexec(1).map_err(setup("duplicate stdout"))?;
    sys::dup_onto(&null, 0).map_err(setup("redirect stdin"))?;
    sys::dup_onto(&log, 1).map_err(setup("redirect stdout"))?;
    sys::dup_onto(&log, 2).map_err(setup("redirect stderr"))?;
    Ok((File::from(input), File::from(output)))
}

fn run(
    config: &BootConfig,
    mut control_in: File,
    control_out: &mut File,
) -> Result<Infallible, Error> {
    // First, so that every process of the host starts inside its cgroups.
    if let Some(root) = &config.cgroup_root {
        let scope = cgroups::init_scope(root);
        cgroups::join(&scope).map_err(|source| Error::HostSetup {
            step: format!("move init into the cgroup {scope}"),
            source,
        })?;
    }
    set_up_filesystem(config)?;
    sys::sethostname(&config.hostname).map_err(|source| Error::HostSetup {
        step: format!("set the hostname to {}", config.hostname),
        source,
    })?;
    ensure_host_key(&config.hostname)?;
    write_sshd_config()?;

    let waited = sys::read_line_until(&mut control_in, Instant::now() + Duration::from_secs(120));
    if !matches!(&waited, Ok(Some(line)) if line == "net") {
        return Err(Error::Boot {
            host: config.hostname.clone(),
            detail: format!("expected `net` from the test process, got {waited:?}"),
        });
    }
    configure_network(config)?;

    let manager = Manager::launch(sshd_command(), config.cgroup_root.clone())?;
    manager.start_enabled_units();
    wait_for_sshd(config)?;
    writeln!(control_out, "up").map_err(Error::io("control pipe"))?;
    let _ = control_out.flush();

    hold(control_in)
}

/// Keeps the host up until the test process closes the control pipe (or
/// dies, which closes it too).
fn hold(mut control_in: File) -> Result<Infallible, Error> {
    let mut buf = [0u8; 64];
    loop {
        match control_in.read(&mut buf) {
            Ok(0) => std::process::exit(0),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => std::process::exit(0),
        }
    }
}

fn set_up_filesystem(config: &BootConfig) -> Result<(), Error> {
    let setup = |step: String| move |source| Error::HostSetup { step, source };
    // Without this, the mounts below would propagate back to the machine.
    sys::make_mounts_private().map_err(setup(
        "make the mount tree private (mount --make-rprivate /)".into(),
    ))?;

    // Handles on the state directory and on this binary, which the volatile
    // /run may hide or a new /proc may rename.
    let state = open_path(&config.state_dir)?;
    // By name: /proc/self/exe itself belongs to the machine's mount
    // namespace, which bind mounts here refuse as a source.
    let exe_name = fs::read_link("/proc/self/exe").map_err(Error::io("/proc/self/exe"))?;
    let exe = open_path(&exe_name)?;
    let state_path = fd_path(&state);
    let exe_path = fd_path(&exe);
    // The machine's cgroup hierarchies, which the host's own /sys would hide.
    let cgroup_tree = open_path(Path::new("/sys/fs/cgroup")).ok();

    overlay_etc(config)?;

    for (dir, options) in VOLATILE_DIRS {
        // The machine's mounts below it would only be hidden, and would keep
        // what they hold alive (network namespaces under /run/netns).
        detach_mounts_below(Path::new(dir));
        sys::mount(
            Some(Path::new("tmpfs")),
            Path::new(dir),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(options),
        )
        .map_err(setup(format!("mount a tmpfs on {dir}")))?;
    }
    for dir in &config.private_dirs {
        let source = state_path
            .join("root")
            .join(dir.strip_prefix("/").unwrap_or(dir));
        fs::create_dir_all(&source).map_err(Error::io(&source))?;
        fs::create_dir_all(dir).map_err(Error::io(dir))?;
        sys::mount(Some(&source), dir, None, libc::MS_BIND, None).map_err(setup(format!(
            "bind-mount {} on {}",
            source.display(),
            dir.display()
        )))?;
    }
    let mount_point = Path::new(STATE_MOUNT);
    fs::create_dir_all(mount_point).map_err(Error::io(mount_point))?;
    sys::mount(Some(&state_path), mount_point, None, libc::MS_BIND, None).map_err(setup(
        format!("bind-mount the host's state on {STATE_MOUNT}"),
    ))?;
    for dir in ["/run/sshd", LOG_DIR] {
        fs::create_dir_all(dir).map_err(Error::io(dir))?;
    }

    for tool in TOOLS {
        // First on PATH, so that a host without systemd installed has one...
        let link = PathBuf::from(TOOL_DIR).join(tool);
        fs::write(&link, "").map_err(Error::io(&link))?;
        fs::set_permissions(&link, fs::Permissions::from_mode(0o755)).map_err(Error::io(&link))?;
        // ...and over the real one, for callers that use its full path.
        let real = PathBuf::from("/usr/bin").join(tool);
        for target in std::iter::once(link).chain(real.exists().then_some(real)) {
            sys::mount(Some(&exe_path), &target, None, libc::MS_BIND, None).map_err(setup(
                format!("bind-mount kok-testhost on {}", target.display()),
            ))?;
        }
    }

    // The host's own processes and network interfaces.
    sys::mount(
        Some(Path::new("proc")),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(setup("mount /proc for the host's PID namespace".into()))?;
    // The host's own network interfaces in /sys/class/net (the kubelet's
    // cAdvisor reads them), with the machine's cgroup hierarchies on top.
    let own_sys = sys::mount(
        Some(Path::new("sysfs")),
        Path::new("/sys"),
        Some("sysfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    );
    if let (Ok(()), Some(tree)) = (own_sys, &cgroup_tree) {
        sys::mount(
            Some(&fd_path(tree)),
            Path::new("/sys/fs/cgroup"),
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(setup(
            "bind-mount the cgroup hierarchies on /sys/fs/cgroup".into(),
        ))?;
    }
    // The bridge is IPv4 only; without IPv6 the host sends no router
    // solicitations and `ip addr` shows only its own address.
    for which in ["default", "all"] {
        let _ = fs::write(format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6"), "1");
    }
    // As systemd leaves a machine: mounts the kubelet makes (volumes) reach
    // containers that ask for them. The peer groups are the host's own: the
    // tree was made private first.
    sys::make_mounts_shared().map_err(setup(
        "make the host's mount tree shared (mount --make-rshared /)".into(),
    ))?;
    Ok(())
}

/// `/etc` as the machine's with the host's own changes on top (an overlay
/// whose upper layer is in the host's state directory, kept across boots):
/// packages write files such as `/etc/crictl.yaml` straight into `/etc`,
/// which must not reach the machine or other hosts. The host also gets its
/// own `/etc/hostname` and, at first boot, its own `/etc/machine-id`.
fn overlay_etc(config: &BootConfig) -> Result<(), Error> {
    let upper = config.state_dir.join("etc").join("upper");
    let work = config.state_dir.join("etc").join("work");
    for dir in [&upper, &work] {
        fs::create_dir_all(dir).map_err(Error::io(dir))?;
    }
    let options = format!(
        "lowerdir=/etc,upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    sys::mount(
        Some(Path::new("overlay")),
        Path::new("/etc"),
        Some("overlay"),
        0,
        Some(&options),
    )
    .map_err(|source| Error::HostSetup {
        step: format!("mount an overlay on /etc ({options})"),
        source,
    })?;
    let hostname = Path::new("/etc/hostname");
    fs::write(hostname, format!("{}\n", config.hostname)).map_err(Error::io(hostname))?;
    if !upper.join("machine-id").exists() {
        let id = format!("{:016x}{:016x}", sys::random_u64(), sys::random_u64());
        let path = Path::new("/etc/machine-id");
        // A file the machine has as a link (to /var/lib/dbus) is replaced.
        let _ = fs::remove_file(path);
        fs::write(path, format!("{id}\n")).map_err(Error::io(path))?;
    }
    Ok(())
}

/// Unmounts every mount below `dir` (not `dir` itself), deepest first.
fn detach_mounts_below(dir: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut below: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    below.sort();
    below.dedup();
    for mount_point in below.iter().rev() {
        let _ = sys::unmount_detach(mount_point);
    }
}

fn open_path(path: &Path) -> Result<File, Error> {
    File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io(path))
}

/// A path that names what `file` is open on, usable while `file` stays open.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Generates the host key on first boot; later boots keep it, as a rebooted
/// machine does.
fn ensure_host_key(hostname: &str) -> Result<(), Error> {
    let key = Path::new(STATE_MOUNT).join("ssh_host_ed25519_key");
    if key.exists() {
        return Ok(());
    }
    tools::keygen(&key, hostname)
}

fn sshd_config_path() -> PathBuf {
    Path::new(STATE_MOUNT).join("sshd_config")
}

fn write_sshd_config() -> Result<(), Error> {
    let state = STATE_MOUNT;
    // Root logs in with the test key only. StrictModes is off because the
    // state directory belongs to the test run, not to a user. The generous
    // limits let benchmarks open many sessions at once.
    let config = format!(
        "Port 22
AddressFamily inet
ListenAddress 0.0.0.0
HostKey {state}/ssh_host_ed25519_key
AuthorizedKeysFile {state}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
PidFile none
MaxStartups 500
MaxSessions 100
Subsystem sftp internal-sftp
"
    );
    let path = sshd_config_path();
    fs::write(&path, config).map_err(Error::io(&path))
}

fn sshd_command() -> Vec<String> {
    vec![
        "/usr/sbin/sshd".into(),
        "-D".into(),
        "-e".into(),
        "-f".into(),
        sshd_config_path().display().to_string(),
    ]
}

fn configure_network(config: &BootConfig) -> Result<(), Error> {
    // The default route leads to the machine, which forwards to its other
    // bridges (the Pod runner's) and nowhere else (see network.rs).
    network::ip_batch(
        &format!(
            "link set lo up\naddr add {}/{} dev eth0\nlink set eth0 up\n\
             route add default via {}\n",
            config.address, config.prefix_len, config.gateway
        ),
        false,
    )
}

fn wait_for_sshd(config: &BootConfig) -> Result<(), Error> {
    let addr = SocketAddr::from((config.address, 22));
    if network::wait_until_listening(addr, Duration::from_secs(60)) {
        return Ok(());
    }
    Err(Error::Unreachable {
        host: config.hostname.clone(),
        what: "starting sshd",
    })
}
