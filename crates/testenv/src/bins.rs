//! Locating the upstream binaries, so tests run the exact versions
//! `scripts/testenv-bins.sh` pins instead of whatever happens to be on `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::kube_env::Error;

/// Overrides the directory holding the binaries (skips the build script).
pub const BIN_DIR_ENV: &str = "KOK_TESTENV_BIN_DIR";

/// The directory once found. A mutex rather than a `OnceLock` so that two threads
/// asking at the same time never run the build script twice, and so that a failed
/// lookup is retried rather than remembered.
static BIN_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The directory holding kube-apiserver, etcd, kwok and the rest.
///
/// `KOK_TESTENV_BIN_DIR` when set; otherwise whatever `scripts/testenv-bins.sh`
/// prints, which is instant when its cache is warm and builds the binaries when not.
pub fn bin_dir() -> Result<PathBuf, Error> {
    let mut cached = BIN_DIR
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(dir) = cached.as_ref() {
        return Ok(dir.clone());
    }
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => run_script()?,
    };
    if !dir.is_dir() {
        return Err(Error::Bins {
            detail: format!("{} is not a directory", dir.display()),
        });
    }
    *cached = Some(dir.clone());
    Ok(dir)
}

/// The path of one upstream binary, e.g. `bin("kube-apiserver")`.
pub fn bin(name: &str) -> Result<PathBuf, Error> {
    let dir = bin_dir()?;
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::BinMissing {
            name: name.to_owned(),
            dir,
        })
    }
}

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testenv-bins.sh")
}

fn run_script() -> Result<PathBuf, Error> {
    let script = script_path();
    // stderr is inherited: a first build takes a long while and its progress lines
    // are the only sign that the test is not hanging.
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Bins {
            detail: format!("could not run {}: {e}", script.display()),
        })?;
    if !output.status.success() {
        return Err(Error::Bins {
            detail: format!("{} failed ({})", script.display(), output.status),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(last) => Ok(PathBuf::from(last)),
        None => Err(Error::Bins {
            detail: format!("{} printed no directory", script.display()),
        }),
    }
}
