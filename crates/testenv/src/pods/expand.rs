//! Container command, args and environment as the kubelet computes them:
//! `$(VAR)` references expand to earlier variables, `$$` escapes a dollar, and
//! downward-API fields come from the Pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

/// Values the runner supplies for `valueFrom` references it resolves itself.
pub trait Lookup {
    /// A Secret key's value.
    fn secret(&self, namespace: &str, name: &str, key: &str) -> Option<String>;
    /// A ConfigMap key's value.
    fn config_map(&self, namespace: &str, name: &str, key: &str) -> Option<String>;
}

/// Expand `$(NAME)` in `input` with `vars`; unknown references stay as written
/// and `$$` becomes `$`, as the kubelet does.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'('
                && let Some(end) = input[i + 2..].find(')')
            {
                let name = &input[i + 2..i + 2 + end];
                match vars.get(name) {
                    Some(value) => out.push_str(value),
                    None => out.push_str(&input[i..i + 3 + end]),
                }
                i += 3 + end;
                continue;
            }
        }
        let ch = input[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// A downward-API field of the Pod (`fieldRef.fieldPath`).
pub fn field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let from_map = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        map.as_ref()?.get(key).cloned()
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()),
        p if p.starts_with("metadata.labels['") => from_map(&meta.labels, "metadata.labels['"),
        p if p.starts_with("metadata.annotations['") => {
            from_map(&meta.annotations, "metadata.annotations['")
        }
        _ => None,
    }
}

/// Why a container's environment could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {message}")]
pub struct EnvError {
    pub container: String,
    pub message: String,
}

/// The environment of `container`, in order, with references resolved.
pub fn environment(
    pod: &Pod,
    container: &Container,
    lookup: &dyn Lookup,
) -> Result<BTreeMap<String, String>, EnvError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let fail = |message: String| EnvError {
        container: container.name.clone(),
        message,
    };
    let mut vars = BTreeMap::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.iter().flatten()
    {
        let resolved = match (value, value_from) {
            (Some(v), _) => expand(v, &vars),
            (None, None) => String::new(),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path).ok_or_else(|| {
                        fail(format!("{name}: field {} is not available", f.field_path))
                    })?
                } else if let Some(s) = &from.secret_key_ref {
                    match lookup.secret(&namespace, &s.name, &s.key) {
                        Some(v) => v,
                        None if s.optional == Some(true) => continue,
                        None => {
                            return Err(fail(format!(
                                "{name}: secret {}/{} has no key {}",
                                namespace, s.name, s.key
                            )));
                        }
                    }
                } else if let Some(c) = &from.config_map_key_ref {
                    match lookup.config_map(&namespace, &c.name, &c.key) {
                        Some(v) => v,
                        None if c.optional == Some(true) => continue,
                        None => {
                            return Err(fail(format!(
                                "{name}: configmap {}/{} has no key {}",
                                namespace, c.name, c.key
                            )));
                        }
                    }
                } else {
                    return Err(fail(format!("{name}: unsupported valueFrom")));
                }
            }
        };
        vars.insert(name.clone(), resolved);
    }
    Ok(vars)
}

/// The argv of `container`: `command` (or the image's entrypoint, which the
/// caller supplies) followed by `args`, each expanded with `vars`.
pub fn argv(
    container: &Container,
    entrypoint: &str,
    vars: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out: Vec<String> = match &container.command {
        Some(command) if !command.is_empty() => command.iter().map(|c| expand(c, vars)).collect(),
        _ => vec![entrypoint.to_string()],
    };
    out.extend(container.args.iter().flatten().map(|a| expand(a, vars)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector, PodStatus};

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn expansion_follows_kubelet_rules() {
        let v = vars(&[("IP", "10.1.2.3"), ("NAME", "etcd-0")]);
        assert_eq!(
            expand("--listen=https://$(IP):2379", &v),
            "--listen=https://10.1.2.3:2379"
        );
        assert_eq!(expand("$(NAME)-$(MISSING)", &v), "etcd-0-$(MISSING)");
        assert_eq!(expand("$$(IP) costs $5", &v), "$(IP) costs $5");
        assert_eq!(expand("$(unterminated", &v), "$(unterminated");
    }

    struct NoLookup;
    impl Lookup for NoLookup {
        fn secret(&self, _: &str, _: &str, _: &str) -> Option<String> {
            None
        }
        fn config_map(&self, _: &str, _: &str, _: &str) -> Option<String> {
            None
        }
    }

    #[test]
    fn downward_api_and_references() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("etcd-0".into());
        pod.metadata.namespace = Some("ns".into());
        pod.status = Some(PodStatus {
            pod_ip: Some("10.1.2.3".into()),
            ..Default::default()
        });
        let field_env = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        };
        let container = Container {
            name: "etcd".into(),
            env: Some(vec![
                field_env("POD_IP", "status.podIP"),
                field_env("POD_NAME", "metadata.name"),
                EnvVar {
                    name: "URL".into(),
                    value: Some("https://$(POD_IP):2380".into()),
                    value_from: None,
                },
            ]),
            command: Some(vec!["etcd".into()]),
            args: Some(vec![
                "--name=$(POD_NAME)".into(),
                "--initial-advertise-peer-urls=$(URL)".into(),
            ]),
            ..Default::default()
        };
        let env = environment(&pod, &container, &NoLookup).expect("env");
        assert_eq!(env["URL"], "https://10.1.2.3:2380");
        assert_eq!(
            argv(&container, "unused", &env),
            vec![
                "etcd",
                "--name=etcd-0",
                "--initial-advertise-peer-urls=https://10.1.2.3:2380"
            ]
        );
    }
}
