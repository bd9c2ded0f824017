//! What can go wrong in a command, each with the next step a user can take, and
//! the exit status CI scripts can tell apart (a timeout is not a usage error).

use std::process::ExitCode;

/// Errors of the CLI.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable kubeconfig or the API server does not answer.
    #[error("{0} (check --kubeconfig, KUBECONFIG and --context)")]
    Connect(#[source] kok_common::Error),
    /// The API server does not serve the kind: the CRDs are not installed.
    #[error(
        "this cluster does not serve {plural}.kubeonkube.io: {where_}; install the chart (helm install kube-on-kube charts/kube-on-kube) or apply the CRDs (kubectl apply -f crds/)"
    )]
    NoCrds {
        plural: &'static str,
        /// Which cluster was expected to serve the kind.
        where_: &'static str,
    },
    /// The named object does not exist.
    #[error("{kind} {name:?} not found{}; list them with `{list}`", in_namespace(.namespace))]
    NotFound {
        kind: &'static str,
        name: String,
        namespace: Option<String>,
        /// The command that lists what does exist.
        list: String,
    },
    /// The object already exists.
    #[error(
        "{kind} {name:?} already exists{}; delete it first (kubectl kok cluster delete {name} --wait) or choose another name",
        in_namespace(.namespace)
    )]
    AlreadyExists {
        kind: &'static str,
        name: String,
        namespace: Option<String>,
    },
    /// RBAC denies the call.
    #[error(
        "not allowed to {verb} {what}: {message}; ask for a Role granting it, or use --context with a user that has it"
    )]
    Forbidden {
        verb: &'static str,
        what: String,
        message: String,
    },
    /// The API server refused the object (validation) or failed.
    #[error("cannot {verb} {what}: {source}")]
    Api {
        verb: &'static str,
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A wait ran out of time.
    #[error("{0}")]
    Timeout(String),
    /// What the command asked for was tried and failed; the message says
    /// why.
    #[error("{0}")]
    Failed(String),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// YAML or JSON could not be read or written.
    #[error("{what}: {message}")]
    Format { what: String, message: String },
}

fn in_namespace(namespace: &Option<String>) -> String {
    match namespace {
        Some(ns) => format!(" in namespace {ns:?}"),
        None => String::new(),
    }
}

impl Error {
    /// Short static category (for logs and tests).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Connect(_) => "connect",
            Error::NoCrds { .. } => "no-crds",
            Error::NotFound { .. } => "not-found",
            Error::AlreadyExists { .. } => "already-exists",
            Error::Forbidden { .. } => "forbidden",
            Error::Api { .. } => "api",
            Error::Timeout(_) => "timeout",
            Error::Failed(_) => "failed",
            Error::Usage(_) => "usage",
            Error::Io { .. } => "io",
            Error::Format { .. } => "format",
        }
    }

    /// Exit status: 2 when a wait timed out, 1 for everything else.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Timeout(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// What a failed API call was about, to turn its status into an [`Error`].
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// The verb, as RBAC names it (`get`, `list`, `create`, `patch`, `delete`).
    pub verb: &'static str,
    /// Kind (`Cluster`) and its plural (`clusters`).
    pub kind: &'static str,
    pub plural: &'static str,
    /// Object name, when the call names one.
    pub name: Option<&'a str>,
    /// Namespace, for namespaced kinds.
    pub namespace: Option<&'a str>,
    /// The cluster the kind is expected in (`the meta-cluster`).
    pub cluster: &'static str,
    /// The command that lists objects of the kind.
    pub list: &'a str,
}

impl Call<'_> {
    /// Classify `error`: a missing kind, a missing object, a denial, or other.
    pub fn error(&self, error: kube::Error) -> Error {
        let what = match self.name {
            Some(name) => format!("{} {name:?}", self.kind),
            None => self.plural.to_string(),
        };
        if let kube::Error::Api(status) = &error {
            let names_object = status.details.as_ref().is_some_and(|d| !d.name.is_empty());
            // kube's own `is_not_found` misses the plain-text "404 page not
            // found" an API server sends for a kind it does not serve.
            let not_found = status.code == 404 || status.reason == "NotFound";
            if not_found && (!names_object || self.name.is_none()) {
                return Error::NoCrds {
                    plural: self.plural,
                    where_: self.cluster,
                };
            }
            if not_found && let Some(name) = self.name {
                return Error::NotFound {
                    kind: self.kind,
                    name: name.to_string(),
                    namespace: self.namespace.map(str::to_string),
                    list: self.list.to_string(),
                };
            }
            if status.is_already_exists()
                && let Some(name) = self.name
            {
                return Error::AlreadyExists {
                    kind: self.kind,
                    name: name.to_string(),
                    namespace: self.namespace.map(str::to_string),
                };
            }
            if status.code == 403 || status.reason == "Forbidden" {
                return Error::Forbidden {
                    verb: self.verb,
                    what,
                    message: status.message.clone(),
                };
            }
        }
        Error::Api {
            verb: self.verb,
            what,
            source: error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::core::response::StatusDetails;

    fn call(name: Option<&str>) -> Call<'_> {
        Call {
            verb: "get",
            kind: "Cluster",
            plural: "clusters",
            name,
            namespace: Some("ns"),
            cluster: "the meta-cluster",
            list: "kubectl kok cluster list",
        }
    }

    fn not_found(name: &str) -> kube::Error {
        let mut status = Status::failure("not found", "NotFound").with_code(404);
        if !name.is_empty() {
            let details: StatusDetails = serde_json::from_value(serde_json::json!({
                "name": name, "group": "kubeonkube.io", "kind": "clusters"
            }))
            .expect("details");
            status = status.with_details(details);
        }
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn missing_kind_points_at_the_crds() {
        let e = call(Some("a")).error(not_found(""));
        assert_eq!(e.category(), "no-crds");
        assert!(e.to_string().contains("kubectl apply -f crds/"), "{e}");
        // What kube makes of the API server's plain-text 404.
        let plain =
            Status::failure("404 page not found", "Failed to parse error data").with_code(404);
        let e = call(None).error(kube::Error::Api(plain.boxed()));
        assert_eq!(e.category(), "no-crds");
    }

    #[test]
    fn missing_object_names_it_and_the_list_command() {
        let e = call(Some("a")).error(not_found("a"));
        assert_eq!(e.category(), "not-found");
        assert_eq!(
            e.to_string(),
            "Cluster \"a\" not found in namespace \"ns\"; list them with `kubectl kok cluster list`"
        );
    }

    #[test]
    fn denial_says_what_was_denied() {
        let status = Status::failure("forbidden: User \"x\"", "Forbidden").with_code(403);
        let e = call(None).error(kube::Error::Api(status.boxed()));
        assert_eq!(e.category(), "forbidden");
        assert!(
            e.to_string().starts_with("not allowed to get clusters"),
            "{e}"
        );
    }
}
