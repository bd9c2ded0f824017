//! The peer: what `bench/ansible/workers.yml` needs to join the same hosts to
//! the same cluster as kubespray and `kubeadm join` do. A bootstrap token
//! Secret in the business cluster (one for every host, as `kubeadm token
//! create` makes it), the cluster CA and API address from the public
//! `cluster-info`, and per host the same files and units node-operator
//! renders for the same Machine: the same templates, filled by the same
//! code, so both tools leave the same configuration behind.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use kube_on_kube_api::Machine;
use kube_on_kube_api::package::{Arch, ArtifactFormat};
use node_operator::bootstrap;
use node_operator::install;
use node_operator::machine::plan::{self, ClusterValues, Wanted};
use serde_json::{Value, json};

/// Label of the benchmark's bootstrap token Secret.
pub const TOKEN_LABEL: &str = "kok-bench/workers";

/// Creates a bootstrap token and returns the playbook's variables and the
/// token Secret's name.
pub async fn prepare(
    business: &Client,
    packages: &[Wanted],
    machines: &[Machine],
    cluster: &ClusterValues,
) -> Result<(Value, String)> {
    let token = bootstrap::new_token(Timestamp::now() + bootstrap::TOKEN_LIFETIME)?;
    let mut secret = bootstrap::token_secret("kok-bench", &token);
    secret.metadata.labels = Some([(TOKEN_LABEL.to_string(), "true".to_string())].into());
    if let Some(data) = secret.string_data.as_mut() {
        data.insert(
            "description".into(),
            "kubelet TLS bootstrap of the benchmark's Ansible workers".into(),
        );
    }
    let secrets: Api<Secret> = Api::namespaced(business.clone(), "kube-system");
    let created = secrets.create(&PostParams::default(), &secret).await?;
    let info = bootstrap::cluster_info(business).await?;
    let cluster = ClusterValues {
        api_server: info.server.clone(),
        ..cluster.clone()
    };
    let vars = vars(
        packages,
        machines,
        &cluster,
        &bootstrap::bootstrap_kubeconfig(&info, &token),
        &bootstrap::ca_pem(&info)?,
    )?;
    Ok((vars, created.name_any()))
}

/// The playbook's variables (see `bench/ansible/workers.yml`).
pub fn vars(
    packages: &[Wanted],
    machines: &[Machine],
    cluster: &ClusterValues,
    bootstrap_kubeconfig: &str,
    ca: &str,
) -> Result<Value> {
    let mut per_host = serde_json::Map::new();
    for machine in machines {
        let values = plan::template_values(machine, cluster);
        let mut rendered = serde_json::Map::new();
        for w in packages {
            let all = install::template_values(&w.spec, Arch::Amd64, &values);
            let files = w
                .spec
                .install
                .files
                .iter()
                .map(|f| {
                    Ok(json!({
                        "path": f.path,
                        "mode": f.mode,
                        "content": install::render(&f.path, &f.template, &all)?,
                    }))
                })
                .collect::<Result<Vec<_>>>()?;
            let unit = match &w.spec.install.systemd_unit {
                Some(u) => install::render(&u.name, &u.content, &all)?,
                None => String::new(),
            };
            rendered.insert(w.package.clone(), json!({"files": files, "unit": unit}));
        }
        per_host.insert(plan::node_name(machine), Value::Object(rendered));
    }
    let sysctls: BTreeMap<String, String> = machines
        .first()
        .map(|m| m.spec.sysctls.clone())
        .unwrap_or_default();
    let sysctl_conf: String = sysctls
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect();
    Ok(json!({
        "packages": packages.iter().map(package).collect::<Result<Vec<_>>>()?,
        "per_host": per_host,
        "sysctls": sysctls,
        "sysctl_conf": sysctl_conf,
        "bootstrap_kubeconfig": bootstrap_kubeconfig,
        "cluster_ca": ca,
    }))
}

/// One package as the playbook installs it: a tarball unpacked into the one
/// directory its binaries are linked from (less the leading directories
/// they have in the archive), or a single binary downloaded to its link.
fn package(w: &Wanted) -> Result<Value> {
    let spec = &w.spec;
    let artifact = spec
        .artifacts
        .iter()
        .find(|a| a.arch == Arch::Amd64)
        .with_context(|| format!("{} has no amd64 artifact", w.package_version))?;
    let parent = |p: &str| {
        p.rsplit_once('/')
            .map(|(d, _)| d.to_string())
            .unwrap_or_default()
    };
    let links: Vec<(&str, &str)> = spec
        .install
        .binaries
        .iter()
        .map(|b| {
            b.link
                .as_deref()
                .map(|l| (b.path.as_str(), l))
                .with_context(|| format!("{}: {} has no link", w.package_version, b.path))
        })
        .collect::<Result<_>>()?;
    let archive = artifact.format == ArtifactFormat::TarGz;
    let (strip, unpack_dest, binary) = if archive {
        let dirs: BTreeSet<(String, String)> =
            links.iter().map(|(p, l)| (parent(p), parent(l))).collect();
        let mut dirs = dirs.into_iter();
        let (Some((inside, dest)), None) = (dirs.next(), dirs.next()) else {
            bail!(
                "{}: binaries from or to several directories",
                w.package_version
            );
        };
        let strip = inside.split('/').filter(|s| !s.is_empty()).count();
        (strip, dest, String::new())
    } else {
        let [(_, link)] = links[..] else {
            bail!(
                "{}: a binary artifact installs one binary",
                w.package_version
            );
        };
        (0, String::new(), link.to_string())
    };
    // node-operator's own deadline loop, run as one task.
    let health_script = spec
        .health_check
        .as_ref()
        .map(install::health_script)
        .unwrap_or_default();
    Ok(json!({
        "name": w.package,
        "version": spec.version,
        "url": artifact.url,
        "sha256": artifact.sha256,
        "archive": archive,
        "strip": strip,
        "unpack_dest": unpack_dest,
        "binary": binary,
        "unit_name": spec.install.systemd_unit.as_ref().map(|u| u.name.clone()).unwrap_or_default(),
        "health_script": health_script,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_on_kube_api::package::PackageVersionSpec;

    fn wanted(yaml: &str) -> Wanted {
        let spec: PackageVersionSpec = serde_norway::from_str(yaml).unwrap();
        Wanted {
            package: spec.package.clone(),
            package_version: format!("{}-{}", spec.package, spec.version),
            spec,
        }
    }

    #[test]
    fn archives_unpack_where_their_binaries_are_linked() {
        let containerd = wanted(
            "package: containerd\nversion: 2.4.2\nartifacts:\n- {arch: amd64, url: http://a/c.tgz, sha256: ab}\ninstall:\n  binaries:\n  - {path: bin/containerd, link: /usr/local/bin/containerd}\n  - {path: bin/ctr, link: /usr/local/bin/ctr}\n",
        );
        let p = package(&containerd).unwrap();
        assert_eq!(p["archive"], true);
        assert_eq!(p["strip"], 1);
        assert_eq!(p["unpack_dest"], "/usr/local/bin");
        let runc = wanted(
            "package: runc\nversion: 1.5.2\nartifacts:\n- {arch: amd64, url: http://a/runc, sha256: ab, format: Binary}\ninstall:\n  binaries:\n  - {path: bin/runc, link: /usr/local/sbin/runc}\nhealthCheck:\n  command: [/usr/local/sbin/runc, --version]\n",
        );
        let p = package(&runc).unwrap();
        assert_eq!(p["archive"], false);
        assert_eq!(p["binary"], "/usr/local/sbin/runc");
        let health = p["health_script"].as_str().unwrap();
        assert!(
            health.contains("timeout 1 /usr/local/sbin/runc --version")
                || health.contains("'/usr/local/sbin/runc' '--version'"),
            "{health}"
        );
        assert!(health.contains("deadline="), "{health}");
        let split = wanted(
            "package: x\nversion: '1'\nartifacts:\n- {arch: amd64, url: http://a/x.tgz, sha256: ab}\ninstall:\n  binaries:\n  - {path: bin/a, link: /usr/local/bin/a}\n  - {path: b, link: /opt/b}\n",
        );
        assert!(package(&split).is_err());
    }
}
