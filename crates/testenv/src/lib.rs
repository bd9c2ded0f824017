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
