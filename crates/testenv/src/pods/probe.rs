//! Readiness and liveness probes as the kubelet runs them: HTTP(S) GET (any
//! status from 200 to 399 passes, certificates are not verified), TCP connect,
//! or a command; thresholds turn single results into a state.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One probe, resolved against the Pod's address and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Http {
        https: bool,
        host: String,
        port: u16,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp {
        host: String,
        port: u16,
    },
    Exec {
        command: Vec<String>,
    },
}

/// Timing and thresholds of a probe, with the kubelet's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(probe: &Probe) -> Self {
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        Self {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

fn port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("port {p} out of range")),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("no container port named {name}")),
    }
}

/// Resolve `probe` for a Pod at `pod_ip` with container `ports`.
pub fn check_for(probe: &Probe, pod_ip: &str, ports: &[ContainerPort]) -> Result<Check, String> {
    if let Some(http) = &probe.http_get {
        Ok(Check::Http {
            https: http.scheme.as_deref() == Some("HTTPS"),
            host: http.host.clone().unwrap_or_else(|| pod_ip.to_string()),
            port: port(&http.port, ports)?,
            path: http.path.clone().unwrap_or_else(|| "/".into()),
            headers: http
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        })
    } else if let Some(tcp) = &probe.tcp_socket {
        Ok(Check::Tcp {
            host: tcp.host.clone().unwrap_or_else(|| pod_ip.to_string()),
            port: port(&tcp.port, ports)?,
        })
    } else if let Some(exec) = &probe.exec {
        Ok(Check::Exec {
            command: exec.command.clone().unwrap_or_default(),
        })
    } else {
        Err("probe has no handler (httpGet, tcpSocket or exec)".into())
    }
}

/// Consecutive results folded into a state, as the kubelet does: `success`
/// results in a row flip it to passing, `failure` in a row to failing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeState {
    successes: u32,
    failures: u32,
    passing: Option<bool>,
}

impl ProbeState {
    /// Record one result; returns whether the probe now passes.
    pub fn record(&mut self, ok: bool, timing: &Timing) -> bool {
        if ok {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= timing.success_threshold {
                self.passing = Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= timing.failure_threshold {
                self.passing = Some(false);
            }
        }
        self.passing == Some(true)
    }

    /// Whether the probe has failed `failureThreshold` times in a row.
    pub fn failed(&self) -> bool {
        self.passing == Some(false)
    }
}

/// Run a network check once (exec checks are run by the caller inside the Pod).
pub async fn run_network(check: &Check, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, async {
        match check {
            Check::Tcp { host, port } => TcpStream::connect((host.as_str(), *port)).await.is_ok(),
            Check::Http {
                https,
                host,
                port,
                path,
                headers,
            } => http_get(*https, host, *port, path, headers)
                .await
                .is_some_and(|code| (200..400).contains(&code)),
            Check::Exec { .. } => false,
        }
    })
    .await
    .unwrap_or(false)
}

async fn http_get(
    https: bool,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Option<u16> {
    let tcp = TcpStream::connect((host, port)).await.ok()?;
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.35\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    let mut response = Vec::new();
    if https {
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
        let mut tls = tokio_rustls::TlsConnector::from(insecure_tls()?)
            .connect(name, tcp)
            .await
            .ok()?;
        tls.write_all(request.as_bytes()).await.ok()?;
        let _ = tls.read_to_end(&mut response).await;
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes()).await.ok()?;
        let _ = tcp.read_to_end(&mut response).await;
    }
    let status_line = response.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(status_line)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Probes do not verify serving certificates (the kubelet does not either).
fn insecure_tls() -> Option<Arc<rustls::ClientConfig>> {
    #[derive(Debug)]
    struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    Some(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HTTPGetAction, TCPSocketAction};

    #[test]
    fn named_ports_and_defaults() {
        let probe = Probe {
            http_get: Some(HTTPGetAction {
                scheme: Some("HTTPS".into()),
                port: IntOrString::String("https".into()),
                path: Some("/readyz".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ports = vec![ContainerPort {
            name: Some("https".into()),
            container_port: 6443,
            ..Default::default()
        }];
        assert_eq!(
            check_for(&probe, "10.1.0.2", &ports),
            Ok(Check::Http {
                https: true,
                host: "10.1.0.2".into(),
                port: 6443,
                path: "/readyz".into(),
                headers: vec![]
            })
        );
        let timing = Timing::of(&probe);
        assert_eq!(
            (
                timing.period,
                timing.failure_threshold,
                timing.success_threshold
            ),
            (Duration::from_secs(10), 3, 1)
        );
        let tcp = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("nope".into()),
                host: None,
            }),
            ..Default::default()
        };
        assert!(check_for(&tcp, "10.1.0.2", &ports).is_err());
    }

    #[test]
    fn thresholds() {
        let timing = Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 3,
        };
        let mut s = ProbeState::default();
        assert!(!s.record(true, &timing));
        assert!(s.record(true, &timing));
        assert!(s.record(false, &timing));
        assert!(
            s.record(false, &timing),
            "two failures are below the threshold"
        );
        assert!(!s.record(false, &timing));
        assert!(s.failed());
    }

    #[tokio::test]
    async fn tcp_and_http_against_a_real_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let ok = String::from_utf8_lossy(&buf[..n]).starts_with("GET /ok ");
                let reply = if ok {
                    "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                } else {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
                };
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        let t = Duration::from_secs(2);
        assert!(
            run_network(
                &Check::Tcp {
                    host: "127.0.0.1".into(),
                    port
                },
                t
            )
            .await
        );
        let http = |path: &str| Check::Http {
            https: false,
            host: "127.0.0.1".into(),
            port,
            path: path.into(),
            headers: vec![],
        };
        assert!(run_network(&http("/ok"), t).await);
        assert!(!run_network(&http("/bad"), t).await);
        // Nothing listens on port 1.
        assert!(
            !run_network(
                &Check::Tcp {
                    host: "127.0.0.1".into(),
                    port: 1
                },
                t
            )
            .await
        );
    }
}
