//! Errors of the kube-on-kube-operator, and the payloads they carry. A
//! leaf: every step returns these, so this module imports no step.

use std::fmt;

/// Everything a Cluster reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the meta-cluster's API server failed; `call` says which.
    #[error("meta-cluster API call failed ({call}): {source}")]
    Kube {
        call: String,
        #[source]
        source: kube::Error,
    },
    /// Shared plumbing (apply, status) failed.
    #[error(transparent)]
    Common(#[from] kok_common::Error),
    /// A list of the Cluster's namespace holds more than the operator reads.
    #[error(transparent)]
    Limit(#[from] crate::bounded::Exceeded),
    /// An object the Cluster needs has a name another owner's object holds.
    #[error("{0}")]
    NameConflict(Conflict),
    /// The API server refused an object the Cluster needs (invalid, denied
    /// by admission, over a quota): the user must see its message.
    #[error("the API server refused {kind} {name}: {message}")]
    Rejected {
        kind: String,
        name: String,
        /// The API server's own message.
        message: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The keys of a Cluster's snapshot gateway could not be made.
    #[error("making the snapshot gateway's keys: {0}")]
    GatewayKeys(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<crate::bounded::ListError> for Error {
    fn from(e: crate::bounded::ListError) -> Self {
        match e {
            crate::bounded::ListError::Kube { call, source } => Error::Kube { call, source },
            crate::bounded::ListError::Exceeded(e) => Error::Limit(e),
        }
    }
}

impl Error {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Common(e) => e.category(),
            Error::Limit(_) => "limit",
            Error::NameConflict(_) => "name_conflict",
            Error::Rejected { .. } => "rejected",
            Error::GatewayKeys(_) => "gateway_keys",
        }
    }

    /// A failed write of `kind` `name`: [`Error::Rejected`] when the API
    /// server refused it (see [`kok_common::apply::refused`]).
    pub fn writing(kind: &str, name: &str, error: kube::Error) -> Error {
        match &error {
            kube::Error::Api(status) if kok_common::apply::refused(&error) => Error::Rejected {
                kind: kind.to_string(),
                name: name.to_string(),
                message: status.message.clone(),
                source: Box::new(error),
            },
            _ => Error::Kube {
                call: format!("writing {kind} {name}"),
                source: error,
            },
        }
    }

    /// A failed call, described by `call` (`reading ConfigMap x`), as a
    /// `map_err` function.
    pub fn kube(call: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let call = call.into();
        move |source| Error::Kube { call, source }
    }
}

/// An object the operator would write for one owner that another controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Kind of the object, for example `Secret`.
    pub kind: String,
    /// Its name (in the Cluster's namespace).
    pub name: String,
    /// Who controls it: `Cluster x-etcd`, or that nothing does.
    pub owner: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} already exists and belongs to {}: it is left unchanged; rename this Cluster or remove that object",
            self.kind, self.name, self.owner
        )
    }
}
