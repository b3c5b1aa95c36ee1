//! What `lock` and `elect` share: a session with the lease options, its
//! end, and the exit code a command's outcome under the lease gives.

use std::sync::Arc;
use std::time::Duration;

use tenure::{Session, SessionOptions, Store};

use crate::child;
use crate::cli::LeaseArgs;
use crate::exit::{self, Failure};

pub(super) async fn open_session(
    store: &Arc<dyn Store>,
    lease: &LeaseArgs,
) -> Result<(Session, Duration), Failure> {
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
    let session = Session::with_options(store, SessionOptions::new().ttl(lease.ttl)).await?;
    Ok((session, grace))
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
        child::Outcome::Exited(code) | child::Outcome::Stopped { code, .. } => {
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
