//! The kube-on-kube-operator: watches `Cluster` objects in the meta-cluster and
//! converges each one's control plane (PKI, etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, add-ons) to its spec.

pub mod addon_wait;
pub mod addons;
pub mod applied;
pub mod authorities;
pub mod bounded;
pub mod certs;
pub mod context;
pub mod controller;
pub mod error;
pub mod etcd;
pub mod etcd_api;
pub mod membership;
pub mod metrics;
pub mod names;
pub mod ownership;
pub mod pki;
pub mod policy;
pub mod refused;
pub mod render;
pub mod rollout;
pub mod secrets;
pub mod spread;
pub mod status;
pub mod teardown;
pub mod upgrade;
pub mod watches;

pub use context::Context;
pub use error::Error;
pub use watches::run;
