//! What a Cluster spec may ask of the meta-cluster's nodes, as the
//! operator's flags allow: the images its Pods run and the node directories
//! its etcd members keep their data in. A spec asking for more is refused
//! before anything is applied (see "What a Cluster spec may ask for" in
//! `docs/security.md`); the meta-cluster's admission may add its own rules,
//! but the operator does not rely on it.

use k8s_openapi::jiff::Timestamp;
use kok_common::conditions::{self, Desired, Status};
use kube_on_kube_api::cluster::{ALLOWED, Cluster, ClusterPhase, ClusterStatus};

use crate::config::Config;
pub use crate::config::Policy;
use crate::names::Component;
use crate::versions::Resolved;

/// Flag of [`Policy::images`].
pub const IMAGES_FLAG: &str = "--allowed-image-prefixes";
/// Flag of [`Policy::host_path_prefixes`].
pub const HOST_PATHS_FLAG: &str = "--etcd-host-path-prefixes";
/// An allowed-image entry that allows every image.
pub const ANY_IMAGE: &str = "*";

/// Condition reasons of a refusal.
pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";
pub const HOST_PATH_NOT_ALLOWED: &str = "HostPathNotAllowed";

/// The flags that set [`Policy`].
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PolicyArgs {
    /// Images a Cluster may run besides the repositories of the operator's
    /// own defaults (`<--image-registry>/etcd`, `…/kube-apiserver`,
    /// `…/kube-controller-manager`, `…/kube-scheduler`, `…/kube-proxy`,
    /// `…/coredns/coredns`, `…/kas-network-proxy/proxy-agent` and
    /// `…/proxy-server`, `…/node-operator`, the repository of
    /// --node-operator-image and `docker.io/cloudnativelabs/kube-router`, at
    /// any tag or digest), comma-separated. An
    /// entry ending in `/` allows every image under it
    /// (`registry.example.com/kube/`); any other entry is one repository, at
    /// any tag or digest (`registry.example.com/etcd`); `*` allows every
    /// image. Checked: the etcd, kube-apiserver, kube-controller-manager and
    /// kube-scheduler images and every add-on's `values.image` (and
    /// `values.serverImage`, konnectivity's server) in the spec,
    /// and the node-operator image the add-on step would run. A Cluster asking
    /// for another image gets `Allowed=False` (reason `ImageNotAllowed`) and is
    /// not changed.
    #[arg(long, env = "KOK_ALLOWED_IMAGE_PREFIXES", value_delimiter = ',', value_parser = image_entry)]
    pub allowed_image_prefixes: Vec<String>,
    /// Absolute node directories under which Clusters may keep etcd data on
    /// `spec.etcd.storage.volumeSource.hostPath`, comma-separated. A Cluster in
    /// namespace N may use `<prefix>/N` or a directory below it (no `.` or
    /// `..` segments, letters, digits, `.`, `_` and `-` only), so tenants never
    /// share a directory. Default: none, no Cluster may use hostPath (a
    /// hostPath is a directory on a meta-cluster node, the admin's to hand
    /// out). The node directories themselves are the admin's to keep: see
    /// docs/security.md. A Cluster asking for another path gets
    /// `Allowed=False` (reason `HostPathNotAllowed`) and is not changed.
    #[arg(long, env = "KOK_ETCD_HOST_PATH_PREFIXES", value_delimiter = ',', value_parser = host_path_prefix)]
    pub etcd_host_path_prefixes: Vec<String>,
    /// S3 endpoints Clusters may write etcd snapshots to
    /// (`spec.etcd.backup.s3.endpoint`), comma-separated, each
    /// `https://host[:port]` (or `http://` for storage on a trusted local
    /// network). Default: none, no Cluster may name one (the operator would
    /// otherwise send signed requests to any address a tenant writes, from
    /// inside the meta-cluster's network). A Cluster naming another gets
    /// `BackupReady=False` (reason `EndpointNotAllowed`); its etcd runs on.
    #[arg(long, env = "KOK_BACKUP_ENDPOINTS", value_delimiter = ',', value_parser = backup_endpoint)]
    pub backup_endpoints: Vec<String>,
    /// The shortest `spec.etcd.backup.schedule.every` a Cluster may ask for
    /// (as `5m`); a shorter one is taken as this.
    #[arg(long, env = "KOK_BACKUP_MIN_INTERVAL", default_value = "5m", value_parser = kok_common::duration::parse)]
    pub backup_min_interval: std::time::Duration,
    /// Let Clusters write snapshots under any prefix of a bucket
    /// (`spec.etcd.backup.s3.prefix`). Default: only under their own
    /// namespace's `<namespace>/` (the default prefix is
    /// `<namespace>/<cluster>`), so that a tenant given credentials to a
    /// shared bucket cannot write, or have retention delete, under another
    /// tenant's prefix. A Cluster naming another prefix gets
    /// `BackupReady=False` (reason `PrefixNotAllowed`). Restores read from
    /// any prefix their credentials reach.
    #[arg(long, env = "KOK_BACKUP_ANY_PREFIX")]
    pub backup_any_prefix: bool,
}

impl PolicyArgs {
    /// The policy these flags set.
    pub fn policy(&self) -> Policy {
        Policy {
            images: self.allowed_image_prefixes.clone(),
            host_path_prefixes: self.etcd_host_path_prefixes.clone(),
            backup_endpoints: self.backup_endpoints.clone(),
            backup_min_interval: self.backup_min_interval,
            backup_any_prefix: self.backup_any_prefix,
        }
    }
}

/// A backup endpoint flag entry: `http(s)://host[:port]`, nothing after.
fn backup_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim().trim_end_matches('/');
    let ok = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
        });
    if ok {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "{text:?} is not an endpoint such as https://s3.example.com or https://10.0.0.5:9000"
        ))
    }
}

/// Why a Cluster of namespace `namespace` may not write snapshots under
/// `prefix`: it is outside `<namespace>/` and `--backup-any-prefix` is off.
pub fn backup_prefix_refused(policy: &Policy, namespace: &str, prefix: &str) -> Option<String> {
    let prefix = prefix.trim_matches('/');
    let inside = prefix
        .strip_prefix(namespace)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    let escapes = prefix.split('/').any(|s| s == "." || s == "..");
    (!policy.backup_any_prefix && (!inside || escapes)).then(|| {
        format!(
            "prefix {prefix:?} is outside this namespace's {namespace:?}: snapshots go under {namespace}/ (the default is {namespace}/<cluster>), unless the meta-cluster's admin sets --backup-any-prefix"
        )
    })
}

/// Whether the operator's `--backup-endpoints` lists `endpoint` (compared
/// without a trailing `/`, the scheme and host case-insensitively).
pub fn backup_endpoint_allowed(policy: &Policy, endpoint: &str) -> bool {
    let endpoint = endpoint.trim_end_matches('/').to_ascii_lowercase();
    policy.backup_endpoints.contains(&endpoint)
}

/// An allowed-image flag entry: `*`, or a reference prefix without spaces.
fn image_entry(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text == ANY_IMAGE || (!text.is_empty() && text.chars().all(reference_char)) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is neither `*` nor an image prefix such as registry.example.com/kube/"
        ))
    }
}

/// A hostPath prefix flag entry: absolute, without `.`, `..` or empty
/// segments; a trailing `/` is dropped.
fn host_path_prefix(text: &str) -> Result<String, String> {
    let path = without_trailing_slash(text.trim());
    segments(path)
        .map(|_| path.to_string())
        .map_err(|e| format!("hostPath prefix {text:?} {e}"))
}

/// Characters an image reference may hold.
fn reference_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-/:@+".contains(c)
}

/// The repository of an image reference: without its tag and digest.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].find(':') {
        Some(colon) => &image[..slash + colon],
        None => image,
    }
}

/// The repositories the operator's own defaults come from: always allowed.
pub fn default_repositories(config: &Config) -> Vec<String> {
    let registry = &config.registry;
    let mut repositories: Vec<String> = [
        Component::Etcd,
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
        Component::NodeOperator,
    ]
    .into_iter()
    .map(|c| format!("{registry}/{}", crate::names::display_name(c)))
    .chain(
        [
            "kube-proxy",
            "coredns/coredns",
            "kas-network-proxy/proxy-agent",
            "kas-network-proxy/proxy-server",
        ]
        .into_iter()
        .map(|r| format!("{registry}/{r}")),
    )
    .chain([crate::render::addons::KUBE_ROUTER_REPOSITORY.to_string()])
    .collect();
    if let Some(image) = &config.node_operator_image {
        repositories.push(repository(image).to_string());
    }
    repositories
}

/// Whether `rest`, what follows a repository in an image reference, is
/// nothing, a tag, a digest or both.
fn tag_or_digest(rest: &str) -> bool {
    let (tag, digest) = match rest.split_once('@') {
        Some((tag, digest)) => (tag, Some(digest)),
        None => (rest, None),
    };
    let tag_ok = tag.is_empty()
        || tag.strip_prefix(':').is_some_and(|t| {
            !t.is_empty()
                && t.len() <= 128
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        });
    let digest_ok = digest.is_none_or(|d| {
        d.split_once(':').is_some_and(|(algorithm, hex)| {
            !algorithm.is_empty()
                && !hex.is_empty()
                && algorithm
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+._-".contains(c))
                && hex.chars().all(|c| c.is_ascii_hexdigit())
        })
    });
    tag_ok && digest_ok
}

/// Whether `image` is one `entry` allows: `*` every image; an entry ending
/// in `/` every image under it; any other entry that repository, bare or
/// with a tag or digest (so `registry.example.com/etcd` does not allow
/// `registry.example.com/etcd-evil` or `registry.example.com/etcd/x`).
pub fn image_matches(image: &str, entry: &str) -> bool {
    if entry == ANY_IMAGE {
        return true;
    }
    if image.is_empty() || !image.chars().all(reference_char) {
        return false;
    }
    match image.strip_prefix(entry) {
        None => false,
        Some(rest) if entry.ends_with('/') => !rest.is_empty() && !rest.starts_with('/'),
        Some(rest) => tag_or_digest(rest),
    }
}

/// Whether the policy allows `image`, the operator's defaults included.
pub fn image_allowed(image: &str, config: &Config) -> bool {
    default_repositories(config)
        .iter()
        .chain(&config.policy.images)
        .any(|entry| image_matches(image, entry))
}

/// `path` without trailing `/`, unless it is the root.
fn without_trailing_slash(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" if path.starts_with('/') => "/",
        trimmed => trimmed,
    }
}

/// The segments of an absolute path without `.`, `..` or empty segments
/// (`/` has none), each of letters, digits, `.`, `_` and `-`.
fn segments(path: &str) -> Result<Vec<&str>, String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("must be an absolute path".into());
    };
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for segment in rest.split('/') {
        match segment {
            "" => return Err("may not contain empty segments (`//`)".into()),
            "." | ".." => return Err("may not contain `.` or `..` segments".into()),
            s if !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) =>
            {
                return Err(format!(
                    "segment {s:?} may hold only letters, digits, `.`, `_` and `-`"
                ));
            }
            s => out.push(s),
        }
    }
    Ok(out)
}

/// Whether a Cluster in `namespace` may keep etcd data under hostPath
/// `path`: it must be `<prefix>/<namespace>` or below it for one of
/// `prefixes`, compared segment by segment (so `/var/lib/kok-etcd-evil` is
/// not under `/var/lib/kok-etcd`). A trailing `/` is ignored, as the
/// rendered member directory ignores it.
pub fn host_path_allowed(path: &str, namespace: &str, prefixes: &[String]) -> Result<(), String> {
    let given = segments(without_trailing_slash(path))?;
    if prefixes.is_empty() {
        return Err(format!(
            "no hostPath is allowed: the operator's {HOST_PATHS_FLAG} is empty"
        ));
    }
    let under = |prefix: &String| {
        segments(without_trailing_slash(prefix)).is_ok_and(|p| {
            given.len() > p.len() && given[..p.len()] == p[..] && given[p.len()] == namespace
        })
    };
    if prefixes.iter().any(under) {
        return Ok(());
    }
    Err(format!(
        "is not under {} (the operator's {HOST_PATHS_FLAG})",
        allowed_dirs(prefixes, namespace)
    ))
}

/// The directories a Cluster in `namespace` may use, for messages.
fn allowed_dirs(prefixes: &[String], namespace: &str) -> String {
    let dirs: Vec<String> = prefixes
        .iter()
        .map(|p| format!("{}/{namespace}", p.trim_end_matches('/')))
        .collect();
    dirs.join(" or ")
}

/// One thing a spec asks for that the policy does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The condition reason.
    pub reason: &'static str,
    /// The spec field, as a user writes it.
    pub field: String,
    /// What is wrong, with the flag that decides it.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A refused image.
pub fn image_refusal(field: String, image: &str) -> Refusal {
    Refusal {
        reason: IMAGE_NOT_ALLOWED,
        field,
        message: format!(
            "image {image:?} is not allowed: allow it with the operator's {IMAGES_FLAG}"
        ),
    }
}

/// Why the node-operator's Deployment may not run with these values (its
/// template's defaults with the Cluster's values over them): the image it
/// would run in the meta-cluster is not allowed.
pub fn node_operator_refusal(
    values: &serde_json::Map<String, serde_json::Value>,
    config: &Config,
) -> Option<Refusal> {
    let image = crate::render::addons::node_operator_image(values);
    (!image_allowed(image, config)).then(|| {
        image_refusal(
            format!(
                "the {} add-on's values.image",
                crate::render::addons::NODE_OPERATOR
            ),
            image,
        )
    })
}

/// Everything in the Cluster's spec the policy does not allow; empty when
/// it may be applied.
pub fn check(cluster: &Cluster, config: &Config, resolved: &Resolved) -> Vec<Refusal> {
    let spec = &cluster.spec;
    let mut refusals = Vec::new();
    let components = [
        ("spec.etcd.image", &resolved.etcd),
        ("spec.apiServer.image", &resolved.api_server),
        ("spec.controllerManager.image", &resolved.controller_manager),
        ("spec.scheduler.image", &resolved.scheduler),
    ];
    for (field, wanted) in components {
        if !image_allowed(&wanted.image, config) {
            refusals.push(image_refusal(field.into(), &wanted.image));
        }
    }
    if let Some(kms) = &spec.api_server.kms
        && !image_allowed(&kms.image, config)
    {
        refusals.push(image_refusal("spec.apiServer.kms.image".into(), &kms.image));
    }
    // `serverImage`: the konnectivity add-on's server, run in the
    // meta-cluster beside kube-apiserver.
    for addon in spec.addons.iter().filter(|a| a.enabled) {
        for key in ["image", "serverImage"] {
            let image = addon.values.as_ref().and_then(|v| v.get(key));
            match image {
                None => {}
                Some(serde_json::Value::String(image)) if image_allowed(image, config) => {}
                Some(value) => refusals.push(image_refusal(
                    format!("spec.addons[{}].values.{key}", addon.name),
                    &value
                        .as_str()
                        .map_or_else(|| value.to_string(), str::to_string),
                )),
            }
        }
    }
    if let Some(host_path) = spec
        .etcd
        .storage
        .volume_source
        .as_ref()
        .and_then(|s| s.host_path.as_ref())
    {
        let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
        let prefixes = &config.policy.host_path_prefixes;
        if let Err(e) = host_path_allowed(&host_path.path, namespace, prefixes) {
            // Every refusal says where a hostPath may go, and which flag
            // says so.
            let hint = if e.contains(HOST_PATHS_FLAG) {
                String::new()
            } else {
                format!(
                    " (allowed: directories under {}, by the operator's {HOST_PATHS_FLAG})",
                    allowed_dirs(prefixes, namespace)
                )
            };
            refusals.push(Refusal {
                reason: HOST_PATH_NOT_ALLOWED,
                field: "spec.etcd.storage.volumeSource.hostPath.path".into(),
                message: format!("{:?} {e}{hint}", host_path.path),
            });
        }
    }
    refusals
}

/// Set the `Allowed` condition: True, or False with the first refusal's
/// reason and every refusal in its message (a refused Cluster's phase is
/// `Failed` unless it is paused).
pub fn set_condition(
    status: &mut ClusterStatus,
    cluster: &Cluster,
    refusals: &[Refusal],
    now: Timestamp,
) {
    let desired = match refusals.first() {
        None => Desired {
            type_: ALLOWED,
            status: Status::True,
            reason: "Allowed",
            message: "the operator's flags allow what this Cluster asks for".into(),
        },
        Some(first) => Desired {
            type_: ALLOWED,
            status: Status::False,
            reason: first.reason,
            message: format!(
                "{}; nothing of this Cluster is changed until then",
                refusals
                    .iter()
                    .map(Refusal::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        },
    };
    conditions::set(
        &mut status.conditions,
        desired,
        cluster.metadata.generation,
        now,
    );
    if !refusals.is_empty() && !cluster.spec.paused {
        status.phase = Some(ClusterPhase::Failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check as a pass makes it, the spec resolved first.
    fn checked(cluster: &Cluster, config: &Config) -> Vec<Refusal> {
        check(cluster, config, &Resolved::of(cluster, config))
    }
    use serde_json::json;

    #[test]
    fn snapshots_are_written_under_the_clusters_namespace_unless_the_admin_allows_any_prefix() {
        let policy = Policy::default();
        for ok in ["team-a", "team-a/prod", "/team-a/prod/", "team-a/x/y"] {
            assert_eq!(backup_prefix_refused(&policy, "team-a", ok), None, "{ok}");
        }
        for refused in [
            "team-b/prod",
            "team-ab/prod",
            "",
            "team-a/../team-b",
            "shared",
        ] {
            let why = backup_prefix_refused(&policy, "team-a", refused).expect(refused);
            assert!(why.contains("--backup-any-prefix"), "{why}");
        }
        let any = Policy {
            backup_any_prefix: true,
            ..Policy::default()
        };
        assert_eq!(backup_prefix_refused(&any, "team-a", "team-b/prod"), None);
    }

    fn config(images: &[&str], host_paths: &[&str]) -> Config {
        Config {
            node_operator_image: Some("example.test/kok/node-operator:dev".into()),
            policy: Policy {
                images: images.iter().map(|s| s.to_string()).collect(),
                host_path_prefixes: host_paths.iter().map(|s| s.to_string()).collect(),
                ..Policy::default()
            },
            ..Config::default()
        }
    }

    fn cluster() -> Cluster {
        let mut c: Cluster =
            serde_norway::from_str(include_str!("../../../examples/cluster-minimal.yaml"))
                .expect("example");
        c.metadata.namespace = Some("tenant".into());
        c
    }

    fn prefixes(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_repository_entry_allows_its_tags_and_digests_only() {
        let repo = "registry.example.com/etcd";
        for ok in [
            "registry.example.com/etcd",
            "registry.example.com/etcd:3.6.16-0",
            "registry.example.com/etcd@sha256:0123abcdef",
            "registry.example.com/etcd:v1@sha256:0123abcdef",
        ] {
            assert!(image_matches(ok, repo), "{ok}");
        }
        for bad in [
            "registry.example.com/etcd-evil",
            "registry.example.com/etcd-evil:1",
            "registry.example.com/etcd/evil:1",
            "registry.example.com/etcd:1/evil",
            "registry.example.com/etcd:",
            "registry.example.com/etcd@",
            "registry.example.com/etcd@sha256:xyz",
            "registry.example.com/etc",
            "registry.example.com.evil.io/etcd:1",
            "registry.example.com/etcd:1 --privileged",
            "",
        ] {
            assert!(!image_matches(bad, repo), "{bad}");
        }
    }

    #[test]
    fn a_slash_entry_allows_what_is_under_it_and_star_everything() {
        let under = "registry.example.com/kube/";
        assert!(image_matches("registry.example.com/kube/etcd:1", under));
        assert!(image_matches("registry.example.com/kube/a/b", under));
        for bad in [
            "registry.example.com/kube/",
            "registry.example.com/kube//x",
            "registry.example.com/kubex/etcd",
            "registry.example.com/kube",
            "evil.io/registry.example.com/kube/x",
        ] {
            assert!(!image_matches(bad, under), "{bad}");
        }
        assert!(image_matches("anything.io/x:1", ANY_IMAGE));
    }

    #[test]
    fn the_defaults_allow_what_the_operator_itself_would_run() {
        let c = config(&[], &[]);
        for ok in [
            "registry.k8s.io/etcd:3.6.16-0",
            "registry.k8s.io/kube-apiserver:v1.35.4",
            "registry.k8s.io/kube-controller-manager:v1.36.0",
            "registry.k8s.io/kube-scheduler:v1.35.4",
            "registry.k8s.io/kube-proxy:v1.35.4",
            "registry.k8s.io/coredns/coredns:v1.12.1",
            "registry.k8s.io/node-operator:0.1.0",
            "example.test/kok/node-operator:dev",
            "example.test/kok/node-operator:0.2.0",
            "docker.io/cloudnativelabs/kube-router:v2.1.0",
        ] {
            assert!(image_allowed(ok, &c), "{ok}");
        }
        for bad in [
            "registry.k8s.io/busybox:1",
            "docker.io/library/etcd:3.6",
            "docker.io/cloudnativelabs/kube-router-evil:v2.1.0",
            "example.test/kok/evil:dev",
            "etcd:3.6.16-0",
        ] {
            assert!(!image_allowed(bad, &c), "{bad}");
        }
        assert!(checked(&cluster(), &c).is_empty());
    }

    #[test]
    fn every_image_field_of_the_spec_is_checked() {
        let mut c = cluster();
        c.spec.etcd.component.image = Some("evil.io/etcd:1".into());
        c.spec.api_server.component.image = Some("evil.io/apiserver:1".into());
        c.spec.controller_manager.image = Some("registry.k8s.io/kube-controller-manager:v1".into());
        c.spec.scheduler.image = Some("evil.io/scheduler:1".into());
        c.spec.api_server.kms = Some(
            serde_json::from_value(serde_json::json!({"name": "k", "image": "evil.io/kms:1"}))
                .expect("kms"),
        );
        c.spec.addons = serde_json::from_value(serde_json::json!([
            {"name": "node-operator", "version": "0.1.0", "values": {"image": "evil.io/no:1"}},
            {"name": "coredns", "version": "1.12.1", "values": {"image": {"not": "a string"}}},
            {"name": "kube-proxy", "version": "1.35.4", "values": {"image": "registry.k8s.io/kube-proxy:v1.35.4"}},
            {"name": "konnectivity", "version": "0.34.0", "values": {
                "image": "registry.k8s.io/kas-network-proxy/proxy-agent:v0.34.0",
                "serverImage": "evil.io/proxy-server:1"}},
            {"name": "off", "version": "1.0.0", "enabled": false, "values": {"image": "evil.io/x:1"}},
        ]))
        .expect("addons");
        let refused: Vec<String> = checked(&c, &config(&[], &[]))
            .into_iter()
            .map(|r| {
                assert_eq!(r.reason, IMAGE_NOT_ALLOWED);
                assert!(r.message.contains(IMAGES_FLAG), "{r}");
                r.field
            })
            .collect();
        assert_eq!(
            refused,
            [
                "spec.etcd.image",
                "spec.apiServer.image",
                "spec.scheduler.image",
                "spec.apiServer.kms.image",
                "spec.addons[node-operator].values.image",
                "spec.addons[coredns].values.image",
                "spec.addons[konnectivity].values.serverImage",
            ]
        );
        // Allowed by the flag: nothing refused but the non-string image.
        let open = config(&["evil.io/"], &[]);
        assert_eq!(checked(&c, &open).len(), 1);
        assert!(checked(&c, &config(&[ANY_IMAGE], &[])).len() == 1);
    }

    #[test]
    fn the_node_operator_image_a_template_names_is_checked_as_it_renders() {
        let c = config(&[], &[]);
        let values = |v: serde_json::Value| v.as_object().cloned().expect("map");
        assert_eq!(
            node_operator_refusal(
                &values(json!({"image": "example.test/kok/node-operator:dev"})),
                &c
            ),
            None
        );
        // A tenant's template registered under the built-in's name.
        let refused = node_operator_refusal(&values(json!({"image": "evil.io/miner:1"})), &c)
            .expect("refused");
        assert_eq!(refused.reason, IMAGE_NOT_ALLOWED);
        assert!(
            refused.to_string().contains("\"evil.io/miner:1\""),
            "{refused}"
        );
        // No image, or not a string: what renders (`node-operator`) is checked.
        for v in [json!({}), json!({"image": 7})] {
            let refused = node_operator_refusal(&values(v), &c).expect("refused");
            assert!(refused.message.contains("\"node-operator\""), "{refused}");
        }
        assert_eq!(
            node_operator_refusal(&values(json!({})), &config(&["node-operator"], &[])),
            None
        );
    }

    #[test]
    fn a_host_path_must_be_under_a_prefix_and_the_namespace() {
        let p = prefixes(&["/var/lib/kok-etcd", "/mnt/ssd/"]);
        for ok in [
            "/var/lib/kok-etcd/tenant",
            "/var/lib/kok-etcd/tenant/",
            "/var/lib/kok-etcd/tenant/a",
            "/var/lib/kok-etcd/tenant/a.b/c_d-e",
            "/mnt/ssd/tenant/etcd",
        ] {
            assert_eq!(host_path_allowed(ok, "tenant", &p), Ok(()), "{ok}");
        }
        for bad in [
            "/var/lib/kok-etcd-evil/tenant",
            "/var/lib/kok-etcd",
            "/var/lib/kok-etcd/",
            "/var/lib/kok-etcd/other",
            "/var/lib/kok-etcd/tenantx",
            "/var/lib/kok-etcd/tenant/../other",
            "/var/lib/kok-etcd/tenant/..",
            "/var/lib/kok-etcd/tenant/./a",
            "/var/lib/kok-etcd//tenant",
            "var/lib/kok-etcd/tenant",
            "./var/lib/kok-etcd/tenant",
            "tenant",
            "",
            "/",
            "/etc",
            "/var/lib/kok-etcd/tenant/a b",
            "/var/lib/kok-etcd/tenant/a\nb",
            "/var/lib/kok-etcd/tenant/\u{0}",
            "/var/lib/kok/etcd/tenant",
        ] {
            assert!(host_path_allowed(bad, "tenant", &p).is_err(), "{bad:?}");
        }
        assert_eq!(
            host_path_allowed("/var/lib/kok-etcd/tenant/../../x", "tenant", &p),
            Err("may not contain `.` or `..` segments".into())
        );
        assert_eq!(
            host_path_allowed("relative/path", "tenant", &p),
            Err("must be an absolute path".into())
        );
        assert_eq!(
            host_path_allowed("/var/lib/kok-etcd-evil/tenant", "tenant", &p),
            Err("is not under /var/lib/kok-etcd/tenant or /mnt/ssd/tenant (the operator's --etcd-host-path-prefixes)".into())
        );
        let none = host_path_allowed("/var/lib/kok-etcd/tenant", "tenant", &[]);
        assert!(none.is_err_and(|e| e.contains(HOST_PATHS_FLAG)));
    }

    #[test]
    fn host_path_prefix_flags_are_checked_as_paths() {
        assert_eq!(
            host_path_prefix("/var/lib/kok-etcd/"),
            Ok("/var/lib/kok-etcd".into())
        );
        assert_eq!(host_path_prefix("/"), Ok("/".into()));
        for bad in ["var/lib", "/var/../etc", "/var//lib", ""] {
            assert!(host_path_prefix(bad).is_err(), "{bad}");
        }
        // The root as prefix still keeps each namespace apart.
        let root = prefixes(&["/"]);
        assert_eq!(host_path_allowed("/tenant/etcd", "tenant", &root), Ok(()));
        assert!(host_path_allowed("/etc", "tenant", &root).is_err());
        assert!(image_entry(ANY_IMAGE).is_ok());
        assert!(image_entry("registry.example.com/").is_ok());
        assert!(image_entry("").is_err());
        assert!(image_entry("a b").is_err());
    }

    #[test]
    fn a_refused_host_path_names_the_field_and_the_flag() {
        let mut c = cluster();
        c.spec.etcd.storage = serde_json::from_value(serde_json::json!(
            {"volumeSource": {"hostPath": {"path": "/var/lib/kok-etcd/../../etc"}}}
        ))
        .expect("storage");
        let refused = checked(&c, &config(&[], &["/var/lib/kok-etcd"]));
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].reason, HOST_PATH_NOT_ALLOWED);
        assert_eq!(
            refused[0].to_string(),
            "spec.etcd.storage.volumeSource.hostPath.path: \"/var/lib/kok-etcd/../../etc\" may not contain `.` or `..` segments (allowed: directories under /var/lib/kok-etcd/tenant, by the operator's --etcd-host-path-prefixes)"
        );
        c.spec.etcd.storage = serde_json::from_value(serde_json::json!(
            {"volumeSource": {"hostPath": {"path": "/var/lib/kok-etcd/tenant/c"}}}
        ))
        .expect("storage");
        assert!(checked(&c, &config(&[], &["/var/lib/kok-etcd"])).is_empty());
        let none = checked(&c, &config(&[], &[]));
        assert!(none[0].message.contains(HOST_PATHS_FLAG), "{}", none[0]);
    }

    #[test]
    fn the_condition_says_what_is_refused_and_clears_when_allowed() {
        let c = cluster();
        let mut status = ClusterStatus::default();
        let refusal = image_refusal("spec.etcd.image".into(), "evil.io/etcd:1");
        set_condition(&mut status, &c, &[refusal], Timestamp::UNIX_EPOCH);
        let cond = status.condition(ALLOWED).expect("condition").clone();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", IMAGE_NOT_ALLOWED)
        );
        assert!(cond.message.contains("--allowed-image-prefixes"));
        assert_eq!(status.phase, Some(ClusterPhase::Failed));
        set_condition(&mut status, &c, &[], Timestamp::UNIX_EPOCH);
        assert_eq!(status.condition(ALLOWED).expect("condition").status, "True");
    }
}
