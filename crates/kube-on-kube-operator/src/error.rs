//! Errors of the kube-on-kube-operator.

/// Everything a Cluster reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the meta-cluster's API server failed.
    #[error("meta-cluster API call failed: {0}")]
    Kube(#[source] kube::Error),
    /// Shared plumbing (apply, status) failed.
    #[error(transparent)]
    Common(#[from] kok_common::Error),
    /// A list of the Cluster's namespace holds more than the operator reads.
    #[error(transparent)]
    Limit(#[from] crate::bounded::Exceeded),
}

impl From<crate::bounded::ListError> for Error {
    fn from(e: crate::bounded::ListError) -> Self {
        match e {
            crate::bounded::ListError::Kube(e) => Error::Kube(e),
            crate::bounded::ListError::Exceeded(e) => Error::Limit(e),
        }
    }
}

impl Error {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Common(e) => e.category(),
            Error::Limit(_) => "limit",
        }
    }
}
