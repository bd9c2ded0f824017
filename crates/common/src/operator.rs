//! How an operator binary runs in production: serve the HTTP endpoint, stand
//! for leader election, run the controllers only while leading, release the
//! Lease on SIGTERM/SIGINT so a standby takes over at once, and exit when
//! leadership is lost so the replica is restarted as a fresh candidate.

use std::future::Future;
use std::time::Duration;

use kube::Client;

use crate::health;
use crate::http::HttpArgs;
use crate::leader::{LeaderArgs, Lost};
use crate::metrics;
use crate::shutdown;

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
reconciles (for at most --shutdown-grace) and releases the Lease, so a standby
takes over at once. A second SIGTERM/SIGINT exits without waiting.";

/// Flags every operator has for running in production.
#[derive(clap::Args, Debug, Clone)]
pub struct RuntimeArgs {
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// How long, after SIGTERM/SIGINT, the reconciles in flight may run on
    /// before they are cut short so the Lease is released and the process
    /// exits. Keep it below the Pod's terminationGracePeriodSeconds.
    #[arg(long, env = "KOK_SHUTDOWN_GRACE", default_value = "25s", value_parser = crate::duration::parse)]
    pub shutdown_grace: Duration,
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
    /// The SIGTERM/SIGINT handlers could not be installed.
    #[error("cannot listen for SIGTERM/SIGINT: {0}")]
    Signals(#[source] std::io::Error),
    /// Contradicting flags.
    #[error("{0}")]
    Flags(String),
    /// This replica led and lost the Lease; it exits so that it is restarted
    /// and does not write next to the new leader.
    #[error("lost leadership: {0}")]
    LostLeadership(#[source] Lost),
}

/// Run `controllers` (a future that ends once shutdown is requested) the way `args`
/// say. `namespace` and `lease` are the Lease's defaults when the flags do not
/// name one.
pub async fn run(
    args: &RuntimeArgs,
    client: Client,
    namespace: &str,
    lease: &str,
    controllers: impl Future<Output = ()>,
) -> Result<(), RunError> {
    shutdown::listen().map_err(RunError::Signals)?;
    let address = args.http.http_address;
    crate::http::serve(address)
        .await
        .map_err(|source| RunError::Http { address, source })?;
    let health = health::global();
    let metrics = metrics::global();
    if !args.leader.leader_elect {
        tracing::info!("leader election is off: running the controllers");
        stop_within(args.shutdown_grace, shutdown::requested(), controllers).await;
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
        () = shutdown::requested() => {
            tracing::info!("stopped while standing by");
            return Ok(());
        }
    }
    health.set_standby(false);
    metrics.set_leading(&lease, true);
    let lost = tokio::select! {
        () = stop_within(args.shutdown_grace, shutdown::requested(), controllers) => None,
        lost = elector.hold() => Some(lost),
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

/// Run `controllers` until they stop on the shutdown request, or until
/// `grace` has passed since the request (`requested` resolving), when those
/// still running are dropped (their reconciles in flight with them) so the
/// process can release its Lease and exit before the kubelet kills it.
async fn stop_within(
    grace: Duration,
    requested: impl Future<Output = ()>,
    controllers: impl Future<Output = ()>,
) {
    tokio::select! {
        () = controllers => {}
        () = async {
            requested.await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(
                grace = %format!("{grace:?}"),
                "controllers still running after the shutdown grace period; stopping them"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test(start_paused = true)]
    async fn controllers_that_do_not_stop_are_dropped_a_grace_period_after_the_request() {
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Flag(dropped.clone());
        let stuck = async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        };
        let start = tokio::time::Instant::now();
        let requested = tokio::time::sleep(Duration::from_secs(3));
        stop_within(Duration::from_secs(25), requested, stuck).await;
        assert_eq!(start.elapsed(), Duration::from_secs(28));
        assert!(
            dropped.load(Ordering::SeqCst),
            "the stuck controllers were dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn controllers_that_stop_are_not_waited_for() {
        let start = tokio::time::Instant::now();
        let stops = tokio::time::sleep(Duration::from_secs(2));
        stop_within(Duration::from_secs(25), std::future::ready(()), stops).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
