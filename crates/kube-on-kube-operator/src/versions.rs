//! The versions and images a Cluster's spec asks for, resolved with the
//! operator's defaults ([`Resolved`], computed once per pass), and the rules
//! for moving a running component from one version to another. Pure
//! functions: the image policy, the etcd step and the control-plane step
//! read the same [`Resolved`].

use kube_on_kube_api::Cluster;
use kube_on_kube_api::cluster::ComponentSpec;

use crate::config::Config;
use crate::names::{Component, display_name};

/// One component's image and version, as the spec asks for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub image: String,
    pub version: String,
}

/// What the Cluster's spec asks each component to run, the operator's
/// defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The Cluster's Kubernetes version (`spec.version`).
    pub version: String,
    pub etcd: Wanted,
    pub api_server: Wanted,
    pub controller_manager: Wanted,
    pub scheduler: Wanted,
}

impl Resolved {
    /// The spec of `cluster` resolved with `config`.
    pub fn of(cluster: &Cluster, config: &Config) -> Resolved {
        let spec = &cluster.spec;
        let stateless = |component: Component, of: &ComponentSpec| Wanted {
            image: component_image(&config.registry, display_name(component), of, &spec.version),
            version: of.version.clone().unwrap_or_else(|| spec.version.clone()),
        };
        Resolved {
            version: spec.version.clone(),
            etcd: Wanted {
                image: etcd_image(cluster, config),
                version: etcd_version(cluster, config),
            },
            api_server: stateless(Component::ApiServer, &spec.api_server.component),
            controller_manager: stateless(Component::ControllerManager, &spec.controller_manager),
            scheduler: stateless(Component::Scheduler, &spec.scheduler),
        }
    }

    /// What `component` is to run; kube-apiserver's for the components
    /// that take its image (none does today but the three and etcd).
    pub fn component(&self, component: Component) -> &Wanted {
        match component {
            Component::Etcd => &self.etcd,
            Component::ControllerManager => &self.controller_manager,
            Component::Scheduler => &self.scheduler,
            _ => &self.api_server,
        }
    }
}

/// The image the spec asks for one component: its own image, else the
/// registry's image at its own version or the cluster's.
pub fn component_image(
    registry: &str,
    name: &str,
    spec: &ComponentSpec,
    cluster_version: &str,
) -> String {
    spec.image.clone().unwrap_or_else(|| {
        format!(
            "{registry}/{name}:v{}",
            spec.version.as_deref().unwrap_or(cluster_version)
        )
    })
}

/// The etcd version a Cluster asks for.
pub fn etcd_version(cluster: &Cluster, config: &Config) -> String {
    cluster
        .spec
        .etcd
        .component
        .version
        .clone()
        .unwrap_or_else(|| config.etcd_version.clone())
}

/// The image of the etcd members.
pub fn etcd_image(cluster: &Cluster, config: &Config) -> String {
    cluster
        .spec
        .etcd
        .component
        .image
        .clone()
        .unwrap_or_else(|| {
            format!(
                "{}/etcd:{}-0",
                config.registry,
                etcd_version(cluster, config)
            )
        })
}

/// The version an image reference names by its tag: `registry.k8s.io/
/// kube-apiserver:v1.35.4` → `1.35.4`, `…/etcd:3.6.16-0` → `3.6.16`. None for
/// digests and tags that are not versions.
pub fn image_version(image: &str) -> Option<String> {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains('@') {
        return None;
    }
    let (_, tag) = last.split_once(':')?;
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let version = tag.split('-').next().unwrap_or(tag);
    parse(version).map(|_| version.to_string())
}

fn parse(version: &str) -> Option<(u64, u64, u64)> {
    let v = version.strip_prefix('v').unwrap_or(version);
    let mut parts = v.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?;
    // Pre-release or build suffixes (`1.36.0-rc.1`) do not count for skew.
    let patch = patch
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((major, minor, patch))
}

/// Whether a component running Kubernetes `from` may move to `to`: the major
/// version stays, and the minor version moves forward by at most one (the rule
/// the API server's validation also enforces on `spec.version`). Versions that
/// do not parse are not judged here; the API schema checks their form.
pub fn check_version_change(from: &str, to: &str) -> Result<(), String> {
    check_change("Kubernetes", "v", from, to)
}

/// The same rule for etcd, whose members only run with peers one minor
/// version apart and cannot go back to an older minor version's data.
pub fn check_etcd_version_change(from: &str, to: &str) -> Result<(), String> {
    check_change("etcd", "", from, to)
}

fn check_change(what: &str, v: &str, from: &str, to: &str) -> Result<(), String> {
    let (Some(old), Some(new)) = (parse(from), parse(to)) else {
        return Ok(());
    };
    if old.0 != new.0 {
        return Err(format!(
            "the {what} major version cannot change ({v}{from} to {v}{to})"
        ));
    }
    if new.1 > old.1 + 1 {
        return Err(format!(
            "upgrading from {v}{from} to {v}{to} skips a minor version; upgrade one minor version at a time"
        ));
    }
    if new.1 < old.1 {
        return Err(format!(
            "downgrading the minor version from {v}{from} to {v}{to} is not supported"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_resolved_with_the_defaults() {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        let config = Config::default();
        c.spec.version = "1.35.4".into();
        c.spec.etcd.component.version = None;
        c.spec.etcd.component.image = None;
        c.spec.scheduler.version = Some("1.35.3".into());
        c.spec.controller_manager.image = Some("mirror/kcm:x".into());
        let r = Resolved::of(&c, &config);
        assert_eq!(r.version, "1.35.4");
        assert_eq!(r.etcd.version, config.etcd_version);
        assert_eq!(
            r.etcd.image,
            format!("registry.k8s.io/etcd:{}-0", config.etcd_version)
        );
        assert_eq!(
            r.component(Component::ApiServer).image,
            "registry.k8s.io/kube-apiserver:v1.35.4"
        );
        assert_eq!(r.component(Component::Scheduler).version, "1.35.3");
        assert_eq!(
            r.component(Component::Scheduler).image,
            "registry.k8s.io/kube-scheduler:v1.35.3"
        );
        assert_eq!(
            r.component(Component::ControllerManager).image,
            "mirror/kcm:x"
        );
        assert_eq!(r.component(Component::ControllerManager).version, "1.35.4");
    }

    const OLD: &str = "registry.k8s.io/kube-apiserver:v1.35.3";

    #[test]
    fn versions_are_read_from_image_tags() {
        assert_eq!(image_version(OLD).as_deref(), Some("1.35.3"));
        assert_eq!(
            image_version("registry.k8s.io/etcd:3.6.16-0").as_deref(),
            Some("3.6.16")
        );
        assert_eq!(image_version("localhost:5000/kube-apiserver"), None);
        assert_eq!(image_version("r/kube-apiserver@sha256:abcd"), None);
        assert_eq!(image_version("r/kube-apiserver:latest"), None);
    }

    #[test]
    fn minor_skips_and_downgrades_are_refused_patches_and_one_minor_are_not() {
        assert_eq!(check_version_change("1.35.3", "1.35.4"), Ok(()));
        assert_eq!(check_version_change("1.35.4", "1.35.3"), Ok(()));
        assert_eq!(check_version_change("1.34.9", "1.35.0"), Ok(()));
        assert_eq!(check_version_change("1.35.0", "1.36.0-rc.1"), Ok(()));
        let skip = check_version_change("1.34.2", "1.36.0").expect_err("skip");
        assert!(skip.contains("skips a minor version"), "{skip}");
        assert!(
            check_version_change("1.35.0", "1.34.0")
                .expect_err("down")
                .contains("downgrading")
        );
        assert!(
            check_version_change("1.35.0", "2.35.0")
                .expect_err("major")
                .contains("major")
        );
        assert_eq!(check_version_change("garbage", "1.35.0"), Ok(()));
    }
}
