//! Stopping the process: one request to shut down, made by the first
//! SIGTERM/SIGINT and seen by everything that stops on it (the leader
//! election, every controller), however late it starts listening.
//!
//! Signals are listened for from [`listen`] on, which an operator binary
//! calls before it does anything else: a signal that arrives while the
//! replica stands by, takes the Lease or starts its controllers is never
//! lost. A second signal exits at once.

use std::sync::OnceLock;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

fn requests() -> &'static watch::Sender<bool> {
    static REQUESTS: OnceLock<watch::Sender<bool>> = OnceLock::new();
    REQUESTS.get_or_init(|| watch::channel(false).0)
}

/// Ask everything that waits on [`requested`] to stop.
pub fn request() {
    requests().send_replace(true);
}

/// Resolves once shutdown has been requested (at once if it already was).
pub async fn requested() {
    let mut requests = requests().subscribe();
    // The sender is a static: it is never dropped, so this only returns
    // when the value turns true.
    let _ = requests.wait_for(|requested| *requested).await;
}

/// Listen for SIGTERM and SIGINT from now on: the first requests shutdown,
/// a second exits the process (code 130) without waiting.
///
/// # Errors
/// When the signal handlers cannot be installed.
pub fn listen() -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut received = 0;
        loop {
            let name = tokio::select! {
                Some(()) = term.recv() => "SIGTERM",
                Some(()) = int.recv() => "SIGINT",
                else => return,
            };
            received += 1;
            if received == 1 {
                tracing::info!(
                    signal = name,
                    "shutdown requested: finishing the reconciles in flight (a second signal exits at once)"
                );
                request();
            } else {
                tracing::warn!(signal = name, "second signal: exiting without waiting");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_reaches_waiters_started_before_and_after_it() {
        assert!(!*requests().borrow());
        let before = tokio::spawn(requested());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!before.is_finished(), "resolved before any request");
        request();
        tokio::time::timeout(Duration::from_secs(5), before)
            .await
            .expect("a waiter from before the request")
            .expect("join");
        assert!(*requests().borrow());
        tokio::time::timeout(Duration::from_secs(5), requested())
            .await
            .expect("a waiter from after the request");
    }
}
