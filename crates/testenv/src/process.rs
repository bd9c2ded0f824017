//! One long-lived thread forks every process that must not outlive the test
//! binary.
//!
//! The kernel sends the parent-death signal when the *thread* that forked a
//! child exits, not when its process does. Tests run on short-lived threads
//! (libtest and `#[tokio::test]` give each test its own), so a host forked
//! from a test thread would be killed when that test ends even if it is
//! shared with later tests. Forking from a thread that lives as long as the
//! process ties every child (components, test hosts, Pod containers) to the
//! process instead, including when it is SIGKILLed.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::mpsc::{self, Sender};

use crate::sys;

type Job = (Command, Sender<io::Result<Child>>);

static SPAWNER: Mutex<Option<Sender<Job>>> = Mutex::new(None);

/// Spawns `command` so that it gets SIGKILL when this process dies.
pub(crate) fn spawn_tied_to_process(command: Command) -> io::Result<Child> {
    let jobs = {
        let mut spawner = SPAWNER.lock().unwrap_or_else(|p| p.into_inner());
        match spawner.as_ref() {
            Some(jobs) => jobs.clone(),
            None => {
                let (jobs, queue) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name("kok-testenv-spawner".into())
                    .spawn(move || serve(queue))?;
                *spawner = Some(jobs.clone());
                jobs
            }
        }
    };
    let (reply, answer) = mpsc::channel();
    let gone = || io::Error::other("the spawner thread is gone");
    jobs.send((command, reply)).map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}

fn serve(queue: mpsc::Receiver<Job>) {
    let parent = std::process::id();
    // The sender lives in a static, so this loop ends only with the process.
    for (mut command, reply) in queue {
        // SAFETY: the closure only makes async-signal-safe calls (prctl,
        // getppid), as required between fork and exec.
        unsafe {
            command.pre_exec(move || {
                sys::die_with_parent()?;
                // The parent may have died before prctl took effect; then no
                // signal would ever come, so give up on this child now.
                if sys::parent_pid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let _ = reply.send(command.spawn());
    }
}
