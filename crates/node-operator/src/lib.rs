//! The node-operator: watches `Machine`, `PackageVersion`,
//! `ClusterPackageVersion`, `CanaryRelease` and `Node` in one business cluster
//! and keeps every host's packages at their declared versions over SSH.

pub mod bootstrap;
pub mod canary;
pub mod context;
pub mod controller;
pub mod cpv;
pub mod drain;
pub mod error;
pub mod host;
pub mod install;
pub mod machine;
pub mod metrics;
pub mod paths;
pub mod redact;
pub mod repair;
pub mod rollout;
pub mod serving_certs;
pub mod sessions;
pub mod ssh;

pub use context::{Context, Settings};
pub use controller::{run, run_with};
pub use error::Error;
