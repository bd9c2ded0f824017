//! The real test environment: upstream Kubernetes binaries built by
//! `scripts/testenv-bins.sh`, and SSH test hosts in network namespaces.
//!
//! Used only as a dev-dependency. Nothing here imitates Kubernetes or sshd: it
//! starts the real programs and hands tests their addresses and credentials.

mod background;
pub mod bins;
pub mod hosts;
pub mod kube_env;
pub mod load_balancer;
pub mod operator_http;
pub mod pods;
mod process;
pub mod proxy;
mod sys;
pub mod wait;
pub mod watchdog;
