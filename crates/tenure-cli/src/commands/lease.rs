//! What `lock` and `elect` share: a session with the lease options, its
//! end, and the exit code a command's outcome under the lease gives.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tenure::{Session, SessionOptions, Store};

use crate::child;
use crate::cli::LeaseArgs;
use crate::exit::{self, Failure};

/// `--kill-grace`, checked against the TTL.
pub(super) fn kill_grace(lease: &LeaseArgs) -> Result<Duration, Failure> {
    check_ttl(lease.ttl)?;
    let grace = lease.kill_grace.unwrap_or(lease.ttl / 6);
    if grace >= lease.ttl / 2 {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--kill-grace {grace:?} must be under half the TTL ({:?})",
                lease.ttl
            ),
        ));
    }
    Ok(grace)
}

/// A session with the lease options.
pub(super) async fn open(store: &Arc<dyn Store>, lease: &LeaseArgs) -> tenure::Result<Session> {
    Session::with_options(store, SessionOptions::new().ttl(lease.ttl)).await
}

/// The longest pause between two tries on a store that does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// While a wait lasts, a store that is briefly unavailable (a server
/// restarting, a failover under way) is tried again with a backoff, until
/// the wait's end; `--no-wait` tries once.
pub(crate) struct Retry {
    /// `None`: no retry (`--no-wait`); `Some(None)`: for ever.
    until: Option<Option<Instant>>,
    backoff: Duration,
}

impl Retry {
    pub(crate) fn new(no_wait: bool, wait: Option<Duration>) -> Retry {
        Retry {
            until: (!no_wait).then(|| wait.map(|w| Instant::now() + w)),
            backoff: Duration::from_millis(100),
        }
    }

    /// What is left of `--wait` (zero once over).
    pub(crate) fn left(&self) -> Duration {
        match self.until {
            Some(Some(until)) => until.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// Whether `e` is tried again: temporary, and the wait has time left
    /// for the next try.
    pub(crate) fn may(&self, e: &tenure::Error) -> bool {
        e.is_temporary()
            && match self.until {
                None => false,
                Some(None) => true,
                Some(Some(until)) => Instant::now() + self.backoff < until,
            }
    }

    /// Waits before the next try; `Err(code)` when a signal stops tenure
    /// meanwhile.
    pub(crate) async fn pause(
        &mut self,
        e: &tenure::Error,
        hub: &child::SignalHub,
    ) -> Result<(), u8> {
        tracing::warn!(error = %e, "the store is unavailable; trying again in {}", humantime::format_duration(self.backoff));
        tokio::select! {
            () = tokio::time::sleep(self.backoff) => {}
            sig = hub.stopped() => return Err(128u8.saturating_add(sig as u8)),
        }
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        Ok(())
    }
}

pub(super) fn check_ttl(ttl: Duration) -> Result<(), Failure> {
    if ttl.is_zero() {
        return Err(Failure::new(
            exit::USAGE,
            "--ttl 0s: the session TTL must be more than zero (such as 15s)",
        ));
    }
    Ok(())
}

/// Opens a session and takes what the runner runs under through it
/// (`take`: a lock, a term), both tried again with a backoff while the store
/// is briefly unavailable and the wait lasts. `Ok(Err(code))` when a signal
/// stops tenure meanwhile (the session closed); a lasting error closes the
/// session and is returned.
pub(super) async fn open_and_take<T, F, Fut>(
    store: &Arc<dyn Store>,
    lease: &LeaseArgs,
    runner: &mut super::Runner,
    mut take: F,
) -> Result<Result<(Session, T), u8>, Failure>
where
    F: FnMut(Session, Duration) -> Fut,
    Fut: std::future::Future<Output = tenure::Result<T>>,
{
    let super::Runner { hub, retry } = runner;
    loop {
        let opened = tokio::select! {
            opened = open(store, lease) => opened,
            signal = hub.stopped() => return Ok(Err(128u8.saturating_add(signal as u8))),
        };
        let session = match opened {
            Ok(session) => session,
            Err(e) if retry.may(&e) => match retry.pause(&e, hub).await {
                Ok(()) => continue,
                Err(code) => return Ok(Err(code)),
            },
            Err(e) => return Err(e.into()),
        };
        let taken = tokio::select! {
            taken = take(session.clone(), retry.left()) => taken,
            signal = hub.stopped() => {
                let _ = session.close().await;
                return Ok(Err(128u8.saturating_add(signal as u8)));
            }
        };
        match taken {
            Ok(taken) => return Ok(Ok((session, taken))),
            Err(e) if retry.may(&e) => {
                let _ = bounded_close(&session).await;
                if let Err(code) = retry.pause(&e, hub).await {
                    return Ok(Err(code));
                }
            }
            Err(e) => {
                let _ = bounded_close(&session).await;
                return Err(e.into());
            }
        }
    }
}

/// Runs the command under the supervisor while what `lost` watches is held,
/// then releases it (`release`: a lock's release, a term's resignation) and
/// ends the session; the exit code is the command's, or 79 for a lost lease.
pub(super) async fn run_held<R>(
    run: &child::Run<'_>,
    session: &Session,
    lost: impl std::future::Future<Output = tenure::LostReason>,
    hub: &child::SignalHub,
    release: impl FnOnce() -> R,
) -> Result<u8, Failure>
where
    R: std::future::Future<Output = tenure::Result<()>>,
{
    let lost = async { lost.await.to_string() };
    match child::supervise(run, session, lost, std::future::pending(), hub).await {
        Ok(outcome) => finish(outcome, release(), session).await,
        Err(f) => {
            // Release now: a runtime shutting down would not run a drop's release.
            let _ = release().await;
            let _ = bounded_close(session).await;
            Err(f)
        }
    }
}

/// Refuses a TTL outside the store's range before anything starts (a
/// runner that campaigns or claims in the background would otherwise
/// report it late, after announcing its jobs).
pub(super) fn check_ttl_on(store: &Arc<dyn Store>, ttl: Duration) -> Result<(), Failure> {
    let caps = store.capabilities();
    if ttl < caps.min_ttl || ttl > caps.max_ttl {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--ttl {}: the {} store takes a TTL from {} to {}",
                humantime::format_duration(ttl),
                caps.backend,
                humantime::format_duration(caps.min_ttl),
                humantime::format_duration(caps.max_ttl)
            ),
        ));
    }
    Ok(())
}

/// How long tenure waits, at most, to end a session whose lease is lost:
/// the store ends it by itself within the TTL anyway.
const LOST_CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Closes the session, waiting at most [`LOST_CLOSE_BOUND`].
pub(super) async fn bounded_close(session: &Session) -> bool {
    matches!(
        tokio::time::timeout(LOST_CLOSE_BOUND, session.close()).await,
        Ok(Ok(()))
    )
}

/// Turns a child's outcome into tenure's exit code, after releasing. Called
/// only once the command's process group is gone.
pub(super) async fn finish(
    outcome: child::Outcome,
    release: impl std::future::Future<Output = tenure::Result<()>>,
    session: &Session,
) -> Result<u8, Failure> {
    match outcome {
        child::Outcome::Stopped { why, code } => {
            tracing::info!("the command was stopped: {why}");
            if let Err(e) = release.await {
                tracing::warn!(error = %e, "release after the command was stopped failed");
            }
            let _ = bounded_close(session).await;
            Ok(code)
        }
        child::Outcome::Exited(code) => {
            if let Err(e) = release.await {
                tracing::warn!(error = %e, "release after the command exited failed");
            }
            let _ = bounded_close(session).await;
            Ok(code)
        }
        child::Outcome::LeaseLost(why) => {
            // Nothing to release: the lease is gone or about to be. Ending the
            // session lets others in sooner, but a store that does not answer
            // must not keep tenure from reporting the loss.
            drop(release);
            tracing::warn!(
                "the command's process group is gone; ending the session (best effort, at most {}s)",
                LOST_CLOSE_BOUND.as_secs()
            );
            if bounded_close(session).await {
                tracing::info!("session ended");
            } else {
                tracing::warn!("the store did not confirm the session's end; it expires it by itself within the TTL");
            }
            Err(Failure::new(
                exit::LEASE_LOST,
                format!("lease lost while the command ran ({why}); its process group was stopped"),
            ))
        }
    }
}
