//! An idempotency guard: run something at most once per key while its record
//! lives.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Order, Wait};
use crate::error::{Error, Result};
use crate::session::{Session, SessionOptions};
use crate::store::{EntryKind, Name, Store};

const RUNNING: u8 = b'R';
const DONE: u8 = b'D';
const FAILED: u8 = b'F';

/// How [`once`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnceOutcome {
    /// This call ran the job, which succeeded; its result is recorded.
    Ran(Vec<u8>),
    /// An earlier call ran the job and recorded this result.
    Recorded(Vec<u8>),
    /// The job failed for good (in this call or an earlier one); the failure
    /// is recorded and the job will not run again while the record lives.
    Failed(String),
    /// This call ran the job, which failed in a way worth retrying; nothing
    /// is recorded, so the next call runs it again.
    Retry(String),
}

/// How the job says it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobError {
    /// Worth running again: the record is dropped.
    Retryable(String),
    /// Not worth running again: the failure is recorded like a result.
    Final(String),
}

/// What a duplicate call does while the first one still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhileRunning {
    /// Return [`Error::InProgress`] at once.
    Fail,
    /// Wait (at most this long) for the first call's outcome.
    Wait(Duration),
}

/// Runs `job` at most once per `key` while its record lives: `ttl` after the
/// job ends (the record is kept alive while the job runs). A concurrent
/// duplicate waits for the first outcome or fails with
/// [`Error::InProgress`], as `while_running` says. If the process running the
/// job dies, the record expires `ttl` later and the job may run again.
///
/// Keys share the namespace of lock names with the prefix `once/`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// use tenure::{once, OnceOutcome, WhileRunning};
/// let store = tenure::open("memory://").await?;
/// let charge = || async { Ok(b"receipt-17".to_vec()) };
/// let ttl = Duration::from_secs(3600);
/// let first = once(&store, "payment-42", ttl, WhileRunning::Fail, charge).await?;
/// assert_eq!(first, OnceOutcome::Ran(b"receipt-17".to_vec()));
/// let again = once(&store, "payment-42", ttl, WhileRunning::Fail, charge).await?;
/// assert_eq!(again, OnceOutcome::Recorded(b"receipt-17".to_vec()));
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping the future while the job runs drops the job and the record with
/// it (its session is closed), so the job may run again.
pub async fn once<F, Fut>(
    store: &Arc<dyn Store>,
    key: &str,
    ttl: Duration,
    while_running: WhileRunning,
    job: F,
) -> Result<OnceOutcome>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<u8>, JobError>>,
{
    let result = run_once(store, key, ttl, while_running, job).await;
    crate::metrics::once_outcome(match &result {
        Ok(OnceOutcome::Ran(_)) => "ran",
        Ok(OnceOutcome::Recorded(_)) => "recorded",
        Ok(OnceOutcome::Failed(_)) => "failed",
        Ok(OnceOutcome::Retry(_)) => "retry",
        Err(Error::InProgress(_)) => "in_progress",
        Err(_) => "error",
    });
    result
}

async fn run_once<F, Fut>(
    store: &Arc<dyn Store>,
    key: &str,
    ttl: Duration,
    while_running: WhileRunning,
    job: F,
) -> Result<OnceOutcome>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<u8>, JobError>>,
{
    let name = Name::new(format!("once/{key}"))?;
    let give_up = match while_running {
        WhileRunning::Wait(d) => tokio::time::Instant::now().checked_add(d),
        WhileRunning::Fail => None,
    };
    loop {
        // The record is an entry of a session of its own whose TTL is the
        // record's life: renewed while the job runs, left to expire after.
        let session = Session::with_options(store, SessionOptions::new().ttl(ttl)).await?;
        let mut value = vec![RUNNING];
        let claimed = session
            .acquire(
                &name,
                EntryKind::Exclusive,
                std::mem::take(&mut value),
                Wait::No,
                Order::Fifo,
                // Keys are not bounded: they never become label values.
                None,
            )
            .await?;
        if let Some((hold, _)) = claimed {
            let outcome = tokio::select! {
                result = job() => result,
                reason = session.lost() => {
                    return Err(Error::SessionLost(reason))
                }
            };
            let (record, outcome) = match outcome {
                Ok(result) => (tagged(DONE, &result), OnceOutcome::Ran(result)),
                Err(JobError::Final(message)) => (
                    tagged(FAILED, message.as_bytes()),
                    OnceOutcome::Failed(message),
                ),
                Err(JobError::Retryable(message)) => {
                    drop(hold);
                    session.close().await?;
                    return Ok(OnceOutcome::Retry(message));
                }
            };
            session
                .store()
                .set_value(session.key(), &name, hold.seq, &record)
                .await?;
            hold.keep();
            // One last renewal, so the record lives a full TTL from now.
            session.renew().await?;
            session.detach();
            return Ok(outcome);
        }
        session.close().await?;
        // Someone holds the record: read it.
        let queue = store.queue(&name).await?;
        let version = queue.version;
        match queue.entries.first().map(|e| e.value.as_slice()) {
            Some([DONE, result @ ..]) => return Ok(OnceOutcome::Recorded(result.to_vec())),
            Some([FAILED, message @ ..]) => {
                return Ok(OnceOutcome::Failed(
                    String::from_utf8_lossy(message).into_owned(),
                ))
            }
            Some(_) => {
                let Some(give_up) = give_up else {
                    return Err(Error::InProgress(key.to_string()));
                };
                // Wait for the record to change (outcome, or gone), then look again.
                match tokio::time::timeout_at(give_up, store.wait_changed(&name, version)).await {
                    Ok(changed) => {
                        changed?;
                    }
                    Err(_) => return Err(Error::InProgress(key.to_string())),
                }
            }
            // Gone between our try and our read: try again.
            None => {}
        }
    }
}

fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 1);
    v.push(tag);
    v.extend_from_slice(body);
    v
}
