//! The test environment's OCI registry: the real `registry` of
//! `distribution/v3` (built by `scripts/registry-bins.sh`) serving the images
//! `scripts/node-images.sh` built, so that containerd on the test hosts pulls
//! them through a registry mirror (`hosts.toml`) under their upstream names,
//! as a site with its own registry does.
//!
//! It serves the cached storage read-only (`maintenance.readonly`, and no
//! upload purging, the one thing a registry writes on its own), so every run
//! shares it without copying; pushes are refused. It listens on the address
//! it is given (the test hosts' bridge address, see
//! [`crate::hosts::TestHosts::gateway_ip`]) at a free port, and dies with the
//! test process like the other components. Its log is under
//! `target/testenv-logs/`.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::kube_env::supervisor::{Supervised, log_tail};
use crate::kube_env::workdir::run_log_dir;
use crate::node_software::{self, Error};

const READY: Duration = Duration::from_secs(30);
/// Tries when another process takes the free port first.
const PORT_ATTEMPTS: usize = 3;

/// A running registry. Dropping it kills it.
pub struct Registry {
    addr: SocketAddr,
    storage: PathBuf,
    log: PathBuf,
    process: Supervised,
}

impl Registry {
    /// Serves the node images of `scripts/node-images.sh` (building them
    /// first if the cache lacks them) on `ip`.
    pub fn start_with_node_images(ip: IpAddr) -> Result<Registry, Error> {
        let storage = node_software::images_dir()?.join("registry");
        Registry::start(ip, &storage)
    }

    /// Serves `storage`, a root directory of distribution's filesystem
    /// storage driver, read-only on `ip` at a free port, and waits until it
    /// answers `GET /v2/`.
    pub fn start(ip: IpAddr, storage: &Path) -> Result<Registry, Error> {
        let bin = node_software::registry_bin_dir()?.join("registry");
        let logs = run_log_dir().map_err(|e| Error::Io {
            what: "creating the log directory".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = TcpListener::bind((ip, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(Error::io(format!("finding a free port on {ip}")))?;
            let addr = SocketAddr::new(ip, port);
            let config = logs.join(format!("registry-{port}.yml"));
            std::fs::write(&config, config_yaml(storage, addr))
                .map_err(Error::io(format!("writing {}", config.display())))?;
            let log = logs.join(format!("registry-{port}.log"));
            let mut command = Command::new(&bin);
            command.arg("serve").arg(&config);
            let process =
                Supervised::spawn("registry", command, &log).map_err(|e| Error::Registry {
                    detail: e.to_string(),
                    log: log.clone(),
                })?;
            let mut registry = Registry {
                addr,
                storage: storage.to_owned(),
                log,
                process,
            };
            match registry.wait_ready() {
                Ok(()) => return Ok(registry),
                Err(e) => last = Some(e),
            }
            if !log_tail(&registry.log, 20).contains("address already in use") {
                break;
            }
        }
        Err(last.unwrap_or_else(|| Error::Registry {
            detail: "no attempt made".into(),
            log: PathBuf::new(),
        }))
    }

    fn wait_ready(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + READY;
        loop {
            if let Err(e) = self.process.check_running() {
                return Err(Error::Registry {
                    detail: e.to_string(),
                    log: self.log.clone(),
                });
            }
            if http_status(self.addr, "/v2/") == Some(200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Registry {
                    detail: format!("GET /v2/ did not answer 200 within {READY:?}"),
                    log: self.log.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `IP:PORT`, what a `hosts.toml` and `node-packageversions.sh --mirror`
    /// take.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The storage it serves.
    pub fn storage(&self) -> &Path {
        &self.storage
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The registry's pid on the machine.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Every response so far, in order, from the registry's access log:
    /// who asked (a test host's own address), what, and the bytes of the
    /// body sent. What a benchmark counts as image bytes pulled per host.
    pub fn served(&self) -> Result<Vec<Served>, Error> {
        let text = std::fs::read_to_string(&self.log)
            .map_err(Error::io(format!("reading {}", self.log.display())))?;
        Ok(text.lines().filter_map(parse_access_line).collect())
    }
}

/// One response of the registry, as its access log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub client: IpAddr,
    pub method: String,
    /// The request target, query included.
    pub path: String,
    pub status: u16,
    /// Bytes of the response body.
    pub bytes: u64,
}

/// A line of the access log, which is in Apache's combined format:
/// `IP - - [time] "METHOD PATH PROTO" STATUS BYTES "referer" "agent"`.
/// The registry's other log lines (`time=... level=...`) are not.
fn parse_access_line(line: &str) -> Option<Served> {
    let (client, rest) = line.split_once(' ')?;
    let client: IpAddr = client.parse().ok()?;
    let (_, rest) = rest.split_once("] \"")?;
    let (request, rest) = rest.split_once('"')?;
    let mut request = request.split(' ');
    let method = request.next()?.to_string();
    let path = request.next()?.to_string();
    let mut rest = rest.split_whitespace();
    let status = rest.next()?.parse().ok()?;
    // A body of nothing is written `-`.
    let bytes = match rest.next()? {
        "-" => 0,
        n => n.parse().ok()?,
    };
    Some(Served {
        client,
        method,
        path,
        status,
        bytes,
    })
}

fn config_yaml(storage: &Path, addr: SocketAddr) -> String {
    // JSON strings are YAML strings: paths with any character stay one value.
    let storage = serde_json::to_string(&storage.display().to_string()).unwrap_or_default();
    format!(
        "version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  maintenance:
    readonly:
      enabled: true
    uploadpurging:
      enabled: false
http:
  addr: {addr}
"
    )
}

/// The status code of a plain `GET path` (no body read), or `None` when
/// nothing answers.
pub(crate) fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_log_lines_are_read_and_others_skipped() {
        let line = r#"10.213.206.2 - - [26/Nov/2026:17:11:09 +0000] "GET /v2/registry.k8s.io/pause/blobs/sha256:acc9?ns=registry.k8s.io HTTP/1.1" 200 287 "" "containerd/v2.4.2""#;
        assert_eq!(
            parse_access_line(line),
            Some(Served {
                client: "10.213.206.2".parse().unwrap(),
                method: "GET".into(),
                path: "/v2/registry.k8s.io/pause/blobs/sha256:acc9?ns=registry.k8s.io".into(),
                status: 200,
                bytes: 287,
            })
        );
        let head = r#"10.213.206.2 - - [26/Nov/2026:17:11:09 +0000] "HEAD /v2/x/manifests/3.10.1 HTTP/1.1" 200 - "" "containerd/v2.4.2""#;
        assert_eq!(parse_access_line(head).map(|s| s.bytes), Some(0));
        let other = r#"time="2026-11-26T17:10:48.233362825Z" level=info msg="response completed" http.request.remoteaddr="10.213.206.1:38048""#;
        assert_eq!(parse_access_line(other), None);
    }

    #[test]
    fn serves_the_storage_read_only_without_purging() {
        let yaml = config_yaml(
            Path::new("/cache/registry"),
            "10.213.7.1:5000".parse().unwrap(),
        );
        let config: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
        let storage = &config["storage"];
        assert_eq!(storage["filesystem"]["rootdirectory"], "/cache/registry");
        assert_eq!(storage["maintenance"]["readonly"]["enabled"], true);
        assert_eq!(storage["maintenance"]["uploadpurging"]["enabled"], false);
        assert_eq!(config["http"]["addr"], "10.213.7.1:5000");
    }
}
