//! What the CLI tests share: running the built `kubectl-kok` against a test
//! environment, and finding the workspace's other binaries (cargo only names a
//! crate's own binaries to its tests).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A finished CLI run.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics with the output unless the run exited 0.
    pub fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "command failed: {self:#?}");
        self
    }
}

/// Run `kubectl-kok --kubeconfig <kubeconfig> <args>` to completion (on a
/// blocking thread, so the test's runtime keeps serving other tasks).
pub async fn kok(kubeconfig: &Path, args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-kok"));
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("KOK_CONTEXT");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("run kubectl-kok");
    let run = Run::from(out);
    // Test credentials only, but kubeconfigs stay out of logs all the same.
    let stdout = if run.stdout.contains("client-key-data") {
        "(a kubeconfig)\n"
    } else {
        run.stdout.as_str()
    };
    println!("$ kubectl kok {}\n{stdout}{}", args.join(" "), run.stderr);
    run
}

/// A workspace binary next to this test binary's profile directory
/// (`target/debug/<name>` for `target/debug/deps/<test>`). `scripts/test.sh`
/// builds every binary before the tests run.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(name))
        .collect();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} not found at {candidates:?}; build it with `cargo build --workspace --bins` (scripts/test.sh does)"
            )
        })
}

/// A child process killed when dropped (also when the test panics).
pub struct Process {
    child: Child,
    pub log: PathBuf,
}

impl Process {
    /// Start `program` with `args`, its output appended to `log`.
    pub fn start(program: &Path, args: &[String], log: PathBuf) -> Process {
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Process { child, log }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited, with its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where test logs go: `target/testenv-logs/kokctl/`.
pub fn log_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let target = exe
        .ancestors()
        .find(|d| d.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = target.join("testenv-logs").join("kokctl");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir
}
