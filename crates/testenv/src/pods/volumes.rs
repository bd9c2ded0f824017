//! A Pod's volumes as directories on the machine, bind-mounted at their
//! `mountPath`s when a container starts: Secret, ConfigMap and projected
//! sources become files (honouring `items` and modes), emptyDir a fresh
//! directory, a PersistentVolumeClaim a directory per claim that outlives the
//! Pod, hostPath the path itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{KeyToPath, Volume};

/// One file of a materialized volume: relative path, content, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
}

/// Where a volume's content comes from, once its objects have been read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Files written into the Pod's volume directory.
    Files(Vec<File>),
    /// An empty directory that lives as long as the Pod.
    EmptyDir,
    /// A path on the machine, used as is (hostPath, or a claim's volume).
    HostPath(PathBuf),
}

/// The objects a volume needs, so the runner can fetch them first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Needs {
    Secret {
        name: String,
        optional: bool,
    },
    ConfigMap {
        name: String,
        optional: bool,
    },
    Claim(String),
    ServiceAccountToken {
        audience: Option<String>,
        expiration_seconds: Option<i64>,
    },
}

/// What `volume` needs fetched.
pub fn needs(volume: &Volume) -> Vec<Needs> {
    let mut out = Vec::new();
    if let Some(s) = &volume.secret {
        out.push(Needs::Secret {
            name: s.secret_name.clone().unwrap_or_default(),
            optional: s.optional == Some(true),
        });
    }
    if let Some(c) = &volume.config_map {
        out.push(Needs::ConfigMap {
            name: c.name.clone(),
            optional: c.optional == Some(true),
        });
    }
    if let Some(p) = &volume.persistent_volume_claim {
        out.push(Needs::Claim(p.claim_name.clone()));
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(s) = &source.secret {
                out.push(Needs::Secret {
                    name: s.name.clone(),
                    optional: s.optional == Some(true),
                });
            }
            if let Some(c) = &source.config_map {
                out.push(Needs::ConfigMap {
                    name: c.name.clone(),
                    optional: c.optional == Some(true),
                });
            }
            if let Some(t) = &source.service_account_token {
                out.push(Needs::ServiceAccountToken {
                    audience: t.audience.clone(),
                    expiration_seconds: t.expiration_seconds,
                });
            }
        }
    }
    out
}

/// Objects fetched for a Pod's volumes.
#[derive(Debug, Default, Clone)]
pub struct Fetched {
    /// Secret name → decoded data.
    pub secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    /// ConfigMap name → data.
    pub config_maps: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    /// Claim name → directory of the volume it is bound to.
    pub claims: BTreeMap<String, PathBuf>,
    /// Service-account token for projected volumes.
    pub token: Option<String>,
    /// The Pod's namespace, for projected downward-API `metadata.namespace`.
    pub namespace: String,
}

/// Why a volume cannot be set up yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("volume {volume}: {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

fn select(
    data: &BTreeMap<String, Vec<u8>>,
    items: &Option<Vec<KeyToPath>>,
    default_mode: Option<i32>,
    what: &str,
) -> Result<Vec<File>, String> {
    let mode = |m: Option<i32>| m.or(default_mode).unwrap_or(0o644) as u32;
    match items {
        None => Ok(data
            .iter()
            .map(|(k, v)| File {
                path: k.clone(),
                content: v.clone(),
                mode: mode(None),
            })
            .collect()),
        Some(items) => items
            .iter()
            .map(|item| {
                data.get(&item.key)
                    .map(|v| File {
                        path: item.path.clone(),
                        content: v.clone(),
                        mode: mode(item.mode),
                    })
                    .ok_or_else(|| format!("{what} has no key {}", item.key))
            })
            .collect(),
    }
}

/// Turn `volume` into its source, given what was fetched.
pub fn source(volume: &Volume, fetched: &Fetched) -> Result<Source, VolumeError> {
    let fail = |message: String| VolumeError {
        volume: volume.name.clone(),
        message,
    };
    if let Some(s) = &volume.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        return match fetched.secrets.get(&name) {
            Some(data) => select(data, &s.items, s.default_mode, &format!("secret {name}"))
                .map(Source::Files)
                .map_err(fail),
            None if s.optional == Some(true) => Ok(Source::Files(vec![])),
            None => Err(fail(format!("secret {name} not found"))),
        };
    }
    if let Some(c) = &volume.config_map {
        return match fetched.config_maps.get(&c.name) {
            Some(data) => select(
                data,
                &c.items,
                c.default_mode,
                &format!("configmap {}", c.name),
            )
            .map(Source::Files)
            .map_err(fail),
            None if c.optional == Some(true) => Ok(Source::Files(vec![])),
            None => Err(fail(format!("configmap {} not found", c.name))),
        };
    }
    if volume.empty_dir.is_some() {
        return Ok(Source::EmptyDir);
    }
    if let Some(h) = &volume.host_path {
        return Ok(Source::HostPath(PathBuf::from(&h.path)));
    }
    if let Some(p) = &volume.persistent_volume_claim {
        return fetched
            .claims
            .get(&p.claim_name)
            .map(|dir| Source::HostPath(dir.clone()))
            .ok_or_else(|| {
                fail(format!(
                    "persistentvolumeclaim {} is not bound yet",
                    p.claim_name
                ))
            });
    }
    if let Some(projected) = &volume.projected {
        let mut files = Vec::new();
        for s in projected.sources.iter().flatten() {
            if let Some(secret) = &s.secret {
                match fetched.secrets.get(&secret.name) {
                    Some(data) => files.extend(
                        select(
                            data,
                            &secret.items,
                            projected.default_mode,
                            &format!("secret {}", secret.name),
                        )
                        .map_err(fail)?,
                    ),
                    None if secret.optional == Some(true) => {}
                    None => return Err(fail(format!("secret {} not found", secret.name))),
                }
            }
            if let Some(cm) = &s.config_map {
                match fetched.config_maps.get(&cm.name) {
                    Some(data) => files.extend(
                        select(
                            data,
                            &cm.items,
                            projected.default_mode,
                            &format!("configmap {}", cm.name),
                        )
                        .map_err(fail)?,
                    ),
                    None if cm.optional == Some(true) => {}
                    None => return Err(fail(format!("configmap {} not found", cm.name))),
                }
            }
            if let Some(t) = &s.service_account_token {
                let token = fetched
                    .token
                    .clone()
                    .ok_or_else(|| fail("no service-account token".into()))?;
                files.push(File {
                    path: t.path.clone(),
                    content: token.into_bytes(),
                    mode: projected.default_mode.unwrap_or(0o644) as u32,
                });
            }
            if let Some(d) = &s.downward_api {
                for item in d.items.iter().flatten() {
                    if let Some(f) = &item.field_ref
                        && f.field_path == "metadata.namespace"
                    {
                        files.push(File {
                            path: item.path.clone(),
                            content: fetched.namespace.clone().into_bytes(),
                            mode: 0o644,
                        });
                    }
                }
            }
        }
        return Ok(Source::Files(files));
    }
    Err(fail("unsupported volume type (supported: secret, configMap, projected, emptyDir, hostPath, persistentVolumeClaim)".into()))
}

/// Write `files` into `dir` atomically enough for readers: each file is
/// written beside its final name and renamed into place.
pub fn write_files(dir: &Path, files: &[File]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    for file in files {
        if file.path.split('/').any(|p| p == "..") || file.path.starts_with('/') {
            return Err(std::io::Error::other(format!(
                "refusing path {:?}",
                file.path
            )));
        }
        let target = dir.join(&file.path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = target.with_extension("kok-tmp");
        std::fs::write(&tmp, &file.content)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(file.mode & 0o7777))?;
        std::fs::rename(&tmp, &target)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ProjectedVolumeSource, SecretProjection, SecretVolumeSource, VolumeProjection,
    };

    fn fetched() -> Fetched {
        let mut f = Fetched::default();
        f.secrets.insert(
            "tls".into(),
            [
                ("tls.crt".to_string(), b"CERT".to_vec()),
                ("tls.key".to_string(), b"KEY".to_vec()),
            ]
            .into(),
        );
        f
    }

    #[test]
    fn secret_items_pick_and_rename_keys() {
        let volume = Volume {
            name: "pki".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("tls".into()),
                items: Some(vec![KeyToPath {
                    key: "tls.crt".into(),
                    path: "server.crt".into(),
                    mode: Some(0o600),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            needs(&volume),
            vec![Needs::Secret {
                name: "tls".into(),
                optional: false
            }]
        );
        assert_eq!(
            source(&volume, &fetched()),
            Ok(Source::Files(vec![File {
                path: "server.crt".into(),
                content: b"CERT".to_vec(),
                mode: 0o600
            }]))
        );
        let missing = Volume {
            secret: Some(SecretVolumeSource {
                secret_name: Some("nope".into()),
                ..Default::default()
            }),
            ..volume
        };
        assert!(source(&missing, &fetched()).is_err());
    }

    #[test]
    fn projected_secrets_merge_and_files_are_written() {
        let volume = Volume {
            name: "certs".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    secret: Some(SecretProjection {
                        name: "tls".into(),
                        items: None,
                        optional: None,
                    }),
                    ..Default::default()
                }]),
                default_mode: Some(0o640),
            }),
            ..Default::default()
        };
        let Ok(Source::Files(files)) = source(&volume, &fetched()) else {
            panic!("files expected")
        };
        let dir = tempfile::tempdir().expect("tempdir");
        write_files(dir.path(), &files).expect("write");
        assert_eq!(
            std::fs::read(dir.path().join("tls.key")).expect("read"),
            b"KEY"
        );
        let evil = vec![File {
            path: "../escape".into(),
            content: vec![],
            mode: 0o644,
        }];
        assert!(write_files(dir.path(), &evil).is_err());
    }
}
