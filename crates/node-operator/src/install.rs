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

// Exit codes by which scripts report failures Rust sorts into error variants.
const EXIT_DOWNLOAD: i32 = 20;
const EXIT_HTTP: i32 = 21;
const EXIT_CHECKSUM: i32 = 22;
const EXIT_NOT_UNPACKED: i32 = 23;
const EXIT_UNHEALTHY: i32 = 24;
const EXIT_NO_PREVIOUS: i32 = 25;
const EXIT_LOCKED: i32 = 26;
const EXIT_UNSAFE_ARCHIVE: i32 = 27;
const EXIT_ARTIFACT_TOO_LARGE: i32 = 28;
const EXIT_UNPACKED_TOO_LARGE: i32 = 29;

/// `fetch URL CURL-FLAGS...`: curl reads the URL from its standard input
/// (`-K -`, a config line), never from its command line, where any user of
/// the host could read the credentials a URL may carry (`user:password@`).
/// The function and `printf` are the shell's own, so no process gets the
/// URL as an argument; `"` and `\` are escaped for the config line, and a
/// URL with a control character (a second config line) is refused.
const FETCH_FUNCTION: &str = r#"fetch() {
  case "$1" in *[![:print:]]*) echo "the URL has a control character" >&2; return 2 ;; esac
  printf 'url = "%s"\n' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')" | { shift; curl -K - "$@"; }
}
"#;

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

/// How much one artifact may take on a host: what is downloaded, and what
/// it unpacks to. A tar bomb is refused before anything is unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest artifact downloaded, in bytes.
    pub artifact_bytes: u64,
    /// Largest total size of the files an archive unpacks to, in bytes.
    pub unpacked_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            artifact_bytes: 1 << 30,
            unpacked_bytes: 4 << 30,
        }
    }
}

/// Parses a size: bytes, or with a suffix `K`, `M`, `G`, `T` (powers of
/// 1000) or `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024), as Kubernetes
/// quantities are written.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 512Mi or 2Gi"))?;
    let unit: u64 = match suffix {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {suffix:?} (K, M, G, T, Ki, Mi, Gi, Ti)"
            ));
        }
    };
    number
        .checked_mul(unit)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} must be more than 0 and less than 16Ei"))
}

/// Reads a `tar -tzv` listing on stdin and prints `refused=<why>` for the
/// first entry that would land outside the directory it is unpacked into,
/// or `unpacked=<bytes>` with the total size of its files. Only plain files,
/// directories, and links whose target stays below the link's own directory
/// (relative, no `..`) are allowed: a chain of such links cannot lead out.
/// A link whose name or target holds the listing's own separator (` -> `,
/// ` link to `) is refused: where one ends and the other starts is unknown.
const CHECK_LISTING: &str = r#"awk -v max="$max_unpacked" '
function bad(why) { print "refused=" why; failed = 1; exit }
function parent(p,   n, parts, i) {
  n = split(p, parts, "/")
  for (i = 1; i <= n; i++) if (parts[i] == "..") return 1
  return 0
}
{
  type = substr($1, 1, 1)
  size = $3
  rest = $0
  sub(/^[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ /, "", rest)
  name = rest; target = ""
  if (type == "l") { i = index(rest, " -> "); if (i == 0) bad("unreadable link entry"); name = substr(rest, 1, i - 1); target = substr(rest, i + 4) }
  if (type == "h") { i = index(rest, " link to "); if (i == 0) bad("unreadable hard link entry"); name = substr(rest, 1, i - 1); target = substr(rest, i + 9) }
  # A name or target holding the separator itself cannot be split safely
  # ("a -> b -> /etc" is a link a -> "b -> /etc" or "a -> b" -> /etc).
  if (type == "l" && index(target, " -> ")) bad("ambiguous link entry " rest)
  if (type == "h" && index(target, " link to ")) bad("ambiguous hard link entry " rest)
  if (type != "-" && type != "d" && type != "l" && type != "h") bad("entry " name " is not a file, directory or link")
  if (substr(name, 1, 1) == "/") bad("absolute path " name)
  if (parent(name)) bad("path " name " has a .. segment")
  if (type == "l" && substr(target, 1, 1) == "/") bad("link " name " points to the absolute path " target)
  if (type == "l" && parent(target)) bad("link " name " points to " target ", outside its directory")
  if (type == "h" && (substr(target, 1, 1) == "/" || parent(target))) bad("hard link " name " points to " target ", outside the archive")
  if (type == "-") total += size
  if (total > max) bad("unpacked size exceeds " max " bytes")
}
END { if (!failed) print "unpacked=" total + 0 }
'"#;

/// Step (b): download, verify, unpack. Skipped when the version directory's
/// `.complete` marker names the expected sha256. The marker is written inside
/// `<version>.tmp` before the one `mv` that makes the version visible, so an
/// interrupted run never leaves a version that looks complete but is not.
/// An archive is listed before it is unpacked and refused whole when an
/// entry would land outside the version directory or the files add up to
/// more than `limits` allow.
pub fn fetch_script(
    spec: &PackageVersionSpec,
    arch: Arch,
    limits: &Limits,
) -> Result<String, Error> {
    crate::paths::check_spec(spec)?;
    let artifact = spec
        .artifacts
        .iter()
        .find(|a| a.arch == arch)
        .ok_or_else(|| Error::NoArtifact {
            package: spec.package.clone(),
            version: spec.version.clone(),
            arch: arch_name(arch).into(),
        })?;
    let (check, unpack) = match artifact.format {
        ArtifactFormat::TarGz => (
            format!(
                r#"# GNU tar lists names with a leading / or ../ stripped unless told
# not to; the check must see them as stored.
stored=
if tar --version 2>/dev/null | grep -q 'GNU tar'; then stored=--absolute-names; fi
if ! tar -tzv $stored -f "$dl" > "$dl.list"; then
  rm -f "$dl" "$dl.list"; echo "refused=not a gzip-compressed tar archive"; exit {EXIT_UNSAFE_ARCHIVE}
fi
check=$({CHECK_LISTING} < "$dl.list")
rm -f "$dl.list"
case "$check" in
  unpacked=*) ;;
  *"unpacked size exceeds"*) rm -f "$dl"; echo "$check"; exit {EXIT_UNPACKED_TOO_LARGE} ;;
  *) rm -f "$dl"; echo "$check"; exit {EXIT_UNSAFE_ARCHIVE} ;;
esac
"#
            ),
            "tar -xzf \"$dl\" -C \"$v.tmp\" --no-same-owner".to_string(),
        ),
        ArtifactFormat::Binary => (String::new(), {
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
        }),
    };
    Ok(format!(
        r#"set -eu
{FETCH_FUNCTION}{lock}dir={dir}
version={version}
v="$dir/$version"
want={sha}
url={url}
max_artifact={max_artifact}
max_unpacked={max_unpacked}
if [ -f "$v/.complete" ] && [ "$(cat "$v/.complete")" = "$want" ]; then
  echo "present $v"
  exit 0
fi
mkdir -p "$dir"
dl="$dir/.$version.download"
rm -f "$dl"
# --max-filesize refuses what announces a larger size and, with curl 8.4 or
# later, stops any transfer that grows past it; the size is checked again
# below for older curls.
rc=0
code=$(fetch "$url" -sS -L --connect-timeout 10 --max-time 600 --max-filesize "$max_artifact" -o "$dl" -w '%{{http_code}}') || rc=$?
if [ "$rc" = 63 ]; then
  rm -f "$dl"; echo "artifact larger than $max_artifact bytes"; exit {EXIT_ARTIFACT_TOO_LARGE}
fi
if [ "$rc" != 0 ]; then
  rm -f "$dl"
  echo "download of $url failed" >&2
  exit {EXIT_DOWNLOAD}
fi
case "$code" in
  2??) ;;
  *) rm -f "$dl"; echo "http_status=$code"; exit {EXIT_HTTP} ;;
esac
if [ "$(stat -c %s "$dl")" -gt "$max_artifact" ]; then
  rm -f "$dl"; echo "artifact larger than $max_artifact bytes"; exit {EXIT_ARTIFACT_TOO_LARGE}
fi
got=$(sha256sum "$dl" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  rm -f "$dl"
  echo "sha256=$got"
  exit {EXIT_CHECKSUM}
fi
{check}rm -rf "$v.tmp"
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
        max_artifact = limits.artifact_bytes,
        max_unpacked = limits.unpacked_bytes,
    ))
}

/// Shell function writing a file only when its content or mode differ, via a
/// temporary file and `mv` so readers never see it half written. The
/// temporary file is created afresh under umask 077, so content meant to be
/// private (a bootstrap token) is never readable by others, not even before
/// its `chmod`; the content goes through `printf` (a shell builtin) and a
/// pipe, never a command line another user could read in `ps`.
pub(crate) const WRITE_FILE_FN: &str = r#"write_file() {
  p=$1; m=$2; t="$1.kok-tmp"
  mkdir -p "$(dirname "$p")"
  rm -f "$t"
  (umask 077 && printf '%s' "$3" | base64 -d > "$t")
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
        (None, Some(url)) => format!("fetch {} -fsS -o /dev/null --max-time 5", quote(url)),
        (None, None) => "true".to_string(),
    };
    let fetch = if check.http_get.is_some() {
        FETCH_FUNCTION
    } else {
        ""
    };
    format!(
        r#"{fetch}deadline=$(( $(date +%s) + {timeout} ))
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
    limits: Limits,
}

impl<'a> Installer<'a> {
    /// An installer working over `session`.
    pub fn new(session: &'a Session) -> Self {
        Self {
            session,
            limits: Limits::default(),
        }
    }

    /// The same installer with other size limits.
    pub fn with_limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    async fn step(&self, step: &'static str, script: &str) -> Result<(Output, StepOutput), Error> {
        let started = std::time::Instant::now();
        let output = self.session.run(script).await;
        let ok = output.as_ref().is_ok_and(|o| o.success());
        crate::metrics::domain().observe_ssh_step(step, ok, started.elapsed());
        let output = output?;
        tracing::debug!(host = %self.session.host(), step, status = output.status, "install step ran");
        let summary = StepOutput {
            step,
            changed: changed(&output),
            tail: output.redacted_tail(),
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
            tail: output.redacted_tail(),
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
        crate::paths::check_spec(spec)?;
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

        let (output, summary) = self
            .step("fetch", &fetch_script(spec, arch, &self.limits)?)
            .await?;
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
            let unit = unit.as_ref().map(|(name, _)| name.as_str());
            self.health(&spec.package, &current, check, unit, &mut steps)
                .await?;
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
        crate::paths::package_name(package).map_err(|reason| Error::UnsafePath {
            what: "package".into(),
            path: package.to_string(),
            reason,
        })?;
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
            self.health(package, &current, check, unit, &mut steps)
                .await?;
        }
        Ok(InstallResult {
            package: package.to_string(),
            version: current,
            previous,
            changed: true,
            steps,
        })
    }

    /// Runs the health check. A service with a unit that fails it is
    /// restarted once and checked again before the install fails: a service
    /// can come up without what its check asks for and stay so while it
    /// runs (containerd whose CRI plugin failed to load at start keeps
    /// serving without it), and nothing else would restart it, since the
    /// next install finds nothing changed and the unit active.
    async fn health(
        &self,
        package: &str,
        version: &str,
        check: &HealthCheck,
        unit: Option<&str>,
        steps: &mut Vec<StepOutput>,
    ) -> Result<(), Error> {
        let (mut output, mut summary) = self.step("health", &health_script(check)).await?;
        if let (EXIT_UNHEALTHY, Some(unit)) = (output.status, unit) {
            tracing::warn!(
                host = %self.session.host(),
                package,
                version,
                unit,
                detail = %output.redacted_tail(),
                "health check failed; restarting the unit once"
            );
            steps.push(summary);
            steps.push(
                self.checked("unit", &unit_script(unit, None, true))
                    .await?
                    .1,
            );
            (output, summary) = self.step("health", &health_script(check)).await?;
        }
        if output.status == EXIT_UNHEALTHY {
            return Err(Error::HealthCheck {
                package: package.to_string(),
                version: version.to_string(),
                timeout_seconds: check.timeout_seconds,
                detail: output.redacted_tail(),
            });
        }
        if !output.success() {
            return Err(self.failed("health", &output));
        }
        steps.push(summary);
        Ok(())
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
            EXIT_UNSAFE_ARCHIVE => Error::UnsafeArchive {
                url: url.0,
                detail: value_of(output, "refused")
                    .map(crate::redact::line)
                    .unwrap_or_else(|| "refused".into()),
            },
            EXIT_ARTIFACT_TOO_LARGE => Error::TooLarge {
                url: url.0,
                what: "the download",
                limit: self.limits.artifact_bytes,
            },
            EXIT_UNPACKED_TOO_LARGE => Error::TooLarge {
                url: url.0,
                what: "what it unpacks to",
                limit: self.limits.unpacked_bytes,
            },
            EXIT_DOWNLOAD => Error::Download {
                url: url.0,
                detail: output.redacted_tail(),
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
                before_remove: vec![],
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
        let script = fetch_script(&spec(), Arch::Amd64, &Limits::default()).unwrap();
        let verify = script.find("sha256sum").unwrap();
        let unpack = script.find("tar -xzf").unwrap();
        let marker = script.find(".complete\"\n").unwrap();
        let publish = script.find("mv -T \"$v.tmp\" \"$v\"").unwrap();
        assert!(verify < unpack && unpack < marker && marker < publish);
        assert!(script.contains("dir='/opt/kube-on-kube/packages/kubelet'"));
        assert!(
            fetch_script(&spec(), Arch::Arm64, &Limits::default())
                .unwrap_err()
                .category()
                == "no_artifact"
        );
    }

    #[test]
    fn archives_are_listed_and_checked_before_unpacking() {
        let script = fetch_script(&spec(), Arch::Amd64, &Limits::default()).unwrap();
        let list = script.find("tar -tzv $stored -f").unwrap();
        let check = script.find("check=$(awk").unwrap();
        let unpack = script.find("tar -xzf").unwrap();
        assert!(list < check && check < unpack);
        assert!(script.contains("--max-filesize \"$max_artifact\""));
        assert!(script.contains(&format!("max_unpacked={}", 4u64 << 30)));
    }

    #[test]
    fn unsafe_names_never_reach_a_script() {
        for (field, value) in [
            ("path", "../evil"),
            ("path", "/usr/bin/evil"),
            ("package", "../../etc"),
            ("version", "1.0.0/../.."),
        ] {
            let mut s = spec();
            match field {
                "path" => s.install.binaries[0].path = value.into(),
                "package" => s.package = value.into(),
                _ => s.version = value.into(),
            }
            let err = fetch_script(&s, Arch::Amd64, &Limits::default()).unwrap_err();
            assert_eq!(err.category(), "unsafe_path", "{field}={value}");
        }
    }

    #[test]
    fn sizes_parse_like_quantities() {
        assert_eq!(parse_size("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        for bad in ["", "0", "1Q", "Gi", "-1", "99999999999Ti"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn binary_artifacts_are_placed_under_the_first_binary_path() {
        let mut s = spec();
        s.artifacts[0].format = ArtifactFormat::Binary;
        let script = fetch_script(&s, Arch::Amd64, &Limits::default()).unwrap();
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
        // Private from the first byte: a fresh file under umask 077.
        let private = script.find("(umask 077 && printf").unwrap();
        assert!(script.find("rm -f \"$t\"").unwrap() < private);
        assert!(private < script.find("chmod \"$m\" \"$t\"").unwrap());
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
        assert!(
            fetch_script(&spec(), Arch::Amd64, &Limits::default())
                .unwrap()
                .contains(lock)
        );
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
            http.contains("fetch 'http://127.0.0.1:10248/healthz' -fsS -o /dev/null --max-time 5")
        );
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
