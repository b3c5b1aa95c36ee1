//! The SQL core. PostgreSQL and MySQL keep the same tables and run the
//! contract through server-side routines of the same names and answers
//! (`join`, `leave`, `look`, `set_value`, `refresh`, `evict`,
//! `evict_session`, `close`); all but talking to the server is written here
//! once, over [`SqlDriver`]: decoding answers, the queue read that settles
//! expired entries, waiting, wake-ups, and creating or upgrading the schema.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::codec;
use super::poll::{self, Listeners, Watch};
use crate::error::{Error, Result};
use crate::store::{Capabilities, CellWrite, Entry, Name};

mod driver;
mod hints;
mod row;
mod schema;
mod store;
#[cfg(test)]
mod tests;

pub use driver::SqlDriver;
pub(crate) use hints::FastHints;
pub use row::{Arg, Cell, SqlRow};
pub(crate) use schema::{ensure_additions, ensure_schema};
pub use schema::SqlSchema;

/// A store over a SQL database: [`PostgresStore`](super::postgres::PostgresStore)
/// and [`MysqlStore`](super::mysql::MysqlStore).
#[derive(Clone)]
pub struct SqlStore<D> {
    pub(crate) driver: D,
    pub(crate) caps: Capabilities,
    /// This process's waiters and observers (the driver may hold a clone,
    /// to wake them from the server's notifications).
    pub(crate) listeners: Listeners,
    /// Calls made to the database (see [`SqlStore::round_trips`]).
    pub(crate) round_trips: Arc<std::sync::atomic::AtomicU64>,
    /// What the joins of queued entries said a first look would, until
    /// their waiters take it (or leave).
    pub(crate) joined: poll::JoinedLooks,
    /// When the one-statement paths are worth a try (hints only).
    pub(crate) fast_hints: FastHints,
}

impl<D: fmt::Debug> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.driver.fmt(f)
    }
}

/// How long a statement may go unanswered: then the call fails with
/// [`Error::Unavailable`], as etcd's and ZooKeeper's calls do after as
/// long. A server that stopped (paused, or behind a network that drops
/// packets without a word) would otherwise hold a release or a join for as
/// long as TCP takes to give up, many minutes. Every statement tenure runs
/// is one short transaction, so a live server answers well within it.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// `call`'s answer, or [`Error::Unavailable`] once it has not come within
/// [`CALL_TIMEOUT`] (a store opened by [`crate::open`] names the server).
pub(crate) async fn answered<T>(
    backend: &'static str,
    call: impl std::future::Future<Output = T>,
) -> Result<T> {
    answered_within(CALL_TIMEOUT, backend, call).await
}

/// [`answered`] within `limit`: for what runs several statements, such
/// as a new connection's check of the schema (which may wait for another
/// process that installs it).
pub(crate) async fn answered_within<T>(
    limit: Duration,
    backend: &'static str,
    call: impl std::future::Future<Output = T>,
) -> Result<T> {
    tokio::time::timeout(limit, call)
        .await
        .map_err(|_| Error::unavailable(backend, format!("no answer within {limit:?}")))
}

fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::backend("sql", format!("a negative version {v}")))
}

/// A token or version as SQL's signed 64-bit integers hold it.
fn int_arg(what: &'static str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument {
        what,
        reason: format!("{v} is larger than SQL's 64-bit integers"),
    })
}

/// Whether `tag` could be a session's public tag here. Tags are made by
/// [`OpenedSession::random`](crate::store::OpenedSession::random) (12 hex
/// digits); one longer than MySQL's column holds (32), or with a NUL (which
/// PostgreSQL's text refuses), is nobody's, and is answered without asking
/// the server (which would fail on it).
fn storable_tag(tag: &str) -> bool {
    tag.chars().count() <= 32 && !tag.contains('\0')
}

fn seq_arg(seq: u64) -> Result<i64> {
    i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))
}

impl<D: SqlDriver> SqlStore<D> {
    /// How many calls this store has made to the database so far: what the
    /// no-thundering-herd check counts per handoff, and while waiters wait.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a task of this process waits for a grant on `name`: then
    /// the one-statement fast paths cannot apply, and are not tried.
    pub(super) fn waited_for(&self, name: &Name) -> bool {
        self.listeners
            .any_with_prefix(&poll::grant_prefix(name.as_str()))
    }

    /// The driver, for one call to the database (counted).
    pub(super) fn counted(&self) -> &D {
        self.round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.driver
    }

    pub(super) fn status(&self, row: &SqlRow, name: &Name) -> Result<String> {
        let status = row.text(0)?;
        match status.as_str() {
            "ok" | "none" | "granted" | "wait" => Ok(status),
            s => Err(codec::status_error(
                self.driver.backend(),
                s,
                None,
                name.as_str(),
            )),
        }
    }

    /// A register routine's status: `ok`, `stale` or `mismatch`, else the
    /// error it names (a lost owner session, a name of the other kind).
    pub(super) fn register_status(&self, row: &SqlRow, name: &Name) -> Result<String> {
        let status = row.text(0)?;
        match status.as_str() {
            "ok" | "stale" | "mismatch" => Ok(status),
            s => Err(codec::status_error(
                self.driver.backend(),
                s,
                None,
                name.as_str(),
            )),
        }
    }

    pub(super) fn cell_write(&self, row: &SqlRow, name: &Name) -> Result<CellWrite> {
        let current = row.opt_int(1)?.map(to_u64).transpose()?;
        let status = self.register_status(row, name)?;
        codec::cell_write(self.driver.backend(), Some(&status), current)
    }

    /// The blockers' fingerprint and TTL at columns `at` and `at + 1`, if any.
    pub(super) fn watch_at(&self, row: &SqlRow, at: usize) -> Result<Option<Watch>> {
        let blockers = match row.cells.get(at) {
            None | Some(Cell::Null) => String::new(),
            Some(_) => row.text(at)?,
        };
        if blockers.is_empty() {
            return Ok(None);
        }
        Ok(Some(Watch {
            blockers,
            ttl: Duration::from_millis(row.opt_int(at + 1)?.map_or(0, |ms| ms.max(0) as u64)),
        }))
    }

    /// Wakes this process's observers of `name` after a change made here.
    pub(super) fn changed(&self, name: &str) {
        if self.driver.wakes_by_hand() {
            self.listeners.wake(&poll::change_key(name));
        }
    }

    /// Wakes the first local waiter of `name` in queue order after a change
    /// made here: in FIFO order it is the one a release may have granted.
    /// Waiters behind it (several readers or permits granted at once) find
    /// out by polling; a herd of lookups would cost more than it saves.
    pub(super) fn wake_next(&self, name: &str) {
        if self.driver.wakes_by_hand() {
            self.listeners.wake_first(&poll::grant_prefix(name));
            self.changed(name);
        }
    }

    /// An entry of a queue read; `None` for one whose session ended (the
    /// name needs a refresh). One that lapsed by the server's clock, which
    /// only a watcher can confirm expired, shows with no time left.
    pub(super) fn entry(&self, row: &SqlRow) -> Result<Option<Entry>> {
        let left = row.int(8)?;
        if left < 0 {
            return Ok(None);
        }
        let granted_ms = row.opt_int(7)?;
        Ok(Some(Entry {
            seq: row.count(0)?,
            kind: codec::kind_from_code(
                self.driver.backend(),
                row.int(1)?,
                row.int(2)?,
                row.int(3)?,
            )?,
            session_tag: row.text(4)?,
            label: row.text(5)?,
            value: row.bytes(6)?,
            granted: granted_ms.is_some(),
            granted_at: granted_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            expires_in: Duration::from_millis(row.count(8)?),
            holds: row.count(9)?,
        }))
    }
}
