#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `sqlite:///path/file.db`: the embedded default. Every process on a machine
//! that opens the same file shares its locks.
//!
//! Three tables: sessions (with an expiry in milliseconds of the machine's
//! `CLOCK_BOOTTIME`, see `layout.rs`), names (the fencing counter and a change version, kept
//! forever so tokens never go back), and entries (the queues). Writes run in
//! `BEGIN IMMEDIATE` transactions; the file is in WAL mode, checkpointed by
//! a thread of the store's own, off the lock path.
//!
//! Waiters in this process are woken directly when a release here grants
//! them; waiters in other processes poll their own row with a backoff, and
//! sleep no longer than until the next expiry ahead of them.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use super::poll::Listeners;
use super::url::UrlRules;
use crate::store::{Capabilities, Wake};

mod calls;
mod checkpoint;
mod connect;
mod entries;
mod layout;
mod read;
mod registers;
mod sessions;
mod settle;
mod store;
#[cfg(test)]
mod tests;
mod wait;

use checkpoint::Checkpointer;

const BACKEND: &str = "sqlite";
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The version of what this build keeps in an SQLite file (its *format*):
/// 2, format 1 (`tenure_meta`'s `schema` row says 1, which builds of 0.1.0
/// require) and beside it the build each session was opened by.
pub(crate) const FORMAT: &str = "2";

/// A file, not a server: nothing to greet.
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> = None;

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::file(&["synchronous"]);

/// The SQLite backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(5),
        // A call waits for another process's write at most this long.
        call_deadline: BUSY_TIMEOUT,
        wake: Wake::local_or_poll(POLL_MIN, POLL_MAX),
        ..Capabilities::durable_store(
            BACKEND,
            "this machine's CLOCK_BOOTTIME, shared by every process on it; sessions of an earlier boot are dropped",
            "no network; acquire: 1 transaction of 5 statements, release: 1 of 5 (6 when it grants a waiter), renew: 1 statement",
        )
    }
}

/// A store in one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Mutex<Connection>,
    /// Checkpoints the WAL off the lock path (`None`: SQLite's own
    /// automatic checkpoint does, inside a commit).
    checkpointer: Option<Arc<Checkpointer>>,
    path: PathBuf,
    caps: Capabilities,
    /// Waiters (woken when a change made here grants them) and observers
    /// (woken on any change made here) of this process.
    listeners: Listeners,
    /// Calls to the database file so far (see [`SqliteStore::round_trips`]).
    /// Shared with the checkpoint thread, which counts by it.
    round_trips: Arc<AtomicU64>,
}

store_debug!(SqliteStore: path);

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.close();
        }
    }
}
