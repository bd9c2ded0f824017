//! The test environment's S3-compatible storage: a real `versitygw`
//! (github.com/versity/versitygw, built by `scripts/backup-bins.sh`) serving
//! a temporary directory with its POSIX backend, on loopback at a free port,
//! with a root access key and secret of its own and, optionally, TLS with a
//! CA made here. What etcd backups are written to and read from.
//!
//! With the POSIX backend every bucket is a directory under the root and
//! every object a file at its key, so a test can look at or damage what the
//! server stores ([`S3Server::object_path`]). The server dies with the test
//! process like the other components, and when dropped; its directory goes
//! with it (or, after a killed run, with the next run's sweep of the
//! environment's state directories). Its log is under
//! `target/testenv-logs/<run>/s3-<n>/`.
//!
//! ```no_run
//! use kok_testenv::s3::{S3Options, S3Server};
//!
//! let s3 = S3Server::start(&S3Options::default()).unwrap();
//! let (endpoint, bucket) = (s3.endpoint(), s3.bucket());
//! let ca = s3.ca_pem(); // Some: TLS is the default
//! # let _ = (endpoint, bucket, ca);
//! ```

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};

use crate::kube_env::pki::ca_params;
use crate::kube_env::supervisor::{Supervised, log_tail};
use crate::kube_env::workdir::Workdir;
use crate::node_software;

const READY: Duration = Duration::from_secs(30);
/// Tries when another process takes the free port first.
const PORT_ATTEMPTS: usize = 3;

/// Why the storage could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `scripts/backup-bins.sh` failed.
    #[error("building or finding versitygw: {0}")]
    Bins(#[source] node_software::Error),
    /// The state and log directories could not be made.
    #[error("preparing the storage's directories: {0}")]
    Workdir(#[source] crate::kube_env::Error),
    /// A file or directory could not be made.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The certificates could not be made.
    #[error("generating the storage's certificates: {0}")]
    Pki(#[source] rcgen::Error),
    /// versitygw did not start.
    #[error("versitygw did not start: {detail}; its log is {}", log.display())]
    Start { detail: String, log: PathBuf },
    /// A bucket name versitygw would refuse.
    #[error("{0:?} is not a valid bucket name")]
    BucketName(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// How to start the server.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Serve HTTPS with a certificate for its address, `127.0.0.1` and
    /// `localhost` signed by a CA of its own ([`S3Server::ca_pem`]); else
    /// plain HTTP.
    pub tls: bool,
    /// The address to listen on: loopback, or an address Pods reach (the
    /// Pod runner's gateway, [`crate::pods::PodRunner::gateway`]).
    pub listen: Ipv4Addr,
    /// The bucket created before the server starts.
    pub bucket: String,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            tls: true,
            bucket: "backups".into(),
            listen: Ipv4Addr::LOCALHOST,
        }
    }
}

/// A running versitygw. Dropping it kills it and removes its storage.
pub struct S3Server {
    addr: SocketAddr,
    tls: bool,
    ca_pem: Option<String>,
    bucket: String,
    access_key_id: String,
    secret_access_key: String,
    log: PathBuf,
    process: Supervised,
    /// The storage and certificates, and the log; dropped after the process
    /// (fields drop in order).
    workdir: Workdir,
}

/// The directory holding `versitygw` and `etcdutl`, from
/// `scripts/backup-bins.sh` (which builds them when its cache lacks them).
pub fn bin_dir() -> Result<PathBuf, Error> {
    node_software::cached_dir("backup-bins.sh").map_err(Error::Bins)
}

/// `etcdutl` of the tests' etcd release: reads snapshot files offline.
pub fn etcdutl() -> Result<PathBuf, Error> {
    Ok(bin_dir()?.join("etcdutl"))
}

impl S3Server {
    /// Starts versitygw on `options.listen` at a free port with a new root
    /// access key and secret, `options.bucket` already created, and waits
    /// until it accepts connections.
    pub fn start(options: &S3Options) -> Result<S3Server, Error> {
        if !valid_bucket_name(&options.bucket) {
            return Err(Error::BucketName(options.bucket.clone()));
        }
        let bin = bin_dir()?.join("versitygw");
        static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let workdir = Workdir::create(&format!("s3-{n}")).map_err(Error::Workdir)?;
        let root = workdir.state.join("root");
        // The POSIX backend's buckets are the root's directories.
        std::fs::create_dir_all(root.join(&options.bucket))
            .map_err(io(format!("creating the bucket under {}", root.display())))?;
        let tls = if options.tls {
            Some(write_certificates(&workdir.state, options.listen)?)
        } else {
            None
        };
        let access_key_id = format!("kok-{}", std::process::id());
        let secret_access_key = secret();
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = TcpListener::bind((options.listen, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(io(format!("finding a free port on {}", options.listen)))?;
            let addr = SocketAddr::from((options.listen, port));
            let log = workdir.logs.join(format!("versitygw-{port}.log"));
            let mut command = Command::new(&bin);
            command
                .arg("--port")
                .arg(addr.to_string())
                .arg("--health")
                .arg("/health")
                .arg("--access-log")
                .arg("stderr")
                // The root account's key and secret, from the environment
                // rather than the command line (which `ps` shows).
                .env("ROOT_ACCESS_KEY_ID", &access_key_id)
                .env("ROOT_SECRET_ACCESS_KEY", &secret_access_key);
            if let Some(tls) = &tls {
                command
                    .arg("--cert")
                    .arg(&tls.cert)
                    .arg("--key")
                    .arg(&tls.key);
            }
            command.arg("posix").arg(&root);
            let mut process =
                Supervised::spawn("versitygw", command, &log).map_err(|e| Error::Start {
                    detail: e.to_string(),
                    log: log.clone(),
                })?;
            match wait_ready(&mut process, addr, &log) {
                Ok(()) => {
                    return Ok(S3Server {
                        addr,
                        tls: tls.is_some(),
                        ca_pem: tls.map(|t| t.ca_pem),
                        bucket: options.bucket.clone(),
                        access_key_id,
                        secret_access_key,
                        log,
                        process,
                        workdir,
                    });
                }
                Err(e) => last = Some(e),
            }
            if !log_tail(&log, 20).contains("address already in use") {
                break;
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            detail: "no attempt made".into(),
            log: PathBuf::new(),
        }))
    }

    /// `https://ADDRESS:PORT` (or `http://` without TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The PEM CA that signed its certificate; `None` without TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The bucket it was started with.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The root account's access key ID.
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    /// The root account's secret access key.
    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    /// The region it signs for (versitygw's default).
    pub fn region(&self) -> &str {
        "us-east-1"
    }

    /// The file holding object `key` of `bucket`: the POSIX backend stores
    /// an object at its key under the bucket's directory.
    pub fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.workdir.state.join("root").join(bucket).join(key)
    }

    /// Makes another bucket (a directory under the root, which the POSIX
    /// backend serves as a bucket).
    pub fn create_bucket(&self, name: &str) -> Result<(), Error> {
        if !valid_bucket_name(name) {
            return Err(Error::BucketName(name.into()));
        }
        let dir = self.workdir.state.join("root").join(name);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))
    }

    /// Its log (access log and errors).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its pid on the machine.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Kills it; the storage directory stays until it is dropped.
    pub fn stop(&mut self) {
        self.process.kill();
    }
}

/// S3's rules for bucket names, as far as a test needs them: 3 to 63
/// lower-case letters, digits, dots and hyphens, starting and ending with a
/// letter or digit.
fn valid_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

/// Waits until the server accepts connections on `addr`.
fn wait_ready(process: &mut Supervised, addr: SocketAddr, log: &Path) -> Result<(), Error> {
    let deadline = Instant::now() + READY;
    loop {
        if let Err(e) = process.check_running() {
            return Err(Error::Start {
                detail: e.to_string(),
                log: log.to_owned(),
            });
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Start {
                detail: format!("{addr} accepted no connection within {READY:?}"),
                log: log.to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A secret no other run shares: the test process's random hasher seeds,
/// which std draws from the OS.
fn secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..4u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

struct Tls {
    ca_pem: String,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA, and a serving certificate it signed for `127.0.0.1`,
/// `localhost` and `listen`, written under `dir`.
fn write_certificates(dir: &Path, listen: Ipv4Addr) -> Result<Tls, Error> {
    let ca_key = KeyPair::generate().map_err(Error::Pki)?;
    let ca_params = ca_params("kok-testenv-s3-ca");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(Error::Pki)?;
    let issuer = Issuer::new(ca_params, &ca_key);
    let key = KeyPair::generate().map_err(Error::Pki)?;
    let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    if listen != Ipv4Addr::LOCALHOST {
        names.push(listen.to_string());
    }
    let mut params = CertificateParams::new(names).map_err(Error::Pki)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "versitygw");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(Error::Pki)?;
    let tls = Tls {
        ca_pem: ca_cert.pem(),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&tls.cert, cert.pem()).map_err(io("writing the serving certificate"))?;
    std::fs::write(&tls.key, key.serialize_pem()).map_err(io("writing the serving key"))?;
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_follow_s3s_rules() {
        for good in ["backups", "a-b.c", "abc", "0ab"] {
            assert!(valid_bucket_name(good), "{good}");
        }
        for bad in ["ab", "Backups", "-ab", "ab-", "a_b", &"a".repeat(64)] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }

    #[test]
    fn secrets_differ() {
        let (a, b) = (secret(), secret());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
