//! The operators' HTTP endpoint: `/healthz` (the process serves), `/readyz`
//! (see [`crate::health`]), `/metrics` (Prometheus text format) and
//! `/debug/loglevel` (`GET` the log filter, `PUT` a new one).

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Flags of the HTTP endpoint.
#[derive(clap::Args, Debug, Clone)]
pub struct HttpArgs {
    /// Address of the HTTP endpoint serving /healthz, /readyz, /metrics and
    /// /debug/loglevel. Port 0 picks a free port (logged at start).
    #[arg(long, env = "KOK_HTTP_ADDRESS", default_value = "0.0.0.0:8080")]
    pub http_address: SocketAddr,
}

/// Bind the endpoint and serve it in the background; returns the bound
/// address. Failing to bind is an error: probes would fail anyway.
pub async fn serve(address: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, "serving /healthz, /readyz, /metrics and /debug/loglevel");
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let served = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(handle))
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "HTTP connection ended with an error");
                }
            });
        }
    });
    Ok(bound)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        "text/plain; charset=utf-8".parse().expect("static header"),
    );
    response
}

async fn handle(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") | (&Method::GET, "/livez") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => match crate::health::global().readiness() {
            Ok(why) => text(StatusCode::OK, format!("{why}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        (&Method::GET, "/metrics") => {
            let mut response = text(StatusCode::OK, crate::metrics::global().encode());
            response.headers_mut().insert(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    .parse()
                    .expect("static header"),
            );
            response
        }
        (&Method::GET, "/debug/loglevel") => match crate::telemetry::log_level() {
            Some(level) => text(StatusCode::OK, format!("{level}\n")),
            None => text(StatusCode::NOT_FOUND, "logging is not reloadable\n"),
        },
        (&Method::PUT, "/debug/loglevel") | (&Method::POST, "/debug/loglevel") => {
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    return Ok(text(StatusCode::BAD_REQUEST, format!("{error}\n")));
                }
            };
            let level = String::from_utf8_lossy(&body).to_string();
            match crate::telemetry::set_log_level(&level) {
                Ok(()) => text(StatusCode::OK, format!("{}\n", level.trim())),
                Err(why) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /healthz, /readyz, /metrics or /debug/loglevel\n",
        ),
    };
    Ok(response)
}
