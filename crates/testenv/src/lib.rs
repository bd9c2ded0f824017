//! The real test environment: upstream Kubernetes binaries built by
//! `scripts/testenv-bins.sh`, SSH test hosts in network namespaces that run
//! a worker node's software, the OCI registry serving its images, and
//! S3-compatible storage for etcd backups.
//!
//! Used only as a dev-dependency. Nothing here imitates Kubernetes or sshd: it
//! starts the real programs and hands tests their addresses and credentials.

mod background;
pub mod bins;
pub mod hosts;
pub mod issuer;
pub mod kube_env;
pub mod load_balancer;
pub mod meta_network;
pub mod modules;
pub mod node_software;
pub mod operator_http;
pub mod pods;
mod process;
pub mod proxy;
pub mod registry;
pub mod s3;
mod sys;
pub mod wait;
pub mod watchdog;

pub use sys::{parent_of, renice_process};

/// The process that made something this crate leaves on the machine while
/// it runs, named by `name` (its last part): an interface, network
/// namespace or cgroup of a host run ([`hosts::owner_of`]), of a Pod runner
/// ([`pods::net::owner_pid_of_name`]) or of a load balancer; for a
/// container's cgroup (`kok-pods/<pid>`), the container's process. `None`
/// for a name of none of these. The process may have exited: a check for
/// leftovers uses it to tell its own run's from those of tests beside it.
pub fn owner_pid(name: &str) -> Option<u32> {
    let mut parts = name.rsplit('/');
    let last = parts.next().unwrap_or(name);
    if parts.next() == Some("kok-pods") {
        return last.parse().ok();
    }
    hosts::owner_of(last)
        .or_else(|| pods::net::owner_pid_of_name(last))
        .or_else(|| load_balancer::owner_of_interface(last))
}

/// `pid start-time` of a running process: with [`identity_alive`], what
/// tells a process from a later one given the same pid.
pub use sys::{identity_alive, process_identity, process_memory};

/// A kubelet's client certificate request for Node `node`, as a kubelet
/// makes it when it joins (subject `system:node:<node>` in `system:nodes`,
/// no alternative names): (CSR PEM, private key PEM).
pub fn node_csr(node: &str) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((csr, key.serialize_pem()))
}
