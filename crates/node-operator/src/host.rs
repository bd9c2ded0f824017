//! Host-level steps besides installing a package: reading the host's facts and
//! the state of its packages back in one round trip, kernel parameters, the
//! kubelet's bootstrap files, and removing everything on offboarding. Scripts
//! are built by pure functions; [`Host`] runs them over a [`Session`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube_on_kube_api::machine::HostFacts;

use crate::install::{PACKAGES_ROOT, WRITE_FILE_FN, base64, package_dir, parse_arch, quote};
use crate::ssh::{Output, Session};
use crate::{Error, redact};

/// Where the kernel parameters of a Machine are persisted.
pub const SYSCTL_FILE: &str = "/etc/sysctl.d/90-kube-on-kube.conf";
/// The kubelet's bootstrap kubeconfig, written by the operator.
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/kubernetes/bootstrap-kubelet.conf";
/// The kubelet's own kubeconfig, written by the kubelet after its TLS
/// bootstrap; its presence means the host has joined.
pub const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// The cluster CA the kubelet trusts clients of its own API with.
pub const CLUSTER_CA: &str = "/etc/kubernetes/pki/ca.crt";

/// One package as the state script reads it back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageState {
    /// Version `current` points at; empty when not installed.
    pub current: String,
    /// Whether its unit is active (true for packages without a unit).
    pub active: bool,
}

/// What one round trip reads back from a host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostState {
    /// Architecture, OS, kernel, host name.
    pub facts: HostFacts,
    /// By package name.
    pub packages: BTreeMap<String, PackageState>,
    /// Whether the kubelet has its own kubeconfig (it has joined once).
    pub kubelet_joined: bool,
}

/// A package to read back: its name and its unit, if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub package: String,
    pub unit: Option<String>,
}

/// Facts and the state of `packages`, as `key=value` lines.
pub fn state_script(packages: &[Probe]) -> String {
    let mut script = String::from(
        r#"echo "arch=$(uname -m)"
echo "hostname=$(hostname)"
echo "kernel=$(uname -r)"
os=$( . /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || true)
echo "os=$os"
"#,
    );
    let _ = writeln!(
        script,
        "if [ -s {} ]; then echo joined=1; else echo joined=0; fi",
        quote(KUBELET_KUBECONFIG)
    );
    for probe in packages {
        let _ = writeln!(
            script,
            "echo \"pkg.{name}.current=$(readlink {dir}/current 2>/dev/null || true)\"",
            name = probe.package,
            dir = quote(&package_dir(&probe.package)),
        );
        match &probe.unit {
            Some(unit) => {
                let _ = writeln!(
                    script,
                    "if systemctl is-active --quiet {u}; then echo \"pkg.{name}.active=1\"; else echo \"pkg.{name}.active=0\"; fi",
                    u = quote(unit),
                    name = probe.package,
                );
            }
            None => {
                let _ = writeln!(script, "echo \"pkg.{}.active=1\"", probe.package);
            }
        }
    }
    script
}

/// Parses what [`state_script`] printed.
pub fn parse_state(stdout: &str) -> Result<HostState, Error> {
    let mut state = HostState::default();
    let mut arch = String::new();
    for line in stdout.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        match key {
            "arch" => arch = value.to_string(),
            // Facts go into the Machine's status: what the host says is
            // redacted like any other output of it.
            "hostname" => state.facts.hostname = redact::line(value),
            "kernel" => state.facts.kernel = (!value.is_empty()).then(|| redact::line(value)),
            "os" => state.facts.os = (!value.is_empty()).then(|| redact::line(value)),
            "joined" => state.kubelet_joined = value == "1",
            _ => {
                let Some(rest) = key.strip_prefix("pkg.") else {
                    continue;
                };
                let Some((package, field)) = rest.rsplit_once('.') else {
                    continue;
                };
                let entry = state.packages.entry(package.to_string()).or_default();
                match field {
                    "current" => entry.current = value.to_string(),
                    "active" => entry.active = value == "1",
                    _ => {}
                }
            }
        }
    }
    let arch = parse_arch(&arch)?;
    state.facts.arch = match arch {
        kube_on_kube_api::package::Arch::Amd64 => "amd64".into(),
        kube_on_kube_api::package::Arch::Arm64 => "arm64".into(),
    };
    Ok(state)
}

/// Sets each parameter that differs with `sysctl -w` and persists them all.
pub fn sysctl_script(sysctls: &BTreeMap<String, String>) -> String {
    let mut script = format!("set -eu\n{WRITE_FILE_FN}");
    let mut persisted =
        String::from("# Written by the node-operator from the Machine's spec.sysctls.\n");
    for (key, value) in sysctls {
        let _ = writeln!(
            script,
            "if [ \"$(sysctl -n {k})\" != {v} ]; then sysctl -q -w {kv}; echo \"changed {k}\"; fi",
            k = quote(key),
            v = quote(value),
            kv = quote(&format!("{key}={value}")),
        );
        let _ = writeln!(persisted, "{key} = {value}");
    }
    if sysctls.is_empty() {
        let _ = writeln!(script, "rm -f {}", quote(SYSCTL_FILE));
    } else {
        let _ = writeln!(
            script,
            "write_file {} 0644 {}",
            quote(SYSCTL_FILE),
            quote(&base64(persisted.as_bytes()))
        );
    }
    script
}

/// Writes each `(path, mode, content)` when it differs.
pub fn files_script(files: &[(&str, &str, &str)]) -> String {
    let mut script = format!("set -eu\n{WRITE_FILE_FN}");
    for (path, mode, content) in files {
        let _ = writeln!(
            script,
            "write_file {} {} {}",
            quote(path),
            quote(mode),
            quote(&base64(content.as_bytes()))
        );
    }
    script
}

/// What offboarding removes for one package.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    pub package: String,
    pub unit: Option<String>,
    pub links: Vec<String>,
    /// The PackageVersion's `beforeRemove` command.
    pub before_remove: Vec<String>,
}

/// Stops and removes every package, the links into them, the kubelet's
/// files and the persisted kernel parameters. Safe to repeat. Only package
/// names reach `rm -rf`, and a link is removed only while it points into its
/// package's directory.
pub fn offboard_script(packages: &[Removal]) -> String {
    let mut script = String::from("set -u\n");
    for removal in packages
        .iter()
        .filter(|r| crate::paths::package_name(&r.package).is_ok())
    {
        if !removal.before_remove.is_empty() {
            // Bounded, and never the end of the removal: a host whose
            // runtime already died still gets cleaned.
            let command: Vec<String> = removal.before_remove.iter().map(|a| quote(a)).collect();
            let _ = writeln!(
                script,
                "if [ -e {d} ]; then timeout 120 {c} || echo \"before-remove of {p} failed ($?)\"; fi",
                d = quote(&package_dir(&removal.package)),
                c = command.join(" "),
                p = removal.package,
            );
        }
        if let Some(unit) = &removal.unit {
            let _ = writeln!(
                script,
                "u={u}\nif [ -e /etc/systemd/system/\"$u\" ]; then systemctl stop \"$u\" || true; systemctl disable \"$u\" >/dev/null 2>&1 || true; rm -f /etc/systemd/system/\"$u\"; echo \"removed unit $u\"; fi",
                u = quote(unit)
            );
        }
        for link in &removal.links {
            let _ = writeln!(
                script,
                "l={l}\nif [ -L \"$l\" ]; then case \"$(readlink \"$l\")\" in {d}/*) rm -f \"$l\" ;; esac; fi",
                l = quote(link),
                d = quote(&package_dir(&removal.package)),
            );
        }
        let _ = writeln!(
            script,
            "if [ -e {d} ]; then rm -rf {d}; echo \"removed {d}\"; fi\nrm -f {lock}",
            d = quote(&package_dir(&removal.package)),
            lock = quote(&format!("{PACKAGES_ROOT}/.{}.lock", removal.package)),
        );
    }
    // Links into removed packages that no PackageVersion named any more.
    let _ = writeln!(
        script,
        "for l in /usr/local/bin/* /opt/cni/bin/*; do if [ -L \"$l\" ]; then case \"$(readlink \"$l\")\" in {root}/*) rm -f \"$l\" ;; esac; fi; done",
        root = PACKAGES_ROOT
    );
    let _ = writeln!(
        script,
        "rm -f {} {} {} {}\nsystemctl daemon-reload || true\necho offboarded",
        quote(BOOTSTRAP_KUBECONFIG),
        quote(KUBELET_KUBECONFIG),
        quote(CLUSTER_CA),
        quote(SYSCTL_FILE)
    );
    script
}

/// Runs host-level steps over a session.
pub struct Host<'a> {
    session: &'a Session,
}

impl<'a> Host<'a> {
    pub fn new(session: &'a Session) -> Self {
        Self { session }
    }

    async fn checked(&self, step: &'static str, script: &str) -> Result<Output, Error> {
        let started = std::time::Instant::now();
        let output = self.session.run(script).await;
        let ok = output.as_ref().is_ok_and(|o| o.success());
        crate::metrics::domain().observe_ssh_step(step, ok, started.elapsed());
        let output = output?;
        if !output.success() {
            return Err(Error::Step {
                host: self.session.host().to_string(),
                step,
                status: output.status,
                tail: output.redacted_tail(),
            });
        }
        Ok(output)
    }

    /// Facts and package state in one round trip.
    pub async fn state(&self, packages: &[Probe]) -> Result<HostState, Error> {
        let output = self.checked("state", &state_script(packages)).await?;
        parse_state(&output.stdout)
    }

    /// Applies kernel parameters; returns whether anything changed.
    pub async fn sysctls(&self, sysctls: &BTreeMap<String, String>) -> Result<bool, Error> {
        let output = self.checked("sysctl", &sysctl_script(sysctls)).await?;
        Ok(output.stdout.lines().any(|l| l.starts_with("changed")))
    }

    /// Writes files; returns whether anything changed.
    pub async fn files(&self, files: &[(&str, &str, &str)]) -> Result<bool, Error> {
        let output = self.checked("files", &files_script(files)).await?;
        Ok(output.stdout.lines().any(|l| l.starts_with("changed")))
    }

    /// Restarts a unit.
    pub async fn restart(&self, unit: &str) -> Result<(), Error> {
        self.checked("restart", &format!("systemctl restart {}\n", quote(unit)))
            .await
            .map(|_| ())
    }

    /// Runs a remediation command; returns the redacted tail of its output.
    pub async fn command(&self, command: &str) -> Result<String, Error> {
        let output = self.checked("remediation", &format!("{command}\n")).await?;
        Ok(output.redacted_tail())
    }

    /// Removes every package.
    pub async fn offboard(&self, packages: &[Removal]) -> Result<String, Error> {
        let output = self.checked("offboard", &offboard_script(packages)).await?;
        Ok(output.redacted_tail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_read_back_in_one_script() {
        let probes = [
            Probe {
                package: "kubelet".into(),
                unit: Some("kubelet.service".into()),
            },
            Probe {
                package: "cni-plugins".into(),
                unit: None,
            },
        ];
        let script = state_script(&probes);
        assert!(script.contains("readlink '/opt/kube-on-kube/packages/kubelet'/current"));
        assert!(script.contains("systemctl is-active --quiet 'kubelet.service'"));
        let state = parse_state(
            "arch=x86_64\nhostname=h1\nkernel=6.1\nos=Debian\njoined=1\npkg.kubelet.current=1.35.4\npkg.kubelet.active=0\npkg.cni-plugins.current=\npkg.cni-plugins.active=1\n",
        )
        .unwrap();
        assert_eq!(state.facts.arch, "amd64");
        assert_eq!(state.facts.hostname, "h1");
        assert!(state.kubelet_joined);
        assert_eq!(
            state.packages["kubelet"],
            PackageState {
                current: "1.35.4".into(),
                active: false
            }
        );
        assert_eq!(state.packages["cni-plugins"].current, "");
        assert!(parse_state("arch=mips\n").is_err());
    }

    #[test]
    fn sysctls_are_set_only_when_different_and_persisted() {
        let script = sysctl_script(&BTreeMap::from([(
            "net.ipv4.ip_forward".to_string(),
            "1".to_string(),
        )]));
        assert!(script.contains("if [ \"$(sysctl -n 'net.ipv4.ip_forward')\" != '1' ]; then sysctl -q -w 'net.ipv4.ip_forward=1'"));
        assert!(script.contains(&format!("write_file '{SYSCTL_FILE}' 0644 ")));
        assert!(sysctl_script(&BTreeMap::new()).contains(&format!("rm -f '{SYSCTL_FILE}'")));
    }

    #[test]
    fn offboarding_stops_units_and_removes_packages_and_links() {
        let script = offboard_script(&[Removal {
            package: "kubelet".into(),
            unit: Some("kubelet.service".into()),
            links: vec!["/usr/local/bin/kubelet".into()],
            before_remove: vec![],
        }]);
        let stop = script.find("systemctl stop").unwrap();
        let rm = script
            .find("rm -rf '/opt/kube-on-kube/packages/kubelet'")
            .unwrap();
        assert!(stop < rm);
        assert!(script.contains("l='/usr/local/bin/kubelet'\nif [ -L \"$l\" ]; then case \"$(readlink \"$l\")\" in '/opt/kube-on-kube/packages/kubelet'/*) rm -f \"$l\""));
        assert!(script.contains(KUBELET_KUBECONFIG));
    }

    #[test]
    fn a_before_remove_command_runs_quoted_while_the_service_still_runs() {
        let script = offboard_script(&[Removal {
            package: "containerd".into(),
            unit: Some("containerd.service".into()),
            links: vec![],
            before_remove: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo '$(x)'; kill all".into(),
            ],
        }]);
        let before = script
            .find("timeout 120 '/bin/sh' '-c' 'echo '\\''$(x)'\\''; kill all' || echo")
            .unwrap_or_else(|| panic!("{script}"));
        let stop = script.find("systemctl stop").unwrap();
        let rm = script
            .find("rm -rf '/opt/kube-on-kube/packages/containerd'")
            .unwrap();
        assert!(before < stop && stop < rm, "{script}");
    }
}
