//! The SQL core. PostgreSQL and MySQL keep the same tables and run the
//! contract through server-side routines of the same names and answers
//! (`join`, `leave`, `look`, `set_value`, `refresh`, `evict`,
//! `evict_session`, `close`); all but talking to the server is written here
//! once, over [`SqlDriver`]: decoding answers, the queue read that settles
//! expired entries, waiting, wake-ups, and creating or upgrading the schema.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

use super::codec;
use super::poll::{self, Listeners, Look, Watch};
use crate::error::{Error, LostReason, Result};
use crate::store::{
    Capabilities, CellWrite, Entry, Expect, FenceOp, FenceState, JoinMode, JoinRequest, Joined,
    Name, OpenedSession, Queue, SessionKey, SessionSpec, Store, Versioned,
};

/// A value passed to a routine.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// Text.
    Text(&'a str),
    /// A whole number.
    Int(i64),
    /// Bytes.
    Bytes(&'a [u8]),
    /// A truth value.
    Flag(bool),
    /// SQL NULL.
    Null,
}

/// A value of a routine's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A whole number of any width.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A truth value.
    Flag(bool),
}

/// One row of an answer, read with typed errors that name the backend (a
/// schema changed under us is an error, never a panic).
#[derive(Debug, Clone)]
pub struct SqlRow {
    backend: &'static str,
    cells: Vec<Cell>,
}

impl SqlRow {
    /// A row of `backend`'s answer.
    pub fn new(backend: &'static str, cells: Vec<Cell>) -> SqlRow {
        SqlRow { backend, cells }
    }

    fn cell(&self, i: usize) -> Result<&Cell> {
        self.cells
            .get(i)
            .ok_or_else(|| Error::backend(self.backend, format!("an answer without column {i}")))
    }

    fn wrong(&self, i: usize, want: &str, got: &Cell) -> Error {
        Error::backend(
            self.backend,
            format!("column {i}: expected {want}, got {got:?}"),
        )
    }

    /// A whole number.
    pub fn int(&self, i: usize) -> Result<i64> {
        match self.cell(i)? {
            Cell::Int(v) => Ok(*v),
            other => Err(self.wrong(i, "a number", other)),
        }
    }

    /// A whole number or NULL.
    pub fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    /// Text.
    pub fn text(&self, i: usize) -> Result<String> {
        match self.cell(i)? {
            Cell::Text(v) => Ok(v.clone()),
            Cell::Bytes(v) => {
                String::from_utf8(v.clone()).map_err(|e| Error::backend(self.backend, e))
            }
            other => Err(self.wrong(i, "text", other)),
        }
    }

    /// Text, or `None` for NULL or a column the answer does not have (one
    /// an older schema's routine does not return).
    pub fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.cells.get(i) {
            None | Some(Cell::Null) => Ok(None),
            Some(_) => self.text(i).map(Some),
        }
    }

    /// Bytes (NULL reads as none).
    pub fn bytes(&self, i: usize) -> Result<Vec<u8>> {
        match self.cell(i)? {
            Cell::Bytes(v) => Ok(v.clone()),
            Cell::Text(v) => Ok(v.clone().into_bytes()),
            Cell::Null => Ok(Vec::new()),
            other => Err(self.wrong(i, "bytes", other)),
        }
    }

    /// Whether column `i` is there and true (a flag, or a number not 0).
    pub fn truthy(&self, i: usize) -> bool {
        matches!(self.cells.get(i), Some(Cell::Flag(true)))
            || matches!(self.cells.get(i), Some(Cell::Int(n)) if *n != 0)
    }

    /// Bytes or NULL.
    pub fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            _ => self.bytes(i).map(Some),
        }
    }

    /// A truth value (a number: not zero).
    pub fn flag(&self, i: usize) -> Result<bool> {
        match self.cell(i)? {
            Cell::Flag(v) => Ok(*v),
            Cell::Int(v) => Ok(*v != 0),
            other => Err(self.wrong(i, "a truth value", other)),
        }
    }

    fn count<T: TryFrom<i64>>(&self, i: usize) -> Result<T> {
        T::try_from(self.int(i)?)
            .map_err(|_| Error::backend(self.backend, format!("column {i} out of range")))
    }
}

/// What a SQL database must do for the core: run tenure's routines and a few
/// plain statements, one round trip each, and say how it wakes waiters.
#[async_trait]
pub trait SqlDriver: Send + Sync + fmt::Debug + 'static {
    /// The backend's name.
    fn backend(&self) -> &'static str;

    /// Records a new session of `ttl_ms`, by the server's clock.
    async fn open(&self, secret: &str, tag: &str, label: &str, ttl_ms: i64) -> Result<()>;

    /// Extends a live session by its TTL; `false` when there is none.
    async fn keep_alive(&self, secret: &str) -> Result<bool>;

    /// Calls one of tenure's routines; its first row. Deadlocks and
    /// serialization failures are retried.
    async fn call(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<SqlRow>;

    /// A one-statement answer to `routine` ("join" or "leave") for the
    /// common case — taking a name nobody holds or waits for, releasing a
    /// lone holder — or `None` when that case does not apply, and
    /// [`SqlDriver::call`] decides. Called only when
    /// [`SqlDriver::has_fast_paths`]. Also "still_queued" (secret, name,
    /// seq): a row when that entry waits, not granted, none otherwise; for
    /// a driver whose `join` says what a waiter's first look would.
    async fn fast(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<Option<SqlRow>> {
        let _ = (routine, args);
        Ok(None)
    }

    /// Whether [`SqlDriver::fast`] may answer (one more round trip when
    /// it does not).
    fn has_fast_paths(&self) -> bool {
        false
    }

    /// A name's entries in queue order — seq, kind, count, limit, tag,
    /// label, value, granted_ms, ms left, holds — and its version.
    async fn rows(&self, name: &str) -> Result<(Vec<SqlRow>, i64)>;

    /// The names with live entries that start with `prefix`, sorted.
    async fn names(&self, prefix: &str) -> Result<Vec<String>>;

    /// The names a session has entries in (to wake them after it ends).
    async fn names_of(&self, secret: &str) -> Result<Vec<String>>;

    /// The names the live session with the public tag `tag` has entries
    /// in (to wake them after it is evicted).
    async fn names_of_tag(&self, tag: &str) -> Result<Vec<String>>;

    /// What the server's announcement of the grant of `secret`'s entry
    /// `seq` carries as its proof, for a driver whose announcements anyone
    /// could send ([`poll::Listeners::announced`]); `None` for one that
    /// announces no grant.
    fn grant_proof(&self, secret: &str, seq: u64) -> Option<String> {
        let _ = (secret, seq);
        None
    }

    /// Before a wait, and before each look: make sure the server's
    /// notifications arrive, where it sends any (PostgreSQL's `LISTEN`).
    /// Returns whether they do; if not, waiters poll.
    async fn listen(&self) -> bool {
        false
    }

    /// Whether changes made here must wake this process's waiters by hand
    /// (a server that sends no notifications).
    fn wakes_by_hand(&self) -> bool;

    /// The shortest and longest poll, for a change no notification tells.
    fn poll_bounds(&self) -> (Duration, Duration);
}

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

/// When a one-statement take or release is worth trying: each try that does
/// not apply costs a round trip before the routine's call. Only hints: a
/// wrong one costs that round trip, or a routine's call where a statement
/// would have done; never a different answer. Kept per store (per
/// [`crate::open`]), not shared between stores of one process.
#[derive(Clone)]
pub(crate) struct FastHints {
    inner: Arc<std::sync::Mutex<FastHintsInner>>,
    /// Names on which a one-statement take changed nothing, lately.
    missed: poll::RecentKeys,
}

impl Default for FastHints {
    fn default() -> Self {
        Self {
            inner: Default::default(),
            missed: poll::RecentKeys::new(Self::MISS_HELD),
        }
    }
}

#[derive(Default)]
struct FastHintsInner {
    /// Entries this store holds, as far as it knows, in their name's row,
    /// by name (tokens): only those can be released by the statement (an
    /// entry granted from the queue is never moved into the row). By name,
    /// so that a routine's join forgets a name's holds without a walk over
    /// every name held.
    row_held: HashMap<String, Vec<u64>>,
}

impl FastHints {
    /// At most this many names' holds are kept; past it they are forgotten.
    const KEPT: usize = 4096;
    /// How long a name on which the statement missed goes to the routine
    /// directly: a try-lock of a held name pays one round trip, not two,
    /// and a take of it once free pays a routine's call.
    const MISS_HELD: Duration = Duration::from_secs(1);

    fn inner(&self) -> std::sync::MutexGuard<'_, FastHintsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_worth_trying(&self, name: &Name) -> bool {
        !self.missed.is_recent(name.as_str())
    }

    /// The one-statement take of `name` was tried and changed nothing.
    fn missed(&self, name: &Name) {
        self.missed.mark(name.as_str());
    }

    /// A join of `name` answered `joined`, by the statement (`by_statement`:
    /// a hold in the name's row) or by the routine. An exclusive hold the
    /// routine granted as the only hold is in the row too (the routine
    /// keeps a lone holder there), and the name was free: no miss to
    /// remember. (A shared or permit hold the routine granted may have
    /// others beside it: not counted as in the row.) A routine's join
    /// moves any row holder into the queue, so this store's other holds of
    /// the name are no longer in the row.
    fn joined(&self, name: &Name, kind: i16, joined: &Joined, by_statement: bool) {
        let mut inner = self.inner();
        if !by_statement {
            inner.row_held.remove(name.as_str());
        }
        if by_statement || (kind == 0 && joined.granted && joined.holds == 1) {
            self.missed.take(name.as_str());
            if inner.row_held.len() >= Self::KEPT {
                inner.row_held.clear();
            }
            let seqs = inner.row_held.entry(name.as_str().to_owned()).or_default();
            if !seqs.contains(&joined.seq) {
                seqs.push(joined.seq);
            }
        }
    }

    /// Whether the release of `name`'s entry `seq` is worth a statement
    /// (forgets the entry: a second release of a reentered hold goes to
    /// the routine).
    fn release_worth_trying(&self, name: &Name, seq: u64) -> bool {
        let mut inner = self.inner();
        let Some(seqs) = inner.row_held.get_mut(name.as_str()) else {
            return false;
        };
        let held = seqs
            .iter()
            .position(|s| *s == seq)
            .map(|i| seqs.swap_remove(i));
        if seqs.is_empty() {
            inner.row_held.remove(name.as_str());
        }
        held.is_some()
    }
}

impl<D: fmt::Debug> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.driver.fmt(f)
    }
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
/// [`OpenedSession::random`] (12 hex digits); one longer than MySQL's column
/// holds (32), or with a NUL (which PostgreSQL's text refuses), is nobody's,
/// and is answered without asking the server (which would fail on it).
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
    fn waited_for(&self, name: &Name) -> bool {
        self.listeners
            .any_with_prefix(&poll::grant_prefix(name.as_str()))
    }

    /// The driver, for one call to the database (counted).
    fn counted(&self) -> &D {
        self.round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.driver
    }

    fn status(&self, row: &SqlRow, name: &Name) -> Result<String> {
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
    fn register_status(&self, row: &SqlRow, name: &Name) -> Result<String> {
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

    fn cell_write(&self, row: &SqlRow, name: &Name) -> Result<CellWrite> {
        let current = row.opt_int(1)?.map(to_u64).transpose()?;
        let status = self.register_status(row, name)?;
        codec::cell_write(self.driver.backend(), Some(&status), current)
    }

    /// The blockers' fingerprint and TTL at columns `at` and `at + 1`, if any.
    fn watch_at(&self, row: &SqlRow, at: usize) -> Result<Option<Watch>> {
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
    fn changed(&self, name: &str) {
        if self.driver.wakes_by_hand() {
            self.listeners.wake(&poll::change_key(name));
        }
    }

    /// Wakes the first local waiter of `name` in queue order after a change
    /// made here: in FIFO order it is the one a release may have granted.
    /// Waiters behind it (several readers or permits granted at once) find
    /// out by polling; a herd of lookups would cost more than it saves.
    fn wake_next(&self, name: &str) {
        if self.driver.wakes_by_hand() {
            self.listeners.wake_first(&poll::grant_prefix(name));
            self.changed(name);
        }
    }

    /// An entry of a queue read; `None` for one whose session ended (the
    /// name needs a refresh). One that lapsed by the server's clock, which
    /// only a watcher can confirm expired, shows with no time left.
    fn entry(&self, row: &SqlRow) -> Result<Option<Entry>> {
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

#[async_trait]
impl<D: SqlDriver> Store for SqlStore<D> {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let label: String = spec.label.chars().take(255).collect();
        self.driver
            .open(opened.key.secret(), &opened.tag, &label, spec.ttl_ms())
            .await?;
        Ok(opened)
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        match self.counted().keep_alive(session.secret()).await? {
            true => Ok(()),
            false => Err(Error::SessionLost(LostReason::Expired)),
        }
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let names = if self.driver.wakes_by_hand() {
            self.counted().names_of(session.secret()).await?
        } else {
            Vec::new()
        };
        self.driver
            .call("close", &[Arg::Text(session.secret())])
            .await?;
        for name in names {
            self.wake_next(&name);
        }
        Ok(())
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let name = request.name;
        let (k, count, limit) = codec::kind_code(request.kind);
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(k.into()),
            Arg::Int(count),
            Arg::Int(limit),
            Arg::Bytes(request.value),
            Arg::Flag(request.mode == JoinMode::IfGranted),
        ];
        let mut confirmed = false;
        // A semaphore request larger than its limit is the routine's to
        // judge; a name someone here waits for is not free.
        let tried = self.driver.has_fast_paths()
            && count <= limit
            && !self.waited_for(name)
            && self.fast_hints.take_worth_trying(name);
        let fast = if tried {
            self.counted().fast("join", &args).await?
        } else {
            None
        };
        let by_statement = fast.is_some();
        if tried && !by_statement {
            self.fast_hints.missed(name);
        }
        let row = match fast {
            Some(row) => row,
            None => loop {
                let row = self.counted().call("join", &args).await?;
                if self.status(&row, name)? != "none" {
                    break row;
                }
                // A try-lock on a queue where nobody is alive by the server's
                // clock (holders and waiters): that clock alone is not trusted,
                // so watch them all for their TTL, end those none renewed, and
                // try once more.
                match self.watch_at(&row, 5)? {
                    Some(watch) if row.truthy(7) && !confirmed => {
                        confirmed = true;
                        let ended = poll::confirm_lapsed(&watch, || async {
                            let args = [Arg::Text(name.as_str()), Arg::Text(&watch.blockers)];
                            Ok(self.counted().call("expire", &args).await?.int(1)? > 0)
                        })
                        .await?;
                        if !ended {
                            return Ok(None);
                        }
                        self.wake_next(name.as_str());
                    }
                    _ => return Ok(None),
                }
            },
        };
        self.changed(name.as_str());
        let joined = Joined {
            seq: row.count(1)?,
            granted: row.flag(2)?,
            holds: row.count(3)?,
            first: row.flag(4)?,
        };
        if self.driver.has_fast_paths() {
            self.fast_hints.joined(name, k, &joined, by_statement);
        }
        // A queued entry's join may also say what a first look would
        // (PostgreSQL's and MySQL's, from schema 10: columns 8 and 9).
        if !joined.granted && row.cells.len() > 9 {
            if let Some(until) = row.opt_int(8)? {
                let wait = Look::Wait {
                    until: poll::next_expiry(Some(until)),
                    next: row.flag(9)?,
                    watch: self.watch_at(&row, 5)?,
                };
                self.joined.keep(name, joined.seq, wait);
            }
        }
        Ok(Some(joined))
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.joined.take(name, seq);
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
        ];
        // With a waiter here, the holder was moved into the queue; a hold
        // this store does not know to be in the row goes to the routine.
        let in_row = self.fast_hints.release_worth_trying(name, seq);
        let fast = if in_row && self.driver.has_fast_paths() && !self.waited_for(name) {
            self.counted().fast("leave", &args).await?
        } else {
            None
        };
        let row = match fast {
            Some(row) => row,
            None => self.counted().call("leave", &args).await?,
        };
        self.status(&row, name)?;
        let holds = row.count(1)?;
        if holds == 0 {
            // What the release granted, where the routine says (MySQL's):
            // committed, and nothing after the release's settling ends it,
            // so a waiter of this process takes it without a look.
            if let Some(granted) = row.opt_text(2)? {
                for seq in granted.split(',').filter(|s| !s.is_empty()) {
                    let seq = seq.parse::<u64>().map_err(|e| {
                        Error::backend(self.driver.backend(), format!("granted entry {seq:?}: {e}"))
                    })?;
                    self.listeners.granted(&poll::grant_key(name.as_str(), seq));
                }
            }
            // Whoever is next may be waiting in this process.
            self.wake_next(name.as_str());
        }
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let (listening, _) = self.listeners.listen(poll::grant_key(name.as_str(), seq));
        let listening = listening.in_line(poll::grant_prefix(name.as_str()));
        if let Some(proof) = self.driver.grant_proof(session.secret(), seq) {
            listening.expect_proof(proof);
        }
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
        ];
        let (min, max) = self.driver.poll_bounds();
        let pushed = || self.driver.listen();
        let args = &args;
        // The join said what a first look would: once this waiter listens
        // (notifications arrive), only check that its entry was not granted
        // before, with a plain read.
        // Where nothing is pushed (MySQL), a release of this process
        // announces its grants, and the announcement is kept for a waiter
        // that listens late; anything else is found by polling, as after a
        // look: the answer stands in without a check.
        let first = self.joined.take(name, seq).map(|joined| {
            let heard_here = self.driver.wakes_by_hand();
            let still_queued = move || async move {
                let row = self.counted().fast("still_queued", &args[..3]).await?;
                Ok(row.is_some())
            };
            let joined = if heard_here {
                joined.without_push()
            } else {
                joined
            };
            (joined, still_queued)
        });
        poll::until_granted(
            &listening,
            min,
            max,
            pushed,
            |confirm| async move {
                let mut args = args.to_vec();
                args.push(confirm.as_deref().map_or(Arg::Null, Arg::Text));
                let row = self.counted().call("look", &args).await?;
                if confirm.is_some() {
                    // Confirmed blockers were ended: others may be next.
                    self.wake_next(name.as_str());
                }
                Ok(match self.status(&row, name)?.as_str() {
                    "granted" => Look::Granted,
                    _ => Look::Wait {
                        until: poll::next_expiry(row.opt_int(1)?),
                        next: row.flag(2)?,
                        watch: self.watch_at(&row, 3)?,
                    },
                })
            },
            first,
        )
        .await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let args = [
            Arg::Text(key.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
            Arg::Bytes(value),
        ];
        let row = self.counted().call("set_value", &args).await?;
        self.status(&row, name)?;
        self.changed(name.as_str());
        Ok(())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        loop {
            let (rows, version) = self.counted().rows(name.as_str()).await?;
            let mut entries = Vec::with_capacity(rows.len());
            let mut stale = false;
            for row in &rows {
                match self.entry(row)? {
                    Some(entry) => entries.push(entry),
                    None => stale = true,
                }
            }
            // An expired entry, or one the rules grant that the store has
            // not stamped: settle the name (ending expired sessions for
            // good) before anyone reads a grant from it.
            if stale || poll::has_unstamped_grant(&entries) {
                self.driver
                    .call("refresh", &[Arg::Text(name.as_str())])
                    .await?;
                self.wake_next(name.as_str());
                continue;
            }
            return Ok(Queue {
                version: u64::try_from(version)
                    .map_err(|e| Error::backend(self.driver.backend(), e))?,
                entries,
            });
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let (listening, _) = self.listeners.listen(poll::change_key(name.as_str()));
        let (min, max) = self.driver.poll_bounds();
        let pushed = || self.driver.listen();
        poll::until_changed(self, name, version, listening.notify(), min, max, pushed).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.driver
            .names(prefix)
            .await?
            .into_iter()
            .map(Name::new)
            .collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let row = self
            .driver
            .call("evict", &[Arg::Text(name.as_str())])
            .await?;
        self.wake_next(name.as_str());
        // Like every routine: a status, then the answer (sessions ended).
        let n = row.int(1)?;
        usize::try_from(n).map_err(|e| Error::backend(self.driver.backend(), e))
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        if !storable_tag(tag) {
            return Ok(false);
        }
        // As on close: the names to wake here are read first, since the
        // routine takes the session's entries away.
        let names = if self.driver.wakes_by_hand() {
            self.counted().names_of_tag(tag).await?
        } else {
            Vec::new()
        };
        let row = self.driver.call("evict_session", &[Arg::Text(tag)]).await?;
        // A status, then whether a live session had that tag.
        let ended = row.flag(1)?;
        if ended {
            for name in names {
                self.wake_next(&name);
            }
        }
        Ok(ended)
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let (token, value) = match op {
            FenceOp::Read => (Arg::Null, Arg::Null),
            FenceOp::Admit { token, value } => (
                Arg::Int(int_arg("fencing token", token)?),
                value.map_or(Arg::Null, Arg::Bytes),
            ),
        };
        let row = self
            .counted()
            .call("fence", &[Arg::Text(name.as_str()), token, value])
            .await?;
        let status = self.register_status(&row, name)?;
        Ok(FenceState {
            admitted: status == "ok",
            highest: to_u64(row.int(1)?)?,
            value: row.opt_bytes(2)?,
        })
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let row = self
            .counted()
            .call("cell_get", &[Arg::Text(name.as_str())])
            .await?;
        self.register_status(&row, name)?;
        match (row.opt_int(1)?, row.opt_bytes(2)?) {
            (Some(version), Some(value)) => Ok(Some(Versioned {
                value,
                version: to_u64(version)?,
            })),
            _ => Ok(None),
        }
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let expect = match expect {
            Expect::Absent => 0,
            Expect::Version(v) => int_arg("version", v)?,
        };
        let args = [
            Arg::Text(name.as_str()),
            Arg::Bytes(value),
            Arg::Int(expect),
            owner.map_or(Arg::Null, |k| Arg::Text(k.secret())),
        ];
        let row = self.counted().call("cell_put", &args).await?;
        self.cell_write(&row, name)
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let args = [
            Arg::Text(name.as_str()),
            Arg::Int(int_arg("version", version)?),
        ];
        let row = self.counted().call("cell_delete", &args).await?;
        self.cell_write(&row, name)
    }
}

/// How a database keeps its schema, for [`ensure_schema`].
#[async_trait]
pub trait SqlSchema: Send + Sync {
    /// The schema version recorded, or `None` before the first user.
    async fn stored_version(&mut self) -> Result<Option<String>>;
    /// Takes the lock that serializes schema work among first users.
    async fn lock(&mut self) -> Result<()>;
    /// Creates the tables and routines (an upgrade rewrites them) and
    /// records `version`, under the lock.
    async fn apply(&mut self, version: &str) -> Result<()>;
    /// Gives the lock back (committing what `apply` did).
    async fn unlock(&mut self) -> Result<()>;
}

/// Creates the schema once, or upgrades one of a version in `upgrades_from`,
/// under a lock so that concurrent first users do not race. A newer schema
/// is never rewritten: it is an [`Error::SchemaMismatch`], as is any other.
pub(crate) async fn ensure_schema(
    schema: &mut dyn SqlSchema,
    version: &str,
    upgrades_from: &[&str],
    mismatch: impl Fn(&str) -> Error,
) -> Result<()> {
    let current = |v: &Option<String>| match v {
        Some(v) if v == version => Ok(true),
        Some(v) if upgrades_from.contains(&v.as_str()) => Ok(false),
        Some(v) => Err(mismatch(v)),
        None => Ok(false),
    };
    if current(&schema.stored_version().await?)? {
        return Ok(());
    }
    schema.lock().await?;
    let result = async {
        // Read again under the lock: another user may have just done it.
        if !current(&schema.stored_version().await?)? {
            schema.apply(version).await?;
        }
        Ok(())
    }
    .await;
    let unlocked = schema.unlock().await;
    result.and(unlocked)?;
    match schema.stored_version().await? {
        Some(v) if v == version => Ok(()),
        other => Err(mismatch(other.as_deref().unwrap_or("none"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_no_store_could_hold_are_nobodys() {
        assert!(storable_tag("0123456789ab"));
        assert!(storable_tag("x'; DROP TABLE sessions; --"));
        assert!(storable_tag(""));
        assert!(!storable_tag(&"a".repeat(33)));
        assert!(!storable_tag("ab\0cd"));
    }

    #[test]
    fn rows_read_with_typed_errors() {
        let row = SqlRow::new(
            "t",
            vec![
                Cell::Int(7),
                Cell::Flag(true),
                Cell::Null,
                Cell::Text("x".into()),
                Cell::Bytes(b"v".to_vec()),
            ],
        );
        assert_eq!(row.int(0).unwrap(), 7);
        assert!(row.flag(1).unwrap() && row.flag(0).unwrap());
        assert_eq!(row.opt_int(2).unwrap(), None);
        assert_eq!(row.text(3).unwrap(), "x");
        assert_eq!(row.bytes(4).unwrap(), b"v");
        assert_eq!(row.bytes(2).unwrap(), b"");
        assert!(row.int(3).is_err());
        assert!(row.int(9).is_err());
        assert!(row.count::<u32>(0).is_ok());
        assert!(SqlRow::new("t", vec![Cell::Int(-1)])
            .count::<u32>(0)
            .is_err());
        assert!(row
            .int(9)
            .unwrap_err()
            .to_string()
            .contains("t store error"));
    }
}
