//! The kube-on-kube-operator: watches `Cluster` objects in the meta-cluster and
//! converges each one's control plane (PKI, etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, add-ons) to its spec.

pub mod addon_retry;
pub mod addons;
pub mod apiserver_files;
pub mod applied;
pub mod backup;
pub mod bounded;
pub mod config;
pub mod context;
pub mod control_plane;
pub mod controller;
pub mod error;
pub mod etcd;
pub mod key_rotation;
pub mod metrics;
pub mod names;
pub mod network;
pub mod ownership;
pub mod pki;
pub mod policy;
pub mod refused;
pub mod render;
pub mod resources;
pub mod status;
pub mod teardown;
pub mod versions;
pub mod watches;

pub use context::Context;
pub use error::Error;
pub use watches::run;
