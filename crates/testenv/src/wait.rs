//! Waiting in tests: poll a condition until it holds or a deadline passes, and
//! fail with what was being waited for, never hang.

use std::time::{Duration, Instant};

/// Poll `check` every 250 ms until it returns `Some`, and return that value.
///
/// # Panics
/// After `timeout`, naming `what`.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
