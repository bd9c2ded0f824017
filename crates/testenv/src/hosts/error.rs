//! What can go wrong while setting up or driving test hosts, worded so that a
//! failing test says which system facility refused.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed: {detail}")]
    Command { program: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kok-testhost helper binary was not found (looked at {searched}); build it with \
         `cargo build -p kok-testenv --bin kok-testhost` or point KOK_TESTHOST_BIN at it"
    )]
    HelperMissing { searched: String },
    #[error("cannot {step}: {source}")]
    HostSetup {
        step: String,
        #[source]
        source: std::io::Error,
    },
    #[error("host {host} did not boot: {detail}")]
    Boot { host: String, detail: String },
    #[error("host {host} is not reachable on port 22 after {what}")]
    Unreachable { host: String, what: &'static str },
    #[error("no free /24 left in 10.213.0.0/16 for the test hosts' bridge")]
    NoSubnet,
    #[error("{count} hosts asked for; one run holds at most {max}")]
    TooManyHosts { count: usize, max: usize },
    #[error("cannot start the artifact server on {addr}: {source}")]
    ArtifactServer {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short fixed label for the kind of failure.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Spawn { .. } => "spawn",
            Error::Command { .. } => "command",
            Error::Io { .. } => "io",
            Error::HelperMissing { .. } => "helper-missing",
            Error::HostSetup { .. } => "host-setup",
            Error::Boot { .. } => "boot",
            Error::Unreachable { .. } => "unreachable",
            Error::NoSubnet => "no-subnet",
            Error::TooManyHosts { .. } => "too-many-hosts",
            Error::ArtifactServer { .. } => "artifact-server",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}
