//! Waiting, shared by the backends that cannot push every change: a local
//! or pushed notification wakes a waiter at once, a backoff poll catches the
//! rest (such as a holder that expires silently).

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::store::{Entry, EntryKind};

mod joined;
mod listeners;
mod recent;
mod retry;
#[cfg(test)]
mod tests;
mod wait;

// What the backends use from here.
pub(crate) use self::{
    joined::{JoinedLook, JoinedLooks, NoStandIn},
    listeners::{change_key, grant_key, grant_prefix, Listeners, Listening},
    recent::RecentKeys,
    retry::{retry_at_once, retrying, ReconnectGate, RETRY_FOR},
    wait::{until_changed, until_granted},
};

/// What a waiter learns from one look at its entry.
#[derive(Debug, Clone)]
pub(crate) enum Look {
    /// Granted.
    Granted,
    /// Not yet.
    Wait {
        /// How long until the expiry that could grant the entry, or move it
        /// up, without a release: the holders' first expiry for the next in
        /// line, the expiry of the entry just ahead for the others. With a
        /// `watch`, only a hint.
        until: Option<Duration>,
        /// Whether the entry is next in line: a release may grant it.
        next: bool,
        /// On stores whose clock is not trusted with expiry: what blocks the
        /// entry, for the waiter to watch (see [`until_granted`]).
        watch: Option<Watch>,
    },
}

/// What blocks a waiter, on a store whose clock is not trusted with expiry
/// (a server's wall clock, which anyone can set and which steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The blocking entries as the store writes them, comma-separated:
    /// `seq:renewals:lapse`, which any renewal of one changes.
    pub blockers: String,
    /// Their longest TTL.
    pub ttl: Duration,
}

/// How long a watcher must see blockers of TTL `ttl` unchanged before it
/// may call them expired: their TTL, plus 1 % and 10 ms for the difference
/// in clock rates (a holder gives up at its TTL less 1 % and 2 ms).
pub(crate) fn confirm_after(ttl: Duration) -> Duration {
    ttl + ttl / 100 + Duration::from_millis(10)
}

/// A newcomer's confirmation (a try-lock that found nobody in the queue
/// alive by the store's clock, holders and waiters): watches them for [`confirm_after`] their TTL, then
/// runs `expire`, which ends those still as in `watch`; says whether any
/// ended. A TTL of 0 would be a store that lost a session's record: never
/// confirmed by.
pub(crate) async fn confirm_lapsed<F, Fut>(watch: &Watch, expire: F) -> Result<bool>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    if watch.ttl.is_zero() {
        return Ok(false);
    }
    tokio::time::sleep(confirm_after(watch.ttl)).await;
    expire().await
}

/// Milliseconds from a store (which may say -1 for "none") as a duration.
pub(crate) fn next_expiry(ms: Option<i64>) -> Option<Duration> {
    ms.and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

/// Whether a queue read shows an entry the rules grant but the store has not
/// stamped yet (its predecessor expired silently): the name needs settling.
pub(crate) fn has_unstamped_grant(entries: &[Entry]) -> bool {
    let kinds: Vec<EntryKind> = entries.iter().map(|e| e.kind).collect();
    crate::queue::grants(&kinds)
        .iter()
        .zip(entries)
        .any(|(granted, e)| *granted && !e.granted)
}

/// A version for a queue whose store keeps none: a hash (FNV-1a) of what
/// can change in it, so it differs whenever the queue does.
pub(crate) fn fingerprint(parts: impl IntoIterator<Item = u64>) -> u64 {
    let mut f = Fingerprint::default();
    for part in parts {
        f.bytes(&part.to_le_bytes());
    }
    f.0
}

/// The hasher behind [`fingerprint`], for fields that are bytes.
pub(crate) struct Fingerprint(pub(crate) u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A session label as a store keeps it: control characters (which separate
/// fields in some stores' records) become spaces.
pub(crate) fn printable(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whose leaving can grant the waiting entry at `i` of a queue of `kinds`:
/// for a mutex the entry just ahead, for a reader the last writer ahead; a
/// semaphore waiter depends on every entry ahead (`None`: watch them all).
/// Watching only this one is what keeps a release from waking every waiter.
pub(crate) fn blocker(kinds: &[EntryKind], i: usize) -> Option<usize> {
    match kinds[i] {
        EntryKind::Permits { .. } => None,
        EntryKind::Shared => kinds[..i]
            .iter()
            .rposition(|k| *k != EntryKind::Shared)
            .or_else(|| i.checked_sub(1)),
        EntryKind::Exclusive => i.checked_sub(1),
    }
}
