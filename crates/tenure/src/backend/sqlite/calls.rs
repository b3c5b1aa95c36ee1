//! Calls to the file: each runs on the connection at once, or in the
//! blocking pool while another writer holds the file; writes run in
//! `BEGIN IMMEDIATE` transactions, settle the names they change and then
//! wake this process's waiters. Also SQLite's errors and numbers as the
//! store reads them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::Connection;

use super::settle::settle;
use super::{SqliteStore, BACKEND, BUSY_TIMEOUT};
use crate::backend::{codec, poll};
use crate::error::{Error, Result};
use crate::store::{EntryKind, Name};

/// A `BEGIN IMMEDIATE` transaction, rolled back when dropped uncommitted.
/// Its `BEGIN` and `COMMIT` are cached statements: rusqlite's own
/// `Transaction` parses both again every time, a few microseconds of every
/// lock operation.
pub(super) struct Tx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> Tx<'c> {
    pub(super) fn immediate(conn: &'c Connection) -> Result<Tx<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(db_err)?;
        Ok(Tx { conn, open: true })
    }

    pub(super) fn commit(mut self) -> Result<()> {
        self.conn
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .map_err(db_err)?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::debug!(error = %e, "rolling back failed");
            }
        }
    }
}

impl SqliteStore {
    /// How many calls (transactions or reads) this store has made to the
    /// database file so far: what the no-thundering-herd check counts.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// Runs `f` on the connection in the blocking pool.
    ///
    /// Fast path: when the connection is free, `f` runs right here with a zero
    /// busy timeout — a statement takes microseconds, less than a hop to the
    /// blocking pool. Only if another writer holds the file (SQLITE_BUSY) does
    /// it run again in the blocking pool, where it may wait out the busy
    /// timeout without stalling the async runtime.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let calls = self.inner.round_trips.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(checkpointer) = &self.inner.checkpointer {
            checkpointer.called(calls);
        }
        if let Ok(mut conn) = self.inner.conn.try_lock() {
            let _ = conn.busy_timeout(Duration::ZERO);
            let result = f(&mut conn);
            let _ = conn.busy_timeout(BUSY_TIMEOUT);
            match result {
                Err(Error::Unavailable { .. }) => {}
                other => return other,
            }
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| Error::backend(BACKEND, e))?
    }

    /// Wakes this process's waiters that `granted` names and its observers.
    pub(super) fn notify(&self, changed: &[(Name, Vec<u64>)]) {
        for (name, granted) in changed {
            // Granted by a transaction that has committed.
            for seq in granted {
                self.inner
                    .listeners
                    .granted(&poll::grant_key(name.as_str(), *seq));
            }
            self.inner.listeners.wake(&poll::change_key(name.as_str()));
        }
    }

    /// Runs a write transaction that settles `names` afterwards, then wakes
    /// local waiters.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl Fn(&Tx<'_>) -> Result<(T, Vec<Name>)> + Send + 'static,
    ) -> Result<T> {
        let (value, changed) = self
            .run(move |conn| {
                let tx = Tx::immediate(conn)?;
                let (value, names) = f(&tx)?;
                let mut changed = Vec::with_capacity(names.len());
                for name in names {
                    let granted = settle(&tx, &name, true)?;
                    changed.push((name, granted));
                }
                tx.commit()?;
                Ok((value, changed))
            })
            .await?;
        self.notify(&changed);
        Ok(value)
    }
}

pub(super) fn db_err(e: rusqlite::Error) -> Error {
    if is_busy(&e) {
        // The transaction did not commit: the call took no effect.
        Error::refused(BACKEND, e)
    } else {
        Error::backend(BACKEND, e)
    }
}

pub(super) fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|e| Error::backend(BACKEND, e))
}

/// The entry kind stored in columns `first`, `first + 1`, `first + 2`
/// (kind code, count, limit) of a row.
pub(super) fn kind_at(r: &rusqlite::Row<'_>, first: usize) -> Result<EntryKind> {
    codec::kind_from_code(
        BACKEND,
        r.get(first).map_err(db_err)?,
        r.get(first + 1).map_err(db_err)?,
        r.get(first + 2).map_err(db_err)?,
    )
}

pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}
