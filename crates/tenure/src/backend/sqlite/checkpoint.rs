//! The WAL's checkpoints, made by a thread of the store's own, off the
//! lock path.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// Checkpoints the WAL from a thread of its own, so that no acquire or
/// release waits for one. SQLite's automatic checkpoint runs inside the
/// commit that crosses its threshold (1,000 pages of WAL): writing them back
/// and syncing stalled one lock operation in about 170 for 10–20 ms, which
/// was most of the mean cycle (see bench/README.md). Here a thread
/// checkpoints (`PASSIVE`: it never blocks a writer or a reader) after every
/// [`CHECKPOINT_EVERY`] calls of this store, and once a second while calls
/// went on. The lock connection keeps SQLite's own automatic checkpoint (at
/// its default, 1,000 pages) as a backstop for a thread that falls behind:
/// it then finds most of the WAL written back already.
pub(super) struct Checkpointer {
    /// Calls of the store so far: the store's own count
    /// ([`SqliteStore::round_trips`](super::SqliteStore::round_trips)).
    pub(super) calls: Arc<AtomicU64>,
    /// Checkpoints the thread has made.
    pub(super) checkpoints: AtomicU64,
    state: Mutex<CheckpointState>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct CheckpointState {
    due: bool,
    closed: bool,
}

/// Calls of a store between two checkpoints: one transaction writes a few
/// pages, so about SQLite's default 1,000 pages of WAL.
pub(super) const CHECKPOINT_EVERY: u64 = 64;
/// How often the checkpoint thread looks for calls made since its last
/// checkpoint, when fewer than [`CHECKPOINT_EVERY`] were.
const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);

impl Checkpointer {
    /// Opens the thread's own connection to `path` and starts it; `None`
    /// (and SQLite checkpoints inside commits, as by default) if either
    /// fails.
    pub(super) fn start(path: &Path, calls: Arc<AtomicU64>) -> Option<Arc<Checkpointer>> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let conn = match Connection::open_with_flags(path, flags) {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "no checkpoint thread: SQLite checkpoints inside commits");
                return None;
            }
        };
        let checkpointer = Arc::new(Checkpointer {
            calls,
            checkpoints: AtomicU64::new(0),
            state: Mutex::new(CheckpointState::default()),
            wake: std::sync::Condvar::new(),
        });
        let thread = checkpointer.clone();
        let started = std::thread::Builder::new()
            .name("tenure-sqlite-checkpoint".into())
            .spawn(move || thread.run(&conn));
        if let Err(e) = started {
            tracing::debug!(error = %e, "no checkpoint thread: SQLite checkpoints inside commits");
            return None;
        }
        Some(checkpointer)
    }

    /// The store made its `calls`-th call.
    pub(super) fn called(&self, calls: u64) {
        if calls % CHECKPOINT_EVERY == 0 {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).due = true;
            self.wake.notify_one();
        }
    }

    pub(super) fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.wake.notify_one();
    }

    fn run(&self, conn: &Connection) {
        let mut checkpointed_at = 0;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.closed {
                return;
            }
            if !state.due {
                state = match self.wake.wait_timeout(state, CHECKPOINT_IDLE) {
                    Ok((state, _)) => state,
                    Err(e) => e.into_inner().0,
                };
                if state.closed {
                    return;
                }
            }
            state.due = false;
            let calls = self.calls.load(Ordering::Relaxed);
            if calls == checkpointed_at {
                continue;
            }
            checkpointed_at = calls;
            drop(state);
            // A busy answer only means another process's checkpoint runs.
            match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                Ok(()) => {
                    self.checkpoints.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "WAL checkpoint failed; the next one retries")
                }
            }
            state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        }
    }
}
