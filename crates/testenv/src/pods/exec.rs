//! Starting one container: `kok-pod-exec` reads a [`Spec`], joins the Pod's
//! network namespace, builds a private root (every top-level directory of the
//! machine as a copy-on-write overlay, so what a container writes never reaches
//! the machine or another Pod), bind-mounts the volumes at their `mountPath`s,
//! chroots and executes the container's program.
//!
//! A separate program rather than a `pre_exec` hook, because mounting needs
//! allocation and error reporting that are unsafe between fork and exec in a
//! multi-threaded test binary.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys;

/// Everything `kok-pod-exec` needs to start a container.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Spec {
    /// Network namespace to join (`/run/netns/NAME`).
    pub netns: PathBuf,
    /// Host name inside the container.
    pub hostname: String,
    /// Empty directory where the container's root is assembled.
    pub root: PathBuf,
    /// Directory for the overlays' upper and work directories (per Pod, so
    /// containers of one Pod share writes like a Pod shares its image layers
    /// would not, but volumes are what they really share).
    pub upper: PathBuf,
    /// Volumes: (source on the machine, mountPath, read-only).
    pub mounts: Vec<Mount>,
    /// Working directory inside the container.
    pub working_dir: Option<String>,
    /// Program and arguments; `argv[0]` is a path on the machine.
    pub argv: Vec<String>,
    /// Environment, complete (nothing is inherited).
    pub env: BTreeMap<String, String>,
}

/// One bind mount into the container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// Top-level directories that are bound, not overlaid.
const BOUND: [&str; 3] = ["proc", "dev", "sys"];

fn overlay_or_bind(lower: &Path, target: &Path, upper: &Path) -> io::Result<()> {
    let up = upper.join("u");
    let work = upper.join("w");
    std::fs::create_dir_all(&up)?;
    std::fs::create_dir_all(&work)?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        up.display(),
        work.display()
    );
    match sys::mount(
        Some(Path::new("overlay")),
        target,
        Some("overlay"),
        0,
        Some(&data),
    ) {
        Ok(()) => Ok(()),
        // Some file systems cannot be overlay lower layers: share them instead.
        Err(_) => sys::mount(
            Some(lower),
            target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        ),
    }
}

/// Assemble the container's root under `spec.root`.
fn build_root(spec: &Spec) -> io::Result<()> {
    std::fs::create_dir_all(&spec.root)?;
    sys::mount(
        Some(Path::new("tmpfs")),
        &spec.root,
        Some("tmpfs"),
        0,
        Some("mode=0755"),
    )?;
    for entry in std::fs::read_dir("/")? {
        let entry = entry?;
        let name = entry.file_name();
        let source = Path::new("/").join(&name);
        let target = spec.root.join(&name);
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            let name = name.to_string_lossy();
            if BOUND.contains(&name.as_ref()) {
                sys::mount(
                    Some(&source),
                    &target,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                )?;
            } else if name == "tmp" {
                sys::mount(
                    Some(Path::new("tmpfs")),
                    &target,
                    Some("tmpfs"),
                    0,
                    Some("mode=1777"),
                )?;
            } else {
                overlay_or_bind(&source, &target, &spec.upper.join(name.as_ref()))?;
            }
        }
    }
    for mount in &spec.mounts {
        let target = resolve_in_root(&spec.root, &mount.target)?;
        if mount.source.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if !target.exists() {
                std::fs::write(&target, b"")?;
            }
        }
        sys::mount(
            Some(&mount.source),
            &target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        if mount.read_only {
            sys::mount(
                None,
                &target,
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                None,
            )?;
        }
    }
    Ok(())
}

/// `path` as seen from inside `root`: symbolic links met on the way are
/// followed within `root` (an absolute link such as `/var/run -> /run` must not
/// lead out to the machine's `/run`).
fn resolve_in_root(root: &Path, path: &str) -> io::Result<PathBuf> {
    let mut resolved = PathBuf::new();
    let mut pending: Vec<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .rev()
        .map(str::to_string)
        .collect();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let candidate = resolved.join(&part);
        match std::fs::symlink_metadata(root.join(&candidate)) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > 40 {
                    return Err(io::Error::other(format!(
                        "too many symbolic links in {path}"
                    )));
                }
                let target = std::fs::read_link(root.join(&candidate))?;
                let target = target.to_string_lossy().to_string();
                if target.starts_with('/') {
                    resolved = PathBuf::new();
                }
                pending.extend(
                    target
                        .split('/')
                        .filter(|p| !p.is_empty())
                        .rev()
                        .map(str::to_string),
                );
            }
            _ => resolved = candidate,
        }
    }
    Ok(root.join(resolved))
}

/// Set up the container described by `spec` in this process and execute its
/// program. Returns only on failure.
pub fn enter_and_exec(spec: &Spec) -> io::Error {
    let result = (|| -> io::Result<io::Error> {
        let netns = std::fs::File::open(&spec.netns)?;
        sys::setns(&netns, libc::CLONE_NEWNET)?;
        sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS)?;
        sys::make_mounts_private()?;
        sys::sethostname(&spec.hostname)?;
        build_root(spec)?;
        sys::chroot(&spec.root)?;
        std::env::set_current_dir(spec.working_dir.as_deref().unwrap_or("/"))?;
        let (program, args) = spec
            .argv
            .split_first()
            .ok_or_else(|| io::Error::other("empty command"))?;
        let mut command =
            std::process::Command::new(std::ffi::OsStr::from_bytes(program.as_bytes()));
        command.args(args).env_clear().envs(&spec.env);
        Ok(command.exec())
    })();
    match result {
        Ok(error) | Err(error) => error,
    }
}

/// Run `command` inside the running container `pid` (its network, mount and
/// UTS namespaces and its root), as exec probes do; true when it exits 0 within
/// `timeout`.
pub async fn run_in(
    pid: u32,
    spec: &Spec,
    command: &[String],
    timeout: std::time::Duration,
) -> bool {
    let Some(program) = exec_program() else {
        return false;
    };
    let mut join = tokio::process::Command::new(program);
    join.arg("--join")
        .arg(pid.to_string())
        .arg(&spec.root)
        .args(command);
    join.env_clear().envs(&spec.env).kill_on_drop(true);
    join.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    match tokio::time::timeout(timeout, join.status()).await {
        Ok(Ok(status)) => status.success(),
        _ => false,
    }
}

/// Path of the `kok-pod-exec` program, set by the runner when it starts.
pub fn exec_program() -> Option<PathBuf> {
    EXEC_PROGRAM.get().cloned()
}

pub(crate) static EXEC_PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// `kok-pod-exec --join PID ROOT ARGV…`: enter the namespaces of the container
/// whose process is PID, chroot to its ROOT and execute ARGV.
pub fn join_and_exec(pid: u32, root: &Path, argv: &[String]) -> io::Error {
    let result = (|| -> io::Result<io::Error> {
        for (ns, flag) in [
            ("net", libc::CLONE_NEWNET),
            ("uts", libc::CLONE_NEWUTS),
            ("mnt", libc::CLONE_NEWNS),
        ] {
            let file = std::fs::File::open(format!("/proc/{pid}/ns/{ns}"))?;
            sys::setns(&file, flag)?;
        }
        sys::chroot(root)?;
        std::env::set_current_dir("/")?;
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::other("empty command"))?;
        Ok(std::process::Command::new(program).args(args).exec())
    })();
    match result {
        Ok(error) | Err(error) => error,
    }
}

#[cfg(test)]
mod tests {
    use super::resolve_in_root;

    #[test]
    fn links_resolve_inside_the_root() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("run")).expect("run");
        std::fs::create_dir_all(root.path().join("var")).expect("var");
        std::os::unix::fs::symlink("/run", root.path().join("var/run")).expect("link");
        std::os::unix::fs::symlink("../run", root.path().join("var/rel")).expect("link");
        let resolved = resolve_in_root(root.path(), "/var/run/secrets/token").expect("resolve");
        assert_eq!(resolved, root.path().join("run/secrets/token"));
        let relative = resolve_in_root(root.path(), "/var/rel/x").expect("resolve");
        assert_eq!(relative, root.path().join("run/x"));
        assert_eq!(
            resolve_in_root(root.path(), "/../../etc").expect("resolve"),
            root.path().join("etc")
        );
    }
}
