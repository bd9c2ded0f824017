//! kube-apiserver's configuration files that come from the tenant: the audit
//! policy, the audit webhook's kubeconfig and the JWT (OIDC) issuers of the
//! structured authentication configuration. Each is read from an object in
//! the Cluster's namespace, bounded, checked and written again from what was
//! parsed, so kube-apiserver only ever reads what was checked here.

use std::net::IpAddr;

use kok_common::network::Network;
use serde_json::{Map, Value, json};

/// Largest audit policy read, in bytes.
pub const MAX_POLICY_BYTES: usize = 256 * 1024;
/// Largest authentication configuration or webhook kubeconfig read.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Most rules of an audit policy, JWT issuers of an authentication
/// configuration.
const MAX_RULES: usize = 1000;
const MAX_ISSUERS: usize = 64;

/// The key of the tenant's ConfigMap holding the audit policy.
pub const POLICY_KEY: &str = "policy.yaml";
/// The key of the tenant's ConfigMap holding the authentication configuration.
pub const AUTHENTICATION_KEY: &str = "authentication-configuration.yaml";
/// The key of the tenant's Secret (and of the operator's copy) holding the
/// audit webhook's kubeconfig.
pub const WEBHOOK_KEY: &str = "kubeconfig";

/// The audit policy without the tenant's own: every request's metadata
/// (who, what, when, the answer's code), never a body, so a Secret's value
/// never reaches the log; not the health checks, nor the control plane's
/// and nodes' own reads, which would fill it.
pub const DEFAULT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: None
  nonResourceURLs:
  - /healthz*
  - /livez*
  - /readyz*
  - /version
- level: None
  users:
  - system:kube-controller-manager
  - system:kube-scheduler
  - system:apiserver
  verbs:
  - get
  - list
  - watch
- level: None
  userGroups:
  - system:nodes
  verbs:
  - get
  - list
  - watch
- level: None
  resources:
  - group: ''
    resources:
    - events
- level: Metadata
";

/// Parses `text` (YAML or JSON) as one mapping.
fn mapping(text: &str, limit: usize) -> Result<Map<String, Value>, String> {
    if text.len() > limit {
        return Err(format!(
            "{} bytes, more than the {limit} allowed",
            text.len()
        ));
    }
    match serde_norway::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("not a mapping".into()),
        Err(e) => Err(format!("not YAML: {e}")),
    }
}

fn only_keys(map: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), String> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(format!("{what}: field {key:?} is not allowed here")),
        None => Ok(()),
    }
}

fn kind_is(map: &Map<String, Value>, api_version: &str, kind: &str) -> Result<(), String> {
    let field = |f: &str| map.get(f).and_then(Value::as_str).unwrap_or_default();
    if field("apiVersion") != api_version || field("kind") != kind {
        return Err(format!(
            "apiVersion {:?} kind {:?}; expected {api_version} {kind}",
            field("apiVersion"),
            field("kind")
        ));
    }
    Ok(())
}

/// The tenant's audit policy (`policy.yaml` of its ConfigMap), checked and
/// written again; kube-apiserver checks each rule's fields itself.
pub fn audit_policy(text: &str) -> Result<String, String> {
    let map = mapping(text, MAX_POLICY_BYTES)?;
    kind_is(&map, "audit.k8s.io/v1", "Policy")?;
    only_keys(
        &map,
        &[
            "apiVersion",
            "kind",
            "metadata",
            "rules",
            "omitStages",
            "omitManagedFields",
        ],
        "Policy",
    )?;
    let rules = map
        .get("rules")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
        .ok_or("Policy: rules must be a non-empty list")?;
    if rules.len() > MAX_RULES {
        return Err(format!(
            "Policy: {} rules, at most {MAX_RULES}",
            rules.len()
        ));
    }
    for (i, rule) in rules.iter().enumerate() {
        let level = rule.get("level").and_then(Value::as_str);
        if !matches!(
            level,
            Some("None" | "Metadata" | "Request" | "RequestResponse")
        ) {
            return Err(format!(
                "Policy: rules[{i}].level must be None, Metadata, Request or RequestResponse"
            ));
        }
    }
    Ok(to_text(&Value::Object(map)))
}

/// The JWT issuers of the tenant's AuthenticationConfiguration: at most
/// [`MAX_ISSUERS`], each with an https issuer URL (and discovery URL) that is
/// not an address of the meta-cluster's own networks, and audiences.
pub fn jwt_issuers(text: &str, refused_networks: &[Network]) -> Result<Vec<Value>, String> {
    let map = mapping(text, MAX_CONFIG_BYTES)?;
    kind_is(
        &map,
        "apiserver.config.k8s.io/v1",
        "AuthenticationConfiguration",
    )?;
    if map.contains_key("anonymous") {
        return Err("AuthenticationConfiguration: anonymous is set by the operator (only the health endpoints and cluster-info) and may not be given".into());
    }
    only_keys(
        &map,
        &["apiVersion", "kind", "jwt"],
        "AuthenticationConfiguration",
    )?;
    let jwt = map
        .get("jwt")
        .and_then(Value::as_array)
        .filter(|j| !j.is_empty())
        .ok_or("AuthenticationConfiguration: jwt must be a non-empty list of issuers")?;
    if jwt.len() > MAX_ISSUERS {
        return Err(format!("jwt: {} issuers, at most {MAX_ISSUERS}", jwt.len()));
    }
    for (i, authenticator) in jwt.iter().enumerate() {
        let issuer = authenticator
            .get("issuer")
            .and_then(Value::as_object)
            .ok_or(format!("jwt[{i}]: issuer is missing"))?;
        for field in ["url", "discoveryURL"] {
            let Some(url) = issuer.get(field) else {
                continue;
            };
            let url = url.as_str().unwrap_or_default();
            https_outside(url, refused_networks)
                .map_err(|e| format!("jwt[{i}].issuer.{field}: {e}"))?;
        }
        if !issuer.contains_key("url") {
            return Err(format!("jwt[{i}].issuer.url is missing"));
        }
        let audiences = issuer.get("audiences").and_then(Value::as_array);
        if audiences.is_none_or(|a| a.is_empty()) {
            return Err(format!(
                "jwt[{i}].issuer.audiences must name at least one audience"
            ));
        }
        if authenticator.get("claimMappings").is_none() {
            return Err(format!(
                "jwt[{i}].claimMappings is missing (claimMappings.username at least)"
            ));
        }
    }
    Ok(jwt.clone())
}

/// The authentication configuration kube-apiserver reads: anonymous
/// requests only on the health endpoints and `kube-public/cluster-info` (a
/// joining kubelet reads it before it has credentials), and the tenant's
/// JWT issuers.
pub fn authentication_configuration(jwt: &[Value]) -> String {
    let mut config = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AuthenticationConfiguration",
        "anonymous": {
            "enabled": true,
            "conditions": [
                {"path": "/livez"},
                {"path": "/readyz"},
                {"path": "/healthz"},
                {"path": "/api/v1/namespaces/kube-public/configmaps/cluster-info"},
            ],
        },
    });
    if !jwt.is_empty() {
        config["jwt"] = Value::Array(jwt.to_vec());
    }
    to_text(&config)
}

/// The tenant's audit webhook kubeconfig, checked: https servers that are
/// not addresses of the meta-cluster's networks, and credentials given
/// inline only (a file path would be read, an exec plugin run, inside the
/// control plane's Pod).
pub fn webhook_kubeconfig(text: &str, refused_networks: &[Network]) -> Result<String, String> {
    let map = mapping(text, MAX_CONFIG_BYTES)?;
    only_keys(
        &map,
        &[
            "apiVersion",
            "kind",
            "clusters",
            "users",
            "contexts",
            "current-context",
            "preferences",
        ],
        "kubeconfig",
    )?;
    let entries = |list: &str, inner: &str| -> Result<Vec<Map<String, Value>>, String> {
        map.get(list)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|e| {
                e.get(inner)
                    .and_then(Value::as_object)
                    .cloned()
                    .ok_or(format!("kubeconfig: every entry of {list} needs {inner}"))
            })
            .collect()
    };
    let clusters = entries("clusters", "cluster")?;
    if clusters.is_empty() {
        return Err("kubeconfig: no cluster names the webhook's server".into());
    }
    for cluster in &clusters {
        only_keys(
            cluster,
            &["server", "certificate-authority-data", "tls-server-name"],
            "kubeconfig cluster",
        )?;
        let server = cluster
            .get("server")
            .and_then(Value::as_str)
            .unwrap_or_default();
        https_outside(server, refused_networks).map_err(|e| format!("kubeconfig server: {e}"))?;
    }
    for user in entries("users", "user")? {
        only_keys(
            &user,
            &["client-certificate-data", "client-key-data", "token"],
            "kubeconfig user",
        )?;
    }
    Ok(to_text(&Value::Object(map)))
}

/// `url` is https and, when its host is an address, outside `refused`.
fn https_outside(url: &str, refused: &[Network]) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(format!("{url:?} is not an https URL"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(format!("{url:?} carries credentials"));
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if host.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    if let Ok(ip) = host.parse::<IpAddr>()
        && refused.iter().any(|n| n.contains(&ip))
    {
        return Err(format!("{ip} is in the meta-cluster's own networks"));
    }
    Ok(())
}

/// What kube-apiserver reads: the parsed value, written again as YAML.
fn to_text(value: &Value) -> String {
    serde_norway::to_string(value).expect("a JSON value serializes as YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets() -> Vec<Network> {
        vec!["10.96.0.0/12".parse().expect("network")]
    }

    const ISSUER: &str = "apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: https://issuer.example.com
    audiences: [kubernetes]
  claimMappings:
    username: {claim: sub, prefix: 'oidc:'}
";

    #[test]
    fn the_default_policy_is_a_policy() {
        let text = audit_policy(DEFAULT_POLICY).expect("the default policy passes");
        assert!(text.contains("level: Metadata"), "{text}");
    }

    #[test]
    fn a_tenants_policy_is_checked_and_bounded() {
        let refuse = |text: &str, says: &str| {
            let e = audit_policy(text).expect_err(text);
            assert!(e.contains(says), "{e}");
        };
        refuse(
            "kind: Policy\nrules: [{level: Metadata}]",
            "expected audit.k8s.io/v1 Policy",
        );
        refuse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []",
            "non-empty",
        );
        refuse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Everything}]",
            "rules[0].level",
        );
        refuse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None}]\nextra: 1",
            "\"extra\"",
        );
        refuse(&"#".repeat(MAX_POLICY_BYTES + 1), "more than");
        refuse("[1, 2]", "not a mapping");
    }

    #[test]
    fn jwt_issuers_are_merged_under_the_operators_anonymous_rules() {
        let jwt = jwt_issuers(ISSUER, &nets()).expect("issuer");
        let text = authentication_configuration(&jwt);
        let parsed: Value = serde_norway::from_str(&text).expect("yaml");
        assert_eq!(
            parsed["jwt"][0]["issuer"]["url"],
            "https://issuer.example.com"
        );
        assert_eq!(
            parsed["anonymous"]["conditions"].as_array().map(Vec::len),
            Some(4)
        );
        let none: Value = serde_norway::from_str(&authentication_configuration(&[])).expect("yaml");
        assert!(none.get("jwt").is_none());
    }

    #[test]
    fn a_tenant_may_not_open_anonymous_access_or_point_an_issuer_inside() {
        let with_anonymous = format!("{ISSUER}anonymous: {{enabled: true}}\n");
        let e = jwt_issuers(&with_anonymous, &nets()).expect_err("anonymous");
        assert!(e.contains("anonymous is set by the operator"), "{e}");
        let inside = ISSUER.replace("https://issuer.example.com", "https://10.96.0.10:443/x");
        let e = jwt_issuers(&inside, &nets()).expect_err("inside");
        assert!(e.contains("meta-cluster's own networks"), "{e}");
        let plain = ISSUER.replace("https://", "http://");
        assert!(
            jwt_issuers(&plain, &nets())
                .expect_err("http")
                .contains("not an https URL")
        );
        let no_audience = ISSUER.replace("[kubernetes]", "[]");
        assert!(
            jwt_issuers(&no_audience, &nets())
                .expect_err("aud")
                .contains("audiences")
        );
    }

    #[test]
    fn a_webhook_kubeconfig_carries_its_credentials_inline_only() {
        let good = "apiVersion: v1
kind: Config
clusters:
- name: audit
  cluster: {server: 'https://audit.example.com:8443/events', certificate-authority-data: Zm9v}
users:
- name: audit
  user: {token: abc}
contexts:
- name: audit
  context: {cluster: audit, user: audit}
current-context: audit
";
        let text = webhook_kubeconfig(good, &nets()).expect("inline credentials");
        assert!(text.contains("audit.example.com"));
        for (bad, says) in [
            (
                good.replace("token: abc", "tokenFile: /etc/kubernetes/pki/sa.key"),
                "tokenFile",
            ),
            (
                good.replace(
                    "certificate-authority-data: Zm9v",
                    "certificate-authority: /etc/kubernetes/pki/ca.key",
                ),
                "certificate-authority",
            ),
            (
                good.replace("{token: abc}", "{exec: {command: sh}}"),
                "exec",
            ),
            (
                good.replace("audit.example.com:8443", "10.100.0.1:8443"),
                "meta-cluster's own networks",
            ),
            (
                good.replace("https://audit", "https://user:pw@audit"),
                "carries credentials",
            ),
            (good.replace("https://", "http://"), "not an https URL"),
        ] {
            let e = webhook_kubeconfig(&bad, &nets()).expect_err(&bad);
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
