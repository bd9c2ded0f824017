//! SSH sessions to Machines that trust exactly the pinned host key and turn
//! `ssh`'s free-text failures into errors a controller can act on.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use openssh::{KnownHosts, SessionBuilder, Stdio};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::Error;

/// Where and as whom to log in.
#[derive(Clone)]
pub struct Target {
    /// Address of the host.
    pub ip: IpAddr,
    /// Port of its sshd.
    pub port: u16,
    /// User to log in as.
    pub user: String,
    /// Private key in OpenSSH or PEM format.
    pub private_key_pem: String,
    /// The only host key accepted, `ssh-ed25519 AAAA...` as in `known_hosts`.
    pub host_public_key: String,
}

impl std::fmt::Debug for Target {
    // The private key must never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("ip", &self.ip)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("host_public_key", &self.host_public_key)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// `ip:port`, as errors name the host.
    pub fn address(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }

    /// The `known_hosts` host pattern `ssh` looks up for this address.
    fn known_hosts_pattern(&self) -> String {
        if self.port == 22 {
            self.ip.to_string()
        } else {
            format!("[{}]:{}", self.ip, self.port)
        }
    }
}

/// What a script printed and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// Exit status; -1 when the remote process was killed by a signal.
    pub status: i32,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl Output {
    /// Whether the script exited with 0.
    pub fn success(&self) -> bool {
        self.status == 0
    }

    /// The last lines of what the script printed, stdout then stderr,
    /// redacted (see [`crate::redact::tail`]).
    pub fn redacted_tail(&self) -> String {
        crate::redact::tail(&self.stdout, &self.stderr)
    }
}

/// The most a script may print on its stdout, and again on its stderr: what
/// the steps print is a few lines, and a host is not trusted to stop. Past
/// it the script is stopped and the step fails with
/// [`Error::OutputTooLarge`], so a host cannot fill the node-operator's
/// memory.
pub const MAX_OUTPUT_BYTES: usize = 4 << 20;

/// How much of the end of an output that was too large the error keeps.
const TOO_LARGE_TAIL_BYTES: usize = 2048;

/// How long connecting and running may take.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP connect plus SSH handshake.
    pub connect: Duration,
    /// One script, from start to exit.
    pub run: Duration,
    /// How often a connection that carries nothing is probed; after
    /// [`KEEPALIVE_PROBES`] unanswered probes the host is unreachable.
    pub keepalive: Duration,
}

/// Unanswered keepalive probes after which a connection counts as lost.
pub const KEEPALIVE_PROBES: u32 = 3;

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            run: Duration::from_secs(600),
            keepalive: Duration::from_secs(5),
        }
    }
}

/// One multiplexed SSH connection to one host; scripts run over it without a
/// new handshake each.
pub struct Session {
    inner: openssh::Session,
    host: String,
    run_timeout: Duration,
    // Holds the key, known_hosts and control socket; removed on drop.
    _dir: tempfile::TempDir,
}

impl Session {
    /// Logs in to `target`, trusting only its pinned host key.
    pub async fn connect(target: &Target, timeouts: Timeouts) -> Result<Session, Error> {
        let host = target.address();
        let dir = tempfile::Builder::new()
            .prefix("kok-ssh-")
            .tempdir()
            .map_err(Error::LocalIo)?;
        let key = dir.path().join("id");
        let mut pem = target.private_key_pem.clone();
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        write_private(&key, &pem)?;
        let known_hosts = dir.path().join("known_hosts");
        write_private(
            &known_hosts,
            &format!(
                "{} {}\n",
                target.known_hosts_pattern(),
                target.host_public_key.trim()
            ),
        )?;
        // An own config file keeps the user's and the system's ssh
        // configuration (and global known_hosts) out of the trust decision.
        let config = dir.path().join("config");
        write_private(
            &config,
            &format!(
                "GlobalKnownHostsFile /dev/null\nUserKnownHostsFile {}\nStrictHostKeyChecking yes\nUpdateHostKeys no\nHashKnownHosts no\nServerAliveCountMax {KEEPALIVE_PROBES}\nLogLevel ERROR\n",
                known_hosts.display()
            ),
        )?;

        let mut builder = SessionBuilder::default();
        builder
            .user(target.user.clone())
            .port(target.port)
            .keyfile(&key)
            .config_file(&config)
            .user_known_hosts_file(&known_hosts)
            .known_hosts_check(KnownHosts::Strict)
            .connect_timeout(timeouts.connect)
            .server_alive_interval(timeouts.keepalive)
            .control_directory(dir.path());
        let destination = target.ip.to_string();
        // ssh's ConnectTimeout covers TCP only; a host that accepts and then
        // stalls the handshake is bounded here.
        let connecting = builder.connect(&destination);
        let inner = match tokio::time::timeout(timeouts.connect * 2, connecting).await {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => return Err(classify(&host, &e)),
            Err(_) => {
                return Err(Error::Unreachable {
                    host,
                    detail: format!("no SSH handshake within {:?}", timeouts.connect * 2),
                });
            }
        };
        Ok(Session {
            inner,
            host,
            run_timeout: timeouts.run,
            _dir: dir,
        })
    }

    /// `ip:port` of the host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Runs `script` with `sh -s` on the host. The script goes in on stdin so
    /// its size is not bounded by the remote command line.
    pub async fn run(&self, script: &str) -> Result<Output, Error> {
        match tokio::time::timeout(self.run_timeout, self.run_unbounded(script)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unreachable {
                host: self.host.clone(),
                detail: format!("script did not finish within {:?}", self.run_timeout),
            }),
        }
    }

    async fn run_unbounded(&self, script: &str) -> Result<Output, Error> {
        let mut child = self
            .inner
            .command("sh")
            .arg("-s")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .await
            .map_err(|e| self.session_error(&e))?;
        if let Some(mut stdin) = child.stdin().take() {
            stdin
                .write_all(script.as_bytes())
                .await
                .map_err(|e| Error::Ssh {
                    host: self.host.clone(),
                    detail: format!("sending the script: {e}"),
                })?;
            stdin.shutdown().await.map_err(|e| Error::Ssh {
                host: self.host.clone(),
                detail: format!("closing the script's input: {e}"),
            })?;
        }
        // Both streams at once (a script blocked on a full stderr pipe
        // never ends its stdout), each within its bound. Past one, the
        // streams and the child are dropped: the channel closes and the
        // remote script's next write fails.
        let stdout = child.stdout().take();
        let stderr = child.stderr().take();
        let (stdout, stderr) = tokio::try_join!(
            self.read_bounded(stdout, "stdout", MAX_OUTPUT_BYTES),
            self.read_bounded(stderr, "stderr", MAX_OUTPUT_BYTES),
        )?;
        let status = child.wait().await.map_err(|e| self.session_error(&e))?;
        Ok(Output {
            status: status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// `stream` to its end, at most `limit` bytes of it.
    async fn read_bounded(
        &self,
        stream: Option<impl AsyncRead + Unpin>,
        name: &'static str,
        limit: usize,
    ) -> Result<Vec<u8>, Error> {
        let Some(stream) = stream else {
            return Ok(Vec::new());
        };
        // One byte past the bound says the output was larger.
        let mut bytes = Vec::new();
        stream
            .take(limit as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| Error::Ssh {
                host: self.host.clone(),
                detail: format!("reading the script's {name}: {e}"),
            })?;
        if bytes.len() <= limit {
            return Ok(bytes);
        }
        let from = bytes.len().saturating_sub(TOO_LARGE_TAIL_BYTES);
        let tail = crate::redact::text(&String::from_utf8_lossy(&bytes[from..]));
        Err(Error::OutputTooLarge {
            host: self.host.clone(),
            stream: name,
            limit,
            tail: tail
                .chars()
                .filter(|c| !c.is_control() || *c == '\n')
                .collect(),
        })
    }

    fn session_error(&self, e: &openssh::Error) -> Error {
        match e {
            // The process implementation cannot tell a dropped connection from
            // exit status 255; both mean the host is gone for us.
            openssh::Error::Disconnected | openssh::Error::RemoteProcessTerminated => {
                Error::Unreachable {
                    host: self.host.clone(),
                    detail: format!("the connection was lost during a step ({e})"),
                }
            }
            _ => classify(&self.host, e),
        }
    }

    /// Whether the connection still works; a session that lost its host is
    /// not usable again and must be replaced by a new [`Session::connect`].
    pub async fn is_alive(&self) -> bool {
        self.inner.check().await.is_ok()
    }

    /// Ends the master connection.
    pub async fn close(self) {
        if let Err(e) = self.inner.close().await {
            tracing::debug!(host = %self.host, error = %e, "closing SSH session");
        }
    }
}

fn write_private(path: &Path, content: &str) -> Result<(), Error> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::LocalIo)?;
    file.write_all(content.as_bytes()).map_err(Error::LocalIo)
}

/// Sorts an `ssh` failure by what the operator should do about it.
fn classify(host: &str, e: &openssh::Error) -> Error {
    let detail = error_text(e);
    classify_text(host, detail)
}

fn error_text(e: &openssh::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn classify_text(host: &str, detail: String) -> Error {
    let host = host.to_string();
    // ssh relays what the host's sshd and shell print (banners, rc files).
    let detail = crate::redact::text(detail.trim());
    let lower = detail.to_lowercase();
    if lower.contains("host key verification failed")
        || lower.contains("remote host identification has changed")
        || lower.contains("host key for")
    {
        Error::HostKeyMismatch {
            host,
            detail: mismatch_detail(&detail),
        }
    } else if [
        "timed out",
        "no route to host",
        "network is unreachable",
        "connection refused",
        "connection reset",
        "connection closed",
        "host is down",
    ]
    .iter()
    .any(|s| lower.contains(s))
    {
        Error::Unreachable { host, detail }
    } else {
        Error::Ssh { host, detail }
    }
}

/// ssh's mismatch warning is a screenful meant for a terminal; the
/// fingerprint the host presented is what an operator needs to compare.
fn mismatch_detail(text: &str) -> String {
    let key_type = text
        .lines()
        .find_map(|l| l.strip_prefix("The fingerprint for the "))
        .and_then(|l| l.split_whitespace().next());
    let fingerprint = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("SHA256:"))
        .map(|l| l.trim_end_matches('.'));
    match (key_type, fingerprint) {
        (Some(t), Some(f)) => format!("the host presented the {t} key {f}"),
        (None, Some(f)) => format!("the host presented the key {f}"),
        _ => "Host key verification failed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hosts_pattern_names_non_default_ports() {
        let mut t = Target {
            ip: "10.0.0.2".parse().unwrap(),
            port: 2222,
            user: "root".into(),
            private_key_pem: "secret".into(),
            host_public_key: "ssh-ed25519 AAAA".into(),
        };
        assert_eq!(t.known_hosts_pattern(), "[10.0.0.2]:2222");
        t.port = 22;
        assert_eq!(t.known_hosts_pattern(), "10.0.0.2");
        assert!(!format!("{t:?}").contains("secret"));
    }

    #[test]
    fn ssh_failures_are_sorted() {
        let mismatch = classify_text(
            "h",
            "@@@\nWARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!\nHost key verification failed."
                .into(),
        );
        assert_eq!(mismatch.category(), "host_key_mismatch");
        let detail = mismatch_detail(
            "@@@\nThe fingerprint for the ED25519 key sent by the remote host is\nSHA256:mAcMuP.\nPlease contact",
        );
        assert_eq!(detail, "the host presented the ED25519 key SHA256:mAcMuP");
        let down = classify_text(
            "h",
            "ssh: connect to host 10.0.0.2 port 22: Connection timed out".into(),
        );
        assert_eq!(down.category(), "unreachable");
        let auth = classify_text("h", "root@10.0.0.2: Permission denied (publickey).".into());
        assert_eq!(auth.category(), "ssh");
    }
}
