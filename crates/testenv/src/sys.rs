//! Safe wrappers over the few Linux calls the test environment needs that std lacks,
//! so the `unsafe` blocks stay in one place and each says what it relies on.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"))
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    cstring(path.as_os_str().as_bytes())
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// mount(2). `source` and `data` are optional as in C.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(path_cstring).transpose()?;
    let target = path_cstring(target)?;
    let fstype = fstype.map(|s| cstring(s.as_bytes())).transpose()?;
    let data = data.map(|s| cstring(s.as_bytes())).transpose()?;
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // outlives the call.
    let ret = unsafe {
        libc::mount(
            source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast::<libc::c_void>()),
        )
    };
    check(ret).map(drop)
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall without pointers.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Sets the nice value of every thread of this process to `nice`: the
/// processes they start afterwards inherit it (Linux keeps it per thread).
/// Lowering it needs `CAP_SYS_NICE` (root).
pub fn renice_process(nice: i32) -> io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Ok(tid) = entry?.file_name().to_string_lossy().parse::<libc::id_t>() else {
            continue;
        };
        // SAFETY: setpriority reads no memory of ours.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
            let e = io::Error::last_os_error();
            // A thread that ended since it was listed.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Sends `signal` to `pid` (a negative pid names a process group).
pub fn kill(pid: i32, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall without pointers.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// Asks the kernel to SIGKILL the calling process when its parent thread exits.
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; async-signal-safe, so it may
    // run between fork and exec.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

/// The parent of process `pid`, from `/proc/<pid>/stat`; None when it is
/// gone.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …; comm may hold spaces and parentheses.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn parent_pid() -> u32 {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() }.unsigned_abs()
}

/// Creates a new session so that a process and its children form one process
/// group that can be signalled as a whole. Async-signal-safe.
pub fn new_session() -> io::Result<()> {
    // SAFETY: plain syscall without pointers.
    check(unsafe { libc::setsid() }).map(drop)
}

pub enum Forked {
    Child,
    Parent(i32),
}

/// fork(2). Only to be called while the process has a single thread: the
/// child goes on running ordinary Rust code.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: callers guarantee a single-threaded process, so no lock can be
    // held by a thread that does not exist in the child.
    let pid = check(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// A pipe whose both ends close on exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Duplicates `fd` onto a new close-on-exec descriptor.
pub fn dup_cloexec(fd: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor number; failure is reported, not UB.
    let new = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fcntl returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Makes descriptor `target` refer to what `source` refers to.
pub fn dup_onto(source: &impl AsRawFd, target: libc::c_int) -> io::Result<()> {
    // SAFETY: dup2 on descriptor numbers; `target` is one of 0, 1, 2, which the
    // process owns.
    check(unsafe { libc::dup2(source.as_raw_fd(), target) }).map(drop)
}

/// Makes a thread blocked in `accept` on `socket` return, whatever became
/// of the address it listens on.
pub fn shut_down(socket: &impl AsRawFd) {
    // SAFETY: shutdown on a descriptor the caller keeps open.
    unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
}

/// Waits for `fd` to become readable or hung up, for at most `timeout`.
/// Returns true when it is.
pub fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    loop {
        // SAFETY: one valid pollfd.
        match check(unsafe { libc::poll(&mut pfd, 1, millis) }) {
            Ok(n) => return Ok(n > 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads one line from a pipe, giving up at `deadline`. `Ok(None)` means the
/// other end closed before a full line arrived.
pub fn read_line_until(
    reader: &mut (impl Read + AsRawFd),
    deadline: Instant,
) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !wait_readable(reader, left)? {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
        }
        // One byte at a time so nothing after the newline is consumed: the
        // next line is read by a later call.
        match reader.read(&mut byte)? {
            0 => return Ok(None),
            _ if byte[0] == b'\n' => return Ok(Some(String::from_utf8_lossy(&line).into_owned())),
            _ => line.push(byte[0]),
        }
    }
}

/// An exclusive flock(2) held until dropped. Locks belong to the open file,
/// so two holders in one process exclude each other as well.
pub struct FileLock {
    _file: File,
}

impl FileLock {
    pub fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock on a descriptor we own.
            match check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }) {
                Ok(_) => return Ok(FileLock { _file: file }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A process's start time in clock ticks since boot, which together with its
/// pid names it without ambiguity (pids are reused, start times are not).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces; fields after it don't.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall; after the name, field 3 (state) is the first.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// `pid start-time` of a process, so that a reused pid is not mistaken for it.
pub fn process_identity(pid: u32) -> Option<String> {
    process_start_time(pid).map(|start| format!("{pid} {start}"))
}

/// The pid a record of [`process_identity`] names, if that very process
/// still runs.
pub fn identity_alive(record: &str) -> Option<u32> {
    let pid: u32 = record.split_whitespace().next()?.parse().ok()?;
    (process_identity(pid).as_deref() == Some(record.trim()) && is_running(pid)).then_some(pid)
}

/// A memory figure of process `pid` from `/proc/<pid>/status` (`VmRSS`,
/// `VmHWM` for the peak, ...), in bytes; None when the process or the
/// field is gone.
pub fn process_memory(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// True if `pid` exists and has not exited (zombies count as gone).
pub fn is_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is 8 writable bytes.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == 8 {
        return u64::from_ne_bytes(bytes);
    }
    // Never seen in practice; names made from this are checked for collisions anyway.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 32)
}

/// setns(2): move this thread into the namespace `file` refers to.
pub fn setns(file: &File, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor that stays open for the call.
    check(unsafe { libc::setns(file.as_raw_fd(), nstype) }).map(drop)
}

/// chroot(2).
pub fn chroot(path: &Path) -> io::Result<()> {
    let path = path_cstring(path)?;
    // SAFETY: a NUL-terminated string that outlives the call.
    check(unsafe { libc::chroot(path.as_ptr()) }).map(drop)
}

/// Send `signal` to the process group led by `pid`.
pub fn kill_group(pid: u32, signal: libc::c_int) {
    // SAFETY: plain syscall without pointers.
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
}

/// Make every mount below `/` private, so mounts made next in this mount
/// namespace do not propagate back to the machine.
pub fn make_mounts_private() -> io::Result<()> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// Make every mount below `/` shared within this mount namespace, as systemd
/// leaves a machine: mounts made later below a shared mount reach the
/// namespaces cloned from it that ask for them (`rslave` container mounts).
/// Call it after [`make_mounts_private`], so the peer groups are new ones
/// that the machine is not part of.
pub fn make_mounts_shared() -> io::Result<()> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SHARED,
        None,
    )
}

/// getrlimit(2): `(soft, hard)`, `RLIM_INFINITY` as `u64::MAX`.
pub fn getrlimit(resource: libc::__rlimit_resource_t) -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit the call fills in.
    check(unsafe { libc::getrlimit(resource, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// setrlimit(2) of this process.
pub fn setrlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid pointer to an initialized rlimit.
    check(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

/// umount2(2) with `MNT_DETACH`: the mount goes from the tree at once.
pub fn unmount_detach(target: &Path) -> io::Result<()> {
    let target = path_cstring(target)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// The least inotify limits the test environment needs, which it raises the
/// machine's to and never lowers (kind asks the same of a machine running
/// many nodes). Test hosts share
/// the machine's kernel and its root user: every host's containerd and
/// kubelet and every control plane's kube-apiservers (7 instances each)
/// take inotify instances from one per-user count, 128 by default. A
/// containerd started once they are gone comes up without its CRI plugin
/// ("failed to create fsnotify watcher: too many open files") and stays so.
const INOTIFY_LIMITS: [(&str, u64); 2] = [
    ("/proc/sys/fs/inotify/max_user_instances", 8192),
    ("/proc/sys/fs/inotify/max_user_watches", 1 << 20),
];

/// Raises the machine's inotify limits to [`INOTIFY_LIMITS`].
pub fn raise_inotify_limits() -> io::Result<()> {
    for (path, least) in INOTIFY_LIMITS {
        let now = std::fs::read_to_string(path)?;
        if now.trim().parse::<u64>().is_ok_and(|n| n >= least) {
            continue;
        }
        std::fs::write(path, least.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_figures_are_read_from_proc_status() {
        let me = std::process::id();
        let rss = process_memory(me, "VmRSS").expect("VmRSS");
        let peak = process_memory(me, "VmHWM").expect("VmHWM");
        assert!(rss > 1 << 20 && peak >= rss, "rss {rss}, peak {peak}");
        // A field that only starts like another is not it.
        assert_eq!(process_memory(me, "Vm"), None);
        assert_eq!(process_memory(me, "NoSuchField"), None);
    }
}
