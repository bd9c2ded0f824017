//! The one error type of the Kubernetes test environment, so a failed start says
//! which component broke and where its log is.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the test binaries are not available: {detail}; build them with scripts/testenv-bins.sh \
         (or set KOK_TESTENV_BIN_DIR to a directory holding them)"
    )]
    Bins { detail: String },

    #[error("{name} is missing from {}; rerun scripts/testenv-bins.sh", dir.display())]
    BinMissing { name: String, dir: PathBuf },

    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    #[error("generating the test PKI")]
    Pki(#[source] rcgen::Error),

    #[error("rendering {what}")]
    Render {
        what: &'static str,
        #[source]
        source: serde_norway::Error,
    },

    #[error("loading the admin kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),

    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },

    #[error("{component} exited ({status}) before it was ready; last lines of {}:\n{tail}", log.display())]
    Exited {
        component: &'static str,
        status: String,
        log: PathBuf,
        tail: String,
    },

    #[error("{what}")]
    Wait {
        what: String,
        #[source]
        source: kube::runtime::wait::Error,
    },

    #[error("{what} did not happen within {after:?}")]
    Timeout { what: String, after: Duration },

    #[error("starting the test environment failed; component logs are in {}", logs.display())]
    Start {
        logs: PathBuf,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// A short fixed label per variant, for grouping failures.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Bins { .. } | Error::BinMissing { .. } => "bins",
            Error::Io { .. } => "io",
            Error::Pki(_) => "pki",
            Error::Render { .. } => "render",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Kube { .. } => "kube",
            Error::Exited { .. } => "exited",
            Error::Wait { .. } => "wait",
            Error::Timeout { .. } => "timeout",
            Error::Start { source, .. } => source.category(),
        }
    }

    /// The message with every cause appended, for panics where nobody walks the
    /// source chain.
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            source = cause.source();
        }
        out
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}
