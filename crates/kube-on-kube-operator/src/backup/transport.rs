//! The HTTP transport object_store's S3 client sends its requests through:
//! hyper with rustls on ring, the TLS stack the operator already uses for
//! etcd and the Kubernetes API, trusting either the CA a backup target names
//! or the system's roots. object_store signs, retries and parses; this only
//! moves bytes, bounding how long a request and each pause in a response
//! may take.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody,
    HttpResponse, HttpResponseBody, HttpService,
};
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Why the transport could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The CA given is not a PEM certificate.
    #[error("the storage CA: {message}")]
    Ca { message: String },
    /// No CA was given and the system has no usable root certificates.
    #[error("no CA given and no system root certificates: {message}")]
    NoRoots { message: String },
    /// rustls refused the configuration.
    #[error("TLS configuration: {message}")]
    Tls { message: String },
}

/// Bounds on one request.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Connecting (TCP; TLS is part of the request).
    pub connect: Duration,
    /// A whole request until the head of its answer: connecting, the TLS
    /// handshake, sending its body (an upload part of several MiB) and
    /// waiting for the storage to answer.
    pub request: Duration,
    /// The longest pause between two pieces of an answer's body.
    pub idle: Duration,
}

/// Connects object_store to the storage over hyper and rustls.
#[derive(Debug, Clone)]
pub struct Transport {
    service: Service,
}

#[derive(Debug, Clone)]
struct Service {
    client: Client<HttpsConnector<TcpConnector>, HttpRequestBody>,
    timeouts: Timeouts,
}

impl Transport {
    /// A transport trusting `ca_pem` (one or more PEM certificates) when
    /// given, else the system's roots. `allow_http` permits plain `http://`
    /// endpoints; without it only TLS is spoken.
    pub fn new(
        ca_pem: Option<&str>,
        allow_http: bool,
        timeouts: Timeouts,
    ) -> Result<Self, TransportError> {
        let roots = match ca_pem {
            Some(pem) => ca_roots(pem)?,
            None => system_roots()?,
        };
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError::Tls {
            message: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut tcp = TcpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(timeouts.connect));
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config);
        let connector = if allow_http {
            builder.https_or_http().enable_http1().wrap_connector(tcp)
        } else {
            builder.https_only().enable_http1().wrap_connector(tcp)
        };
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Transport {
            service: Service { client, timeouts },
        })
    }
}

impl HttpConnector for Transport {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(self.service.clone()))
    }
}

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = tokio::time::timeout(self.timeouts.request, self.client.request(request))
            .await
            .map_err(|_| {
                HttpError::new(
                    HttpErrorKind::Timeout,
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {:?}", self.timeouts.request),
                    ),
                )
            })?
            .map_err(|e| {
                let kind = if e.is_connect() {
                    HttpErrorKind::Connect
                } else {
                    HttpErrorKind::Request
                };
                HttpError::new(kind, Failed::from(e))
            })?;
        let (parts, body) = response.into_parts();
        Ok(HttpResponse::from_parts(
            parts,
            idle_bounded(body, self.timeouts.idle),
        ))
    }
}

/// The body of an answer, failing when a piece takes longer than `idle`.
fn idle_bounded(body: Incoming, idle: Duration) -> HttpResponseBody {
    HttpResponseBody::new(IdleBounded {
        body,
        idle,
        timer: Box::pin(tokio::time::sleep(idle)),
    })
}

struct IdleBounded {
    body: Incoming,
    idle: Duration,
    /// When the next piece is late.
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Body for IdleBounded {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.timer.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                Poll::Ready(Some(Err(HttpError::new(HttpErrorKind::Interrupted, e))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::new(
                    HttpErrorKind::Timeout,
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the answer paused for more than {:?}", this.idle),
                    ),
                )))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A failed request, saying why in its message: hyper's own message is
/// only "client error (Connect)", and the reason (refused, no route, which
/// certificate check) is further down a chain that object_store's messages
/// do not follow.
#[derive(Debug)]
struct Failed {
    message: String,
    source: hyper_util::client::legacy::Error,
}

impl From<hyper_util::client::legacy::Error> for Failed {
    fn from(source: hyper_util::client::legacy::Error) -> Self {
        let mut message = source.to_string();
        let mut next = std::error::Error::source(&source);
        while let Some(e) = next {
            message.push_str(": ");
            message.push_str(&e.to_string());
            // An io::Error's source skips the error it wraps.
            next = match e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(inner) if inner.to_string() != e.to_string() => Some(inner),
                _ => e.source(),
            };
        }
        Failed { message, source }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn ca_roots(pem: &str) -> Result<RootCertStore, TransportError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| TransportError::Ca {
            message: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| TransportError::Ca {
            message: e.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(TransportError::Ca {
            message: "no certificate in it".into(),
        });
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, TransportError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let message = found
            .errors
            .first()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "none found".into());
        return Err(TransportError::NoRoots { message });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        connect: Duration::from_secs(5),
        request: Duration::from_secs(5),
        idle: Duration::from_secs(5),
    };

    /// A server on loopback that reads the request, sends `answer` and then
    /// nothing more for a long while.
    async fn stalling_server(
        answer: &'static [u8],
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            socket.write_all(answer).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        (addr, server)
    }

    fn plain_client(timeouts: Timeouts) -> HttpClient {
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("unused", now).unwrap();
        Transport::new(Some(&ca.cert_pem), true, timeouts)
            .unwrap()
            .connect(&ClientOptions::default())
            .unwrap()
    }

    fn get(addr: std::net::SocketAddr) -> HttpRequest {
        hyper::Request::builder()
            .uri(format!("http://{addr}/bucket/key"))
            .body(HttpRequestBody::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_body_that_stalls_fails_after_the_idle_time() {
        let (addr, server) =
            stalling_server(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").await;
        let client = plain_client(Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(5),
            idle: Duration::from_millis(300),
        });
        let started = std::time::Instant::now();
        let response = client.execute(get(addr)).await.unwrap();
        assert_eq!(response.status(), 200);
        let e = response.into_body().bytes().await.unwrap_err();
        assert_eq!(e.kind(), HttpErrorKind::Timeout, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        server.abort();
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let (addr, server) = stalling_server(b"").await;
        let client = plain_client(Timeouts {
            connect: Duration::from_secs(5),
            request: Duration::from_millis(300),
            idle: Duration::from_secs(5),
        });
        let started = std::time::Instant::now();
        let e = client.execute(get(addr)).await.unwrap_err();
        assert_eq!(e.kind(), HttpErrorKind::Timeout, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        server.abort();
    }

    #[tokio::test]
    async fn plain_http_is_refused_unless_allowed() {
        let (addr, server) = stalling_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("unused", now).unwrap();
        let client = Transport::new(Some(&ca.cert_pem), false, TIMEOUTS)
            .unwrap()
            .connect(&ClientOptions::default())
            .unwrap();
        let e = client.execute(get(addr)).await.unwrap_err();
        assert!(e.to_string().contains("scheme"), "{e}");
        server.abort();
    }

    #[test]
    fn a_ca_that_is_not_pem_is_refused() {
        let e = Transport::new(Some("not a certificate"), false, TIMEOUTS).unwrap_err();
        assert!(matches!(e, TransportError::Ca { .. }), "{e}");
    }

    #[test]
    fn a_pem_ca_is_taken() {
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("storage-ca", now).unwrap();
        Transport::new(Some(&ca.cert_pem), false, TIMEOUTS).unwrap();
    }
}
