//! The node-operator: watches `Machine`, `PackageVersion`,
//! `ClusterPackageVersion`, `CanaryRelease` and `Node` in one business cluster
//! and keeps every host's packages at their declared versions over SSH.

pub mod controller;
pub mod cpv;
pub mod error;
pub mod install;
pub mod rollout;
pub mod ssh;

pub use controller::{Context, run};
pub use error::Error;
