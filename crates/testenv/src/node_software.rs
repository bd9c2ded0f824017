//! The software a worker node runs, as the project's scripts build and cache
//! it from upstream sources: the release files of containerd, runc, the CNI
//! plugins, crictl and the kubelet (`scripts/node-artifacts.sh`), the images
//! Pods run (`scripts/node-images.sh`), the OCI registry serving them
//! (`scripts/registry-bins.sh`, see [`crate::registry`]), and the
//! PackageVersions that install them (`scripts/node-packageversions.sh`),
//! and the example Machine filled in for a test host.
//!
//! Each script builds only what its cache lacks and prints the cache
//! directory on its last line, so calling one with a warm cache is instant.
//!
//! ```no_run
//! use kok_testenv::hosts::TestHosts;
//! use kok_testenv::node_software::{self, PackageVersionsOptions};
//! use kok_testenv::registry::Registry;
//!
//! let hosts = TestHosts::start(2).unwrap();
//! let registry = Registry::start_with_node_images(hosts.gateway_ip()).unwrap();
//! node_software::serve_artifacts(&hosts).unwrap();
//! let yaml = node_software::package_versions(
//!     &node_software::artifacts_base_url(&hosts),
//!     &PackageVersionsOptions::for_test_hosts(&registry),
//! )
//! .unwrap();
//! # let _ = yaml;
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Secret;
use kube_on_kube_api::Machine;
use serde_json::Value;

use crate::hosts::{TestHost, TestHosts};
use crate::registry::Registry;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{script} failed: {detail}")]
    Script { script: String, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the registry did not start: {detail}; its log is {}", log.display())]
    Registry { detail: String, log: PathBuf },
    #[error("examples/machine.yaml: {0}")]
    Example(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

fn script_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// Runs one of the project's scripts and returns its standard output. Its
/// standard error passes through: a cold build takes minutes, and its
/// progress lines are the only sign that nothing hangs.
fn run_script(name: &str, args: &[&str]) -> Result<String, Error> {
    let script = script_path(name);
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(Error::io(format!("running {}", script.display())))?;
    if !output.status.success() {
        return Err(Error::Script {
            script: name.to_owned(),
            detail: format!("exited with {}", output.status),
        });
    }
    String::from_utf8(output.stdout).map_err(|e| Error::Script {
        script: name.to_owned(),
        detail: format!("printed something that is not UTF-8: {e}"),
    })
}

/// The directory a caching script prints on its last line.
pub(crate) fn cached_dir(name: &str) -> Result<PathBuf, Error> {
    let stdout = run_script(name, &[])?;
    let dir = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| Error::Script {
            script: name.to_owned(),
            detail: "printed no directory".into(),
        })?;
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(Error::Script {
            script: name.to_owned(),
            detail: format!("printed {}, which is not a directory", dir.display()),
        })
    }
}

/// `scripts/node-artifacts.sh`'s directory: `artifacts/` holds the release
/// files (with `SHA256SUMS` and `versions`), `bin/` the unpacked binaries.
pub fn artifacts_dir() -> Result<PathBuf, Error> {
    cached_dir("node-artifacts.sh")
}

/// `scripts/node-images.sh`'s directory: `registry/` is the storage (the
/// filesystem driver's root directory) holding the images under their
/// upstream names, `images.txt` lists them with their digests.
pub fn images_dir() -> Result<PathBuf, Error> {
    cached_dir("node-images.sh")
}

/// Pushes the operators' images made of the binaries in `bin_dir`
/// (`scripts/operator-images.sh`) into the storage [`Registry::start_with_node_images`]
/// serves, under the chart's names and `tag`; their references with digests.
pub fn push_operator_images(bin_dir: &Path, tag: &str) -> Result<Vec<String>, Error> {
    let dir = bin_dir.display().to_string();
    let out = run_script("operator-images.sh", &[&dir, tag])?;
    Ok(out.lines().map(str::to_owned).collect())
}

/// `scripts/registry-bins.sh`'s directory, holding `registry` and `crane`.
pub fn registry_bin_dir() -> Result<PathBuf, Error> {
    cached_dir("registry-bins.sh")
}

/// Puts the node artifacts (every file of `artifacts/`, hard-linked, or
/// copied where linking fails) into [`TestHosts::artifacts_dir`], where the
/// hosts download them as a real machine downloads release files. Returns
/// the file names.
pub fn serve_artifacts(hosts: &TestHosts) -> Result<Vec<String>, Error> {
    let source = artifacts_dir()?.join("artifacts");
    let target = hosts.artifacts_dir();
    let entries =
        std::fs::read_dir(&source).map_err(Error::io(format!("reading {}", source.display())))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io(format!("reading {}", source.display())))?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let name = entry.file_name();
        let to = target.join(&name);
        let _ = std::fs::remove_file(&to);
        if std::fs::hard_link(entry.path(), &to).is_err() {
            std::fs::copy(entry.path(), &to)
                .map_err(Error::io(format!("copying {}", entry.path().display())))?;
        }
        names.push(name.to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Where [`serve_artifacts`] put the files, as the hosts reach them:
/// `http://<bridge address>:<port>` (no trailing slash).
pub fn artifacts_base_url(hosts: &TestHosts) -> String {
    hosts.artifact_url("").trim_end_matches('/').to_owned()
}

/// The flags of `scripts/node-packageversions.sh`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageVersionsOptions {
    /// `--mirror HOST:PORT`: containerd pulls `registry.k8s.io`, `docker.io`,
    /// `ghcr.io` and `quay.io` images from the registry there.
    pub mirror: Option<String>,
    /// `--cgroup-v1`: the kubelet's `failCgroupV1: false`.
    pub cgroup_v1: bool,
    /// `--restrict-oom-score-adj`: containerd's `restrict_oom_score_adj`.
    pub restrict_oom_score_adj: bool,
}

impl PackageVersionsOptions {
    /// What the SSH test hosts on this machine need: `registry` as the
    /// mirror, `--cgroup-v1` where the machine has no cgroup v2 hierarchy at
    /// `/sys/fs/cgroup`, `--restrict-oom-score-adj` where root lacks
    /// `CAP_SYS_RESOURCE` (the hosts share the machine's kernel and
    /// capabilities).
    pub fn for_test_hosts(registry: &Registry) -> PackageVersionsOptions {
        PackageVersionsOptions {
            mirror: Some(registry.address()),
            cgroup_v1: machine_has_cgroup_v1_only(),
            restrict_oom_score_adj: !has_cap_sys_resource(),
        }
    }

    fn args(&self) -> Vec<&str> {
        let mut args = Vec::new();
        if let Some(mirror) = &self.mirror {
            args.extend(["--mirror", mirror.as_str()]);
        }
        if self.cgroup_v1 {
            args.push("--cgroup-v1");
        }
        if self.restrict_oom_score_adj {
            args.push("--restrict-oom-score-adj");
        }
        args
    }
}

/// The YAML `scripts/node-packageversions.sh BASE_URL ...` prints: one
/// PackageVersion per package (runc, containerd, cni-plugins, crictl,
/// kubelet) with its artifact's URL under `base_url` and its sha256, and the
/// ClusterPackageVersion `default` naming them.
pub fn package_versions(base_url: &str, options: &PackageVersionsOptions) -> Result<String, Error> {
    let mut args = vec![base_url];
    args.extend(options.args());
    run_script("node-packageversions.sh", &args)
}

/// The documents of `examples/machine.yaml`: its key Secret and its Machine.
fn example_documents() -> Result<Vec<Value>, Error> {
    use serde::Deserialize;
    let text = include_str!("../../../examples/machine.yaml");
    serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).map_err(|e| Error::Example(e.to_string())))
        .collect()
}

fn example_document(kind: &str) -> Result<Value, Error> {
    example_documents()?
        .into_iter()
        .find(|d| d["kind"] == kind)
        .ok_or_else(|| Error::Example(format!("no {kind}")))
}

/// Fills in a Machine (as JSON) for `host` the way a user fills one in for
/// a real host — the host's address, SSH port and pinned key — plus what
/// only a test host needs:
/// - kernel parameters of the host's own network namespace only (`net.*`;
///   `vm.max_map_count` and the like would change the machine running the
///   tests);
/// - the kubelet's cgroup root, the host's own subtree of the machine's
///   cgroups (a real host's kubelet owns the whole tree);
/// - no disk eviction threshold (`0%`, which the kubelet reads as none):
///   the hosts share the machine's disk, whose free share says nothing
///   about them. The example's 10% (or the kubelet's default 15% for
///   images) taints them with disk pressure on a well-filled machine, and
///   even 1% did on a machine with 4 GB of 252 GB free: the kubelet
///   evicted a meta worker's control-plane Pods and rejected its
///   DaemonSet's, one after another, until the test timed out.
pub fn fill_in_machine(machine: &mut Value, host: &TestHost) {
    let spec = &mut machine["spec"];
    spec["ip"] = host.ip().to_string().into();
    spec["ssh"]["port"] = host.port().into();
    spec["ssh"]["hostPublicKey"] = host.host_public_key().into();
    match spec["sysctls"].as_object_mut() {
        Some(sysctls) => sysctls.retain(|name, _| name.starts_with("net.")),
        None => spec["sysctls"] = serde_json::json!({}),
    }
    spec["kubelet"]["extraArgs"]["cgroup-root"] = host.cgroup_root().into();
    spec["kubelet"]["evictionHard"]["nodefs.available"] = "0%".into();
    spec["kubelet"]["evictionHard"]["imagefs.available"] = "0%".into();
}

/// The example Machine (`examples/machine.yaml`) for `host`, named after it,
/// in `zone`, filled in by [`fill_in_machine`], and with no package of its
/// own: it follows the cluster default, so changing that rolls it.
pub fn example_machine(host: &TestHost, zone: &str) -> Result<Machine, Error> {
    let mut v = example_document("Machine")?;
    v["metadata"]["name"] = host.name().into();
    v["spec"]["hostname"] = host.name().into();
    v["spec"]["zone"] = zone.into();
    fill_in_machine(&mut v, host);
    v["spec"]["packages"] = serde_json::json!({});
    serde_json::from_value(v).map_err(|e| Error::Example(e.to_string()))
}

/// The example's SSH key Secret (`node-ssh-key` in `kube-system`, which
/// [`example_machine`] names) with the private key `hosts` accept.
pub fn example_ssh_key(hosts: &TestHosts) -> Result<Secret, Error> {
    let mut v = example_document("Secret")?;
    v["stringData"]["ssh-privatekey"] = hosts.client_private_key_pem().into();
    serde_json::from_value(v).map_err(|e| Error::Example(e.to_string()))
}

/// True where `/sys/fs/cgroup` is not a cgroup v2 hierarchy (v1 or hybrid).
pub fn machine_has_cgroup_v1_only() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Whether this process has `CAP_SYS_RESOURCE` (which the test hosts'
/// processes then have too).
pub fn has_cap_sys_resource() -> bool {
    // linux/capability.h
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_machine_names_the_example_key() {
        let machine: Machine =
            serde_json::from_value(example_document("Machine").unwrap()).unwrap();
        let secret = example_document("Secret").unwrap();
        let key = &machine.spec.ssh.private_key_secret_ref;
        assert_eq!(secret["metadata"]["name"], key.name.as_str());
        assert_eq!(secret["metadata"]["namespace"], key.namespace.as_str());
        assert!(secret["stringData"][&key.key].is_string());
    }

    #[test]
    fn options_become_the_scripts_flags() {
        let all = PackageVersionsOptions {
            mirror: Some("10.213.7.1:5000".into()),
            cgroup_v1: true,
            restrict_oom_score_adj: true,
        };
        assert_eq!(
            all.args(),
            [
                "--mirror",
                "10.213.7.1:5000",
                "--cgroup-v1",
                "--restrict-oom-score-adj"
            ]
        );
        assert!(PackageVersionsOptions::default().args().is_empty());
    }

    /// Every document of `text`, each artifact's checksum replaced by the
    /// example's placeholder.
    fn without_checksums(text: &str) -> Vec<Value> {
        use serde::Deserialize;
        serde_norway::Deserializer::from_str(text)
            .map(|doc| {
                let mut v = Value::deserialize(doc).unwrap();
                for a in v["spec"]["artifacts"].as_array_mut().into_iter().flatten() {
                    a["sha256"] = "0".repeat(64).into();
                }
                v
            })
            .collect()
    }

    /// `examples/packageversions.yaml` is what the script prints for a plain
    /// host at the example's artifact mirror, with placeholder checksums for
    /// the user's own files; `examples/clusterpackageversion.yaml` names the
    /// same default versions. The dev environment fills in the checksums.
    #[test]
    fn the_example_package_versions_are_what_the_script_prints() {
        let printed = without_checksums(
            &package_versions(
                "http://artifacts.kube-on-kube.internal",
                &PackageVersionsOptions::default(),
            )
            .unwrap(),
        );
        let (default, printed): (Vec<Value>, Vec<Value>) = printed
            .into_iter()
            .partition(|d| d["kind"] == "ClusterPackageVersion");
        let example = without_checksums(include_str!("../../../examples/packageversions.yaml"));
        assert_eq!(
            example, printed,
            "regenerate examples/packageversions.yaml with scripts/node-packageversions.sh"
        );
        let example_default: Value =
            serde_norway::from_str(include_str!("../../../examples/clusterpackageversion.yaml"))
                .unwrap();
        assert_eq!(
            example_default["spec"]["packages"],
            default[0]["spec"]["packages"]
        );
    }
}
