//! A small client for the etcd v3 cluster and maintenance APIs, spoken as JSON
//! through the HTTP gateway every etcd serves on its client URL, so membership
//! can be managed over mutual TLS without a gRPC stack.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::names::Names;
use crate::pki::secrets;

/// How long one request to one endpoint may take before the next is tried.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The CA, certificate or key could not be turned into a TLS configuration.
    #[error("etcd TLS configuration: {message}")]
    Tls { message: String },
    /// An endpoint is not a usable URL.
    #[error("invalid etcd endpoint {endpoint:?}: {message}")]
    Endpoint { endpoint: String, message: String },
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// The connection or the HTTP exchange failed.
    #[error("etcd {endpoint}: {source}")]
    Transport {
        endpoint: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The endpoint did not answer in time.
    #[error("etcd {endpoint}: no answer within {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    /// etcd answered with an error.
    #[error("etcd {endpoint} refused ({status}): {message}")]
    Refused {
        endpoint: String,
        status: u16,
        /// The gRPC status code etcd reported, when it did.
        code: Option<i32>,
        message: String,
    },
    /// etcd refused a request that will succeed when repeated a little later.
    #[error("etcd {endpoint}: try again later: {message}")]
    TryAgain { endpoint: String, message: String },
    /// The answer was not the JSON expected.
    #[error("etcd {endpoint}: unexpected answer: {source}")]
    Decode {
        endpoint: String,
        #[source]
        source: serde_json::Error,
    },
}

impl EtcdError {
    /// Short static category, used as a metric label and event reason.
    pub fn category(&self) -> &'static str {
        match self {
            EtcdError::Tls { .. } => "etcd-tls",
            EtcdError::Endpoint { .. } | EtcdError::NoEndpoints => "etcd-endpoint",
            EtcdError::Transport { .. } | EtcdError::Timeout { .. } => "etcd-unreachable",
            EtcdError::Refused { .. } => "etcd-refused",
            EtcdError::TryAgain { .. } => "etcd-try-again",
            EtcdError::Decode { .. } => "etcd-decode",
        }
    }

    /// Whether etcd refused to promote a learner because it has not caught up
    /// with the leader yet: a reason to wait, not a failure.
    pub fn is_learner_not_ready(&self) -> bool {
        matches!(self, EtcdError::Refused { message, .. } if message.contains("in sync with leader"))
    }

    /// Whether the same call may succeed later or on another endpoint: the
    /// endpoint could not be reached, or etcd was unavailable (no leader, or
    /// members not connected long enough for a membership change), or the
    /// endpoint is a learner, which serves no linearizable request (a member
    /// being replaced is one until it is promoted). Anything else is etcd's
    /// final answer.
    pub fn is_transient(&self) -> bool {
        match self {
            EtcdError::Transport { .. }
            | EtcdError::Timeout { .. }
            | EtcdError::TryAgain { .. } => true,
            EtcdError::Refused {
                status, message, ..
            } => *status >= 500 || message.contains("not supported for learner"),
            _ => false,
        }
    }
}

/// One member as etcd's membership list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Member {
    #[serde(rename = "ID", deserialize_with = "u64_from_string")]
    pub id: u64,
    /// Empty until the member has started and published its name.
    #[serde(default)]
    pub name: String,
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    /// Empty until the member has started.
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

/// What one endpoint says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Member ID of the endpoint that answered.
    pub member_id: u64,
    /// Member ID of the leader it follows, 0 when it knows none.
    pub leader: u64,
    pub version: String,
    pub is_learner: bool,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    /// The key-value store's revision on the endpoint that answered.
    pub revision: u64,
    /// Alarms and other errors the member reports.
    pub errors: Vec<String>,
}

/// A client over a fixed list of endpoints (client URLs) of one etcd cluster.
#[derive(Clone)]
pub struct EtcdClient {
    endpoints: Vec<String>,
    timeout: Duration,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// PEM material of a client identity trusted by etcd, as stored in the
/// operator's etcd client Secret (`ca.crt`, `tls.crt`, `tls.key`).
#[derive(Clone, Copy)]
pub struct ClientTls<'a> {
    pub ca_pem: &'a str,
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
}

/// Client URLs of members `0..count`, in order: each member answers for the
/// whole cluster, and trying them in turn gets past the ones that are down.
pub fn member_endpoints(names: &Names, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| names.etcd_client_url(&names.etcd_member(i)))
        .collect()
}

impl EtcdClient {
    /// A client for `endpoints` with the identity in a `kubernetes.io/tls`
    /// Secret that also carries the etcd CA (the operator's etcd client
    /// Secret).
    pub fn from_secret(
        endpoints: Vec<String>,
        secret: &Secret,
        timeout: Duration,
    ) -> Result<Self, EtcdError> {
        let field = |key: &str| -> Result<&str, EtcdError> {
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| EtcdError::Tls {
                    message: format!("Secret {} has no {key}", secret.name_any()),
                })?;
            std::str::from_utf8(&bytes.0).map_err(|_| EtcdError::Tls {
                message: format!("{key} of Secret {} is not PEM text", secret.name_any()),
            })
        };
        let tls = ClientTls {
            ca_pem: field(secrets::CA)?,
            cert_pem: field(secrets::CERT)?,
            key_pem: field(secrets::KEY)?,
        };
        Self::new(endpoints, tls, timeout)
    }

    /// A client for `endpoints` (e.g. `https://etcd-0...:2379`), tried in turn.
    pub fn new(
        endpoints: Vec<String>,
        tls: ClientTls<'_>,
        timeout: Duration,
    ) -> Result<Self, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        for endpoint in &endpoints {
            let uri: hyper::Uri = endpoint
                .parse()
                .map_err(|e: hyper::http::uri::InvalidUri| EtcdError::Endpoint {
                    endpoint: endpoint.clone(),
                    message: e.to_string(),
                })?;
            if uri.scheme_str() != Some("https") || uri.host().is_none() {
                return Err(EtcdError::Endpoint {
                    endpoint: endpoint.clone(),
                    message: "expected https://host:port".into(),
                });
            }
        }
        let config = tls_config(tls)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let http = Client::builder(TokioExecutor::new()).build(connector);
        let endpoints = endpoints
            .into_iter()
            .map(|e| e.trim_end_matches('/').to_string())
            .collect();
        Ok(Self {
            endpoints,
            timeout,
            http,
        })
    }

    /// The endpoints this client tries, in order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Every member, voters and learners.
    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdError> {
        #[derive(Serialize)]
        struct Body {
            linearizable: bool,
        }
        // Linearizable, so a member that lost the leader does not answer
        // with a stale list.
        let answer: MembersAnswer = self
            .call("/v3/cluster/member/list", &Body { linearizable: true })
            .await?;
        Ok(answer.members)
    }

    /// Add a learner with `peer_urls`; returns the new member and the list
    /// the new member must be started with.
    ///
    /// Not idempotent: etcd refuses a peer URL it already has, so a caller that
    /// lost the answer finds the learner by its peer URL in `member_list`.
    pub async fn add_learner(
        &self,
        peer_urls: &[String],
    ) -> Result<(Member, Vec<Member>), EtcdError> {
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(rename = "peerURLs")]
            peer_urls: &'a [String],
            #[serde(rename = "isLearner")]
            is_learner: bool,
        }
        #[derive(Deserialize)]
        struct Answer {
            member: Member,
            #[serde(default)]
            members: Vec<Member>,
        }
        let body = Body {
            peer_urls,
            is_learner: true,
        };
        match self
            .call::<_, Answer>("/v3/cluster/member/add", &body)
            .await
        {
            Ok(answer) => Ok((answer.member, answer.members)),
            // etcd derives a new member's ID from its peer URLs and the
            // current second, so adding back a member removed within the
            // same second as it was added yields a removed ID, which etcd
            // reports as "member not found". A second later the ID differs.
            Err(EtcdError::Refused {
                endpoint,
                status: 404,
                message,
                ..
            }) => Err(EtcdError::TryAgain { endpoint, message }),
            Err(e) => Err(e),
        }
    }

    /// Remove member `id`; returns the remaining members.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let answer: MembersAnswer = self
            .call("/v3/cluster/member/remove", &IdBody { id })
            .await?;
        Ok(answer.members)
    }

    /// Promote learner `id` to a voter; etcd refuses until it has caught up
    /// (see [`EtcdError::is_learner_not_ready`]).
    pub async fn promote_member(&self, id: u64) -> Result<Vec<Member>, EtcdError> {
        let answer: MembersAnswer = self
            .call("/v3/cluster/member/promote", &IdBody { id })
            .await?;
        Ok(answer.members)
    }

    /// What `endpoint` says about itself. Asks that endpoint only: the
    /// answer is about the member behind it.
    pub async fn status(&self, endpoint: &str) -> Result<Status, EtcdError> {
        let raw: RawStatus = self
            .call_one(
                endpoint,
                Method::POST,
                "/v3/maintenance/status",
                Bytes::from_static(b"{}"),
            )
            .await?;
        Ok(Status {
            member_id: raw.header.member_id,
            leader: raw.leader,
            version: raw.version,
            is_learner: raw.is_learner,
            raft_index: raw.raft_index,
            raft_applied_index: raw.raft_applied_index,
            revision: raw.header.revision,
            errors: raw.errors,
        })
    }

    /// Whether `endpoint` serves reads through raft (etcd's own `/health`).
    pub async fn healthy(&self, endpoint: &str) -> Result<bool, EtcdError> {
        #[derive(Deserialize)]
        struct Health {
            health: String,
        }
        let result: Result<Health, EtcdError> = self
            .call_one(endpoint, Method::GET, "/health", Bytes::new())
            .await;
        match result {
            Ok(h) => Ok(h.health == "true"),
            // An unhealthy member answers 503 with the same body.
            Err(EtcdError::Refused { status: 503, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Starts a snapshot of the member behind `endpoint` (etcd's
    /// `Maintenance/Snapshot`) and returns the response body: the gateway's
    /// stream of newline-separated JSON messages, each with a base64 blob of
    /// the database, then one with the database's sha256
    /// (`crate::backup::snapshot` reads it). Only the answer's head is bound
    /// by the client's timeout: the body lasts as long as the database takes
    /// to send, and whoever reads it bounds the pauses between its chunks.
    pub async fn snapshot(&self, endpoint: &str) -> Result<Incoming, EtcdError> {
        let endpoint = endpoint.trim_end_matches('/');
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("{endpoint}/v3/maintenance/snapshot"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(b"{}")))
            .map_err(|e| EtcdError::Endpoint {
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            })?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: endpoint.to_string(),
                timeout: self.timeout,
            })?
            .map_err(|e| EtcdError::Transport {
                endpoint: endpoint.to_string(),
                source: Box::new(e),
            })?;
        let status = response.status();
        if status == StatusCode::OK {
            return Ok(response.into_body());
        }
        // A refusal is a short JSON error, never the stream.
        let body = tokio::time::timeout(self.timeout, response.into_body().collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Err(refused(endpoint, status, &body))
    }

    /// POST `body` to `path` on each endpoint in turn until one answers.
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, EtcdError> {
        let body = Bytes::from(
            serde_json::to_vec(body).map_err(|source| EtcdError::Decode {
                endpoint: String::new(),
                source,
            })?,
        );
        let mut last = EtcdError::NoEndpoints;
        for endpoint in &self.endpoints {
            match self
                .call_one(endpoint, Method::POST, path, body.clone())
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(e) if e.is_transient() => {
                    tracing::debug!(%endpoint, path, error = %e, "etcd endpoint failed, trying the next");
                    // What a member said is worth more than that another
                    // could not be reached.
                    if !matches!(last, EtcdError::Refused { .. }) {
                        last = e;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    async fn call_one<T: DeserializeOwned>(
        &self,
        endpoint: &str,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<T, EtcdError> {
        let endpoint = endpoint.trim_end_matches('/');
        let transport = |source: Box<dyn std::error::Error + Send + Sync>| EtcdError::Transport {
            endpoint: endpoint.to_string(),
            source,
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{endpoint}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| EtcdError::Endpoint {
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            })?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| transport(Box::new(e)))?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| transport(Box::new(e)))?
                .to_bytes();
            Ok::<_, EtcdError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: endpoint.to_string(),
                timeout: self.timeout,
            })??;
        if status != StatusCode::OK {
            return Err(refused(endpoint, status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|source| EtcdError::Decode {
            endpoint: endpoint.to_string(),
            source,
        })
    }
}

fn refused(endpoint: &str, status: StatusCode, body: &[u8]) -> EtcdError {
    #[derive(Deserialize)]
    struct GatewayError {
        #[serde(default)]
        code: Option<i32>,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        error: Option<String>,
    }
    let (code, message) = match serde_json::from_slice::<GatewayError>(body) {
        Ok(e) => (
            e.code,
            e.message
                .or(e.error)
                .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
        ),
        Err(_) => (None, String::from_utf8_lossy(body).into_owned()),
    };
    EtcdError::Refused {
        endpoint: endpoint.to_string(),
        status: status.as_u16(),
        code,
        message,
    }
}

fn tls_config(tls: ClientTls<'_>) -> Result<rustls::ClientConfig, EtcdError> {
    let bad = |message: String| EtcdError::Tls { message };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| bad(format!("CA certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CA certificate".into()));
    }
    let chain = CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("client certificate: {e}")))?;
    if chain.is_empty() {
        return Err(bad("no client certificate".into()));
    }
    // Never include the key's parse error text: it could echo key material.
    let key = PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes())
        .map_err(|_| bad("client key is not a PEM private key".into()))?;
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(format!("client certificate and key: {e}")))
}

#[derive(Deserialize)]
struct MembersAnswer {
    #[serde(default)]
    members: Vec<Member>,
}

/// etcd's JSON carries 64-bit integers as strings.
#[derive(Serialize)]
struct IdBody {
    #[serde(rename = "ID", serialize_with = "u64_to_string")]
    id: u64,
}

#[derive(Deserialize)]
struct RawHeader {
    #[serde(default, deserialize_with = "u64_from_string")]
    member_id: u64,
    #[serde(default, deserialize_with = "u64_from_string")]
    revision: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    header: RawHeader,
    #[serde(default)]
    version: String,
    #[serde(default, deserialize_with = "u64_from_string")]
    leader: u64,
    #[serde(default)]
    is_learner: bool,
    #[serde(default, deserialize_with = "u64_from_string")]
    raft_index: u64,
    #[serde(default, deserialize_with = "u64_from_string")]
    raft_applied_index: u64,
    #[serde(default)]
    errors: Vec<String>,
}

fn u64_to_string<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&value.to_string())
}

/// Accepts both a string and a number, since the gateway is only consistent
/// about strings for 64-bit fields.
pub(crate) fn u64_from_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(u64),
    }
    match Either::deserialize(deserializer)? {
        Either::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Either::Number(n) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_decode_from_gateway_json() {
        let json = r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","raft_term":"2"},
            "members":[
              {"ID":"10276657743932975437","name":"a","peerURLs":["https://a:2380"],"clientURLs":["https://a:2379"]},
              {"ID":"18446744073709551615","peerURLs":["https://b:2380"],"isLearner":true}]}"#;
        let answer: MembersAnswer = serde_json::from_str(json).unwrap();
        assert_eq!(
            answer.members,
            vec![
                Member {
                    id: 10276657743932975437,
                    name: "a".into(),
                    peer_urls: vec!["https://a:2380".into()],
                    client_urls: vec!["https://a:2379".into()],
                    is_learner: false,
                },
                Member {
                    id: u64::MAX,
                    name: String::new(),
                    peer_urls: vec!["https://b:2380".into()],
                    client_urls: vec![],
                    is_learner: true,
                },
            ]
        );
    }

    #[test]
    fn ids_are_sent_as_strings() {
        let body = serde_json::to_string(&IdBody { id: u64::MAX }).unwrap();
        assert_eq!(body, r#"{"ID":"18446744073709551615"}"#);
    }

    #[test]
    fn status_decodes() {
        let json = r#"{"header":{"member_id":"5","revision":"1"},"version":"3.6.16","dbSize":"20480",
            "leader":"7","raftIndex":"12","raftTerm":"2","raftAppliedIndex":"12","isLearner":true}"#;
        let raw: RawStatus = serde_json::from_str(json).unwrap();
        assert_eq!(raw.header.member_id, 5);
        assert_eq!(raw.header.revision, 1);
        assert_eq!(raw.leader, 7);
        assert!(raw.is_learner);
        assert_eq!(raw.raft_applied_index, 12);
    }

    #[test]
    fn gateway_errors_keep_the_message() {
        let e = refused(
            "https://x:2379",
            StatusCode::BAD_REQUEST,
            br#"{"error":"etcdserver: can only promote a learner member which is in sync with leader","code":9,"message":"etcdserver: can only promote a learner member which is in sync with leader"}"#,
        );
        assert!(e.is_learner_not_ready(), "{e}");
        assert!(!e.is_transient());
        let e = refused("https://x:2379", StatusCode::SERVICE_UNAVAILABLE, b"oops");
        assert!(e.is_transient());
        assert!(!e.is_learner_not_ready());
        // A learner refuses the member list; another member answers it.
        let e = refused(
            "https://x:2379",
            StatusCode::BAD_REQUEST,
            br#"{"error":"etcdserver: rpc not supported for learner","code":14,"message":"etcdserver: rpc not supported for learner"}"#,
        );
        assert!(e.is_transient(), "{e}");
        assert!(!e.is_learner_not_ready());
    }

    #[test]
    fn client_from_the_operator_secret() {
        use k8s_openapi::ByteString;
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("etcd-ca", now).unwrap();
        let spec = crate::pki::LeafSpec {
            common_name: "operator".into(),
            organizations: vec![],
            dns_names: vec![],
            ips: vec![],
            usage: crate::pki::Usage::Client,
        };
        let leaf = crate::pki::issue(&ca, &spec, now, Duration::from_secs(3600)).unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some("c-operator-etcd-client".into());
        let data = [
            (secrets::CA, &ca.cert_pem),
            (secrets::CERT, &leaf.cert_pem),
            (secrets::KEY, &leaf.key_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
        secret.data = Some(data);
        let names = Names {
            cluster: "c".into(),
            namespace: "ns".into(),
            meta_domain: "cluster.local".into(),
        };
        let endpoints = member_endpoints(&names, 3);
        assert_eq!(endpoints[2], "https://c-etcd-2.ns.svc.cluster.local:2379");
        let client = EtcdClient::from_secret(endpoints, &secret, DEFAULT_TIMEOUT).unwrap();
        assert_eq!(client.endpoints().len(), 3);

        secret.data.as_mut().unwrap().remove(secrets::KEY);
        let e = EtcdClient::from_secret(vec!["https://x:2379".into()], &secret, DEFAULT_TIMEOUT)
            .unwrap_err();
        assert!(e.to_string().contains("tls.key"), "{e}");
    }

    #[test]
    fn bad_material_is_refused() {
        let tls = ClientTls {
            ca_pem: "",
            cert_pem: "",
            key_pem: "",
        };
        let e = EtcdClient::new(vec!["https://x:2379".into()], tls, DEFAULT_TIMEOUT).unwrap_err();
        assert_eq!(e.category(), "etcd-tls");
        let e = EtcdClient::new(vec!["http://x:2379".into()], tls, DEFAULT_TIMEOUT).unwrap_err();
        assert_eq!(e.category(), "etcd-endpoint");
    }
}
