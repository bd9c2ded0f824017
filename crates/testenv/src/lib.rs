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
pub mod kube_env;
pub mod load_balancer;
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

pub use sys::parent_of;

/// The live process that owns something this crate made on the machine,
/// named by the last part of `name`: an interface, network namespace or
/// cgroup of a host run ([`hosts::live_owner_of`]) or of a Pod runner
/// ([`pods::net::owner_pid_of_name`]). `None` for a name of neither, and for
/// what a process that has exited left behind: a check for leftovers uses
/// it to tell a finished run's from those of runs beside it.
pub fn live_owner(name: &str) -> Option<u32> {
    let mut parts = name.rsplit('/');
    let last = parts.next().unwrap_or(name);
    // A container's cgroup is `kok-pods/<pid of the container>`.
    let container = (parts.next() == Some("kok-pods"))
        .then(|| last.parse::<u32>().ok())
        .flatten();
    hosts::live_owner_of(last)
        .or_else(|| pods::net::owner_pid_of_name(last))
        .or(container)
        .filter(|&pid| sys::is_running(pid))
}
