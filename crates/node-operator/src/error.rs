//! Errors of the node-operator.

/// Everything a node-operator reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the business cluster's API server failed; `call` says which.
    #[error("business-cluster API call failed ({call}): {source}")]
    Kube {
        call: String,
        #[source]
        source: kube::Error,
    },
    /// Shared plumbing (apply, status) failed.
    #[error(transparent)]
    Common(#[from] kok_common::Error),
    /// The host presented a key other than the one pinned in its Machine.
    #[error(
        "host key of {host} does not match the pinned spec.ssh.hostPublicKey; refusing to connect (the host was reinstalled or someone is in between): {detail}"
    )]
    HostKeyMismatch { host: String, detail: String },
    /// The host could not be reached (network down, host off, nothing listening).
    #[error("host {host} is unreachable over SSH: {detail}")]
    Unreachable { host: String, detail: String },
    /// Any other SSH failure (authentication, broken session).
    #[error("SSH to {host} failed: {detail}")]
    Ssh { host: String, detail: String },
    /// Preparing the local side of an SSH session failed.
    #[error("could not prepare the SSH session files: {0}")]
    LocalIo(#[source] std::io::Error),
    /// The host's architecture is not one packages are built for.
    #[error("unsupported host architecture {0:?} (uname -m)")]
    UnsupportedArch(String),
    /// The PackageVersion has no artifact for the host's architecture.
    #[error("package {package} {version} has no artifact for {arch}")]
    NoArtifact {
        package: String,
        version: String,
        arch: String,
    },
    /// The artifact server answered with a non-2xx status.
    #[error("artifact {url} answered HTTP {status}")]
    ArtifactHttp { url: String, status: u16 },
    /// The artifact could not be fetched at all (DNS, connection, timeout).
    #[error("downloading artifact {url} failed: {detail}")]
    Download { url: String, detail: String },
    /// The downloaded artifact is not the one the PackageVersion names.
    #[error(
        "artifact {url} has sha256 {actual}, expected {expected}; it was discarded and nothing was switched"
    )]
    ChecksumMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    /// A file or unit template cannot be rendered: an unknown key, or a
    /// value its filter cannot write safely (named in the message).
    #[error("{0}")]
    Template(#[source] kok_common::template::Error),
    /// A name from a spec or a status would lead outside its directory on
    /// the host; nothing was run with it.
    #[error("refusing {what} {path:?}: {reason}")]
    UnsafePath {
        what: String,
        path: String,
        reason: &'static str,
    },
    /// The artifact holds an entry that would land outside its version
    /// directory (an absolute path, a `..`, a link pointing out) or is not
    /// an archive; it was discarded before anything was unpacked.
    #[error("artifact {url} was refused and discarded, nothing was unpacked: {detail}")]
    UnsafeArchive { url: String, detail: String },
    /// The artifact, or what it unpacks to, is larger than the operator
    /// allows (`--max-artifact-size`, `--max-unpacked-size`).
    #[error("artifact {url} was refused and discarded: {what} exceeds the limit of {limit} bytes")]
    TooLarge {
        url: String,
        what: &'static str,
        limit: u64,
    },
    /// The package's health check kept failing until its timeout.
    #[error("health check of {package} {version} failed for {timeout_seconds}s: {detail}")]
    HealthCheck {
        package: String,
        version: String,
        timeout_seconds: i32,
        detail: String,
    },
    /// Rollback was asked for but the host has no previous version.
    #[error("package {package} has no previous version to roll back to")]
    NoPrevious { package: String },
    /// A script printed more than the node-operator reads
    /// ([`crate::ssh::MAX_OUTPUT_BYTES`]); it was stopped.
    #[error(
        "{host} printed more than {limit} bytes on the script's {stream}: output too large, the script was stopped; its last bytes: {tail:?}"
    )]
    OutputTooLarge {
        host: String,
        stream: &'static str,
        limit: usize,
        tail: String,
    },
    /// A step's script failed on the host.
    #[error("step {step} failed on {host} with exit status {status}: {tail}")]
    Step {
        host: String,
        step: &'static str,
        status: i32,
        tail: String,
    },
    /// The Machine asks for something that cannot be done until it changes.
    #[error("invalid Machine {machine}: {detail}")]
    InvalidSpec { machine: String, detail: String },
    /// A PackageVersion the Machine should run is missing or wrong.
    #[error("{0}")]
    MissingPackageVersion(String),
    /// The Secret the Machine names for its SSH private key cannot be used
    /// (missing, no such entry, not allowed, not readable: one message).
    #[error("cannot use Secret {namespace}/{name} for the SSH login: {detail}")]
    MissingSecret {
        namespace: String,
        name: String,
        detail: String,
    },
    /// The `cluster-info` ConfigMap in kube-public is missing or unusable.
    #[error("cannot bootstrap the kubelet: {0}")]
    ClusterInfo(String),
    /// Pods would not leave the Node within the drain timeout.
    #[error("draining node {node} timed out after {seconds}s; still there: {pods}")]
    DrainTimeout {
        node: String,
        seconds: u64,
        pods: String,
    },
}

impl Error {
    /// A failed call, described by `call` (`get Node x`), as a `map_err`
    /// function.
    pub fn kube(call: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let call = call.into();
        move |source| Error::Kube { call, source }
    }

    /// Whether the business API server refused a write of the Machine's
    /// objects (see [`kok_common::apply::refused`]): its message goes into the
    /// Machine's status with the reason `ObjectRejected`.
    pub fn rejected(&self) -> bool {
        match self {
            Error::Kube { source: e, .. }
            | Error::Common(kok_common::Error::Api { source: e, .. }) => {
                kok_common::apply::refused(e)
            }
            _ => false,
        }
    }

    /// Whether retrying without a change to the Machine (or its Secret,
    /// PackageVersions, host) cannot help, so the reconcile waits for one
    /// rather than hammering the host.
    pub fn needs_change(&self) -> bool {
        matches!(
            self,
            Error::HostKeyMismatch { .. }
                | Error::InvalidSpec { .. }
                | Error::UnsupportedArch(_)
                | Error::NoArtifact { .. }
                | Error::ChecksumMismatch { .. }
                | Error::Template(_)
                | Error::UnsafePath { .. }
                | Error::UnsafeArchive { .. }
                | Error::TooLarge { .. }
        )
    }

    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Common(e) => e.category(),
            Error::HostKeyMismatch { .. } => "host_key_mismatch",
            Error::Unreachable { .. } => "unreachable",
            Error::Ssh { .. } => "ssh",
            Error::LocalIo(_) => "local_io",
            Error::UnsupportedArch(_) => "unsupported_arch",
            Error::NoArtifact { .. } => "no_artifact",
            Error::ArtifactHttp { .. } => "artifact_http",
            Error::Download { .. } => "download",
            Error::ChecksumMismatch { .. } => "checksum_mismatch",
            Error::Template(_) => "template",
            Error::UnsafePath { .. } => "unsafe_path",
            Error::UnsafeArchive { .. } => "unsafe_archive",
            Error::TooLarge { .. } => "too_large",
            Error::HealthCheck { .. } => "health_check",
            Error::NoPrevious { .. } => "no_previous",
            Error::OutputTooLarge { .. } => "output_too_large",
            Error::Step { .. } => "install_step",
            Error::InvalidSpec { .. } => "invalid_spec",
            Error::MissingPackageVersion(_) => "missing_package_version",
            Error::MissingSecret { .. } => "missing_secret",
            Error::ClusterInfo(_) => "cluster_info",
            Error::DrainTimeout { .. } => "drain_timeout",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "code": code,
            "message": "secrets \"bootstrap-token-abc\" is forbidden: exceeded quota"
        }))
        .expect("status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_refused_write_is_rejected_and_says_why() {
        let refused = Error::kube("create Secret kube-system/bootstrap-token-abc")(api_error(403));
        assert!(refused.rejected());
        assert!(refused.to_string().contains("exceeded quota"), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("create Secret kube-system/bootstrap-token-abc"),
            "{refused}"
        );
        assert!(
            Error::Common(kok_common::Error::Api {
                call: "applying Machine m".into(),
                source: api_error(422),
            })
            .rejected()
        );
        assert!(!Error::kube("patch Machine m")(api_error(409)).rejected());
        assert!(!Error::kube("patch Machine m")(api_error(503)).rejected());
    }
}
