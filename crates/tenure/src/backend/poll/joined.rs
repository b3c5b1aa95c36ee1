//! What the joins of queued entries said a waiter's first look would, kept
//! for the waiter to take instead of that look.

use std::time::Duration;

use tokio::time::Instant;

use super::{grant_key, Look, RecentKeys};
use crate::error::Result;
use crate::store::Name;

/// How old a join's answer may be, at most, when a waiter takes it for its
/// first look (see [`JoinedLook::is_fresh`]).
pub(crate) const JOINED_FRESH: Duration = Duration::from_secs(1);

/// What the joins of queued entries said a waiter's first look would, by
/// [`grant_key`], kept for the waiter
/// ([`until_granted`](super::until_granted)'s `first`): one older than
/// [`JOINED_FRESH`] is no use ([`RecentKeys`]).
#[derive(Clone)]
pub(crate) struct JoinedLooks(RecentKeys<Look>);

impl Default for JoinedLooks {
    fn default() -> Self {
        Self(RecentKeys::new(JOINED_FRESH))
    }
}

impl JoinedLooks {
    /// Keeps a join's answer for the waiter of `name`'s entry `seq`.
    pub(crate) fn keep(&self, name: &Name, seq: u64, wait: Look) {
        self.0.keep(grant_key(name.as_str(), seq), wait);
    }

    /// Takes the answer kept for the waiter of `name`'s entry `seq` (also
    /// on every release: free while nothing is kept).
    pub(crate) fn take(&self, name: &Name, seq: u64) -> Option<JoinedLook> {
        self.0
            .take_kept(&grant_key(name.as_str(), seq))
            .map(|(at, look)| JoinedLook {
                at,
                look,
                without_push: false,
            })
    }
}

/// One join's answer, taken by its waiter.
pub(crate) struct JoinedLook {
    pub(super) at: Instant,
    pub(super) look: Look,
    pub(super) without_push: bool,
}

impl JoinedLook {
    /// Marks the answer as one to take for the first look without pushed
    /// notifications and without a check, on a store that pushes nothing
    /// (MySQL): a release of this process announces what it granted
    /// ([`Listeners::granted`](super::Listeners::granted)), which keeps the
    /// announcement for a waiter that listens late. Anything else is found by polling, as after a
    /// look: a grant by another process, or one after a session ended here
    /// (whose wake-up goes to the first waiter of the name in this process,
    /// and is lost before it listens). Such a waiter is next in line, or
    /// the first of its name here, or is handed polling on by the one
    /// ahead, so it polls, from the shortest interval.
    pub(crate) fn without_push(mut self) -> Self {
        self.without_push = true;
        self
    }

    /// The answer, if it is still fresh enough to stand in for a look: a
    /// blocker's renewal after the join read it goes unseen until the
    /// waiter's next look, as one after any look's read does. The next in
    /// line looks every quarter of the TTL anyway; for the
    /// others the gap is kept under a tenth of the blockers' TTL (and
    /// [`JOINED_FRESH`]): a few round trips as a rule, more only when the
    /// waiter had to open its notification connection first.
    pub(super) fn is_fresh(&self) -> bool {
        let limit = match &self.look {
            Look::Wait { watch: Some(w), .. } => (w.ttl / 10).min(JOINED_FRESH),
            _ => JOINED_FRESH,
        };
        self.at.elapsed() <= limit
    }
}

/// [`until_granted`](super::until_granted)'s `first` for a store without a
/// stand-in first look.
pub(crate) type NoStandIn = (JoinedLook, fn() -> std::future::Ready<Result<bool>>);
