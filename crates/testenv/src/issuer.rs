//! A test identity provider and audit sink on one HTTPS port of the machine:
//! OIDC discovery and a JWKS for the tokens it signs (ES256), which a real
//! kube-apiserver's JWT authenticator fetches, and `/audit`, where a real
//! kube-apiserver's audit webhook posts its event batches (kept, in order).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KID: &str = "kok-test-issuer";
/// Largest request read (an audit batch included).
const MAX_REQUEST: usize = 8 << 20;

/// The running issuer; it stops when dropped.
pub struct TestIssuer {
    /// `https://<address>:<port>`: the issuer URL tokens name.
    pub url: String,
    /// The PEM of the CA that signed its serving certificate.
    pub ca_pem: String,
    signer: EcdsaKeyPair,
    audit: Arc<Mutex<Vec<Value>>>,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl TestIssuer {
    /// Listens on `address` (one the control plane's Pods reach, like the
    /// Pod runner's gateway), on a free port.
    pub async fn start(address: Ipv4Addr) -> Self {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = Issuer::new(ca, &ca_key);
        let key = KeyPair::generate().expect("key");
        let mut leaf = CertificateParams::new(vec![address.to_string()]).expect("params");
        leaf.subject_alt_names = vec![rcgen::SanType::IpAddress(IpAddr::V4(address))];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer).expect("serving certificate");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind((address, 0))
            .await
            .expect("listen");
        let port = listener.local_addr().expect("address").port();
        let url = format!("https://{address}:{port}");
        let signing_key = KeyPair::generate().expect("signing key");
        let signer = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &signing_key.serialize_der(),
            &SystemRandom::new(),
        )
        .expect("ES256 key");
        let point = signer.public_key().as_ref().to_vec();
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": KID,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]});
        let discovery = json!({
            "issuer": url,
            "jwks_uri": format!("{url}/jwks"),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        });
        let audit = Arc::new(Mutex::new(Vec::new()));
        let events = audit.clone();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (jwks, discovery, events) = (jwks.clone(), discovery.clone(), events.clone());
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some((path, body)) = read_request(&mut tls).await else {
                        seen.lock()
                            .expect("requests")
                            .push("unreadable request".into());
                        return;
                    };
                    seen.lock()
                        .expect("requests")
                        .push(format!("{path} ({} bytes)", body.len()));
                    let answer = match path.split('?').next().unwrap_or_default() {
                        "/.well-known/openid-configuration" => discovery,
                        "/jwks" => jwks,
                        "/audit" => {
                            if let Ok(batch) = serde_json::from_slice::<Value>(&body) {
                                events.lock().expect("events").push(batch);
                            }
                            json!({})
                        }
                        _ => Value::Null,
                    };
                    let (status, body) = match answer {
                        Value::Null => ("404 Not Found", "{}".to_string()),
                        v => ("200 OK", v.to_string()),
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            url,
            ca_pem: ca_cert.pem(),
            signer,
            audit,
            requests,
            task,
        }
    }

    /// A token of subject `sub` for audience `aud`, valid for ten minutes.
    pub fn token(&self, sub: &str, aud: &str) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": KID});
        let claims = json!({
            "iss": self.url, "sub": sub, "aud": aud,
            "iat": now, "nbf": now - 5, "exp": now + 600,
        });
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .signer
            .sign(&SystemRandom::new(), signed.as_bytes())
            .expect("sign");
        format!("{signed}.{}", b64(signature.as_ref()))
    }

    /// Each request so far: its path and body size, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }

    /// Every audit event posted to `/audit` so far.
    pub fn audit_events(&self) -> Vec<Value> {
        self.audit
            .lock()
            .expect("events")
            .iter()
            .flat_map(|batch| batch["items"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// The path and body of one HTTP/1.1 request.
async fn read_request<S: AsyncReadExt + Unpin>(stream: &mut S) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > MAX_REQUEST {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let path = head.split_whitespace().nth(1)?.to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
        .min(MAX_REQUEST);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some((path, buf[head_end..head_end + length].to_vec()))
}
