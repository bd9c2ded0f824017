//! The three packages both tools install: a container runtime and kubelet
//! (services with a unit and a health check) and CNI plugins (binaries and a
//! config file only). Each artifact is a real tar.gz carrying a payload of
//! the requested size, so download, checksum and unpack cost what they would.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use kok_testenv::hosts::TestHosts;
use kube_on_kube_api::package::{
    Arch, Artifact, ArtifactFormat, Binary, ConfigFile, HealthCheck, InstallSpec,
    PackageVersionSpec, SystemdUnit,
};

/// One package as both tools see it.
pub struct Package {
    /// Its PackageVersion's name, `<package>-<version>`.
    pub name: String,
    /// What node-operator installs.
    pub spec: PackageVersionSpec,
    /// The same, as the playbook's variables.
    pub ansible: serde_json::Value,
}

struct Shape {
    name: &'static str,
    binaries: &'static [&'static str],
    config_path: &'static str,
    service: bool,
}

const SHAPES: [Shape; 3] = [
    Shape {
        name: "containerd",
        binaries: &["containerd", "ctr"],
        config_path: "/etc/kubernetes/containerd.toml",
        service: true,
    },
    Shape {
        name: "cni-plugins",
        binaries: &["bridge", "host-local", "loopback"],
        config_path: "/etc/cni/net.d/10-kok.conflist",
        service: false,
    },
    Shape {
        name: "kubelet",
        binaries: &["kubelet"],
        config_path: "/etc/kubernetes/kubelet.yaml",
        service: true,
    },
];

/// Builds the three artifacts into `hosts`' artifact directory.
pub fn build(hosts: &TestHosts, version: &str, payload_mib: usize) -> Result<Vec<Package>> {
    SHAPES
        .iter()
        .map(|shape| build_one(hosts, shape, version, payload_mib, false))
        .collect()
}

/// Where a broken package's health check records each time it failed.
pub const HEALTH_FAILURES: &str = "/root/health-failures";

/// Builds one more version of the kubelet package. A `broken` one installs
/// and starts like any other, but its health check fails, and records when
/// it did in [`HEALTH_FAILURES`] on the host (both tools run the same check).
pub fn build_kubelet(
    hosts: &TestHosts,
    version: &str,
    payload_mib: usize,
    broken: bool,
) -> Result<Package> {
    let shape = SHAPES
        .iter()
        .find(|s| s.name == "kubelet")
        .context("no kubelet package shape")?;
    build_one(hosts, shape, version, payload_mib, broken)
}

fn build_one(
    hosts: &TestHosts,
    shape: &Shape,
    version: &str,
    payload_mib: usize,
    broken: bool,
) -> Result<Package> {
    let work = tempfile::tempdir()?;
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    for name in shape.binaries {
        let version_answer = if broken {
            format!("date +%s.%N >> {HEALTH_FAILURES}; exit 1")
        } else {
            format!("echo {name} {version}; exit 0")
        };
        let script = format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then {version_answer}; fi\nexec sleep 1000000\n"
        );
        let path = bin.join(name);
        std::fs::write(&path, script)?;
        run(Command::new("chmod").arg("0755").arg(&path))?;
    }
    // Incompressible, so the download is as large as asked.
    run(Command::new("head")
        .arg("-c")
        .arg(format!("{}", payload_mib * 1024 * 1024))
        .arg("/dev/urandom")
        .stdout(std::fs::File::create(work.path().join("payload"))?))?;
    let file = format!("{}-{version}.tar.gz", shape.name);
    let name_of_version = format!("{}-{version}", shape.name);
    let archive = hosts.artifacts_dir().join(&file);
    run(Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(work.path())
        .arg("bin")
        .arg("payload"))?;
    let sha256 = sha256(&archive)?;
    let url = hosts.artifact_url(&file);
    let first = shape.binaries[0];
    let template = format!("# {} {{{{version}}}}\nnodeIP: {{{{nodeIP}}}}\n", shape.name);
    let unit_name = format!("{}.service", shape.name);
    let unit = format!(
        "[Unit]\nDescription={name}\n[Service]\nExecStart=/usr/local/bin/{first}\nRestart=always\n[Install]\nWantedBy=multi-user.target\n",
        name = shape.name
    );
    let health = vec![format!("/usr/local/bin/{first}"), "--version".to_string()];
    let health_check = HealthCheck {
        command: Some(health),
        http_get: None,
        timeout_seconds: 10,
    };
    let spec = PackageVersionSpec {
        package: shape.name.into(),
        version: version.into(),
        artifacts: vec![Artifact {
            arch: Arch::Amd64,
            url: url.clone(),
            sha256: sha256.clone(),
            format: ArtifactFormat::TarGz,
        }],
        install: InstallSpec {
            before_remove: vec![],
            binaries: shape
                .binaries
                .iter()
                .map(|b| Binary {
                    path: format!("bin/{b}"),
                    link: Some(format!("/usr/local/bin/{b}")),
                })
                .collect(),
            files: vec![ConfigFile {
                path: shape.config_path.into(),
                template: template.clone(),
                mode: "0644".into(),
            }],
            systemd_unit: shape.service.then(|| SystemdUnit {
                name: unit_name.clone(),
                content: unit.clone(),
            }),
            requires_drain: false,
        },
        health_check: Some(health_check.clone()),
        depends_on: vec![],
    };
    let ansible = serde_json::json!({
        "name": shape.name,
        "version": version,
        "url": url,
        "sha256": sha256,
        "config_path": shape.config_path,
        "config": template.replace("{{version}}", version).replace("{{nodeIP}}", "@nodeIP@"),
        "binaries": shape.binaries.iter().map(|b| serde_json::json!({
            "path": format!("bin/{b}"),
            "link": format!("/usr/local/bin/{b}"),
        })).collect::<Vec<_>>(),
        "unit_name": if shape.service { unit_name.as_str() } else { "" },
        "unit": unit,
        // node-operator's own deadline loop, run as one task.
        "health_script": node_operator::install::health_script(&health_check),
    });
    Ok(Package {
        name: name_of_version,
        spec,
        ansible,
    })
}

/// The template values node-operator fills for a host.
pub fn values(ip: &str) -> node_operator::install::Values {
    BTreeMap::from([("nodeIP".to_string(), serde_json::Value::from(ip))])
}

/// Reads back what a host runs: each package's `current` target and whether
/// its service is active. Both tools must leave every host the same.
pub fn check_host(host: &kok_testenv::hosts::TestHost, version: &str) -> Result<()> {
    let mut script = String::new();
    for shape in &SHAPES {
        script.push_str(&format!(
            "printf '%s ' \"$(readlink /opt/kube-on-kube/packages/{n}/current)\"; /usr/local/bin/{b} --version; ",
            n = shape.name,
            b = shape.binaries[0]
        ));
        if shape.service {
            script.push_str(&format!("systemctl is-active {}.service; ", shape.name));
        }
    }
    let output = host.ssh(&script);
    let text = String::from_utf8_lossy(&output.stdout);
    let expected: String = SHAPES
        .iter()
        .map(|s| {
            let mut line = format!("{version} {} {version}\n", s.binaries[0]);
            if s.service {
                line.push_str("active\n");
            }
            line
        })
        .collect();
    if text != expected {
        bail!("{} is not fully installed: {text:?}", host.name());
    }
    Ok(())
}

fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("{command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

fn sha256(path: &Path) -> Result<String> {
    let output = Command::new("sha256sum").arg(path).output()?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}
