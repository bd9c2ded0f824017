//! Child processes that never outlive the test binary: not after a normal exit,
//! not after a failed test, not after the binary is killed.
//!
//! Three layers, because each one alone has a hole:
//! - every child asks the kernel for SIGKILL when its parent goes away
//!   (`PR_SET_PDEATHSIG`). The kernel ties that to the *thread* that forked, and
//!   `#[tokio::test]` runs each test on a thread that ends with the test, so all
//!   children are forked by one thread that lives as long as the process;
//! - an `atexit` hook SIGKILLs and reaps every child still recorded, so the binary
//!   does not even return before they are gone;
//! - each child leads its own process group, so the hook takes anything it forked
//!   with it, and a Ctrl-C aimed at the test run does not reach it half-way.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};

use super::Error;

/// Process group ids of live children; 0 marks a free slot. Atomics rather than a
/// locked list because the exit hook must not block on a lock another thread might
/// hold while the process is going down.
static LIVE: [AtomicI32; 256] = [const { AtomicI32::new(0) }; 256];

/// Directories to delete at exit, for environments that are never dropped (the
/// shared one lives in a static).
static EXIT_CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

static EXIT_HOOK: Once = Once::new();

/// One running component with its log file.
pub(crate) struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &'static str,
        mut command: Command,
        log: &Path,
    ) -> Result<Supervised, Error> {
        install_exit_hook();
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = crate::process::spawn_tied_to_process(command).map_err(Error::io(format!(
            "starting {name} (log {})",
            log.display()
        )))?;
        record(child.id() as i32);
        Ok(Supervised {
            name,
            child,
            log: log.to_owned(),
        })
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some` once the process has ended (and has been reaped).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            // Its pid is free for reuse now; the exit hook must not signal it.
            forget(self.child.id() as i32);
        }
        status
    }

    /// Turns an early exit into an error carrying the end of the log.
    pub(crate) fn check_running(&mut self) -> Result<(), Error> {
        match self.exited() {
            None => Ok(()),
            Some(status) => Err(Error::Exited {
                component: self.name,
                status: status.to_string(),
                log: self.log.clone(),
                tail: log_tail(&self.log, 30),
            }),
        }
    }

    /// SIGKILLs the process group and reaps the child. The data it leaves behind is
    /// throwaway, so there is nothing a graceful stop would save.
    pub(crate) fn kill(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let pid = self.child.id() as i32;
        // SAFETY: plain syscall on the group of a child not yet reaped, so the id
        // cannot belong to anyone else.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.child.wait();
        forget(pid);
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Deletes `dir` when the process exits normally. Stale directories of processes
/// that were killed are swept by the next run.
pub(crate) fn remove_at_exit(dir: PathBuf) {
    install_exit_hook();
    let mut dirs = EXIT_CLEANUP
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    dirs.push(dir);
}

/// The last `lines` lines of a log, for error messages.
pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    match std::fs::read(log) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read the log: {e})"),
    }
}

fn record(pid: i32) {
    for slot in &LIVE {
        if slot
            .compare_exchange(0, pid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
    // All slots taken: the parent-death signal still covers this child.
    eprintln!("kok-testenv: more than {} live children", LIVE.len());
}

fn forget(pid: i32) {
    for slot in &LIVE {
        if slot
            .compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

fn install_exit_hook() {
    crate::watchdog::arm();
    EXIT_HOOK.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn` with no captured state.
        let rc = unsafe { libc::atexit(kill_all_at_exit) };
        if rc != 0 {
            eprintln!("kok-testenv: atexit failed; relying on the parent-death signal");
        }
    });
}

extern "C" fn kill_all_at_exit() {
    let mut killed = Vec::new();
    for slot in &LIVE {
        let pid = slot.swap(0, Ordering::SeqCst);
        if pid > 0 {
            // SAFETY: plain syscall on a process group this process created.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
            killed.push(pid);
        }
    }
    for pid in killed {
        // Reaped here so that nothing is still writing into the directories below
        // and nothing is left running once the test binary has returned.
        // SAFETY: waits on our own child; a null status pointer is allowed.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    if let Ok(mut dirs) = EXIT_CLEANUP.try_lock() {
        for dir in dirs.drain(..) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
