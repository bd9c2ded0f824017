//! Finding the `kok-testhost` binary. Cargo builds a package's binaries only
//! for that package's own tests, so tests of other crates (node-operator's)
//! may run before it exists; then it is built on first use.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::error::Error;

/// Overrides where the `kok-testhost` binary is looked for.
pub const HELPER_ENV: &str = "KOK_TESTHOST_BIN";

const NAME: &str = "kok-testhost";

/// Held while looking, so that concurrent tests build it once.
static FOUND: Mutex<Option<PathBuf>> = Mutex::new(None);

pub fn path() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os(HELPER_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let mut found = FOUND.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = found.as_ref() {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe().map_err(Error::io("/proc/self/exe"))?;
    // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(NAME))
        .collect();
    let path = match candidates.iter().find(|c| c.is_file()) {
        Some(path) => path.clone(),
        None => build(&exe).map_err(|detail| Error::HelperMissing {
            searched: format!(
                "{}; building it failed: {detail}",
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?,
    };
    *found = Some(path.clone());
    Ok(path)
}

/// Builds the binary into the target directory and profile `exe` (a test
/// binary in `target/<profile>/deps`) was built in.
fn build(exe: &Path) -> Result<PathBuf, String> {
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("the test binary is not in target/<profile>/deps")?;
    let target_dir = profile_dir.parent().ok_or("no target directory")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => return Err("no profile directory".into()),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    eprintln!("kok-testenv: building {NAME} for the SSH test hosts");
    let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args([
            "build",
            "--bin",
            NAME,
            "--profile",
            profile,
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let built = profile_dir.join(NAME);
    if status.success() && built.is_file() {
        Ok(built)
    } else {
        Err(format!("cargo build exited with {status}"))
    }
}
