//! Trying again: a call whose database rolled it back, a call that failed
//! for a passing reason, and a connection that failed lately.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// Remembers when connecting last failed, so that a connection is tried
/// again at most once per interval (a notification connection, one node of
/// several) instead of by every caller that needs it.
#[derive(Default)]
pub(crate) struct ReconnectGate(std::sync::Mutex<Option<std::time::Instant>>);

impl ReconnectGate {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether connecting failed less than `interval` ago.
    pub(crate) fn failed_within(&self, interval: Duration) -> bool {
        self.slot().is_some_and(|at| at.elapsed() < interval)
    }

    /// Connecting failed now.
    pub(crate) fn failed(&self) {
        *self.slot() = Some(std::time::Instant::now());
    }

    /// Connecting worked.
    pub(crate) fn succeeded(&self) {
        *self.slot() = None;
    }
}

/// Runs `op` again at once while its driver's error is one `again` accepts
/// (a deadlock or a serialization failure: the database rolled the call
/// back), up to `times` more times; other errors, and the outer `Err` of
/// `op` (such as no connection), end it. For calls that may run twice.
pub(crate) async fn retry_at_once<T, E, F, Fut>(
    times: usize,
    again: impl Fn(&E) -> bool,
    into: impl Fn(E) -> Error,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<std::result::Result<T, E>>>,
{
    let mut attempt = 0;
    loop {
        match op().await? {
            Ok(v) => return Ok(v),
            Err(e) if again(&e) && attempt < times => attempt += 1,
            Err(e) => return Err(into(e)),
        }
    }
}

/// How long a call that failed for a passing reason (a leader change, a
/// server or member down, a lost connection) is tried again.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(5);

/// Runs `op` until it succeeds, fails for good, or [`RETRY_FOR`] passed.
/// Only for operations that may safely run twice.
pub(crate) async fn retrying<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        match op().await {
            Err(e) if e.is_temporary() && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "store call failed; trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}
