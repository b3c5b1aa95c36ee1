//! The backend contract: one trait every store implements.
//!
//! Each name holds an ordered queue of entries. An entry belongs to one
//! session and lives as long as that session does. Its `seq`, handed out by the
//! store in arrival order and never reused for the name, is the fencing token.
//! Whether an entry is granted is a pure function of the queue
//! (`queue::grants`, in the module beside this one): the recipes (mutex, election, …) are written
//! once over these operations.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{Error, Result};

/// The longest name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// A validated lock, election or semaphore name: 1 to 255 bytes of UTF-8 with
/// no control characters (so no NUL), not ending in a space.
///
/// A name means the same lock on every store, compared byte for byte. The
/// one exception would be MySQL and MariaDB, whose collation pads with
/// spaces (`"x"` and `"x "` are one key there): names that end in a space
/// are refused everywhere instead, the same way on every store.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<str>);

impl Name {
    /// Checks and wraps a name.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(tenure::Name::new("nightly-report").is_ok());
    /// assert!(tenure::Name::new("").is_err());
    /// assert!(tenure::Name::new("a\0b").is_err());
    /// assert!(tenure::Name::new("x ").is_err());
    /// ```
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.ends_with(' ') {
            return Err(Error::InvalidName {
                name: shorten(name),
                reason: "a name must not end in a space (MySQL and MariaDB would take it \
                         for the name without the space)",
            });
        }
        Name::stored(name)
    }

    /// A name read back from the store: checked by the rules of
    /// [`Name::new`] but the last, since a build from before that rule may
    /// have written a name that ends in a space, and it must still be
    /// listed, shown and released.
    pub(crate) fn stored(name: &str) -> Result<Self> {
        let reason = if name.is_empty() {
            Some("a name must not be empty")
        } else if name.len() > MAX_NAME_LEN {
            Some("a name must be at most 255 bytes")
        } else if name.chars().any(char::is_control) {
            Some("a name must not contain control characters such as NUL or newline")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidName {
                name: shorten(name),
                reason,
            }),
            None => Ok(Name(Arc::from(name))),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name's shared string (a metric label takes it without a copy).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn shared(&self) -> &Arc<str> {
        &self.0
    }
}

fn shorten(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    if escaped.chars().count() > 64 {
        let head: String = escaped.chars().take(64).collect();
        format!("{head}…")
    } else {
        escaped
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for Name {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        Name::new(s)
    }
}

/// The secret that identifies a session to its store. Only the session's owner
/// knows it; it never appears in `Debug`, `Display`, logs or query results.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(Arc<str>);

impl SessionKey {
    /// Wraps a secret made by a backend.
    pub fn new(secret: impl Into<Arc<str>>) -> Self {
        SessionKey(secret.into())
    }

    /// A new random secret (128 bits from the OS, as hex).
    pub fn random() -> Result<Self> {
        Ok(SessionKey(Arc::from(random_hex(16)?)))
    }

    /// The secret itself, for a backend to send to its store.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(***)")
    }
}

/// `bytes` random bytes from the OS as lowercase hex: session secrets, public
/// tags and nonces.
pub fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::backend("os", format!("no randomness for a session secret: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// What a new session asks of the store.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// How long the store keeps the session after the last keep-alive.
    pub ttl: Duration,
    /// A public, human-readable label (host and pid by default), shown by
    /// `tenure status`. Not a secret and not an identity.
    pub label: String,
}

impl SessionSpec {
    /// The TTL in whole milliseconds, as stores count it.
    pub fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A session the store has opened.
#[derive(Debug, Clone)]
pub struct OpenedSession {
    /// The secret key that authorizes every later operation of the session.
    pub key: SessionKey,
    /// A public identifier of the session, shown to others in queue entries.
    pub tag: String,
}

impl OpenedSession {
    /// A new random secret (128 bits) and public tag (48 bits), for a store
    /// to record.
    pub fn random() -> Result<OpenedSession> {
        Ok(OpenedSession {
            key: SessionKey::random()?,
            tag: random_hex(6)?,
        })
    }
}

/// The release of tenure and the store format a session's process speaks,
/// as the session recorded it when it opened (see
/// [`Store::session_builds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// The release of tenure, such as `0.2.0`.
    pub release: String,
    /// The version of what that build keeps in the store
    /// ([`Backend::format`](crate::Backend::format)).
    pub format: String,
}

impl Build {
    /// This build of tenure, speaking `format`.
    pub fn this(format: &str) -> Build {
        Build {
            release: env!("CARGO_PKG_VERSION").to_string(),
            format: format.to_string(),
        }
    }

    /// As a store keeps it: `RELEASE FORMAT`.
    pub fn encode(&self) -> String {
        format!("{} {}", self.release, self.format)
    }

    /// Back from [`Build::encode`]'s form; `None` for anything else.
    pub fn decode(text: &str) -> Option<Build> {
        let (release, format) = text.split_once(' ')?;
        (!release.is_empty() && !format.is_empty() && !format.contains(' ')).then(|| Build {
            release: release.to_string(),
            format: format.to_string(),
        })
    }
}

/// A session the store has not ended, with the build that opened it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionBuild {
    /// Its public tag ([`Entry::session_tag`]).
    pub tag: String,
    /// Its label ([`SessionSpec::label`]).
    pub label: String,
    /// What it recorded when it opened; `None` for a session that recorded
    /// nothing: a build of release 0.1.0, which records no build.
    pub build: Option<Build>,
}

impl SessionBuild {
    /// A session's record, for a store to return.
    pub fn new(tag: String, label: String, build: Option<Build>) -> SessionBuild {
        SessionBuild { tag, label, build }
    }

    /// Records as stores keep them (tag, label, [`Build::encode`]'s text or
    /// none), in tag order.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn listed(
        records: impl IntoIterator<Item = (String, String, Option<String>)>,
    ) -> Vec<SessionBuild> {
        let mut all: Vec<SessionBuild> = records
            .into_iter()
            .map(|(tag, label, build)| {
                SessionBuild::new(tag, label, build.as_deref().and_then(Build::decode))
            })
            .collect();
        all.sort_by(|a, b| a.tag.cmp(&b.tag));
        all
    }
}

/// What an entry asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// Granted when it is first in the queue (mutex, write lock, leadership).
    Exclusive,
    /// Granted when no exclusive entry is ahead of it (read lock).
    Shared,
    /// Granted when every entry ahead is granted and all their permits plus
    /// its own fit in `limit` (semaphore).
    Permits {
        /// How many permits this entry takes.
        count: u32,
        /// How many permits the semaphore has in all.
        limit: u32,
    },
}

/// Whether [`Store::join`] may leave a waiting entry behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinMode {
    /// Queue up; the caller then waits with [`Store::await_grant`].
    Wait,
    /// Only if granted at once; otherwise change nothing and report so.
    IfGranted,
}

/// What [`Store::join`] asks for: an entry of `kind` with `value` at the end
/// of `name`'s queue.
#[derive(Debug, Clone, Copy)]
pub struct JoinRequest<'a> {
    /// The queue.
    pub name: &'a Name,
    /// What the entry asks for. Its own sense (permits within the limit) is
    /// checked before the store is called; its fit with the queue is the
    /// store's to check.
    pub kind: EntryKind,
    /// The entry's first value (an election's leader value).
    pub value: &'a [u8],
    /// Whether a waiting entry may be left behind.
    pub mode: JoinMode,
    /// A hint for [`JoinMode::IfGranted`]: the caller has reason to think
    /// the name free (it has just read it so, or it takes a non-fair lock,
    /// which nobody holds most of the time). A store that reads before a
    /// try, to spare a write that a refusal would undo, may skip that
    /// read. It never changes the answer.
    pub likely_free: bool,
}

/// The answer to [`Store::join`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// The entry's sequence number: its place in the queue and its fencing token.
    pub seq: u64,
    /// Whether the entry is granted now.
    pub granted: bool,
    /// How many times the session now holds this entry (1 on a first join).
    pub holds: u32,
    /// Whether this is the first entry the name has ever had, as far as the
    /// store remembers: nobody held or waited on it before. A per-tick
    /// schedule runs a tick only on such a claim.
    pub first: bool,
}

/// One entry of a queue, as anyone may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Sequence number and fencing token.
    pub seq: u64,
    /// What it asks for.
    pub kind: EntryKind,
    /// The public tag of the session that owns it.
    pub session_tag: String,
    /// The owning session's label.
    pub label: String,
    /// The entry's value (an election's leader value).
    pub value: Vec<u8>,
    /// Whether it is granted.
    pub granted: bool,
    /// When the store first saw it granted, by the store's clock, if known.
    pub granted_at: Option<SystemTime>,
    /// How long until the owning session expires unless renewed, by the
    /// store's clock; zero where the store does not tell
    /// ([`Capabilities::expiry_times`]).
    pub expires_in: Duration,
    /// How many times its session holds it.
    pub holds: u32,
}

/// A name's queue in order, at one version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Queue {
    /// A number that changes whenever the queue changes (entries joining,
    /// leaving or expiring, grants, values); for [`Store::wait_changed`].
    /// A reentrant entry's hold count ([`Entry::holds`]) is not versioned:
    /// taking or giving back an inner hold changes nobody else's view.
    pub version: u64,
    /// Live entries in queue order (expired sessions' entries left out).
    pub entries: Vec<Entry>,
}

/// The largest value a [`Cell`](crate::Cell) or a [`Fence`](crate::Fence)
/// keeps, in bytes: small enough for every store's request limit (the
/// smallest, a consensus store's, is 1 MiB; a Redis or SQL row takes far
/// more).
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// Checks a value a fence or a cell is to keep: 1 to [`MAX_VALUE_LEN`]
/// bytes, else [`Error::InvalidArgument`] (the CLI checks with this before it
/// opens a store).
pub fn check_value(value: &[u8]) -> Result<()> {
    if value.is_empty() {
        return Err(Error::InvalidArgument {
            what: "value",
            reason: "a value must not be empty (delete the cell instead)".into(),
        });
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::InvalidArgument {
            what: "value",
            reason: format!(
                "{} bytes is more than the {MAX_VALUE_LEN} bytes a value may have",
                value.len()
            ),
        });
    }
    Ok(())
}

/// What [`Store::fence`] is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOp<'a> {
    /// Read the highest token admitted and the value, changing nothing.
    Read,
    /// Admit `token` if it is at least the highest admitted, recording it as
    /// the highest; with `value`, also replace the fence's value. A lower
    /// token changes nothing.
    Admit {
        /// The token presented (at least 1).
        token: u64,
        /// A value to write through the fence, if any.
        value: Option<&'a [u8]>,
    },
}

/// A fence after [`Store::fence`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FenceState {
    /// Whether the token was admitted (always true for [`FenceOp::Read`]).
    pub admitted: bool,
    /// The highest token the fence has admitted (0 for a fence never used).
    pub highest: u64,
    /// The value last written through the fence, if any.
    pub value: Option<Vec<u8>>,
}

/// What a [`Cell`](crate::Cell) write expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expect {
    /// No value: the cell was never written, was deleted, or its session
    /// ended.
    Absent,
    /// The value at exactly this version.
    Version(u64),
}

/// A cell's value and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The value.
    pub value: Vec<u8>,
    /// Its version: it grows with every write and delete of the cell and is
    /// never reused for the name (it need not grow by one).
    pub version: u64,
}

/// The answer to a conditional cell write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellWrite {
    /// Done; the cell's new version (for a delete, the version the next
    /// write will exceed).
    Done(u64),
    /// Nothing changed: the cell is not as expected. Its current version,
    /// or `None` when it has no value.
    Mismatch(Option<u64>),
}

/// How waiters learn that their entry is granted.
///
/// On every backend a waiter also wakes at the one expiry that could change
/// its turn without a release (the holders' first expiry for the next in
/// line, the expiry of the entry just ahead for the others), so a holder
/// that dies silently is noticed at its expiry; that wake-up is not polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wake {
    /// A release wakes the next waiter only.
    NextOnly,
    /// Waiters in this process are woken directly (next waiter only). For
    /// changes made by other processes, only the next in line and the first
    /// waiter of each name in each process poll, with a backoff from `min` to
    /// `max`; the others wait for a local wake-up. So the polls a process
    /// makes grow with the names it waits on, not with its waiters.
    LocalOrPoll {
        /// First poll interval.
        min: Duration,
        /// Largest poll interval.
        max: Duration,
    },
    /// A release wakes the next waiter only, through a notification the store
    /// sends, and no waiter polls. Only while the notification connection is
    /// down (it is re-opened at once, then at most once a second) do waiters
    /// poll, as for [`Wake::LocalOrPoll`], at most every `fallback_poll`.
    PubSub {
        /// Largest poll interval while notifications are down.
        fallback_poll: Duration,
    },
}

impl Wake {
    /// [`Wake::LocalOrPoll`] from `min` to `max`.
    pub const fn local_or_poll(min: Duration, max: Duration) -> Wake {
        Wake::LocalOrPoll { min, max }
    }

    /// [`Wake::PubSub`], polling at most every `fallback_poll`.
    pub const fn pub_sub(fallback_poll: Duration) -> Wake {
        Wake::PubSub { fallback_poll }
    }
}

/// What a backend can do: plain data, shown by `tenure backends` and used to
/// pick which conformance checks apply.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's name, as in its URL scheme.
    pub backend: &'static str,
    /// Fencing tokens with every grant, increasing per name.
    pub fencing: bool,
    /// Tokens and queues survive closing and reopening the store.
    pub durable: bool,
    /// Several OS processes can share the store.
    pub multi_process: bool,
    /// Waiters are granted in arrival order.
    pub fifo: bool,
    /// Shared (read) entries.
    pub shared: bool,
    /// Permit entries (semaphores).
    pub permits: bool,
    /// How waiters are woken.
    pub wake: Wake,
    /// The clock that judges expiry.
    pub clock: &'static str,
    /// Shortest session TTL.
    pub min_ttl: Duration,
    /// Longest session TTL.
    pub max_ttl: Duration,
    /// Entries say when they were granted, by the store's clock
    /// ([`Entry::granted_at`]; an election's `Leader::since`).
    pub grant_times: bool,
    /// Entries say how long their session has left ([`Entry::expires_in`]).
    /// Where false (a store that keeps a session's deadline to its servers),
    /// `expires_in` is zero and means "not known", not "expiring".
    pub expiry_times: bool,
    /// [`Joined::first`] is exact: the first claim of a name is told so even
    /// when several race for it, so a per-tick schedule runs every tick that
    /// an instance claims in time. Where false (over independent nodes, a
    /// claim undone after a split vote uses up a node's "never used" mark),
    /// a tick may be skipped — never run twice.
    pub exact_first: bool,
    /// Store round trips (or statements, for SQL) for an uncontended
    /// acquire and for a release.
    pub round_trips: &'static str,
    /// Another session's lease ends only once a client that watched it saw
    /// it unrenewed for its TTL on its own monotonic clock, and the store
    /// confirms it did not renew since (the store's own clock is a server's
    /// wall clock, which steps, so it only hints): an entry whose lease
    /// lapsed by the store's clock stays in [`Store::queue`], with no time
    /// left, until then.
    pub watched_expiry: bool,
    /// Fences ([`Store::fence`]): a token check kept by the store.
    pub fences: bool,
    /// Values written through a fence ([`FenceOp::Admit`] with a value).
    pub fence_values: bool,
    /// Cells ([`Store::cell_get`] and the others): values with versions,
    /// written by compare-and-set.
    pub cells: bool,
    /// How long a non-fair waiter may be passed over
    /// ([`Mutex::fair`](crate::Mutex::fair)`(false)`): counted from its first
    /// try, after this it takes a place in the name's queue, granted before
    /// any later try. Each store states about one and a half times the
    /// longest wait of 16 fair contenders on it in the cycle bench: a
    /// waiter is passed over for about as long as the fair lock would keep
    /// it waiting.
    pub barging_bound: Duration,
    /// How long one store call takes, at most, to fail with
    /// [`Error::Unavailable`] when the server stops answering, retries
    /// included: an open, a join, a release, a renewal, a close, a cell or
    /// fence operation. (A wait for another holder is not one call: it
    /// ends when the session is lost, within its TTL.)
    pub call_deadline: Duration,
}

impl Capabilities {
    /// What most stores can do: fencing, durable, shared by processes on
    /// several machines, FIFO, shared entries and permits, grant times, TTLs
    /// from 100 ms to 7 days, waiters woken one at a time. A backend states
    /// how it differs.
    pub const fn durable_store(
        backend: &'static str,
        clock: &'static str,
        round_trips: &'static str,
    ) -> Capabilities {
        Capabilities {
            backend,
            fencing: true,
            durable: true,
            multi_process: true,
            fifo: true,
            shared: true,
            permits: true,
            wake: Wake::NextOnly,
            clock,
            min_ttl: Duration::from_millis(100),
            max_ttl: Duration::from_secs(7 * 24 * 3600),
            grant_times: true,
            expiry_times: true,
            exact_first: true,
            round_trips,
            watched_expiry: false,
            fences: true,
            fence_values: true,
            cells: true,
            barging_bound: Duration::from_millis(20),
            call_deadline: Duration::from_secs(5),
        }
    }
}

/// The backend contract.
///
/// Every method that takes a [`SessionKey`] fails with
/// [`Error::SessionLost`] when the store no longer has that session (expired,
/// closed or evicted). Methods that touch an entry the session does not have
/// fail with [`Error::NotHeld`]. Expiry is judged by the store's own clock,
/// or where that is a wall clock that steps
/// ([`Capabilities::watched_expiry`]), by a watching client's monotonic
/// clock, which the store confirms.
///
/// Unless a method says otherwise, it is *not* cancel safe: a future dropped
/// before it completes may or may not have taken effect in the store. The
/// recipes make their calls cancel safe by finishing them in a spawned task.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// What this backend can do.
    fn capabilities(&self) -> &Capabilities;

    /// Opens a session that lives `spec.ttl` past its last keep-alive.
    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession>;

    /// Extends the session to `ttl` from now, by the store's clock. Fails with
    /// [`Error::SessionLost`] if it has already expired: an expired session
    /// is never revived.
    async fn keep_alive(&self, session: &SessionKey) -> Result<()>;

    /// Ends the session and removes all of its entries at once. Closing a
    /// session that is already gone succeeds.
    async fn close_session(&self, session: &SessionKey) -> Result<()>;

    /// Adds an entry of `kind` for the session at the end of `name`'s queue
    /// with the next sequence number.
    ///
    /// If the session already has an entry in this queue, that entry is reused
    /// (its hold count goes up by one and its seq stays), which makes locks
    /// reentrant per session; the kind must then match, else
    /// [`Error::Conflict`]. With [`JoinMode::IfGranted`] nothing changes
    /// unless the entry is granted at once, and `Ok(None)` says so.
    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>>;

    /// Drops one hold of the session's entry `seq`; the entry leaves the queue
    /// when its hold count reaches zero. Returns the remaining hold count.
    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32>;

    /// Resolves when the session's entry `seq` is granted. Fails with
    /// [`Error::NotHeld`] if the entry is gone and with
    /// [`Error::SessionLost`] if the session is.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits, and dropping it leaves the entry queued.
    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()>;

    /// Replaces the value of the session's entry `seq`, which must be granted
    /// (an election's proclaim); else [`Error::NotHeld`].
    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()>;

    /// Reads `name`'s live queue.
    async fn queue(&self, name: &Name) -> Result<Queue>;

    /// Resolves with the new version once `name`'s queue differs from
    /// `version` (including changes through expiry; hold counts aside, see
    /// [`Queue::version`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64>;

    /// The names that have live entries, sorted, that start with `prefix`.
    async fn names(&self, prefix: &str) -> Result<Vec<Name>>;

    /// Ends every session that holds a granted entry of `name` (an
    /// administrator's forced release). Returns how many sessions were ended.
    async fn evict(&self, name: &Name) -> Result<usize>;

    /// Ends the one session whose public tag ([`Entry::session_tag`]) is
    /// `tag` — an administrator's "end this session": all its entries (held
    /// or waiting, on every name) and the cells bound to it go at once, as
    /// on [`Store::close_session`], and its owner learns at its next
    /// keep-alive that it was evicted. Returns whether a session with that
    /// tag was there to end; an unknown tag changes nothing. Every built-in
    /// backend does it; a store that cannot says [`Error::Unsupported`].
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let _ = tag;
        Err(unsupported(self, "ending one session"))
    }

    /// Every session the store has not ended — a lease that lapsed but whose
    /// end the store has not confirmed yet counts — with the build and
    /// format it recorded when it opened (each built-in backend records
    /// them in [`Store::open_session`], beside what older builds read).
    /// `tenure status` shows which builds use the store from it. A store
    /// that cannot list them says [`Error::Unsupported`].
    async fn session_builds(&self) -> Result<Vec<SessionBuild>> {
        Err(unsupported(self, "listing the builds of its sessions"))
    }

    /// Retires the formats older than this build's (the second half of
    /// finishing an upgrade, after [`crate::upgrade::finish`] found no
    /// session of an older build): marks the store so that builds of older
    /// releases refuse it from their next connection on, and removes what
    /// only they used. Returns what it changed, in words. A store with
    /// nothing to retire returns nothing.
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        Err(unsupported(self, "finishing an upgrade"))
    }

    /// Declares the store new, before its first use: nothing was ever held
    /// on it. A store that can lose everything it held and come back empty
    /// (Redis restarted without persistence, or failed over to a replica
    /// that had none of it) cannot tell such a loss from a new store, so it
    /// grants nothing on an empty keyspace until the longest lease it allows
    /// has lapsed ([`Capabilities::max_ttl`]); this skips that wait, once,
    /// for a store an operator knows is new. Refused with
    /// [`Error::InvalidArgument`] while any session lives on the store.
    /// Returns what it changed, in words; a store that never forgets has
    /// nothing to do and returns nothing.
    async fn declare_new(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Reads the fence `name`, or admits a token through it, in one atomic
    /// step: a token at least the highest admitted is admitted and becomes
    /// the highest (with its value, if one is given); a lower one changes
    /// nothing and the answer says so. Fences and cells share one namespace,
    /// apart from the queues': a cell's name is [`Error::Conflict`].
    /// The token and value are checked before the store is called.
    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let _ = (name, op);
        Err(unsupported(self, "fences"))
    }

    /// Reads the cell `name`: its value and version, or `None` when it has
    /// no value (never written, deleted, or its session ended). A fence's
    /// name is [`Error::Conflict`].
    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let _ = name;
        Err(unsupported(self, "cells"))
    }

    /// Writes `value` to the cell `name` if it is as `expect`ed, atomically.
    /// With `owner`, the value lives only as long as that session (fails
    /// with [`Error::SessionLost`] if it is gone); without, until deleted.
    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let _ = (name, value, expect, owner);
        Err(unsupported(self, "cells"))
    }

    /// Deletes the cell's value if it is at `version`, atomically.
    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let _ = (name, version);
        Err(unsupported(self, "cells"))
    }
}

/// A fence used as a cell or the other way round: `is` and `asked` are "a
/// fence" or "a cell".
pub(crate) fn kind_conflict(name: &Name, is: &str, asked: &str) -> Error {
    Error::Conflict {
        name: name.to_string(),
        reason: format!("it is {is}, not {asked}"),
    }
}

/// [`Error::Unsupported`] for `what` on `store`'s backend.
fn unsupported<S: Store + ?Sized>(store: &S, what: &'static str) -> Error {
    Error::Unsupported {
        backend: store.capabilities().backend,
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(Name::new("a").is_ok());
        assert!(Name::new("x'); DROP TABLE --").is_ok());
        assert!(Name::new("").is_err());
        assert!(Name::new("a\nb").is_err());
        assert!(Name::new("é".repeat(127)).is_ok());
        assert!(Name::new("é".repeat(128)).is_err());
        let long = "x".repeat(10_000);
        let err = Name::new(&long).unwrap_err().to_string();
        assert!(err.len() < 200, "{err}");
    }
}
