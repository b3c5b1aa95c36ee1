//! The non-fair acquisition: whoever asks first after a release may win,
//! waiters are woken one at a time, and none is passed over for longer than
//! the store's bound.
//!
//! A waiter tries; refused, it takes a place in the name's *wake-up line*, a
//! queue of its own beside the name's ([`wake_line`]). Only the first in that
//! line watches the name and tries again when it changes, so a release wakes
//! one waiter, however many wait, and a newcomer's try may still come first.
//! A waiter that has waited [`Capabilities::barging_bound`] since its first
//! try takes a place in the name's own queue instead: it is granted at the
//! next release, and every later try is refused until then.
//!
//! [`Capabilities::barging_bound`]: crate::store::Capabilities::barging_bound

use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use super::{no_grant, Hold, Wait};
use crate::error::{Error, Result};
use crate::metrics::Acquiring;
use crate::session::Session;
use crate::store::{EntryKind, JoinMode, Joined, Name, MAX_NAME_LEN};

/// Names that begin so are wake-up lines: `tenure.wake:NAME` holds the
/// non-fair waiters of `NAME` in their order of arrival (a name too long for
/// the prefix is written `tenure.wake:#` and 16 hex digits of its hash).
pub const WAKE_LINE_PREFIX: &str = "tenure.wake:";

/// The wake-up line of `name`.
pub(crate) fn wake_line(name: &Name) -> Result<Name> {
    let plain = format!("{WAKE_LINE_PREFIX}{}", name.as_str());
    if plain.len() <= MAX_NAME_LEN {
        return Name::new(plain);
    }
    Name::new(format!("{WAKE_LINE_PREFIX}#{:016x}", fnv1a(name.as_str())))
}

/// FNV-1a, 64 bits: a hash that every build computes alike.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// How long the first in line waits for a change of the name before it
/// reads the name again anyway (a lease that lapsed by the store's clock is
/// announced by nobody).
const RECHECK: Duration = Duration::from_secs(1);

/// The first back-off of a waiter whose try was refused although the name
/// read as worth a try.
const MIN_PAUSE: Duration = Duration::from_millis(5);

impl Session {
    /// Takes `name` without a place in its queue (see the module's doc).
    pub(super) async fn acquire_barging(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        wait: Wait,
        mut probe: Option<&mut Acquiring>,
    ) -> Result<Option<(Hold, Joined)>> {
        let deadline = wait.expired();
        tokio::pin!(deadline);
        let attempts = async {
            // Likely free: a non-fair lock is free most of the time.
            if let Some((hold, joined)) = self
                .join(name, kind, value.clone(), JoinMode::IfGranted, true)
                .await?
            {
                return self.still_ours(hold, joined);
            }
            if let Some(probe) = probe.as_deref_mut() {
                probe.waiting();
            }
            let bound = self.store().capabilities().barging_bound;
            self.wait_in_line(name, kind, &value, Instant::now() + bound)
                .await
        };
        tokio::select! {
            result = attempts => result,
            reason = self.lost() => Err(Error::SessionLost(reason)),
            () = &mut deadline => Err(Error::Timeout(wait.length())),
        }
    }

    /// Waits for the first place in the name's wake-up line, then watches
    /// the name and tries whenever it may be free; at `bound_at`, takes a
    /// place in the name's own queue instead. The place in the line is kept
    /// until the name is taken (so that the next in line does not watch a
    /// name it cannot take before this waiter), and left before this
    /// returns (in the background if it is dropped).
    async fn wait_in_line(
        &self,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        bound_at: Instant,
    ) -> Result<Option<(Hold, Joined)>> {
        let line = wake_line(name)?;
        let (turn, joined) = self
            .join(
                &line,
                EntryKind::Exclusive,
                Vec::new(),
                JoinMode::Wait,
                false,
            )
            .await?
            .ok_or_else(no_grant)?;
        // Only waits are cut at the bound, never a call that may change
        // the store: a try undone in the background could meet this
        // session's own join of the name's queue that follows.
        let taken = async {
            let first = joined.granted
                || tokio::select! {
                    waited = self.store().await_grant(self.key(), &line, joined.seq) => {
                        waited?;
                        true
                    }
                    () = sleep_until(bound_at) => false,
                };
            if first {
                if let Some(taken) = self.watch_and_try(name, kind, value, bound_at).await? {
                    return Ok(Some(taken));
                }
            }
            // Waited the bound: the name's own queue, which no later try
            // passes.
            self.acquire_as(name, kind, value.to_vec(), Wait::Forever, None)
                .await
        }
        .await;
        // Left before this returns: the same session may ask for the name
        // again at once, and a join of the line while its own leave is
        // still on its way would meet its old entry.
        if let Err(e) = turn.release().await {
            tracing::debug!(error = %e, %line, "leaving the wake-up line failed");
        }
        taken
    }

    /// The first in line: while the name reads held by others, waits for it
    /// to change, and tries once a try may succeed (the name reads free,
    /// held by this session, or held only by leases lapsed by the store's
    /// clock, which a try confirms by watching). `None` at `bound_at`.
    async fn watch_and_try(
        &self,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        bound_at: Instant,
    ) -> Result<Option<(Hold, Joined)>> {
        let store = self.store().clone();
        let watched_expiry = store.capabilities().watched_expiry;
        // Back-off for tries refused although the name read as worth a try
        // (a holder whose lease lapsed by the store's clock, then renewed).
        let mut pause = Duration::ZERO;
        let mut refused = false;
        loop {
            // Until a try may succeed, only read: on some stores a try is a
            // write even when it is refused (a consensus store's transaction
            // goes through the quorum).
            let mut waited = false;
            loop {
                let queue = store.queue(name).await?;
                let worth_a_try = queue.entries.is_empty()
                    // Its own session holds it: a try reenters.
                    || queue.entries.iter().any(|e| e.granted && e.session_tag == self.tag())
                    // Held only by leases lapsed by the store's clock,
                    // which only a try (watching them) may end.
                    || (watched_expiry && queue.entries.iter().all(|e| e.expires_in.is_zero()));
                if worth_a_try {
                    break;
                }
                waited = true;
                tokio::select! {
                    changed = store.wait_changed(name, queue.version) => {
                        changed?;
                    }
                    () = tokio::time::sleep(RECHECK) => {}
                    () = sleep_until(bound_at) => return Ok(None),
                }
            }
            if waited || !refused {
                pause = Duration::ZERO;
            } else {
                // Refused, yet worth a try at once again.
                pause = (pause * 2).clamp(MIN_PAUSE, RECHECK);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = sleep_until(bound_at) => return Ok(None),
                }
            }
            if let Some((hold, joined)) = self
                .join(name, kind, value.to_vec(), JoinMode::IfGranted, true)
                .await?
            {
                return self.still_ours(hold, joined);
            }
            refused = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_line_is_named_after_its_name_within_the_longest_name() {
        let short = Name::new("jobs").unwrap();
        assert_eq!(wake_line(&short).unwrap().as_str(), "tenure.wake:jobs");
        let long = Name::new("x".repeat(MAX_NAME_LEN)).unwrap();
        let line = wake_line(&long).unwrap();
        assert!(line.as_str().starts_with("tenure.wake:#"), "{line:?}");
        assert_eq!(line.as_str().len(), WAKE_LINE_PREFIX.len() + 17);
        let other = Name::new("y".repeat(MAX_NAME_LEN)).unwrap();
        assert_ne!(wake_line(&other).unwrap(), line);
        // The hash is FNV-1a's: every build names the line alike.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
