//! The lease's upkeep: renewals, the local deadline, and the moment of loss.

use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use super::Inner;
use crate::error::{Error, LostReason, Result};
use crate::metrics::signed_secs;
use crate::task::spawn_detached;

/// A local deadline on the monotonic clock, with how long the machine had
/// been suspended when it was set.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    pub(super) at: Instant,
    pub(super) suspended: Duration,
}

/// The deadline, moved earlier by any suspend since it was set: the store's
/// clock kept running while this process's monotonic clock stood still.
pub(super) fn effective_deadline(inner: &Inner) -> Instant {
    let deadline = *inner.deadline.lock().unwrap_or_else(|e| e.into_inner());
    let slept = crate::clock::suspended().saturating_sub(deadline.suspended);
    deadline.at.checked_sub(slept).unwrap_or_else(Instant::now)
}

pub(super) fn mark_lost(inner: &Inner, reason: LostReason) {
    let newly = inner.lost.send_if_modified(|slot| {
        if slot.is_none() {
            *slot = Some(reason);
            true
        } else {
            false
        }
    });
    if newly {
        inner.ended();
        crate::metrics::session_lost(inner.backend(), reason);
        // Holds' and terms' gauges end with the lease, not with their guards.
        inner.run_end_hooks();
    }
    if newly && reason != LostReason::Closed {
        tracing::warn!(tag = %inner.tag, %reason, "session lost");
        // The store may still count the session alive: end it so others need
        // not wait for its expiry.
        let store = inner.store.clone();
        let key = inner.key.clone();
        spawn_detached(async move {
            let _ = store.close_session(&key).await;
        });
    }
}

pub(super) async fn renew(inner: &Inner) -> Result<()> {
    if let Some(reason) = *inner.lost.borrow() {
        return Err(Error::SessionLost(reason));
    }
    let suspended = crate::clock::suspended();
    let sent = Instant::now();
    match inner.store.keep_alive(&inner.key).await {
        // Confirmed only after the deadline: too late, the session may
        // already have been seen lost (`Session::lost_reason` goes by the
        // deadline), and a loss is never taken back.
        Ok(()) if Instant::now() >= effective_deadline(inner) => {
            crate::metrics::renewal(inner.backend(), "timeout", None);
            mark_lost(inner, LostReason::Unconfirmed);
            Err(Error::SessionLost(LostReason::Unconfirmed))
        }
        Ok(()) if inner.lost.borrow().is_some() => {
            let reason = (*inner.lost.borrow()).unwrap_or(LostReason::Unconfirmed);
            Err(Error::SessionLost(reason))
        }
        Ok(()) => {
            if crate::metrics::enabled() {
                let slack = signed_secs(Instant::now(), effective_deadline(inner));
                crate::metrics::renewal(inner.backend(), "ok", Some(slack));
            }
            let mut deadline = inner.deadline.lock().unwrap_or_else(|e| e.into_inner());
            let next = sent + inner.ttl - inner.drift;
            if next > deadline.at {
                *deadline = Deadline {
                    at: next,
                    suspended,
                };
            }
            Ok(())
        }
        Err(Error::SessionLost(reason)) => {
            crate::metrics::renewal(inner.backend(), "lost", None);
            // The store's expiry comes after our deadline; an answer that the
            // session is gone, received before that deadline, cannot be an
            // expiry: the session was ended by someone.
            let reason = match reason {
                LostReason::Expired if Instant::now() < effective_deadline(inner) => {
                    LostReason::Evicted
                }
                other => other,
            };
            mark_lost(inner, reason);
            Err(Error::SessionLost(reason))
        }
        Err(e) => {
            crate::metrics::renewal(inner.backend(), "error", None);
            Err(e)
        }
    }
}

/// The background task: renews every `renew_every` (when asked to), retries
/// failed renewals quickly, and declares the session lost at the local
/// deadline. Holds only a weak reference so a dropped session ends it.
pub(super) async fn keep_alive(weak: Weak<Inner>, auto_renew: bool) {
    let mut next_renew = Instant::now();
    let mut retry = Duration::from_millis(50);
    loop {
        let (deadline, every) = match weak.upgrade() {
            Some(inner) => {
                if inner.lost.borrow().is_some() {
                    return;
                }
                let deadline = effective_deadline(&inner);
                if Instant::now() >= deadline {
                    mark_lost(&inner, LostReason::Unconfirmed);
                    return;
                }
                (deadline, inner.renew_every)
            }
            None => return,
        };
        if next_renew <= Instant::now() {
            next_renew = Instant::now() + every;
        }
        let wake = if auto_renew {
            next_renew.min(deadline)
        } else {
            deadline
        };
        tokio::time::sleep_until(wake).await;
        if !auto_renew || Instant::now() < next_renew {
            continue;
        }
        let Some(inner) = weak.upgrade() else { return };
        // A renewal still unanswered at the deadline cannot help any more.
        match tokio::time::timeout_at(deadline, renew(&inner)).await {
            Ok(Ok(())) => {
                retry = Duration::from_millis(50);
            }
            Ok(Err(Error::SessionLost(_))) => return,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewal failed; retrying until the lease's deadline");
                next_renew = Instant::now() + retry.min(every);
                retry = (retry * 2).min(every);
            }
            Err(_) => crate::metrics::renewal(inner.backend(), "timeout", None),
        }
    }
}
