//! How a new host's kubelet gets into the cluster: a bootstrap token (a
//! `bootstrap-token-<id>` Secret in kube-system, limited lifetime, one per
//! Machine at a time) and a bootstrap kubeconfig built from the public
//! `cluster-info` ConfigMap, with which the kubelet requests its own client
//! certificate (TLS bootstrap).

use std::collections::BTreeMap;
use std::io::Read;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;

use crate::Error;

/// Extra group of every token the operator creates; the CSR auto-approval
/// bindings cover `system:bootstrappers`, which every token is in.
pub const TOKEN_GROUP: &str = "system:bootstrappers:kube-on-kube";
/// Label on token Secrets naming the Machine they were made for.
pub const MACHINE_LABEL: &str = "kubeonkube.io/machine";
/// How long a new token is valid.
pub const TOKEN_LIFETIME: SignedDuration = SignedDuration::from_hours(1);
/// A token with less left than this is not handed out again.
const MIN_LEFT: SignedDuration = SignedDuration::from_mins(20);

const NAMESPACE: &str = "kube-system";
const TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";

/// A bootstrap token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The public part, `[a-z0-9]{6}`.
    pub id: String,
    /// The secret part, `[a-z0-9]{16}`.
    pub secret: String,
    /// When it stops working.
    pub expires: Timestamp,
}

impl std::fmt::Debug for Token {
    // The secret part must never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("id", &self.id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// `<id>.<secret>`, what the kubeconfig carries.
    pub fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// The cluster as `cluster-info` publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterInfo {
    /// API server URL kubelets use.
    pub server: String,
    /// Base64 of the CA bundle.
    pub ca_data: String,
    /// TLS server name to verify, when the URL's host is not in the certificate.
    pub tls_server_name: Option<String>,
}

/// Reads `cluster-info`'s kubeconfig.
pub fn parse_cluster_info(cm: &ConfigMap) -> Result<ClusterInfo, Error> {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .ok_or_else(|| {
            Error::ClusterInfo("kube-public/cluster-info has no kubeconfig key".into())
        })?;
    let kubeconfig = Kubeconfig::from_yaml(text)
        .map_err(|e| Error::ClusterInfo(format!("kube-public/cluster-info kubeconfig: {e}")))?;
    let cluster = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| Error::ClusterInfo("kube-public/cluster-info names no cluster".into()))?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| Error::ClusterInfo("kube-public/cluster-info has no server".into()))?;
    let ca_data = cluster.certificate_authority_data.clone().ok_or_else(|| {
        Error::ClusterInfo("kube-public/cluster-info has no certificate-authority-data".into())
    })?;
    Ok(ClusterInfo {
        server,
        ca_data,
        tls_server_name: cluster.tls_server_name.clone(),
    })
}

/// The kubelet's bootstrap kubeconfig (JSON, which is YAML).
pub fn bootstrap_kubeconfig(cluster: &ClusterInfo, token: &Token) -> String {
    let mut c = json!({
        "server": cluster.server,
        "certificate-authority-data": cluster.ca_data,
    });
    if let Some(name) = &cluster.tls_server_name {
        c["tls-server-name"] = json!(name);
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": c}],
        "users": [{"name": "tls-bootstrap-token-user", "user": {"token": token.bearer()}}],
        "contexts": [{"name": "tls-bootstrap", "context": {"cluster": "kubernetes", "user": "tls-bootstrap-token-user"}}],
        "current-context": "tls-bootstrap",
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// The CA bundle in PEM, from `cluster-info`.
pub fn ca_pem(cluster: &ClusterInfo) -> Result<String, Error> {
    let bytes = decode_base64(&cluster.ca_data)
        .ok_or_else(|| Error::ClusterInfo("certificate-authority-data is not base64".into()))?;
    String::from_utf8(bytes).map_err(|_| Error::ClusterInfo("the CA bundle is not PEM".into()))
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' | b' ' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// A new random token valid until `expires`.
pub fn new_token(expires: Timestamp) -> Result<Token, Error> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut random = [0u8; 22];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(Error::LocalIo)?;
    // 252 is the largest multiple of 36 below 256: no bias.
    let mut chars = Vec::with_capacity(22);
    let mut pool = random.to_vec();
    while chars.len() < 22 {
        let Some(b) = pool.pop() else {
            let mut more = [0u8; 22];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut more))
                .map_err(Error::LocalIo)?;
            pool.extend_from_slice(&more);
            continue;
        };
        if b < 252 {
            chars.push(char::from(ALPHABET[usize::from(b % 36)]));
        }
    }
    let text: String = chars.into_iter().collect();
    Ok(Token {
        id: text[..6].to_string(),
        secret: text[6..].to_string(),
        expires,
    })
}

/// The Secret that makes `token` valid, labelled with its Machine.
pub fn token_secret(machine: &str, token: &Token) -> Secret {
    let data: BTreeMap<String, String> = [
        ("token-id", token.id.clone()),
        ("token-secret", token.secret.clone()),
        ("expiration", token.expires.to_string()),
        ("usage-bootstrap-authentication", "true".into()),
        ("auth-extra-groups", TOKEN_GROUP.into()),
        (
            "description",
            format!("kubelet TLS bootstrap of Machine {machine}"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{}", token.id)),
            namespace: Some(NAMESPACE.into()),
            labels: Some([(MACHINE_LABEL.to_string(), machine.to_string())].into()),
            ..Default::default()
        },
        type_: Some(TOKEN_TYPE.into()),
        string_data: Some(data),
        ..Default::default()
    }
}

/// The token a Secret holds, if it is one and still usable at `now`.
pub fn usable(secret: &Secret, now: Timestamp) -> Option<Token> {
    if secret.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let data = secret.data.as_ref()?;
    let field = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    let expires: Timestamp = field("expiration")?.parse().ok()?;
    if expires.duration_since(now) < MIN_LEFT {
        return None;
    }
    Some(Token {
        id: field("token-id")?,
        secret: field("token-secret")?,
        expires,
    })
}

/// The Machine's bootstrap token: a still-usable one if it has one (so a
/// retry or a restart never makes a second), else a new one. Tokens of the
/// Machine that are no longer usable are deleted.
pub async fn ensure_token(client: &Client, machine: &str) -> Result<Token, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let list = secrets
        .list(&ListParams::default().labels(&format!("{MACHINE_LABEL}={machine}")))
        .await
        .map_err(Error::kube(format!(
            "list Secrets in {NAMESPACE} for Machine {machine}"
        )))?;
    let now = Timestamp::now();
    let mut found = None;
    for secret in &list.items {
        match (found.is_none(), usable(secret, now)) {
            (true, Some(token)) => found = Some(token),
            _ => {
                if let Some(name) = &secret.metadata.name {
                    delete_ignoring_missing(&secrets, name).await?;
                }
            }
        }
    }
    if let Some(token) = found {
        return Ok(token);
    }
    let token = new_token(now + TOKEN_LIFETIME)?;
    secrets
        .create(&PostParams::default(), &token_secret(machine, &token))
        .await
        .map_err(Error::kube(format!(
            "create Secret {NAMESPACE}/bootstrap-token-{}",
            token.id
        )))?;
    Ok(token)
}

/// The Machine each bootstrap token of this operator was issued for, by
/// token id (tokens being deleted count as gone).
pub async fn machine_tokens(client: &Client) -> Result<BTreeMap<String, String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let list = secrets
        .list(&ListParams::default().labels(MACHINE_LABEL))
        .await
        .map_err(Error::kube(format!(
            "list the bootstrap-token Secrets in {NAMESPACE}"
        )))?;
    Ok(list
        .items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| {
            let id = s
                .metadata
                .name
                .as_deref()?
                .strip_prefix("bootstrap-token-")?;
            let machine = s.metadata.labels.as_ref()?.get(MACHINE_LABEL)?;
            Some((id.to_owned(), machine.clone()))
        })
        .collect())
}

/// Deletes the Machine's tokens: once its kubelet has joined, or when it goes.
pub async fn delete_tokens(client: &Client, machine: &str) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let list = secrets
        .list(&ListParams::default().labels(&format!("{MACHINE_LABEL}={machine}")))
        .await
        .map_err(Error::kube(format!(
            "list Secrets in {NAMESPACE} for Machine {machine}"
        )))?;
    for secret in &list.items {
        if let Some(name) = &secret.metadata.name {
            delete_ignoring_missing(&secrets, name).await?;
        }
    }
    Ok(())
}

async fn delete_ignoring_missing(secrets: &Api<Secret>, name: &str) -> Result<(), Error> {
    match secrets.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete Secret {NAMESPACE}/{name}"))(e)),
    }
}

/// Reads `kube-public/cluster-info`.
pub async fn cluster_info(client: &Client) -> Result<ClusterInfo, Error> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    match cms
        .get_opt("cluster-info")
        .await
        .map_err(Error::kube("get ConfigMap kube-public/cluster-info"))?
    {
        Some(cm) => parse_cluster_info(&cm),
        None => Err(Error::ClusterInfo(
            "ConfigMap kube-public/cluster-info does not exist (the kube-on-kube-operator's bootstrap add-on writes it)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn tokens_have_the_bootstrap_token_shape() {
        let t = new_token(Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(t.id.len(), 6);
        assert_eq!(t.secret.len(), 16);
        assert!(
            t.bearer()
                .chars()
                .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert!(!format!("{t:?}").contains(&t.secret));
        assert_ne!(
            new_token(Timestamp::UNIX_EPOCH).unwrap().bearer(),
            t.bearer()
        );
    }

    #[test]
    fn secret_carries_usage_group_expiry_and_machine() {
        let expires: Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let token = Token {
            id: "abcdef".into(),
            secret: "0123456789abcdef".into(),
            expires,
        };
        let s = token_secret("m1", &token);
        assert_eq!(s.metadata.name.as_deref(), Some("bootstrap-token-abcdef"));
        assert_eq!(s.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
        let data = s.string_data.clone().unwrap();
        assert_eq!(data["usage-bootstrap-authentication"], "true");
        assert_eq!(data["auth-extra-groups"], TOKEN_GROUP);
        assert_eq!(data["expiration"], "2030-01-01T00:00:00Z");
        // As the API server returns it: base64-decoded into data.
        let stored = Secret {
            data: Some(
                data.into_iter()
                    .map(|(k, v)| (k, ByteString(v.into_bytes())))
                    .collect(),
            ),
            ..s
        };
        let now: Timestamp = "2029-12-31T23:00:00Z".parse().unwrap();
        assert_eq!(usable(&stored, now), Some(token));
        let late: Timestamp = "2029-12-31T23:50:00Z".parse().unwrap();
        assert_eq!(usable(&stored, late), None);
    }

    #[test]
    fn bootstrap_kubeconfig_keeps_the_published_cluster() {
        let cluster = ClusterInfo {
            server: "https://10.0.0.1:6443".into(),
            ca_data: "Q0E=".into(),
            tls_server_name: Some("localhost".into()),
        };
        let token = Token {
            id: "abcdef".into(),
            secret: "0123456789abcdef".into(),
            expires: Timestamp::UNIX_EPOCH,
        };
        let text = bootstrap_kubeconfig(&cluster, &token);
        let parsed = Kubeconfig::from_yaml(&text).unwrap();
        let c = parsed.clusters[0].cluster.clone().unwrap();
        assert_eq!(c.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(c.tls_server_name.as_deref(), Some("localhost"));
        assert!(text.contains("abcdef.0123456789abcdef"));
        assert_eq!(ca_pem(&cluster).unwrap(), "CA");
    }

    #[test]
    fn cluster_info_is_parsed() {
        let cm = ConfigMap {
            data: Some(
                [(
                    "kubeconfig".to_string(),
                    r#"{"apiVersion":"v1","kind":"Config","clusters":[{"name":"","cluster":{"server":"https://a:6443","certificate-authority-data":"Q0E="}}],"contexts":[],"users":[]}"#.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        };
        let info = parse_cluster_info(&cm).unwrap();
        assert_eq!(info.server, "https://a:6443");
        assert_eq!(info.tls_server_name, None);
        assert!(parse_cluster_info(&ConfigMap::default()).is_err());
    }
}
