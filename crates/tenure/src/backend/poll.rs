//! Waiting, shared by the backends that cannot push every change: a local
//! or pushed notification wakes a waiter at once, a backoff poll catches the
//! rest (such as a holder that expires silently).

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::store::{Entry, EntryKind, Name, Store};

/// What a waiter learns from one look at its entry.
#[allow(dead_code)] // each backend feature uses part of this module
pub(crate) enum Look {
    /// Granted.
    Granted,
    /// Not yet; the next expiry ahead of it comes in this long, if any.
    Wait(Option<Duration>),
}

/// Looks until granted: after each look it sleeps until `notify` fires, the
/// backoff (from `min`, doubling to `max`) runs out, or just past the next
/// expiry ahead. `notify` is armed before each look, so a wake-up that comes
/// during the look is not lost.
#[allow(dead_code)]
pub(crate) async fn until_granted<F, Fut>(
    notify: &Notify,
    min: Duration,
    max: Duration,
    mut look: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Look>>,
{
    let mut backoff = min;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let sleep = match look().await? {
            Look::Granted => return Ok(()),
            Look::Wait(Some(next_expiry)) => backoff.min(next_expiry + Duration::from_millis(1)),
            Look::Wait(None) => backoff,
        };
        tokio::select! {
            () = notified => backoff = min,
            () = tokio::time::sleep(sleep) => backoff = (backoff * 2).min(max),
        }
    }
}

/// Reads the queue until its version differs from `version`. The backends'
/// `queue` settles expired entries, which bumps the version, so expiry counts
/// as a change.
#[allow(dead_code)]
pub(crate) async fn until_changed(
    store: &dyn Store,
    name: &Name,
    version: u64,
    notify: &Notify,
    min: Duration,
    max: Duration,
) -> Result<u64> {
    let mut backoff = min;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = store.queue(name).await?.version;
        if now != version {
            return Ok(now);
        }
        tokio::select! {
            () = notified => backoff = min,
            () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(max),
        }
    }
}

/// Milliseconds from a store (which may say -1 for "none") as a duration.
#[allow(dead_code)]
pub(crate) fn next_expiry(ms: Option<i64>) -> Option<Duration> {
    ms.and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

/// Whether a queue read shows an entry the rules grant but the store has not
/// stamped yet (its predecessor expired silently): the name needs settling.
#[allow(dead_code)]
pub(crate) fn has_unstamped_grant(entries: &[Entry]) -> bool {
    let kinds: Vec<EntryKind> = entries.iter().map(|e| e.kind).collect();
    crate::queue::grants(&kinds)
        .iter()
        .zip(entries)
        .any(|(granted, e)| *granted && !e.granted)
}

/// An entry kind as the SQL backends store it: (kind, count, limit).
#[allow(dead_code)]
pub(crate) fn kind_code(kind: EntryKind) -> (i16, i64, i64) {
    match kind {
        EntryKind::Exclusive => (0, 0, 0),
        EntryKind::Shared => (1, 0, 0),
        EntryKind::Permits { count, limit } => (2, count.into(), limit.into()),
    }
}

/// The entry kind back from [`kind_code`]'s columns.
#[allow(dead_code)]
pub(crate) fn kind_from_code(
    backend: &'static str,
    kind: i64,
    count: i64,
    limit: i64,
) -> Result<EntryKind> {
    Ok(match kind {
        0 => EntryKind::Exclusive,
        1 => EntryKind::Shared,
        2 => EntryKind::Permits {
            count: u32::try_from(count).map_err(|e| Error::backend(backend, e))?,
            limit: u32::try_from(limit).map_err(|e| Error::backend(backend, e))?,
        },
        other => {
            return Err(Error::backend(
                backend,
                format!("unknown entry kind {other}"),
            ))
        }
    })
}

/// The error a server-side operation reports as a status word.
#[allow(dead_code)]
pub(crate) fn status_error(backend: &'static str, status: &str, name: &Name) -> Error {
    match status {
        "lost" => Error::SessionLost("the store has no such session (expired or closed)"),
        "notheld" => Error::NotHeld("this session holds no such entry"),
        s => match s.strip_prefix("conflict:") {
            Some(reason) => Error::Conflict {
                name: name.to_string(),
                reason: reason.to_string(),
            },
            None => Error::backend(backend, format!("unexpected status {s:?}")),
        },
    }
}
