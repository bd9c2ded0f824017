//! Kubeconfig files: how components and users reach the business API with a
//! client certificate.

use k8s_openapi::ByteString;
use serde_json::json;

/// Inputs of one kubeconfig; PEM text throughout.
pub struct KubeconfigInput<'a> {
    /// Name used for the cluster, user and context entries.
    pub cluster: &'a str,
    pub user: &'a str,
    /// API URL, for example `https://prod-apiserver.clusters.svc:6443`.
    pub server: &'a str,
    pub ca_pem: &'a str,
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
}

/// Render a kubeconfig with embedded credentials (as YAML-compatible JSON,
/// which every kubeconfig reader accepts).
pub fn render(input: &KubeconfigInput<'_>) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let context = format!("{}@{}", input.user, input.cluster);
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": input.cluster, "cluster": {
            "server": input.server,
            "certificate-authority-data": b64(input.ca_pem),
        }}],
        "users": [{"name": input.user, "user": {
            "client-certificate-data": b64(input.cert_pem),
            "client-key-data": b64(input.key_pem),
        }}],
        "contexts": [{"name": context, "context": {"cluster": input.cluster, "user": input.user}}],
        "current-context": context,
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// Secret data key holding the kubeconfig.
pub const KEY: &str = "kubeconfig";

/// The Secret data of a kubeconfig Secret.
pub fn secret_data(text: String) -> std::collections::BTreeMap<String, ByteString> {
    [(KEY.to_string(), ByteString(text.into_bytes()))].into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_as_one() {
        let text = render(&KubeconfigInput {
            cluster: "prod",
            user: "admin",
            server: "https://api.example.com:6443",
            ca_pem: "CA",
            cert_pem: "CERT",
            key_pem: "KEY",
        });
        let parsed = kube::config::Kubeconfig::from_yaml(&text).expect("a valid kubeconfig");
        assert_eq!(parsed.current_context.as_deref(), Some("admin@prod"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(
            cluster.server.as_deref(),
            Some("https://api.example.com:6443")
        );
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
    }
}
