//! The custom resources of kube-on-kube, API group `kubeonkube.io`, version
//! `v1alpha1`.
//!
//! Types only: both operators and the CLI depend on this crate, so it carries no
//! client calls and no runtime. Every field's doc comment becomes its
//! `kubectl explain` text, and the validation attributes become OpenAPI and CEL
//! rules the API server enforces before a controller ever sees the object.

// `#[kube(printcolumn(..))]` repeats `type_ = "string"` by design.
#![allow(clippy::duplicated_attributes)]

pub mod canary;
pub mod cluster;
pub mod machine;
pub mod package;
pub mod shared;

pub use canary::{CanaryRelease, CanaryReleaseSpec, CanaryReleaseStatus};
pub use cluster::{Cluster, ClusterSpec, ClusterStatus};
pub use machine::{Machine, MachineSpec, MachineStatus};
pub use package::{
    ClusterPackageVersion, ClusterPackageVersionSpec, ClusterPackageVersionStatus, PackageVersion,
    PackageVersionSpec, PackageVersionStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every kind in this crate.
pub const GROUP: &str = "kubeonkube.io";
/// The API version of every kind in this crate.
pub const VERSION: &str = "v1alpha1";

/// Every CustomResourceDefinition of the project, in a stable order, each with the
/// file name `crdgen` writes it to.
pub fn crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("cluster.yaml", Cluster::crd()),
        ("machine.yaml", Machine::crd()),
        ("packageversion.yaml", PackageVersion::crd()),
        ("clusterpackageversion.yaml", ClusterPackageVersion::crd()),
        ("canaryrelease.yaml", CanaryRelease::crd()),
    ]
}
