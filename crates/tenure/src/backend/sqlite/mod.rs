//! `sqlite:///path/file.db`: the embedded default. Every process on a machine
//! that opens the same file shares its locks.
//!
//! Three tables: sessions (with an expiry in milliseconds by SQLite's own
//! `julianday('now')`), names (the fencing counter and a change version, kept
//! forever so tokens never go back), and entries (the queues). Writes run in
//! `BEGIN IMMEDIATE` transactions; the file is in WAL mode, checkpointed by
//! a thread of the store's own, off the lock path.
//!
//! Waiters in this process are woken directly when a release here grants
//! them; waiters in other processes poll their own row with a backoff, and
//! sleep no longer than until the next expiry ahead of them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::functions::FunctionFlags;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use super::codec;
use super::poll::{self, Listeners};
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{
    kind_conflict, Capabilities, CellWrite, Entry, EntryKind, Expect, FenceOp, FenceState,
    JoinMode, JoinRequest, Joined, Name, OpenedSession, Queue, SessionKey, SessionSpec, Store,
    Versioned, Wake,
};

const BACKEND: &str = "sqlite";
const SCHEMA_VERSION: i64 = 1;
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The store's clock for expiry: this machine's boot time in milliseconds
/// (`CLOCK_BOOTTIME`, shared by every process, never set by anyone), through
/// a function each connection registers.
const NOW: &str = "tenure_now_ms()";

/// The wall clock, only for showing when an entry was granted.
const WALL_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

static STATEMENTS: AtomicU64 = AtomicU64::new(0);

// Counted from SQLite's profile hook, which gets each statement's own text
// when it ends: the trace hook would expand every bound parameter into a
// new string on every statement, only to be thrown away.
fn count_statement(_sql: &str, _took: Duration) {
    STATEMENTS.fetch_add(1, Ordering::Relaxed);
}

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::file(&["synchronous"]);

/// The SQLite backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
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

/// A `BEGIN IMMEDIATE` transaction, rolled back when dropped uncommitted.
/// Its `BEGIN` and `COMMIT` are cached statements: rusqlite's own
/// `Transaction` parses both again every time, a few microseconds of every
/// lock operation.
struct Tx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> Tx<'c> {
    fn immediate(conn: &'c Connection) -> Result<Tx<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(db_err)?;
        Ok(Tx { conn, open: true })
    }

    fn commit(mut self) -> Result<()> {
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

/// Checkpoints the WAL from a thread of its own, so that no acquire or
/// release waits for one. SQLite's automatic checkpoint runs inside the
/// commit that crosses its threshold (1,000 pages of WAL): writing them back
/// and syncing stalled one lock operation in about 170 for 10–20 ms, which
/// was most of the mean cycle (see the README's bench). Here a thread
/// checkpoints (`PASSIVE`: it never blocks a writer or a reader) after every
/// [`CHECKPOINT_EVERY`] calls of this store, and once a second while calls
/// went on. The lock connection keeps SQLite's own automatic checkpoint (at
/// its default, 1,000 pages) as a backstop for a thread that falls behind:
/// it then finds most of the WAL written back already.
struct Checkpointer {
    /// Calls of the store so far: the store's own count
    /// ([`SqliteStore::round_trips`]).
    calls: Arc<AtomicU64>,
    /// Checkpoints the thread has made.
    checkpoints: AtomicU64,
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
const CHECKPOINT_EVERY: u64 = 64;
/// How often the checkpoint thread looks for calls made since its last
/// checkpoint, when fewer than [`CHECKPOINT_EVERY`] were.
const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);

impl Checkpointer {
    /// Opens the thread's own connection to `path` and starts it; `None`
    /// (and SQLite checkpoints inside commits, as by default) if either
    /// fails.
    fn start(path: &Path, calls: Arc<AtomicU64>) -> Option<Arc<Checkpointer>> {
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
    fn called(&self, calls: u64) {
        if calls % CHECKPOINT_EVERY == 0 {
            self.state.lock().unwrap_or_else(|e| e.into_inner()).due = true;
            self.wake.notify_one();
        }
    }

    fn close(&self) {
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

fn db_err(e: rusqlite::Error) -> Error {
    if is_busy(&e) {
        Error::unavailable(BACKEND, e)
    } else {
        Error::backend(BACKEND, e)
    }
}

fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|e| Error::backend(BACKEND, e))
}

/// The entry kind stored in columns `first`, `first + 1`, `first + 2`
/// (kind code, count, limit) of a row.
fn kind_at(r: &rusqlite::Row<'_>, first: usize) -> Result<EntryKind> {
    codec::kind_from_code(
        BACKEND,
        r.get(first).map_err(db_err)?,
        r.get(first + 1).map_err(db_err)?,
        r.get(first + 2).map_err(db_err)?,
    )
}

fn ms_to_time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// What a waiter learns from one look at its row.
enum Look {
    Granted,
    Waiting {
        until: Option<Duration>,
        next: bool,
    },
    /// Granted by an expiry nobody has settled yet, or behind an expired
    /// entry (this session's, to end) that a walk from the head would not reach.
    NeedsSettle {
        dead_ahead: Option<String>,
    },
}

/// A row of a queue as read inside the store.
struct Row {
    seq: u64,
    kind: EntryKind,
    session: String,
    granted_ms: Option<i64>,
    live: bool,
}

impl SqliteStore {
    /// Opens a store from a `sqlite://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    /// How many calls (transactions or reads) this store has made to the
    /// database file so far: what the no-thundering-herd check counts.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (path, synchronous) = parse_url(&url)?;
        let masked = url.masked().to_string();
        tokio::task::spawn_blocking(move || Self::open_path(&path, synchronous, &masked))
            .await
            .map_err(|e| Error::backend(BACKEND, e))?
    }

    fn open_path(path: &Path, synchronous: &str, url: &str) -> Result<Self> {
        if !crate::clock::boot_time_known() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "a process whose time namespace's offsets cannot be read \
                       (/proc/self/timens_offsets): its boot time could not be compared",
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let open_error = |e: rusqlite::Error| file_error(path, e);
        let mut conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db_err)?;
        conn.set_prepared_statement_cache_capacity(64);
        conn.profile(Some(count_statement));
        conn.create_scalar_function("tenure_now_ms", 0, FunctionFlags::SQLITE_UTF8, |_| {
            Ok(i64::try_from(crate::clock::boot_time().as_millis()).unwrap_or(i64::MAX))
        })
        .map_err(open_error)?;
        // Several processes may set up a new file at once; switching to WAL can
        // report "locked" without waiting on the busy timeout, so retry.
        let started = std::time::Instant::now();
        loop {
            match setup(&mut conn, synchronous) {
                Ok(Ok(())) => break,
                Ok(Err(found)) => {
                    return Err(Error::SchemaMismatch {
                        backend: BACKEND,
                        url: url.to_string(),
                        found,
                        expected: format!("version {SCHEMA_VERSION}"),
                    })
                }
                Err(e) if is_busy(&e) && started.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if is_busy(&e) => return Err(Error::unavailable(BACKEND, e)),
                Err(e) => return Err(open_error(e)),
            }
        }
        let round_trips = Arc::new(AtomicU64::new(0));
        let checkpointer = Checkpointer::start(path, round_trips.clone());
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                checkpointer,
                path: path.to_path_buf(),
                caps: capabilities(),
                listeners: Listeners::default(),
                round_trips,
            }),
        })
    }

    /// How many SQL statements every SQLite store of this process has run
    /// (BEGIN and COMMIT included): for counting statements per operation.
    pub fn statements_executed() -> u64 {
        STATEMENTS.load(Ordering::Relaxed)
    }

    /// Runs `f` on the connection in the blocking pool.
    ///
    /// Fast path: when the connection is free, `f` runs right here with a zero
    /// busy timeout — a statement takes microseconds, less than a hop to the
    /// blocking pool. Only if another writer holds the file (SQLITE_BUSY) does
    /// it run again in the blocking pool, where it may wait out the busy
    /// timeout without stalling the async runtime.
    async fn run<T: Send + 'static>(
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
    fn notify(&self, changed: &[(Name, Vec<u64>)]) {
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
    async fn write<T: Send + 'static>(
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

    /// One look at the session's entry `seq` of `name`: its own row, the
    /// row just ahead, and only for the next in line the granted rows ahead.
    async fn look(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<Look> {
        let key = key.clone();
        let name = name.clone();
        self.run(move |conn| {
            let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
            let own: Option<(Option<i64>, bool)> = conn
                .prepare_cached(&format!(
                    "SELECT e.granted_ms, s.expires_ms > {NOW}
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq = ?2 AND e.session = ?3"
                ))
                .and_then(|mut s| {
                    s.query_row(params![name.as_str(), seq, key.secret()], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                })
                .map_err(db_err)?;
            match own {
                None => {
                    let alive: bool = conn
                        .query_row(
                            &format!("SELECT EXISTS(SELECT 1 FROM tenure_sessions WHERE id = ?1 AND expires_ms > {NOW})"),
                            [key.secret()],
                            |r| r.get(0),
                        )
                        .map_err(db_err)?;
                    return if alive {
                        Err(Error::NotHeld("this session has no such entry"))
                    } else {
                        Err(Error::SessionLost(crate::error::LostReason::Expired))
                    };
                }
                Some((_, false)) => {
                    return Err(Error::SessionLost(crate::error::LostReason::Expired))
                }
                Some((Some(_), true)) => return Ok(Look::Granted),
                Some((None, true)) => {}
            }
            let ahead: Option<(Option<i64>, bool, i64, String)> = conn
                .prepare_cached(&format!(
                    "SELECT e.granted_ms, s.expires_ms > {NOW}, s.expires_ms - {NOW}, e.session
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq < ?2 ORDER BY e.seq DESC LIMIT 1"
                ))
                .and_then(|mut s| {
                    s.query_row(params![name.as_str(), seq], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .optional()
                })
                .map_err(db_err)?;
            let (ahead_granted, ahead_live, ahead_left) = match ahead {
                // Nothing ahead: the rules grant it.
                None => return Ok(Look::NeedsSettle { dead_ahead: None }),
                Some((_, false, _, session)) => {
                    return Ok(Look::NeedsSettle {
                        dead_ahead: Some(session),
                    })
                }
                Some((granted, live, left, _)) => (granted, live, left),
            };
            let ms = |left: i64| Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)));
            if ahead_live && ahead_granted.is_none() {
                return Ok(Look::Waiting {
                    until: ms(ahead_left),
                    next: false,
                });
            }
            // Next in line: every entry ahead is granted. Would the rules
            // grant this one too (a reader behind readers, a permit that
            // fits), or has a holder expired?
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT e.seq, e.kind, e.count, e.lim, s.expires_ms - {NOW}
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq <= ?2 ORDER BY e.seq"
                ))
                .map_err(db_err)?;
            let mut rows = stmt.query(params![name.as_str(), seq]).map_err(db_err)?;
            let mut rule = queue::GrantWalk::new();
            let mut first_expiry: Option<i64> = None;
            while let Some(r) = rows.next().map_err(db_err)? {
                let row_seq: i64 = r.get(0).map_err(db_err)?;
                let kind = kind_at(r, 1)?;
                let left: i64 = r.get(4).map_err(db_err)?;
                let admitted = rule.admit(kind);
                if row_seq == seq {
                    if admitted {
                        return Ok(Look::NeedsSettle { dead_ahead: None });
                    }
                } else if left <= 0 {
                    // A holder expired: settling passes its grant on.
                    return Ok(Look::NeedsSettle { dead_ahead: None });
                } else {
                    first_expiry = Some(first_expiry.map_or(left, |m| m.min(left)));
                }
            }
            Ok(Look::Waiting {
                until: first_expiry.and_then(ms),
                next: true,
            })
        })
        .await
    }
}

fn parse_url(url: &StoreUrl) -> Result<(PathBuf, &'static str)> {
    let path = url.path();
    if path.is_empty() {
        return Err(
            url.invalid("no file path; use sqlite:///absolute/path.db or sqlite://relative.db")
        );
    }
    if path.contains('\0') {
        return Err(url.invalid("the path contains NUL"));
    }
    let synchronous = match url.option("synchronous").map(str::to_ascii_lowercase) {
        None => "NORMAL",
        Some(v) => match v.as_str() {
            "normal" => "NORMAL",
            "full" => "FULL",
            "extra" => "EXTRA",
            _ => {
                return Err(url.invalid(format!(
                    "synchronous must be normal, full or extra, not {v:?}"
                )))
            }
        },
    };
    Ok((PathBuf::from(path), synchronous))
}

/// What is wrong with the file, in words: not a database, read-only, or
/// not to be opened where it is. Each is bad input (the path or its
/// permissions), not a fault of the store.
fn file_error(path: &Path, e: rusqlite::Error) -> Error {
    let code = e.sqlite_error_code();
    let shown = path.display();
    let reason = match code {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            format!(
                "{shown} is not an SQLite database (or is damaged), so it is not a tenure store"
            )
        }
        Some(rusqlite::ErrorCode::ReadOnly) => format!(
            "{shown} is read-only for this user: tenure writes to it, and beside it (its WAL files)"
        ),
        _ if path.is_file() && !accessible(path, libc::R_OK) => {
            format!("{shown} cannot be read by this user")
        }
        _ if path.is_file() && !accessible(path, libc::W_OK) => format!(
            "{shown} is read-only for this user: tenure writes to it, and beside it (its WAL files)"
        ),
        _ => format!(
            "cannot open {shown} for reading and writing ({e}): does its directory exist, and may \
             this user write there?"
        ),
    };
    Error::InvalidArgument {
        what: "SQLite store file",
        reason,
    }
}

/// Whether this process may access `path` in `mode` (`access(2)`: the real
/// user, a read-only mount included).
fn accessible(path: &Path, mode: libc::c_int) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path that lives through the call.
    unsafe { libc::access(c_path.as_ptr(), mode) == 0 }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
}

/// WAL mode, pragmas and tables; `Ok(Err(reason))` for a file this build
/// cannot use.
fn setup(
    conn: &mut Connection,
    synchronous: &str,
) -> rusqlite::Result<std::result::Result<(), String>> {
    // journal_mode answers with a row, so it is queried, not executed; WAL
    // stays set in the file, so later opens only read it.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "SQLite did not switch to WAL; locking still works, slower");
        }
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous={synchronous}; PRAGMA foreign_keys=ON;"
    ))?;
    create_tables(conn)
}

fn create_tables(conn: &mut Connection) -> rusqlite::Result<std::result::Result<(), String>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS tenure_meta (
            key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS tenure_sessions (
            id TEXT PRIMARY KEY,
            tag TEXT NOT NULL,
            label TEXT NOT NULL,
            ttl_ms INTEGER NOT NULL,
            expires_ms INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS tenure_sessions_expiry ON tenure_sessions(expires_ms);
         CREATE TABLE IF NOT EXISTS tenure_names (
            name TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL,
            version INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS tenure_entries (
            name TEXT NOT NULL,
            seq INTEGER NOT NULL,
            session TEXT NOT NULL REFERENCES tenure_sessions(id) ON DELETE CASCADE,
            kind INTEGER NOT NULL,
            count INTEGER NOT NULL,
            lim INTEGER NOT NULL,
            holds INTEGER NOT NULL,
            value BLOB NOT NULL,
            granted_ms INTEGER,
            PRIMARY KEY (name, seq)) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS tenure_entries_session ON tenure_entries(session);
         CREATE TABLE IF NOT EXISTS tenure_registers (
            name TEXT PRIMARY KEY,
            kind INTEGER NOT NULL,
            version INTEGER NOT NULL,
            value BLOB,
            owner TEXT) WITHOUT ROWID;",
    )?;
    let version: Option<i64> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match version {
        None => {
            tx.execute(
                "INSERT INTO tenure_meta (key, value) VALUES ('schema', ?1)",
                [SCHEMA_VERSION],
            )?;
        }
        Some(v) if v > SCHEMA_VERSION => {
            return Ok(Err(format!("the file has tenure schema version {v}")));
        }
        Some(_) => {}
    }
    // Expiry times count from boot: sessions of an earlier boot are over.
    let boot = crate::clock::boot_id();
    let stored: Option<String> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'boot_id'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if stored.as_deref() != Some(boot.as_str()) {
        tx.execute(
            "UPDATE tenure_names SET version = version + 1
             WHERE name IN (SELECT name FROM tenure_entries)",
            [],
        )?;
        tx.execute("DELETE FROM tenure_sessions", [])?;
        tx.execute(
            "INSERT INTO tenure_meta (key, value) VALUES ('boot_id', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [&boot],
        )?;
    }
    tx.commit().map(Ok)
}

/// Drops the name's entries of expired sessions, stamps newly granted entries
/// and, if anything changed (or `changed`), bumps the name's version.
/// Returns the seqs granted by this call.
fn settle(tx: &Tx<'_>, name: &Name, changed: bool) -> Result<Vec<u64>> {
    settle_walk(tx, name, changed).map(|walk| walk.newly)
}

/// What settling saw, walking the queue from its head.
struct Walk {
    /// The live entries the rules grant, in order: a prefix of the queue.
    granted: Vec<Row>,
    /// Whether a live entry waits behind them (the walk stopped there).
    blocked: bool,
    /// The entries this walk stamped granted.
    newly: Vec<u64>,
}

/// Ends expired sessions for good (a session row that is gone cannot be
/// renewed, so even a wall clock that jumps back cannot revive a lease that
/// is being passed on), bumping the versions of every name they were in.
fn end_sessions(tx: &Tx<'_>, sessions: &[String]) -> Result<usize> {
    let mut ended = 0;
    for session in sessions {
        tx.prepare_cached(
            "UPDATE tenure_names SET version = version + 1 WHERE name IN
               (SELECT name FROM tenure_entries WHERE session = ?1)",
        )
        .and_then(|mut s| s.execute([session]))
        .map_err(db_err)?;
        ended += tx
            .prepare_cached(&format!(
                "DELETE FROM tenure_sessions WHERE id = ?1 AND expires_ms <= {NOW}"
            ))
            .and_then(|mut s| s.execute([session]))
            .map_err(db_err)?;
    }
    Ok(ended)
}

/// Walks `name`'s queue from the head: ends the expired sessions it meets,
/// stamps what the rules now grant, and stops at the first live entry that
/// waits, so it reads the granted entries and one more however long the
/// queue. Bumps the version if anything changed (or `changed`).
fn settle_walk(tx: &Tx<'_>, name: &Name, changed: bool) -> Result<Walk> {
    let mut granted = Vec::new();
    let mut blocked = false;
    let mut dead = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT e.seq, e.kind, e.count, e.lim, e.session, e.granted_ms, s.expires_ms > {NOW}
                 FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                 WHERE e.name = ?1 ORDER BY e.seq"
            ))
            .map_err(db_err)?;
        let mut rows = stmt.query([name.as_str()]).map_err(db_err)?;
        let mut rule = queue::GrantWalk::new();
        while let Some(r) = rows.next().map_err(db_err)? {
            let row = Row {
                seq: to_u64(r.get(0).map_err(db_err)?)?,
                kind: kind_at(r, 1)?,
                session: r.get(4).map_err(db_err)?,
                granted_ms: r.get(5).map_err(db_err)?,
                live: r.get(6).map_err(db_err)?,
            };
            if !row.live {
                dead.push(row.session);
            } else if rule.admit(row.kind) {
                granted.push(row);
            } else {
                blocked = true;
                break;
            }
        }
    }
    let purged = end_sessions(tx, &dead)?;
    let mut newly = Vec::new();
    for row in granted.iter_mut().filter(|r| r.granted_ms.is_none()) {
        tx.prepare_cached(&format!(
            "UPDATE tenure_entries SET granted_ms = {WALL_NOW} WHERE name = ?1 AND seq = ?2"
        ))
        .and_then(|mut s| s.execute(params![name.as_str(), row.seq as i64]))
        .map_err(db_err)?;
        newly.push(row.seq);
        row.granted_ms = Some(0);
    }
    if changed || purged > 0 || !newly.is_empty() {
        tx.prepare_cached("UPDATE tenure_names SET version = version + 1 WHERE name = ?1")
            .and_then(|mut s| s.execute([name.as_str()]))
            .map_err(db_err)?;
    }
    Ok(Walk {
        granted,
        blocked,
        newly,
    })
}

fn session_alive(conn: &Connection, key: &SessionKey) -> Result<()> {
    let alive: bool = conn
        .prepare_cached(&format!(
            "SELECT EXISTS(SELECT 1 FROM tenure_sessions WHERE id = ?1 AND expires_ms > {NOW})"
        ))
        .and_then(|mut s| s.query_row([key.secret()], |r| r.get(0)))
        .map_err(db_err)?;
    if alive {
        Ok(())
    } else {
        Err(Error::SessionLost(crate::error::LostReason::Expired))
    }
}

/// The names a session has entries in.
fn session_names(conn: &Connection, key: &str) -> Result<Vec<Name>> {
    let mut stmt = conn
        .prepare_cached("SELECT DISTINCT name FROM tenure_entries WHERE session = ?1")
        .map_err(db_err)?;
    let names = stmt
        .query_map([key], |r| r.get::<_, String>(0))
        .map_err(db_err)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(db_err)?;
    names.into_iter().map(Name::new).collect()
}

/// A fence's or a cell's row in `tenure_registers`. A fence keeps its
/// highest token in `version`; a cell keeps its version there even when it
/// has no value (deleted, or its owner session ended), so versions are never
/// reused for a name.
struct Register {
    is_cell: bool,
    version: i64,
    value: Option<Vec<u8>>,
    /// A cell's owner session is alive, or it has none.
    live: bool,
}

const FENCE: i64 = 0;
const CELL: i64 = 1;

impl Register {
    fn read(conn: &Connection, name: &str) -> Result<Option<Register>> {
        conn.prepare_cached(&format!(
            "SELECT kind, version, value, owner IS NULL OR EXISTS(SELECT 1 FROM tenure_sessions s
                 WHERE s.id = owner AND s.expires_ms > {NOW})
             FROM tenure_registers WHERE name = ?1"
        ))
        .and_then(|mut s| {
            s.query_row([name], |r| {
                Ok(Register {
                    is_cell: r.get::<_, i64>(0)? == CELL,
                    version: r.get(1)?,
                    value: r.get(2)?,
                    live: r.get(3)?,
                })
            })
            .optional()
        })
        .map_err(db_err)
    }

    /// The cell's stored version and live value; a fence is a conflict.
    fn cell(conn: &Connection, name: &Name) -> Result<(i64, Option<Versioned>)> {
        match Register::read(conn, name.as_str())? {
            None => Ok((0, None)),
            Some(r) if !r.is_cell => Err(kind_conflict(name, "a fence", "a cell")),
            Some(r) => {
                let value = match r.value.filter(|_| r.live) {
                    Some(value) => Some(Versioned {
                        value,
                        version: to_u64(r.version)?,
                    }),
                    None => None,
                };
                Ok((r.version, value))
            }
        }
    }
}

fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument {
        what: "number",
        reason: format!("{v} is larger than SQLite's integers"),
    })
}

#[async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let label = spec.label.clone();
        let ttl_ms = spec.ttl_ms();
        let (k, t) = (opened.key.secret().to_string(), opened.tag.clone());
        self.write(move |tx| {
            // Collect a few expired sessions, oldest first (by the expiry
            // index), so the table stays small; their names are settled so
            // observers see the change.
            let dead = tx
                .prepare_cached(&format!(
                    "SELECT id FROM tenure_sessions WHERE expires_ms <= {NOW}
                     ORDER BY expires_ms LIMIT 16"
                ))
                .and_then(|mut s| {
                    s.query_map([], |r| r.get::<_, String>(0))?
                        .collect::<rusqlite::Result<Vec<String>>>()
                })
                .map_err(db_err)?;
            let mut names = Vec::new();
            for session in &dead {
                names.extend(session_names(tx, session)?);
            }
            end_sessions(tx, &dead)?;
            tx.prepare_cached(&format!(
                "INSERT INTO tenure_sessions (id, tag, label, ttl_ms, expires_ms)
                 VALUES (?1, ?2, ?3, ?4, {NOW} + ?4)"
            ))
            .and_then(|mut s| s.execute(params![k, t, label, ttl_ms]))
            .map_err(db_err)?;
            Ok(((), names))
        })
        .await?;
        Ok(opened)
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let key = session.clone();
        self.run(move |conn| {
            let n = conn
                .prepare_cached(&format!(
                    "UPDATE tenure_sessions SET expires_ms = {NOW} + ttl_ms
                     WHERE id = ?1 AND expires_ms > {NOW}"
                ))
                .and_then(|mut s| s.execute([key.secret()]))
                .map_err(db_err)?;
            if n == 0 {
                Err(Error::SessionLost(crate::error::LostReason::Expired))
            } else {
                Ok(())
            }
        })
        .await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let key = session.clone();
        self.write(move |tx| {
            let names = session_names(tx, key.secret())?;
            tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
                .and_then(|mut s| s.execute([key.secret()]))
                .map_err(db_err)?;
            Ok(((), names))
        })
        .await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let key = session.clone();
        let name = name.clone();
        let value = value.to_vec();
        let (kind_col, count_col, limit_col) = codec::kind_code(kind);
        let result = self
            .run(move |conn| {
                let tx = Tx::immediate(conn)?;
                // Settling first drops entries of expired sessions ahead of us.
                let walk = settle_walk(&tx, &name, false)?;
                let newly_ahead = walk.newly.clone();
                // Our own entry: among the rows walked unless the walk
                // stopped short of the end.
                let own = if walk.blocked {
                    tx.prepare_cached(
                        "SELECT seq, kind, count, lim, granted_ms FROM tenure_entries
                         WHERE name = ?1 AND session = ?2",
                    )
                    .and_then(|mut s| {
                        s.query_row(params![name.as_str(), key.secret()], |r| {
                            Ok((
                                r.get::<_, i64>(0)?,
                                r.get::<_, i64>(1)?,
                                r.get::<_, i64>(2)?,
                                r.get::<_, i64>(3)?,
                                r.get::<_, Option<i64>>(4)?,
                            ))
                        })
                        .optional()
                    })
                    .map_err(db_err)?
                    .map(|(seq, k, c, l, granted_ms)| {
                        Ok::<_, Error>((seq, codec::kind_from_code(BACKEND, k, c, l)?, granted_ms))
                    })
                    .transpose()?
                } else {
                    walk.granted
                        .iter()
                        .find(|r| r.session == key.secret())
                        .map(|r| Ok::<_, Error>((i64::try_from(r.seq).map_err(|e| Error::backend(BACKEND, e))?, r.kind, r.granted_ms)))
                        .transpose()?
                };
                if let Some((own_seq, own_kind, granted_ms)) = own {
                    queue::check_same_kind(&name, own_kind, kind)?;
                    let granted = granted_ms.is_some();
                    if mode == JoinMode::IfGranted && !granted {
                        tx.commit()?;
                        return Ok((None, name.clone(), newly_ahead));
                    }
                    let holds: i64 = tx
                        .prepare_cached(
                            "UPDATE tenure_entries SET holds = holds + 1
                             WHERE name = ?1 AND seq = ?2 RETURNING holds",
                        )
                        .and_then(|mut s| {
                            s.query_row(params![name.as_str(), own_seq], |r| r.get(0))
                        })
                        .map_err(db_err)?;
                    let seq = to_u64(own_seq)?;
                    tx.commit()?;
                    let holds = u32::try_from(holds).map_err(|e| Error::backend(BACKEND, e))?;
                    return Ok((
                        Some(Joined { seq, granted, holds, first: false }),
                        name.clone(),
                        newly_ahead,
                    ));
                }
                // Every entry passed this check against those before it, so
                // the head stands for them all.
                queue::check_compatible(&name, kind, walk.granted.first().map(|r| r.kind))?;
                // Behind a waiting entry nothing is granted; otherwise the
                // walk saw every live entry, all granted.
                let granted = !walk.blocked && {
                    let mut rule = queue::GrantWalk::new();
                    walk.granted.iter().all(|r| rule.admit(r.kind)) && rule.admit(kind)
                };
                if mode == JoinMode::IfGranted && !granted {
                    session_alive(&tx, &key)?;
                    tx.commit()?;
                    return Ok((None, name.clone(), newly_ahead));
                }
                let seq: i64 = tx
                    .prepare_cached(
                        "INSERT INTO tenure_names (name, last_seq, version) VALUES (?1, 1, 1)
                         ON CONFLICT (name) DO UPDATE SET last_seq = last_seq + 1, version = version + 1
                         RETURNING last_seq",
                    )
                    .and_then(|mut s| s.query_row([name.as_str()], |r| r.get(0)))
                    .map_err(db_err)?;
                // The session check rides on the insert: no live session, no row.
                let inserted = tx
                    .prepare_cached(&format!(
                        "INSERT INTO tenure_entries
                           (name, seq, session, kind, count, lim, holds, value, granted_ms)
                         SELECT ?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, CASE WHEN ?8 THEN {WALL_NOW} END
                         WHERE EXISTS (SELECT 1 FROM tenure_sessions
                                       WHERE id = ?3 AND expires_ms > {NOW})"
                    ))
                    .and_then(|mut s| {
                        s.execute(params![
                            name.as_str(),
                            seq,
                            key.secret(),
                            kind_col,
                            count_col,
                            limit_col,
                            value,
                            granted
                        ])
                    })
                    .map_err(db_err)?;
                if inserted == 0 {
                    // Dropping the transaction rolls back the counter too.
                    return Err(Error::SessionLost(crate::error::LostReason::Expired));
                }
                tx.commit()?;
                Ok((
                    Some(Joined {
                        seq: to_u64(seq)?,
                        granted,
                        holds: 1,
                        // The counter row is never deleted, so 1 means no
                        // entry ever came before.
                        first: seq == 1,
                    }),
                    name.clone(),
                    newly_ahead,
                ))
            })
            .await?;
        let (joined, name, newly_ahead) = result;
        self.notify(&[(name, newly_ahead)]);
        Ok(joined)
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let key = session.clone();
        let name = name.clone();
        self.write(move |tx| {
            // The usual case, the last hold, is one DELETE; else one UPDATE.
            let alive = format!(
                "name = ?1 AND seq = ?2 AND session = ?3 AND session IN
                   (SELECT id FROM tenure_sessions WHERE id = ?3 AND expires_ms > {NOW})"
            );
            let deleted = tx
                .prepare_cached(&format!(
                    "DELETE FROM tenure_entries WHERE {alive} AND holds <= 1"
                ))
                .and_then(|mut s| s.execute(params![name.as_str(), seq as i64, key.secret()]))
                .map_err(db_err)?;
            if deleted == 0 {
                let holds: Option<i64> = tx
                    .prepare_cached(&format!(
                        "UPDATE tenure_entries SET holds = holds - 1 WHERE {alive} RETURNING holds"
                    ))
                    .and_then(|mut s| {
                        s.query_row(params![name.as_str(), seq as i64, key.secret()], |r| {
                            r.get(0)
                        })
                        .optional()
                    })
                    .map_err(db_err)?;
                let Some(holds) = holds else {
                    // Tell a lost session from an entry it never had.
                    session_alive(tx, &key)?;
                    return Err(Error::NotHeld("this session has no such entry"));
                };
                let holds = u32::try_from(holds).map_err(|e| Error::backend(BACKEND, e))?;
                return Ok((holds, Vec::new()));
            }
            Ok((0, vec![name.clone()]))
        })
        .await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let (listening, _) = self
            .inner
            .listeners
            .listen(poll::grant_key(name.as_str(), seq));
        // Grants made in this process wake their waiters directly; for those
        // made elsewhere only the first waiter of the name here polls.
        let listening = listening.in_line(poll::grant_prefix(name.as_str()));
        let pushed = || async { false };
        // The machine's boot clock judges expiry here: nothing to watch.
        poll::until_granted(
            &listening,
            POLL_MIN,
            POLL_MAX,
            pushed,
            |_| async {
                loop {
                    match self.look(session, name, seq).await? {
                        Look::Granted => return Ok(poll::Look::Granted),
                        Look::Waiting { until, next } => {
                            return Ok(poll::Look::Wait {
                                until,
                                next,
                                watch: None,
                            })
                        }
                        // Granted by an expiry nobody has settled yet, or behind
                        // an expired waiter: settle, look again.
                        Look::NeedsSettle { dead_ahead } => {
                            let name = name.clone();
                            self.write(move |tx| {
                                if let Some(session) = &dead_ahead {
                                    end_sessions(tx, std::slice::from_ref(session))?;
                                }
                                Ok(((), vec![name.clone()]))
                            })
                            .await?;
                        }
                    }
                }
            },
            None::<poll::NoStandIn>,
        )
        .await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let key = key.clone();
        let name = name.clone();
        let value = value.to_vec();
        self.write(move |tx| {
            session_alive(tx, &key)?;
            settle(tx, &name, false)?;
            let n = tx
                .prepare_cached(
                    "UPDATE tenure_entries SET value = ?4
                     WHERE name = ?1 AND seq = ?2 AND session = ?3 AND granted_ms IS NOT NULL",
                )
                .and_then(|mut s| {
                    s.execute(params![name.as_str(), seq as i64, key.secret(), value])
                })
                .map_err(db_err)?;
            if n == 0 {
                return Err(Error::NotHeld(
                    "this session holds no granted entry with that token",
                ));
            }
            Ok(((), vec![name.clone()]))
        })
        .await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        loop {
            let n = name.clone();
            let (queue, stale) = self
                .run(move |conn| {
                    let version: i64 = conn
                        .prepare_cached("SELECT version FROM tenure_names WHERE name = ?1")
                        .and_then(|mut s| s.query_row([n.as_str()], |r| r.get(0)).optional())
                        .map_err(db_err)?
                        .unwrap_or(0);
                    let mut stmt = conn
                        .prepare_cached(&format!(
                            "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value,
                                    e.granted_ms, s.expires_ms - {NOW}, e.holds
                             FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                             WHERE e.name = ?1 ORDER BY e.seq"
                        ))
                        .map_err(db_err)?;
                    let mut rows = stmt.query([n.as_str()]).map_err(db_err)?;
                    let mut entries = Vec::new();
                    let mut stale = false;
                    while let Some(r) = rows.next().map_err(db_err)? {
                        let left: i64 = r.get(8).map_err(db_err)?;
                        if left <= 0 {
                            stale = true;
                            continue;
                        }
                        let granted_ms: Option<i64> = r.get(7).map_err(db_err)?;
                        entries.push(Entry {
                            seq: to_u64(r.get(0).map_err(db_err)?)?,
                            kind: kind_at(r, 1)?,
                            session_tag: r.get(4).map_err(db_err)?,
                            label: r.get(5).map_err(db_err)?,
                            value: r.get(6).map_err(db_err)?,
                            granted: granted_ms.is_some(),
                            granted_at: granted_ms.map(ms_to_time),
                            expires_in: Duration::from_millis(to_u64(left)?),
                            holds: u32::try_from(r.get::<_, i64>(9).map_err(db_err)?)
                                .map_err(|e| Error::backend(BACKEND, e))?,
                        });
                    }
                    let kinds: Vec<EntryKind> = entries.iter().map(|e| e.kind).collect();
                    let needs_stamp = queue::grants(&kinds)
                        .iter()
                        .zip(&entries)
                        .any(|(g, e)| *g && !e.granted);
                    Ok((
                        Queue {
                            version: to_u64(version)?,
                            entries,
                        },
                        stale || needs_stamp,
                    ))
                })
                .await?;
            if !stale {
                return Ok(queue);
            }
            // Unlike settling's walk, end every expired session with an
            // entry here, also behind the first waiter: this reads the whole
            // queue anyway and must not find the same dead entry again.
            let name = name.clone();
            self.write(move |tx| {
                let dead = tx
                    .prepare_cached(&format!(
                        "SELECT DISTINCT e.session FROM tenure_entries e
                         JOIN tenure_sessions s ON s.id = e.session
                         WHERE e.name = ?1 AND s.expires_ms <= {NOW}"
                    ))
                    .and_then(|mut s| {
                        s.query_map([name.as_str()], |r| r.get::<_, String>(0))?
                            .collect::<rusqlite::Result<Vec<String>>>()
                    })
                    .map_err(db_err)?;
                end_sessions(tx, &dead)?;
                Ok(((), vec![name.clone()]))
            })
            .await?;
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let (listening, _) = self.inner.listeners.listen(poll::change_key(name.as_str()));
        // Other processes' changes are not pushed: poll.
        let pushed = || async { false };
        poll::until_changed(
            self,
            name,
            version,
            listening.notify(),
            POLL_MIN,
            POLL_MAX,
            pushed,
        )
        .await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let prefix = prefix.to_string();
        let names: Vec<String> = self
            .run(move |conn| {
                let mut stmt = conn
                    .prepare_cached(&format!(
                        "SELECT DISTINCT e.name FROM tenure_entries e
                         JOIN tenure_sessions s ON s.id = e.session
                         WHERE s.expires_ms > {NOW} AND substr(e.name, 1, length(?1)) = ?1
                         ORDER BY e.name"
                    ))
                    .map_err(db_err)?;
                let names = stmt
                    .query_map([&prefix], |r| r.get::<_, String>(0))
                    .map_err(db_err)?
                    .collect::<rusqlite::Result<Vec<String>>>()
                    .map_err(db_err)?;
                Ok(names)
            })
            .await?;
        names.into_iter().map(Name::new).collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let name = name.clone();
        self.write(move |tx| {
            settle(tx, &name, false)?;
            let mut stmt = tx
                .prepare_cached(
                    "SELECT DISTINCT session FROM tenure_entries
                     WHERE name = ?1 AND granted_ms IS NOT NULL",
                )
                .map_err(db_err)?;
            let holders = stmt
                .query_map([name.as_str()], |r| r.get::<_, String>(0))
                .map_err(db_err)?
                .collect::<rusqlite::Result<Vec<String>>>()
                .map_err(db_err)?;
            let mut names = vec![name.clone()];
            for holder in &holders {
                for n in session_names(tx, holder)? {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
                tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
                    .and_then(|mut s| s.execute([holder]))
                    .map_err(db_err)?;
            }
            Ok((holders.len(), names))
        })
        .await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let tag = tag.to_string();
        self.write(move |tx| {
            // Live by the store's clock: one that expired is over already.
            let session: Option<String> = tx
                .prepare_cached(&format!(
                    "SELECT id FROM tenure_sessions WHERE tag = ?1 AND expires_ms > {NOW} LIMIT 1"
                ))
                .and_then(|mut s| s.query_row([&tag], |r| r.get(0)).optional())
                .map_err(db_err)?;
            let Some(session) = session else {
                return Ok((false, Vec::new()));
            };
            // As evict ends a holder: the row goes, its entries with it, and
            // `write` settles (and wakes) every name they were in.
            let names = session_names(tx, &session)?;
            tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
                .and_then(|mut s| s.execute([&session]))
                .map_err(db_err)?;
            Ok((true, names))
        })
        .await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let name = name.clone();
        let (token, value) = match op {
            FenceOp::Read => (None, None),
            FenceOp::Admit { token, value } => (Some(to_i64(token)?), value.map(<[u8]>::to_vec)),
        };
        self.run(move |conn| {
            let tx = Tx::immediate(conn)?;
            let (highest, stored) = match Register::read(&tx, name.as_str())? {
                Some(r) if r.is_cell => {
                    return Err(kind_conflict(&name, "a cell", "a fence"))
                }
                Some(r) => (r.version, r.value),
                None => (0, None),
            };
            let answer = match token {
                Some(token) if token >= highest => {
                    tx.prepare_cached(
                        "INSERT INTO tenure_registers (name, kind, version, value) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (name) DO UPDATE
                           SET version = excluded.version, value = coalesce(excluded.value, value)",
                    )
                    .and_then(|mut s| s.execute(params![name.as_str(), FENCE, token, value]))
                    .map_err(db_err)?;
                    FenceState {
                        admitted: true,
                        highest: to_u64(token)?,
                        value: value.clone().or(stored),
                    }
                }
                _ => FenceState {
                    admitted: token.is_none(),
                    highest: to_u64(highest)?,
                    value: stored,
                },
            };
            tx.commit()?;
            Ok(answer)
        })
        .await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let name = name.clone();
        self.run(move |conn| Register::cell(conn, &name).map(|(_, value)| value))
            .await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let (name, value, owner) = (name.clone(), value.to_vec(), owner.cloned());
        self.run(move |conn| {
            let tx = Tx::immediate(conn)?;
            let (stored, current) = Register::cell(&tx, &name)?;
            if let Some(owner) = &owner {
                session_alive(&tx, owner)?;
            }
            let current = current.map(|c| c.version);
            if !queue::cell_expected(current, expect) {
                return Ok(CellWrite::Mismatch(current));
            }
            let version = stored + 1;
            tx.prepare_cached(
                "INSERT INTO tenure_registers (name, kind, version, value, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (name) DO UPDATE
                   SET version = excluded.version, value = excluded.value, owner = excluded.owner",
            )
            .and_then(|mut s| {
                s.execute(params![
                    name.as_str(),
                    CELL,
                    version,
                    value,
                    owner.as_ref().map(SessionKey::secret)
                ])
            })
            .map_err(db_err)?;
            tx.commit()?;
            Ok(CellWrite::Done(to_u64(version)?))
        })
        .await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let name = name.clone();
        self.run(move |conn| {
            let tx = Tx::immediate(conn)?;
            let (stored, current) = Register::cell(&tx, &name)?;
            let current = current.map(|c| c.version);
            if current != Some(version) {
                return Ok(CellWrite::Mismatch(current));
            }
            tx.prepare_cached(
                "UPDATE tenure_registers SET value = NULL, owner = NULL WHERE name = ?1",
            )
            .and_then(|mut s| s.execute([name.as_str()]))
            .map_err(db_err)?;
            tx.commit()?;
            Ok(CellWrite::Done(to_u64(stored)?))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<(PathBuf, &'static str)> {
        parse_url(&StoreUrl::parse(url, &URL)?)
    }

    /// The WAL is checkpointed by the store's own thread, which ends with
    /// the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_checkpoints_the_wal_and_ends_with_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("c.db").display());
        let typed = SqliteStore::open(&url).await.unwrap();
        let checkpointer = typed
            .inner
            .checkpointer
            .clone()
            .expect("a checkpoint thread");
        let store: Arc<dyn Store> = Arc::new(typed);
        let session = crate::Session::new(&store).await.unwrap();
        let mutex = crate::Mutex::new(&session, "checkpointed").unwrap();
        let calls_before = checkpointer.calls.load(Ordering::Relaxed);
        for _ in 0..CHECKPOINT_EVERY {
            mutex.lock().await.unwrap().release().await.unwrap();
        }
        // Two calls a cycle: the thread was told at least once.
        assert!(checkpointer.calls.load(Ordering::Relaxed) - calls_before >= CHECKPOINT_EVERY * 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while checkpointer.checkpoints.load(Ordering::Relaxed) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        session.close().await.unwrap();
        drop(mutex);
        drop(session);
        drop(store);
        // The thread let go of its handle: it ended.
        while Arc::strong_count(&checkpointer) > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the checkpoint thread outlived its store"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            parse("sqlite:///tmp/a.db").unwrap().0,
            PathBuf::from("/tmp/a.db")
        );
        assert_eq!(parse("sqlite://a.db").unwrap().0, PathBuf::from("a.db"));
        assert_eq!(parse("sqlite:///a.db?synchronous=full").unwrap().1, "FULL");
        assert!(parse("sqlite://").is_err());
        assert!(parse("sqlite:///a.db?synchronous=maybe").is_err());
        assert!(parse("sqlite:///a.db?bogus=1").is_err());
    }
}
