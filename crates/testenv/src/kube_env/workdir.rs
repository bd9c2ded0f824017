//! Where an environment keeps its files: component logs under `target/` so they
//! are still there to read after a failed run, and etcd data, keys and
//! kubeconfigs in a throwaway temporary directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Error;
use super::supervisor;

/// How many finished runs keep their logs at least, besides runs still in
/// progress (their Pods' state, volumes included, goes at once). Every test is a run of its own under nextest (a process per
/// test), so runs younger than [`KEEP_FINISHED_FOR`] are kept too: a failed
/// test's logs outlive the rest of its suite.
const KEEP_FINISHED_RUNS: usize = 10;
const KEEP_FINISHED_FOR: u64 = 6 * 3600;

const STATE_PREFIX: &str = "kok-kube-env-";

/// The files of one environment.
pub(crate) struct Workdir {
    /// Component logs, kept after the process ends.
    pub(crate) logs: PathBuf,
    /// Data, keys and configs; deleted when the environment is dropped or the
    /// process exits.
    pub(crate) state: PathBuf,
    /// Deletes `state` on drop; `None` once handed to the exit hook.
    guard: Option<tempfile::TempDir>,
}

impl Workdir {
    pub(crate) fn create(env_name: &str) -> Result<Workdir, Error> {
        let logs = run_log_dir()?.join(env_name);
        std::fs::create_dir_all(&logs)
            .map_err(Error::io(format!("creating {}", logs.display())))?;
        sweep_stale_state();
        let guard = tempfile::Builder::new()
            .prefix(&format!("{STATE_PREFIX}{}-{env_name}-", std::process::id()))
            .tempdir()
            .map_err(Error::io("creating a temporary directory"))?;
        Ok(Workdir {
            logs,
            state: guard.path().to_owned(),
            guard: Some(guard),
        })
    }

    /// For environments that live in a static and are never dropped.
    pub(crate) fn remove_at_exit(&mut self) {
        if let Some(guard) = self.guard.take() {
            supervisor::remove_at_exit(guard.keep());
        }
    }
}

/// `target/testenv-logs/<started>-<pid>/`, one per test binary run. The first
/// call also prunes the logs of older finished runs.
pub(crate) fn run_log_dir() -> Result<PathBuf, Error> {
    static RUN_DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = RUN_DIR.get() {
        return Ok(dir.clone());
    }
    let root = target_dir().join("testenv-logs");
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let dir = root.join(format!("{started}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    // Canonical so that paths in error messages can be pasted as they are.
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    let dir = RUN_DIR.get_or_init(|| dir).clone();
    prune_runs(&root, &dir);
    Ok(dir)
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// Deletes the log directories of finished runs beyond the newest few.
fn prune_runs(root: &Path, current: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut finished: Vec<(u64, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p != current)
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let (started, pid) = name.split_once('-')?;
            let started: u64 = started.parse().ok()?;
            let pid: u32 = pid.parse().ok()?;
            (!pid_alive(pid)).then_some((started, p))
        })
        .collect();
    finished.sort_by_key(|run| std::cmp::Reverse(run.0));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    for (i, (started, dir)) in finished.into_iter().enumerate() {
        if i >= KEEP_FINISHED_RUNS && now.saturating_sub(started) > KEEP_FINISHED_FOR {
            let _ = std::fs::remove_dir_all(dir);
        } else {
            remove_pod_state(&dir);
        }
    }
}

/// Deletes what a finished run's Pod runners kept besides logs (their
/// `pods-state-*`: volume claims with etcd data, Pods' working files), a
/// few hundred megabytes a run; its logs stay.
fn remove_pod_state(run: &Path) {
    for env in std::fs::read_dir(run).into_iter().flatten().flatten() {
        for entry in std::fs::read_dir(env.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("pods-state-")
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Deletes state directories whose process is gone (it was killed before its exit
/// hook ran). Runs once per process.
fn sweep_stale_state() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(rest) = name.strip_prefix(STATE_PREFIX) else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !pid_alive(pid)) {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    });
}

fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}
