//! Plumbing both operators and the CLI need, kept in one place so it is written
//! once: connecting to a cluster, server-side apply, status conditions and
//! logging set-up, and the template language of add-ons and packages.

pub mod apply;
pub mod backoff;
pub mod client;
pub mod conditions;
pub mod controller;
pub mod duration;
pub mod events;
pub mod finalizer;
pub mod health;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod network;
pub mod operator;
pub mod shutdown;
pub mod slots;
pub mod telemetry;
pub mod template;
pub mod watch;

/// Errors of the shared plumbing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or has no usable context.
    #[error("cannot load kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error(
        "cannot find cluster credentials (set --kubeconfig or KUBECONFIG, or run in a Pod): {0}"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("cannot create Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// A call to the API server failed; `call` says which.
    #[error("Kubernetes API call failed ({call}): {source}")]
    Api {
        call: String,
        #[source]
        source: kube::Error,
    },
    /// An object could not be turned into an apply patch.
    #[error("cannot serialize {kind} for apply: {source}")]
    Serialize {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A reconcile panicked; the panic was caught so the process and the
    /// controller's other objects go on.
    #[error("reconcile of {object} panicked: {message}")]
    Panicked { object: String, message: String },
}

impl Error {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kubeconfig(_) | Error::Infer(_) => "config",
            Error::Client(_) => "client",
            Error::Api { .. } => "api",
            Error::Serialize { .. } => "serialize",
            Error::Panicked { .. } => "panic",
        }
    }
}
