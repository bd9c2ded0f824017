//! The subset of systemd's unit file format that packages installed on test
//! hosts use: `[Unit]` dependencies (`Requires=`, `Wants=`, `BindsTo=`,
//! `After=`, `Before=`), `[Service]` commands, environment, restart policy,
//! `KillMode=`, resource limits (`LimitNOFILE=`, ...) and `[Install]
//! WantedBy=`, with drop-ins and systemd's quoting and `$VAR` expansion, so
//! the units node-operator writes run here as they would under systemd.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceType {
    /// `simple`, `exec`, `notify`, `idle`: the started process is the service.
    Simple,
    /// Runs its commands to completion.
    Oneshot,
}

/// Which processes stopping the unit (or its main process ending) kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillMode {
    /// Every process in the unit's cgroup (the default).
    ControlGroup,
    /// SIGTERM to the main process, then SIGKILL to the rest of the cgroup.
    Mixed,
    /// The main process only: what it started keeps running (containerd's
    /// shims and containers, for one). `KillMode=none` counts as this.
    Process,
}

impl KillMode {
    pub fn name(self) -> &'static str {
        match self {
            KillMode::ControlGroup => "control-group",
            KillMode::Mixed => "mixed",
            KillMode::Process => "process",
        }
    }
}

/// One `Limit*=` setting: the resource as systemd names it after `Limit`
/// (`NOFILE`, `NPROC`, ...), and its soft and hard values (`None`:
/// `infinity`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limit {
    pub resource: String,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// The resources `Limit*=` may set, with their `RLIMIT_*` numbers.
pub const LIMITS: [(&str, libc::__rlimit_resource_t); 16] = [
    ("CPU", libc::RLIMIT_CPU),
    ("FSIZE", libc::RLIMIT_FSIZE),
    ("DATA", libc::RLIMIT_DATA),
    ("STACK", libc::RLIMIT_STACK),
    ("CORE", libc::RLIMIT_CORE),
    ("RSS", libc::RLIMIT_RSS),
    ("NOFILE", libc::RLIMIT_NOFILE),
    ("AS", libc::RLIMIT_AS),
    ("NPROC", libc::RLIMIT_NPROC),
    ("MEMLOCK", libc::RLIMIT_MEMLOCK),
    ("LOCKS", libc::RLIMIT_LOCKS),
    ("SIGPENDING", libc::RLIMIT_SIGPENDING),
    ("MSGQUEUE", libc::RLIMIT_MSGQUEUE),
    ("NICE", libc::RLIMIT_NICE),
    ("RTPRIO", libc::RLIMIT_RTPRIO),
    ("RTTIME", libc::RLIMIT_RTTIME),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    No,
    Always,
    OnFailure,
}

/// One `ExecStart=`-style line, kept unexpanded until the environment is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecLine {
    pub words: Vec<Word>,
    /// `-` prefix: a failing command doesn't fail the unit.
    pub ignore_failure: bool,
    /// `@` prefix: the second word is argv[0].
    pub custom_argv0: bool,
}

/// A word of a command line after quote removal. `bare_variable` marks an
/// unquoted `$NAME` word, which expands to zero or more words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Word {
    pub text: String,
    pub bare_variable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvironmentFile {
    pub path: PathBuf,
    /// `-` prefix: a missing file is fine.
    pub optional: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitFile {
    pub description: Option<String>,
    /// `Requires=` and `BindsTo=`: started first, and stopping or
    /// restarting one of them stops or restarts this unit too.
    pub requires: Vec<String>,
    /// `Wants=`: started first; its failing does not matter.
    pub wants: Vec<String>,
    /// `After=`: units that start before this one when both start.
    pub after: Vec<String>,
    /// `Before=`: units that start after this one when both start.
    pub before: Vec<String>,
    pub service_type: ServiceType,
    pub exec_start_pre: Vec<ExecLine>,
    pub exec_start: Vec<ExecLine>,
    pub environment: Vec<(String, String)>,
    pub environment_files: Vec<EnvironmentFile>,
    pub working_directory: Option<PathBuf>,
    pub restart: Restart,
    pub restart_sec: Duration,
    pub timeout_stop: Duration,
    pub remain_after_exit: bool,
    pub kill_mode: KillMode,
    pub limits: Vec<Limit>,
    /// `Delegate=`: the unit manages its own sub-cgroups. Every unit may here;
    /// kept for `systemctl show`.
    pub delegate: bool,
    pub wanted_by: Vec<String>,
    pub required_by: Vec<String>,
}

impl Default for UnitFile {
    fn default() -> Self {
        UnitFile {
            description: None,
            requires: Vec::new(),
            wants: Vec::new(),
            after: Vec::new(),
            before: Vec::new(),
            service_type: ServiceType::Simple,
            exec_start_pre: Vec::new(),
            exec_start: Vec::new(),
            environment: Vec::new(),
            environment_files: Vec::new(),
            working_directory: None,
            restart: Restart::No,
            // systemd's defaults.
            restart_sec: Duration::from_millis(100),
            timeout_stop: Duration::from_secs(90),
            remain_after_exit: false,
            kill_mode: KillMode::ControlGroup,
            limits: Vec::new(),
            delegate: false,
            wanted_by: Vec::new(),
            required_by: Vec::new(),
        }
    }
}

impl UnitFile {
    /// Parses a unit file followed by its drop-ins, in the order systemd
    /// applies them: later settings override, an empty value clears a list.
    pub fn parse(sources: &[&str]) -> Result<UnitFile, String> {
        let mut unit = UnitFile::default();
        let mut type_seen = None;
        for source in sources {
            for (section, key, value) in entries(source)? {
                unit.apply(&section, &key, &value, &mut type_seen)?;
            }
        }
        if let Some(other) = type_seen {
            return Err(format!(
                "Type={other} is not supported by the test host's service manager"
            ));
        }
        Ok(unit)
    }

    fn apply(
        &mut self,
        section: &str,
        key: &str,
        value: &str,
        unsupported_type: &mut Option<String>,
    ) -> Result<(), String> {
        let bad = |what: &str| format!("[{section}] {key}={value}: {what}");
        match (section, key) {
            ("Unit", "Description") => self.description = Some(value.to_owned()),
            ("Unit", "Requires") | ("Unit", "BindsTo") => {
                push_words_or_clear(&mut self.requires, value)
            }
            ("Unit", "Wants") => push_words_or_clear(&mut self.wants, value),
            ("Unit", "After") => push_words_or_clear(&mut self.after, value),
            ("Unit", "Before") => push_words_or_clear(&mut self.before, value),
            ("Service", "Type") => match value {
                "simple" | "exec" | "notify" | "notify-reload" | "idle" => {
                    self.service_type = ServiceType::Simple;
                    *unsupported_type = None;
                }
                "oneshot" => {
                    self.service_type = ServiceType::Oneshot;
                    *unsupported_type = None;
                }
                other => *unsupported_type = Some(other.to_owned()),
            },
            ("Service", "ExecStart") => push_or_clear(&mut self.exec_start, value, parse_exec)?,
            ("Service", "ExecStartPre") => {
                push_or_clear(&mut self.exec_start_pre, value, parse_exec)?
            }
            ("Service", "Environment") => {
                if value.is_empty() {
                    self.environment.clear();
                }
                for word in split_words(value).map_err(|e| bad(&e))? {
                    let (name, val) = word
                        .text
                        .split_once('=')
                        .ok_or_else(|| bad("not NAME=VALUE"))?;
                    self.environment.push((name.to_owned(), val.to_owned()));
                }
            }
            ("Service", "EnvironmentFile") => {
                push_or_clear(&mut self.environment_files, value, |v| {
                    let (optional, path) = match v.strip_prefix('-') {
                        Some(path) => (true, path),
                        None => (false, v),
                    };
                    Ok(EnvironmentFile {
                        path: PathBuf::from(path),
                        optional,
                    })
                })?
            }
            ("Service", "WorkingDirectory") => {
                let dir = value.strip_prefix('-').unwrap_or(value);
                self.working_directory = match dir {
                    "" => None,
                    // Without User=, the home directory is root's.
                    "~" => Some(PathBuf::from("/root")),
                    dir => Some(PathBuf::from(dir)),
                };
            }
            ("Service", "Restart") => {
                self.restart = match value {
                    "no" | "" => Restart::No,
                    "always" => Restart::Always,
                    // Close enough for tests: all restart after a crash.
                    "on-failure" | "on-abnormal" | "on-abort" | "on-watchdog" => Restart::OnFailure,
                    _ => return Err(bad("unknown restart policy")),
                }
            }
            ("Service", "RestartSec") => {
                self.restart_sec = parse_timespan(value).ok_or_else(|| bad("bad time span"))?
            }
            ("Service", "TimeoutStopSec") | ("Service", "TimeoutSec") => {
                self.timeout_stop = parse_timespan(value).ok_or_else(|| bad("bad time span"))?
            }
            ("Service", "RemainAfterExit") => {
                self.remain_after_exit = parse_bool(value).ok_or_else(|| bad("not a boolean"))?
            }
            ("Service", "KillMode") => {
                self.kill_mode = match value {
                    "control-group" | "" => KillMode::ControlGroup,
                    "mixed" => KillMode::Mixed,
                    "process" | "none" => KillMode::Process,
                    _ => return Err(bad("unknown kill mode")),
                }
            }
            ("Service", "Delegate") => {
                // `Delegate=cpu memory` names controllers: delegated too.
                self.delegate = parse_bool(value).unwrap_or(!value.is_empty())
            }
            ("Service", limit) if limit.starts_with("Limit") => {
                let resource = &limit["Limit".len()..];
                if !LIMITS.iter().any(|(name, _)| *name == resource) {
                    return Err(bad("unknown resource limit"));
                }
                self.limits.retain(|l| l.resource != resource);
                if !value.is_empty() {
                    let (soft, hard) = parse_limit(value).ok_or_else(|| bad("bad limit"))?;
                    self.limits.push(Limit {
                        resource: resource.to_owned(),
                        soft,
                        hard,
                    });
                }
            }
            ("Install", "WantedBy") => push_words_or_clear(&mut self.wanted_by, value),
            ("Install", "RequiredBy") => push_words_or_clear(&mut self.required_by, value),
            // Everything else (ordering, sandboxing, limits...) has no
            // meaning without the real systemd and is ignored.
            _ => {}
        }
        Ok(())
    }

    /// The one command a simple service runs.
    pub fn main_command(&self) -> Result<&ExecLine, String> {
        match self.exec_start.as_slice() {
            [] => Err("Service has no ExecStart= setting".into()),
            [one] => Ok(one),
            _ => Err("Service has more than one ExecStart= setting, which is only allowed for Type=oneshot".into()),
        }
    }
}

fn push_or_clear<T>(
    list: &mut Vec<T>,
    value: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<(), String> {
    if value.is_empty() {
        list.clear();
    } else {
        list.push(parse(value)?);
    }
    Ok(())
}

fn push_words_or_clear(list: &mut Vec<String>, value: &str) {
    if value.is_empty() {
        list.clear();
    }
    list.extend(value.split_whitespace().map(str::to_owned));
}

/// `(section, key, value)` for every assignment, continuation lines joined.
fn entries(source: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for raw in source.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let logical = std::mem::take(&mut pending);
        if let Some(name) = logical.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = logical
            .split_once('=')
            .ok_or_else(|| format!("not a KEY=VALUE line: {logical}"))?;
        out.push((
            section.clone(),
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    Ok(out)
}

fn parse_exec(value: &str) -> Result<ExecLine, String> {
    let mut rest = value;
    let mut ignore_failure = false;
    let mut custom_argv0 = false;
    while let Some(prefix) = rest.chars().next().filter(|c| "-@:+!".contains(*c)) {
        match prefix {
            '-' => ignore_failure = true,
            '@' => custom_argv0 = true,
            // `:`, `+`, `!`, `!!` change privileges or expansion; root runs
            // everything here anyway.
            _ => {}
        }
        rest = &rest[1..];
    }
    // `%%` is the one specifier resolved here: a literal `%`.
    let words: Vec<Word> = split_words(rest)?
        .into_iter()
        .map(|w| Word {
            text: w.text.replace("%%", "%"),
            ..w
        })
        .collect();
    let needed = if custom_argv0 { 2 } else { 1 };
    if words.len() < needed {
        return Err(format!("empty command line: {value}"));
    }
    Ok(ExecLine {
        words,
        ignore_failure,
        custom_argv0,
    })
}

/// Splits a command line the way systemd does: whitespace separates words,
/// single and double quotes group, backslash escapes.
pub fn split_words(text: &str) -> Result<Vec<Word>, String> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        let mut quoted = false;
        while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
            match c {
                '"' | '\'' => {
                    quoted = true;
                    loop {
                        match chars.next() {
                            None => return Err(format!("unbalanced quotes in: {text}")),
                            Some(q) if q == c => break,
                            Some('\\') if c == '"' => word.push(unescape(chars.next())),
                            Some(other) => word.push(other),
                        }
                    }
                }
                '\\' => {
                    quoted = true;
                    word.push(unescape(chars.next()));
                }
                other => word.push(other),
            }
        }
        let bare_variable = !quoted && bare_variable_name(&word).is_some();
        words.push(Word {
            text: word,
            bare_variable,
        });
    }
}

fn unescape(c: Option<char>) -> char {
    match c {
        Some('n') => '\n',
        Some('t') => '\t',
        Some(other) => other,
        None => '\\',
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric())
        && !s.as_bytes()[0].is_ascii_digit()
}

/// `NAME` if `word` is exactly `$NAME`.
fn bare_variable_name(word: &str) -> Option<&str> {
    word.strip_prefix('$').filter(|name| is_name(name))
}

/// Expands a command line: `$NAME` alone becomes the value's
/// whitespace-separated words, `${NAME}` anywhere becomes the value verbatim.
/// Unset variables expand to nothing. Returns `(program, argv)`.
pub fn expand(line: &ExecLine, env: &HashMap<String, String>) -> (String, Vec<String>) {
    let mut argv = Vec::new();
    for word in &line.words {
        match bare_variable_name(&word.text).filter(|_| word.bare_variable) {
            Some(name) => argv.extend(
                env.get(name)
                    .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default(),
            ),
            None => argv.push(expand_braced(&word.text, env)),
        }
    }
    if line.custom_argv0 && !argv.is_empty() {
        let program = argv.remove(0);
        (program, argv)
    } else {
        (argv.first().cloned().unwrap_or_default(), argv)
    }
}

fn expand_braced(text: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        // `$$` is a literal `$`.
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let braced = after
            .strip_prefix('{')
            .and_then(|b| b.find('}').map(|len| (&b[..len], &b[len + 1..])))
            .filter(|(name, _)| is_name(name));
        match braced {
            Some((name, tail)) => {
                out.push_str(env.get(name).map_or("", String::as_str));
                rest = tail;
            }
            None => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Parses an `EnvironmentFile=`: `NAME=VALUE` lines, `#`/`;` comments,
/// optionally quoted values.
pub fn parse_environment_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            let (name, value) = l.split_once('=')?;
            let name = name.trim();
            let value = value.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            is_name(name).then(|| (name.to_owned(), unquoted.to_owned()))
        })
        .collect()
}

/// systemd time spans: `5`, `5s`, `500ms`, `1min 30s`, `infinity`.
pub fn parse_timespan(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "infinity" {
        // Long enough to never matter in a test.
        return Some(Duration::from_secs(365 * 24 * 3600));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let seconds_per = match &rest[..unit_len] {
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "ms" | "msec" => 0.001,
            "us" | "usec" => 0.000_001,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            _ => return None,
        };
        total += Duration::from_secs_f64(number * seconds_per);
        rest = &rest[unit_len..];
    }
    Some(total)
}

/// `N`, `SOFT:HARD` or `infinity`, numbers with an optional binary suffix
/// (`K`, `M`, `G`, `T`) as systemd accepts for byte limits.
fn parse_limit(text: &str) -> Option<(Option<u64>, Option<u64>)> {
    let one = |t: &str| -> Option<Option<u64>> {
        let t = t.trim();
        if t == "infinity" {
            return Some(None);
        }
        let (digits, factor) = match t.chars().last()? {
            'K' => (&t[..t.len() - 1], 1u64 << 10),
            'M' => (&t[..t.len() - 1], 1 << 20),
            'G' => (&t[..t.len() - 1], 1 << 30),
            'T' => (&t[..t.len() - 1], 1 << 40),
            _ => (t, 1),
        };
        digits.parse::<u64>().ok()?.checked_mul(factor).map(Some)
    };
    match text.split_once(':') {
        Some((soft, hard)) => {
            let (soft, hard) = (one(soft)?, one(hard)?);
            // The soft limit may not exceed the hard one.
            let fits = match (soft, hard) {
                (_, None) => true,
                (None, Some(_)) => false,
                (Some(s), Some(h)) => s <= h,
            };
            fits.then_some((soft, hard))
        }
        None => one(text).map(|v| (v, v)),
    }
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_a_service_with_drop_in_overrides() {
        let main = "\
[Unit]
Description=The kubelet
[Service]
ExecStart=/usr/bin/kubelet
Environment=\"A=one two\" B=3
Restart=always
RestartSec=10
[Install]
WantedBy=multi-user.target
";
        let drop_in = "\
[Service]
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_ARGS \\
    --config=${CONFIG}
";
        let unit = UnitFile::parse(&[main, drop_in]).unwrap();
        assert_eq!(unit.description.as_deref(), Some("The kubelet"));
        assert_eq!(unit.restart, Restart::Always);
        assert_eq!(unit.restart_sec, Duration::from_secs(10));
        assert_eq!(unit.wanted_by, ["multi-user.target"]);
        assert_eq!(
            unit.environment,
            [("A".into(), "one two".into()), ("B".into(), "3".into())]
        );
        assert_eq!(
            unit.environment_files,
            [EnvironmentFile {
                path: "/etc/default/kubelet".into(),
                optional: true
            }]
        );
        let line = unit.main_command().unwrap();
        let (program, argv) = expand(
            line,
            &env(&[("KUBELET_ARGS", "--v=2  --x"), ("CONFIG", "/a b")]),
        );
        assert_eq!(program, "/usr/local/bin/kubelet");
        assert_eq!(
            argv,
            ["/usr/local/bin/kubelet", "--v=2", "--x", "--config=/a b"]
        );
    }

    #[test]
    fn quoting_escapes_and_prefixes() {
        let line = parse_exec(r#"-/bin/sh -c "echo \"hi\" $X" 'a b' c\ d $UNSET"#).unwrap();
        assert!(line.ignore_failure);
        let (_, argv) = expand(&line, &env(&[("X", "x")]));
        assert_eq!(argv, ["/bin/sh", "-c", "echo \"hi\" $X", "a b", "c d"]);
        let line = parse_exec("@/bin/sleep my-sleep 5").unwrap();
        assert_eq!(
            expand(&line, &HashMap::new()),
            (
                "/bin/sleep".to_owned(),
                vec!["my-sleep".to_owned(), "5".to_owned()]
            )
        );
        assert!(parse_exec("\"unbalanced").is_err());
    }

    #[test]
    fn dollars_and_percents_are_escaped_by_doubling() {
        let line = parse_exec(r#"/bin/k --l="a b \"c\" $$HOME 50%% \\x" ${X}$$"#).unwrap();
        let (_, argv) = expand(&line, &env(&[("X", "x"), ("HOME", "/root")]));
        assert_eq!(argv, ["/bin/k", r#"--l=a b "c" $HOME 50% \x"#, "x$"]);
    }

    #[test]
    fn dependencies_kill_mode_and_limits() {
        let unit = UnitFile::parse(&["\
[Unit]
After=network.target containerd.service
Requires=containerd.service
Wants=a.service
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Delegate=yes
KillMode=process
LimitNOFILE=infinity
LimitNPROC=100:200
LimitMEMLOCK=64K
"])
        .unwrap();
        assert_eq!(unit.after, ["network.target", "containerd.service"]);
        assert_eq!(unit.requires, ["containerd.service"]);
        assert_eq!(unit.wants, ["a.service"]);
        assert!(unit.exec_start_pre[0].ignore_failure);
        assert!(unit.delegate);
        assert_eq!(unit.kill_mode, KillMode::Process);
        let limit = |r: &str, soft, hard| Limit {
            resource: r.into(),
            soft,
            hard,
        };
        assert_eq!(
            unit.limits,
            [
                limit("NOFILE", None, None),
                limit("NPROC", Some(100), Some(200)),
                limit("MEMLOCK", Some(65536), Some(65536)),
            ]
        );
        assert_eq!(UnitFile::default().kill_mode, KillMode::ControlGroup);
        assert!(UnitFile::parse(&["[Service]\nLimitNOFILE=2:1\n"]).is_err());
        assert!(UnitFile::parse(&["[Service]\nLimitFOO=1\n"]).is_err());
        assert!(UnitFile::parse(&["[Service]\nKillMode=some\n"]).is_err());
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        assert!(UnitFile::parse(&["[Service]\nType=forking\nExecStart=/bin/true\n"]).is_err());
        let unit = UnitFile::parse(&["[Service]\nExecStart=/bin/a\nExecStart=/bin/b\n"]).unwrap();
        assert!(unit.main_command().is_err());
        assert!(UnitFile::parse(&["[Service]\nRestart=sometimes\n"]).is_err());
    }

    #[test]
    fn environment_files_and_time_spans() {
        assert_eq!(
            parse_environment_file("# c\nA=1\nB=\"two words\"\n; c\nbad line\n"),
            [("A".into(), "1".into()), ("B".into(), "two words".into())]
        );
        assert_eq!(parse_timespan("1min 30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_timespan("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_timespan("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timespan("soon"), None);
    }
}
