//! How an operator binary runs in production: serve the HTTP endpoint, stand
//! for leader election, run the controllers only while leading, release the
//! Lease on SIGTERM/SIGINT so a standby takes over at once, and exit when
//! leadership is lost so the replica is restarted as a fresh candidate.

use std::future::Future;

use kube::Client;

use crate::health;
use crate::http::HttpArgs;
use crate::leader::{LeaderArgs, Lost};
use crate::metrics;

/// The part of `--help` about running in production.
pub const AFTER_HELP: &str = "\
HTTP endpoint (--http-address):
  GET /healthz          200 while the process serves
  GET /readyz           200 once the controllers' caches are synced, or while
                        this replica is a standby waiting for the Lease; 503 before
  GET /metrics          Prometheus metrics (kok_reconciles_total,
                        kok_reconcile_failures_total, kok_reconcile_duration_seconds,
                        kok_reconciles_in_flight, kok_leader, and domain metrics)
  GET /debug/loglevel   the log filter in effect
  PUT /debug/loglevel   replace it, e.g. curl -X PUT --data 'info,node_operator=debug' ...

Leader election: only the replica holding the Lease runs the controllers. A
replica that cannot renew within the renew deadline exits (code 1) so it
restarts as a candidate; on SIGTERM/SIGINT the leader finishes running
reconciles and releases the Lease, so a standby takes over at once.";

/// Flags every operator has for running in production.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Why an operator stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The HTTP endpoint could not be bound.
    #[error("cannot serve HTTP on {address}: {source}")]
    Http {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Contradicting flags.
    #[error("{0}")]
    Flags(String),
    /// This replica led and lost the Lease; it exits so that it is restarted
    /// and does not write next to the new leader.
    #[error("lost leadership: {0}")]
    LostLeadership(#[source] Lost),
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Run `controllers` (a future that ends on SIGTERM/SIGINT) the way `args`
/// say. `namespace` and `lease` are the Lease's defaults when the flags do not
/// name one.
pub async fn run(
    args: &RuntimeArgs,
    client: Client,
    namespace: &str,
    lease: &str,
    controllers: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let address = args.http.http_address;
    crate::http::serve(address)
        .await
        .map_err(|source| RunError::Http { address, source })?;
    let health = health::global();
    let metrics = metrics::global();
    if !args.leader.leader_elect {
        tracing::info!("leader election is off: running the controllers");
        controllers.await;
        return Ok(());
    }
    let mut elector = args
        .leader
        .elector(client, namespace, lease)
        .map_err(RunError::Flags)?;
    let lease = elector.name.clone();
    health.set_standby(true);
    metrics.set_leading(&lease, false);
    tracing::info!(lease = %format!("{}/{}", elector.namespace, lease), identity = %elector.identity, "standing for leader election");
    tokio::select! {
        _ = elector.acquire() => {}
        _ = shutdown_signal() => {
            tracing::info!("stopped while standing by");
            return Ok(());
        }
    }
    health.set_standby(false);
    metrics.set_leading(&lease, true);
    let lost = {
        tokio::pin!(controllers);
        tokio::select! {
            _ = &mut controllers => None,
            lost = elector.hold() => Some(lost),
        }
    };
    metrics.set_leading(&lease, false);
    match lost {
        None => {
            elector.release().await;
            Ok(())
        }
        Some(lost) => {
            tracing::error!(reason = %lost, "lost leadership; exiting so this replica restarts as a candidate");
            Err(RunError::LostLeadership(lost))
        }
    }
}
