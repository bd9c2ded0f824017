//! Installs one PackageVersion on one host: the shell scripts of each step are
//! built here as pure functions, then run over a [`Session`] in an order where
//! a crash or a re-run anywhere converges to the same state.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kube_on_kube_api::package::{Arch, ArtifactFormat, HealthCheck, PackageVersionSpec};

use crate::Error;
use crate::ssh::{Output, Session};

/// Every package lives below this directory on the host.
pub const PACKAGES_ROOT: &str = "/opt/kube-on-kube/packages";

/// Lines of each step's output kept in results.
const TAIL_LINES: usize = 20;

// Exit codes by which scripts report failures Rust sorts into error variants.
const EXIT_DOWNLOAD: i32 = 20;
const EXIT_HTTP: i32 = 21;
const EXIT_CHECKSUM: i32 = 22;
const EXIT_NOT_UNPACKED: i32 = 23;
const EXIT_UNHEALTHY: i32 = 24;
const EXIT_NO_PREVIOUS: i32 = 25;
const EXIT_LOCKED: i32 = 26;

/// What one step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOutput {
    /// Step name: facts, fetch, files, switch, binaries, unit, health.
    pub step: &'static str,
    /// Whether it changed anything on the host.
    pub changed: bool,
    /// The last lines of its output, with secrets redacted.
    pub tail: String,
}

/// Outcome of an install or a rollback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallResult {
    /// Package name.
    pub package: String,
    /// Version `current` points at now.
    pub version: String,
    /// Version `previous` points at now, if any.
    pub previous: Option<String>,
    /// Whether any step changed the host.
    pub changed: bool,
    /// Each step in the order run.
    pub steps: Vec<StepOutput>,
}

/// `/opt/kube-on-kube/packages/<package>`.
pub fn package_dir(package: &str) -> String {
    format!("{PACKAGES_ROOT}/{package}")
}

/// Single-quotes `s` for `sh`.
pub use kok_common::template::shell_quote as quote;

/// Maps `uname -m` to the architecture names artifacts use.
pub fn parse_arch(uname_m: &str) -> Result<Arch, Error> {
    match uname_m.trim() {
        "x86_64" | "amd64" => Ok(Arch::Amd64),
        "aarch64" | "arm64" => Ok(Arch::Arm64),
        other => Err(Error::UnsupportedArch(other.to_string())),
    }
}

fn arch_name(arch: Arch) -> &'static str {
    match arch {
        Arch::Amd64 => "amd64",
        Arch::Arm64 => "arm64",
    }
}

/// Template values: names to JSON values (strings, or lists and maps for
/// the kubelet settings).
pub type Values = BTreeMap<String, serde_json::Value>;

/// `template` (a file's or unit's, called `what` in messages) rendered with
/// the shared template engine; an unknown key or a value its filter cannot
/// write safely is an error rather than text left for the service to trip
/// over.
pub fn render(what: &str, template: &str, values: &Values) -> Result<String, Error> {
    kok_common::template::render(what, template, values).map_err(Error::Template)
}

/// The values templates of `spec` see: the caller's plus `packageDir`,
/// `version` and `arch`.
pub fn template_values(spec: &PackageVersionSpec, arch: Arch, values: &Values) -> Values {
    let mut all = values.clone();
    all.insert("packageDir".into(), package_dir(&spec.package).into());
    all.insert("version".into(), spec.version.clone().into());
    all.insert("arch".into(), arch_name(arch).into());
    all
}

/// Step (a): the facts installing depends on.
pub fn facts_script() -> String {
    "uname -m\n".to_string()
}

/// Step (b): download, verify, unpack. Skipped when the version directory's
/// `.complete` marker names the expected sha256. The marker is written inside
/// `<version>.tmp` before the one `mv` that makes the version visible, so an
/// interrupted run never leaves a version that looks complete but is not.
pub fn fetch_script(spec: &PackageVersionSpec, arch: Arch) -> Result<String, Error> {
    let artifact = spec
        .artifacts
        .iter()
        .find(|a| a.arch == arch)
        .ok_or_else(|| Error::NoArtifact {
            package: spec.package.clone(),
            version: spec.version.clone(),
            arch: arch_name(arch).into(),
        })?;
    let unpack = match artifact.format {
        ArtifactFormat::TarGz => "tar -xzf \"$dl\" -C \"$v.tmp\"".to_string(),
        ArtifactFormat::Binary => {
            let name = spec
                .install
                .binaries
                .first()
                .map(|b| b.path.as_str())
                .unwrap_or(spec.package.as_str());
            format!(
                "mkdir -p \"$(dirname \"$v.tmp/\"{name})\" && install -m 0755 \"$dl\" \"$v.tmp/\"{name}",
                name = quote(name)
            )
        }
    };
    Ok(format!(
        r#"set -eu
{lock}dir={dir}
version={version}
v="$dir/$version"
want={sha}
url={url}
if [ -f "$v/.complete" ] && [ "$(cat "$v/.complete")" = "$want" ]; then
  echo "present $v"
  exit 0
fi
mkdir -p "$dir"
dl="$dir/.$version.download"
rm -f "$dl"
code=$(curl -sS -L --connect-timeout 10 --max-time 600 -o "$dl" -w '%{{http_code}}' "$url") || {{
  rm -f "$dl"
  echo "download of $url failed" >&2
  exit {EXIT_DOWNLOAD}
}}
case "$code" in
  2??) ;;
  *) rm -f "$dl"; echo "http_status=$code"; exit {EXIT_HTTP} ;;
esac
got=$(sha256sum "$dl" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  rm -f "$dl"
  echo "sha256=$got"
  exit {EXIT_CHECKSUM}
fi
rm -rf "$v.tmp"
mkdir -p "$v.tmp"
{unpack}
rm -f "$dl"
printf '%s\n' "$want" > "$v.tmp/.complete"
# A version directory without the right marker is an interrupted earlier
# attempt; it is renamed away rather than deleted in place so the window
# without "$v" is two renames long.
rm -rf "$v.old"
if [ -e "$v" ]; then mv -T "$v" "$v.old"; fi
mv -T "$v.tmp" "$v"
rm -rf "$v.old"
echo "changed unpacked $v"
"#,
        lock = lock_prelude(&spec.package),
        dir = quote(&package_dir(&spec.package)),
        version = quote(&spec.version),
        sha = quote(&artifact.sha256),
        url = quote(&artifact.url),
    ))
}

/// Shell function writing a file only when its content or mode differ, via a
/// temporary file and `mv` so readers never see it half written.
pub(crate) const WRITE_FILE_FN: &str = r#"write_file() {
  p=$1; m=$2; t="$1.kok-tmp"
  mkdir -p "$(dirname "$p")"
  printf '%s' "$3" | base64 -d > "$t"
  chmod "$m" "$t"
  if [ -f "$p" ] && cmp -s "$t" "$p" && [ "$(stat -c %a "$p")" = "$(stat -c %a "$t")" ]; then
    rm -f "$t"
  else
    mv -f "$t" "$p"
    echo "changed $p"
  fi
}
"#;

/// Step (c): config files, rendered and written when they differ.
pub fn files_script(spec: &PackageVersionSpec, values: &Values) -> Result<String, Error> {
    let mut script = format!("set -eu\n{WRITE_FILE_FN}");
    for file in &spec.install.files {
        let content = render(&file.path, &file.template, values)?;
        let _ = writeln!(
            script,
            "write_file {} {} {}",
            quote(&file.path),
            quote(&file.mode),
            quote(&base64(content.as_bytes()))
        );
    }
    Ok(script)
}

/// Step (d): links to `current/<path>`, which stay valid across versions.
pub fn binaries_script(spec: &PackageVersionSpec) -> String {
    let mut script = String::from("set -eu\n");
    let dir = package_dir(&spec.package);
    for binary in &spec.install.binaries {
        let Some(link) = &binary.link else { continue };
        let target = format!("{dir}/current/{}", binary.path);
        let _ = writeln!(
            script,
            r#"l={link}; t={target}
if [ "$(readlink "$l" 2>/dev/null || true)" != "$t" ]; then
  mkdir -p "$(dirname "$l")"
  ln -sfn "$t" "$l.kok-tmp" && mv -T "$l.kok-tmp" "$l"
  echo "changed $l"
fi"#,
            link = quote(link),
            target = quote(&target),
        );
    }
    script
}

/// Step (e): points `current` at `version`, keeping the former target as
/// `previous`.
pub fn switch_script(package: &str, version: &str) -> String {
    format!(
        r#"set -eu
{lock}dir={dir}
want={version}
cur=$(readlink "$dir/current" 2>/dev/null || true)
if [ "$cur" = "$want" ]; then
  echo "current=$want"
  echo "previous=$(readlink "$dir/previous" 2>/dev/null || true)"
  exit 0
fi
if [ ! -f "$dir/$want/.complete" ]; then
  echo "$dir/$want is not unpacked" >&2
  exit {EXIT_NOT_UNPACKED}
fi
{swap}"#,
        lock = lock_prelude(package),
        dir = quote(&package_dir(package)),
        version = quote(version),
        swap = SWAP_LINKS,
    )
}

/// Step (h): swaps `current` and `previous`.
pub fn rollback_script(package: &str) -> String {
    format!(
        r#"set -eu
{lock}dir={dir}
prev=$(readlink "$dir/previous" 2>/dev/null || true)
cur=$(readlink "$dir/current" 2>/dev/null || true)
if [ -z "$prev" ] || [ ! -f "$dir/$prev/.complete" ]; then
  echo "no previous version" >&2
  exit {EXIT_NO_PREVIOUS}
fi
want=$prev
{swap}"#,
        lock = lock_prelude(package),
        dir = quote(&package_dir(package)),
        swap = SWAP_LINKS,
    )
}

/// Makes `$want` current and the former `$cur` previous. Each link is
/// replaced by `rename`, never removed first, so `current` always resolves.
const SWAP_LINKS: &str = r#"if [ -n "$cur" ]; then
  ln -sfn "$cur" "$dir/.previous.kok-tmp"
  mv -T "$dir/.previous.kok-tmp" "$dir/previous"
fi
ln -sfn "$want" "$dir/.current.kok-tmp"
mv -T "$dir/.current.kok-tmp" "$dir/current"
echo "changed current $cur -> $want"
echo "current=$(readlink "$dir/current")"
echo "previous=$(readlink "$dir/previous" 2>/dev/null || true)"
"#;

/// Serialises the steps that change a package's directory, should two
/// operators (or an operator and a person) work on the same host at once.
/// The lock lives beside the package directory, not in it.
fn lock_prelude(package: &str) -> String {
    format!(
        "mkdir -p {root}\nexec 9>{lock}\nflock -w 120 9 || {{ echo \"another install holds {package}'s lock\" >&2; exit {EXIT_LOCKED}; }}\n",
        root = quote(PACKAGES_ROOT),
        lock = quote(&format!("{PACKAGES_ROOT}/.{package}.lock")),
    )
}

/// Step (f): unit file, enabled, and restarted when anything it runs changed
/// or it is not active. `force_restart` carries earlier steps' changes.
pub fn unit_script(name: &str, content: Option<&str>, force_restart: bool) -> String {
    let mut script = format!("set -eu\n{WRITE_FILE_FN}u={}\n", quote(name));
    let _ = writeln!(script, "restart={}", u8::from(force_restart));
    if let Some(content) = content {
        let _ = writeln!(
            script,
            r#"if [ -n "$(write_file /etc/systemd/system/"$u" 0644 {})" ]; then
  echo "changed unit $u"
  systemctl daemon-reload
  restart=1
fi"#,
            quote(&base64(content.as_bytes()))
        );
    }
    script.push_str(
        r#"systemctl enable "$u" >/dev/null
if [ "$restart" = 1 ] || ! systemctl is-active --quiet "$u"; then
  systemctl restart "$u"
  echo "changed restarted $u"
fi
"#,
    );
    script
}

/// Step (g): retries the check until it passes or `timeoutSeconds` pass.
pub fn health_script(check: &HealthCheck) -> String {
    let probe = match (&check.command, &check.http_get) {
        // A probe that hangs must not hold the step past the check's own
        // deadline.
        (Some(command), _) => format!(
            "timeout {} {}",
            check.timeout_seconds.max(1),
            command
                .iter()
                .map(|a| quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        (None, Some(url)) => format!("curl -fsS -o /dev/null --max-time 5 {}", quote(url)),
        (None, None) => "true".to_string(),
    };
    format!(
        r#"deadline=$(( $(date +%s) + {timeout} ))
while :; do
  if out=$({probe} 2>&1); then
    echo "healthy"
    exit 0
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    printf '%s\n' "$out" | tail -n 5
    exit {EXIT_UNHEALTHY}
  fi
  sleep 1
done
"#,
        timeout = check.timeout_seconds.max(1),
    )
}

/// The last lines of a step's output, with anything that looks like a key or
/// token replaced, for status and events.
pub fn redacted_tail(output: &Output) -> String {
    let mut text = output.stdout.clone();
    if !output.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&output.stderr);
    }
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(TAIL_LINES);
    let mut in_key = false;
    let mut out = Vec::new();
    for line in &lines[start..] {
        if line.contains("-----BEGIN") && line.contains("KEY") {
            in_key = true;
        }
        if in_key {
            if line.contains("-----END") {
                in_key = false;
            }
            out.push("[redacted]".to_string());
            continue;
        }
        out.push(redact_line(line));
    }
    out.join("\n")
}

fn redact_line(line: &str) -> String {
    let lower = line.to_lowercase();
    for marker in ["token", "password", "secret", "authorization"] {
        if let Some(at) = lower.find(marker) {
            return format!("{}[redacted]", &line[..at + marker.len()]);
        }
    }
    line.split(' ')
        .map(|word| {
            if looks_like_secret(word) {
                "[redacted]"
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn looks_like_secret(word: &str) -> bool {
    let bootstrap_token = word.len() == 23
        && word.as_bytes()[6] == b'.'
        && word
            .chars()
            .enumerate()
            .all(|(i, c)| i == 6 || c.is_ascii_lowercase() || c.is_ascii_digit());
    let hex = word.chars().all(|c| c.is_ascii_hexdigit());
    let base64ish = word.len() >= 32
        && !hex
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+/=_-".contains(c));
    bootstrap_token || base64ish
}

pub(crate) fn base64(data: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(TABLE[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn value_of<'a>(output: &'a Output, key: &str) -> Option<&'a str> {
    output
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::trim)
}

/// `current` and `previous` as a switch or rollback script read them back.
fn links(output: &Output) -> (String, Option<String>) {
    let current = value_of(output, "current").unwrap_or_default().to_string();
    let previous = value_of(output, "previous")
        .filter(|p| !p.is_empty())
        .map(str::to_string);
    (current, previous)
}

fn changed(output: &Output) -> bool {
    output.stdout.lines().any(|l| l.starts_with("changed "))
}

/// Runs the steps of one package version on one host.
pub struct Installer<'a> {
    session: &'a Session,
}

impl<'a> Installer<'a> {
    /// An installer working over `session`.
    pub fn new(session: &'a Session) -> Self {
        Self { session }
    }

    async fn step(&self, step: &'static str, script: &str) -> Result<(Output, StepOutput), Error> {
        let started = std::time::Instant::now();
        let output = self.session.run(script).await;
        let ok = output.as_ref().is_ok_and(|o| o.success());
        kok_common::metrics::global().observe_ssh_step(step, ok, started.elapsed());
        let output = output?;
        tracing::debug!(host = %self.session.host(), step, status = output.status, "install step ran");
        let summary = StepOutput {
            step,
            changed: changed(&output),
            tail: redacted_tail(&output),
        };
        Ok((output, summary))
    }

    /// Runs a step whose only failure mode is "the script failed".
    async fn checked(
        &self,
        step: &'static str,
        script: &str,
    ) -> Result<(Output, StepOutput), Error> {
        let (output, summary) = self.step(step, script).await?;
        if !output.success() {
            return Err(self.failed(step, &output));
        }
        Ok((output, summary))
    }

    fn failed(&self, step: &'static str, output: &Output) -> Error {
        Error::Step {
            host: self.session.host().to_string(),
            step,
            status: output.status,
            tail: redacted_tail(output),
        }
    }

    /// The host's architecture.
    pub async fn arch(&self) -> Result<Arch, Error> {
        let (output, _) = self.checked("facts", &facts_script()).await?;
        parse_arch(&output.stdout)
    }

    /// Installs `spec` and makes it current. `values` fill the templates of
    /// its files and unit. Safe to repeat: a second run changes nothing and
    /// restarts nothing.
    pub async fn install(
        &self,
        spec: &PackageVersionSpec,
        values: &Values,
    ) -> Result<InstallResult, Error> {
        let mut steps = Vec::new();
        let arch = self.arch().await?;
        let values = template_values(spec, arch, values);
        // Everything is rendered before the host is touched, so a bad
        // template cannot leave a half-done install behind.
        let files = files_script(spec, &values)?;
        let unit = match &spec.install.systemd_unit {
            Some(u) => Some((u.name.clone(), render(&u.name, &u.content, &values)?)),
            None => None,
        };

        let (output, summary) = self.step("fetch", &fetch_script(spec, arch)?).await?;
        if !output.success() {
            return Err(self.fetch_error(spec, arch, &output));
        }
        steps.push(summary);

        steps.push(self.checked("files", &files).await?.1);

        let (output, summary) = self
            .checked("switch", &switch_script(&spec.package, &spec.version))
            .await?;
        let (current, previous) = links(&output);
        steps.push(summary);

        steps.push(self.checked("binaries", &binaries_script(spec)).await?.1);

        if let Some((name, content)) = &unit {
            let anything_changed = steps.iter().any(|s| s.changed);
            let script = unit_script(name, Some(content), anything_changed);
            steps.push(self.checked("unit", &script).await?.1);
        }

        if let Some(check) = &spec.health_check {
            steps.push(self.health(&spec.package, &current, check).await?);
        }

        Ok(InstallResult {
            package: spec.package.clone(),
            version: current,
            changed: steps.iter().any(|s| s.changed),
            previous,
            steps,
        })
    }

    /// Points `current` back at `previous`, restarts `unit` if the package
    /// has one, and runs `health` if given.
    pub async fn rollback(
        &self,
        package: &str,
        unit: Option<&str>,
        health: Option<&HealthCheck>,
    ) -> Result<InstallResult, Error> {
        let mut steps = Vec::new();
        let (output, summary) = self.step("rollback", &rollback_script(package)).await?;
        if output.status == EXIT_NO_PREVIOUS {
            return Err(Error::NoPrevious {
                package: package.to_string(),
            });
        }
        if !output.success() {
            return Err(self.failed("rollback", &output));
        }
        let (current, previous) = links(&output);
        steps.push(summary);
        if let Some(name) = unit {
            steps.push(
                self.checked("unit", &unit_script(name, None, true))
                    .await?
                    .1,
            );
        }
        if let Some(check) = health {
            steps.push(self.health(package, &current, check).await?);
        }
        Ok(InstallResult {
            package: package.to_string(),
            version: current,
            previous,
            changed: true,
            steps,
        })
    }

    async fn health(
        &self,
        package: &str,
        version: &str,
        check: &HealthCheck,
    ) -> Result<StepOutput, Error> {
        let (output, summary) = self.step("health", &health_script(check)).await?;
        if output.status == EXIT_UNHEALTHY {
            return Err(Error::HealthCheck {
                package: package.to_string(),
                version: version.to_string(),
                timeout_seconds: check.timeout_seconds,
                detail: redacted_tail(&output),
            });
        }
        if !output.success() {
            return Err(self.failed("health", &output));
        }
        Ok(summary)
    }

    fn fetch_error(&self, spec: &PackageVersionSpec, arch: Arch, output: &Output) -> Error {
        let url = spec
            .artifacts
            .iter()
            .find(|a| a.arch == arch)
            .map(|a| (a.url.clone(), a.sha256.clone()))
            .unwrap_or_default();
        match output.status {
            EXIT_HTTP => Error::ArtifactHttp {
                url: url.0,
                status: value_of(output, "http_status")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
            },
            EXIT_CHECKSUM => Error::ChecksumMismatch {
                url: url.0,
                expected: url.1,
                actual: value_of(output, "sha256").unwrap_or_default().to_string(),
            },
            EXIT_DOWNLOAD => Error::Download {
                url: url.0,
                detail: redacted_tail(output),
            },
            _ => self.failed("fetch", output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::package::{Artifact, Binary, ConfigFile, InstallSpec, SystemdUnit};

    fn spec() -> PackageVersionSpec {
        PackageVersionSpec {
            package: "kubelet".into(),
            version: "1.35.4".into(),
            artifacts: vec![Artifact {
                arch: Arch::Amd64,
                url: "http://example/kubelet.tgz".into(),
                sha256: "ab".repeat(32),
                format: ArtifactFormat::TarGz,
            }],
            install: InstallSpec {
                binaries: vec![Binary {
                    path: "bin/kubelet".into(),
                    link: Some("/usr/local/bin/kubelet".into()),
                }],
                files: vec![ConfigFile {
                    path: "/etc/kubernetes/kubelet.yaml".into(),
                    template: "nodeIP: {{nodeIP}}\ndir: {{ packageDir }}\n".into(),
                    mode: "0600".into(),
                }],
                systemd_unit: Some(SystemdUnit {
                    name: "kubelet.service".into(),
                    content: "[Service]\nExecStart=/usr/local/bin/kubelet\n".into(),
                }),
                requires_drain: false,
            },
            health_check: None,
            depends_on: vec![],
        }
    }

    #[test]
    fn arch_names_follow_go() {
        assert_eq!(parse_arch("x86_64\n").unwrap(), Arch::Amd64);
        assert_eq!(parse_arch("aarch64").unwrap(), Arch::Arm64);
        assert_eq!(
            parse_arch("mips").unwrap_err().category(),
            "unsupported_arch"
        );
    }

    #[test]
    fn render_fills_placeholders_and_refuses_unknown_ones() {
        let values = Values::from([("nodeIP".to_string(), "10.0.0.2".into())]);
        assert_eq!(
            render("f", "ip={{nodeIP}} {{ nodeIP }}", &values).unwrap(),
            "ip=10.0.0.2 10.0.0.2"
        );
        let err = render("f", "{{clusterDNS}}", &values).unwrap_err();
        assert_eq!(err.category(), "template");
        assert!(
            err.to_string().contains("`clusterDNS` is undefined"),
            "{err}"
        );
    }

    #[test]
    fn a_unit_value_cannot_add_a_directive() {
        let values = Values::from([(
            "nodeLabels".to_string(),
            "a=b\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'".into(),
        )]);
        let unit = "[Service]\nExecStart=/usr/local/bin/kubelet --node-labels={{ nodeLabels | systemd }}\n";
        let err = render("kubelet.service", unit, &values).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("kubelet.service, line 2")
                && message.contains("nodeLabels | systemd")
                && message.contains("newline"),
            "{message}"
        );
        // Forgetting the filter does not let it through either.
        let bare = "[Service]\nExecStart=/usr/local/bin/kubelet --node-labels={{ nodeLabels }}\n";
        assert!(render("kubelet.service", bare, &values).is_err());
    }

    #[test]
    fn quote_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn fetch_verifies_before_unpacking_and_marks_inside_tmp() {
        let script = fetch_script(&spec(), Arch::Amd64).unwrap();
        let verify = script.find("sha256sum").unwrap();
        let unpack = script.find("tar -xzf").unwrap();
        let marker = script.find(".complete\"\n").unwrap();
        let publish = script.find("mv -T \"$v.tmp\" \"$v\"").unwrap();
        assert!(verify < unpack && unpack < marker && marker < publish);
        assert!(script.contains("dir='/opt/kube-on-kube/packages/kubelet'"));
        assert!(fetch_script(&spec(), Arch::Arm64).unwrap_err().category() == "no_artifact");
    }

    #[test]
    fn binary_artifacts_are_placed_under_the_first_binary_path() {
        let mut s = spec();
        s.artifacts[0].format = ArtifactFormat::Binary;
        let script = fetch_script(&s, Arch::Amd64).unwrap();
        assert!(script.contains("install -m 0755 \"$dl\" \"$v.tmp/\"'bin/kubelet'"));
    }

    #[test]
    fn files_are_rendered_and_written_atomically() {
        let s = spec();
        let values = template_values(
            &s,
            Arch::Amd64,
            &Values::from([("nodeIP".to_string(), "10.0.0.2".into())]),
        );
        let script = files_script(&s, &values).unwrap();
        let content = "nodeIP: 10.0.0.2\ndir: /opt/kube-on-kube/packages/kubelet\n";
        assert!(script.contains(&format!(
            "write_file '/etc/kubernetes/kubelet.yaml' '0600' '{}'",
            base64(content.as_bytes())
        )));
        assert!(script.contains("mv -f \"$t\" \"$p\""));
    }

    #[test]
    fn switch_reads_current_back_and_renames_links() {
        let script = switch_script("kubelet", "1.35.4");
        assert!(script.contains("cur=$(readlink \"$dir/current\""));
        assert!(script.contains("mv -T \"$dir/.current.kok-tmp\" \"$dir/current\""));
        assert!(script.find("previous\"\nfi").unwrap() < script.find("ln -sfn \"$want\"").unwrap());
    }

    #[test]
    fn steps_that_change_the_package_directory_hold_its_lock() {
        let lock = "exec 9>'/opt/kube-on-kube/packages/.kubelet.lock'";
        assert!(fetch_script(&spec(), Arch::Amd64).unwrap().contains(lock));
        assert!(switch_script("kubelet", "1.35.4").contains(lock));
        assert!(rollback_script("kubelet").contains(lock));
    }

    #[test]
    fn binaries_link_through_current() {
        let script = binaries_script(&spec());
        assert!(script.contains("t='/opt/kube-on-kube/packages/kubelet/current/bin/kubelet'"));
        assert!(script.contains("l='/usr/local/bin/kubelet'"));
    }

    #[test]
    fn unit_restarts_only_on_change_or_when_inactive() {
        let script = unit_script("kubelet.service", Some("x"), false);
        assert!(script.contains("restart=0"));
        assert!(script.contains("! systemctl is-active --quiet \"$u\""));
        assert!(unit_script("kubelet.service", None, true).contains("restart=1"));
    }

    #[test]
    fn health_check_probes_command_or_url() {
        let command = health_script(&HealthCheck {
            command: Some(vec!["/usr/local/bin/kubelet".into(), "--version".into()]),
            http_get: None,
            timeout_seconds: 7,
        });
        assert!(command.contains("out=$(timeout 7 '/usr/local/bin/kubelet' '--version' 2>&1)"));
        assert!(command.contains("+ 7 ))"));
        let http = health_script(&HealthCheck {
            command: None,
            http_get: Some("http://127.0.0.1:10248/healthz".into()),
            timeout_seconds: 60,
        });
        assert!(
            http.contains("curl -fsS -o /dev/null --max-time 5 'http://127.0.0.1:10248/healthz'")
        );
    }

    #[test]
    fn tails_hide_keys_and_tokens() {
        let output = Output {
            status: 0,
            stdout: "ok\ntoken: abcdef.0123456789abcdef\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\njoin abcdef.0123456789abcdef now\n".into(),
            stderr: "sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n".into(),
        };
        let tail = redacted_tail(&output);
        assert!(!tail.contains("0123456789abcdef now"), "{tail}");
        assert!(!tail.contains("b3BlbnNz"), "{tail}");
        assert!(tail.contains("join [redacted] now"), "{tail}");
        assert!(tail.contains("token[redacted]"), "{tail}");
        assert!(tail.contains("sha256 0123456789abcdef"), "{tail}");
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
