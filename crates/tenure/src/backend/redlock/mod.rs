//! `redlock://[:password@]host:port,host:port,host:port[/db][?prefix=NAME&node_timeout=250ms]`
//! (`redlocks://` for TLS, with `tls_ca=PATH` as for `rediss://`):
//! Redlock over N independent Redis nodes (N odd, 3 to 15), with fencing
//! tokens and a fair queue.
//!
//! Every node runs the Redis backend's own script on its own copy of the
//! queues. An entry's seq is *proposed* by the client and is the same on
//! every node; a node takes it only if it is above every seq that node has
//! seen for the name, else it answers with that highest seq and the client
//! proposes again. So every node's queue is in seq order, and:
//!
//! - an entry counts as queued once a majority of nodes took it (else it is
//!   removed everywhere and proposed again), and as granted once a majority
//!   granted it. Two exclusive grants would need a node where both are
//!   first: impossible. Grants follow seq order, so the queue is FIFO.
//! - the seq is the fencing token. A later holder's majority overlaps an
//!   earlier holder's in at least one node, which saw the earlier seq
//!   before it took the later one: tokens strictly increase per name while
//!   a majority keeps its data. A node that lost its data (restarted empty)
//!   seeds its floor from its own `TIME` in microseconds, as the Redis
//!   backend does.
//! - the session lives on every node with the same secret. A renewal holds
//!   only when a majority confirms it *and* every entry of the session is
//!   still confirmed on a majority; a node that says the session is gone is
//!   never used for it again. The session's local deadline (send time of
//!   the last confirmed renewal + TTL − drift, drift = 1 % + 2 ms) is
//!   Redlock's validity time: `lost()` fires at it.
//! - a node that restarts empty must stay down for at least the longest TTL
//!   in use (Redlock's delayed restart), or a lock it forgot could be
//!   granted twice.
//!
//! Round trips: one per node, in parallel, for acquire (two when a node has
//! seen a seq above this client's clock, as after a clock step), release and
//! renewal.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::poll::Watch;
use super::redis::{NodeJoin, RedisStore};
use super::url::{mask_password, StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, Entry, EntryKind, FenceOp, FenceState, JoinMode, JoinRequest, Joined, Name,
    OpenedSession, Queue, SessionKey, SessionSpec, Store, Wake,
};

const BACKEND: &str = "redlock";
const MAX_NODES: usize = 15;
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a node that could not be reached is left alone before the next
/// connection attempt (calls meanwhile fail at once).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// Bound of one connection attempt to a node (TCP, TLS, AUTH, script load).
/// Operations stay bounded by the node timeout; see [`Node::get`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts to place an entry on a majority before giving up.
const PLACE_ATTEMPTS: u32 = 16;
/// Attempts of a try-lock whose votes split (granted on some nodes, but on
/// no majority) before it reports the lock taken.
const SPLIT_ATTEMPTS: u32 = 5;
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
/// Largest seq a node's script keeps exactly (a Lua number).
const MAX_SEQ: u64 = 1 << 53;
/// How far below a node's ceiling (its clock plus the µs ahead it takes) a
/// client aims once it has heard of one.
const AIM_BELOW_CEILING_US: i64 = 1_000_000;

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["prefix", "node_timeout", "tls_ca"]);

/// The Redlock backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        // Per-node admission cannot bound a count of three or more entries
        // (they need not share a node): no semaphores above one permit.
        permits: false,
        // A claim undone after a split vote uses up a node's "never used"
        // mark: a per-tick schedule may skip a tick (never run one twice).
        exact_first: false,
        // A value, or a compare-and-set, that every client reads alike needs
        // the nodes to agree on one order of writes: consensus, which
        // independent nodes do not have. A fence's admission is a maximum,
        // which a majority keeps without it.
        fence_values: false,
        cells: false,
        wake: Wake::pub_sub(POLL_MAX),
        min_ttl: Duration::from_millis(300),
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock, on each node (a majority must agree); the nodes' TIME only hints",
            "acquire: 1 per node in parallel (2 after a clock step), release: 1 per node, renew: 1 per node",
        )
    }
}

/// A set of nodes, one bit each.
type Mask = u16;

fn count(mask: Mask) -> usize {
    mask.count_ones() as usize
}

fn bit(i: usize) -> Mask {
    1 << i
}

/// One Redis node, connected on first use and again after a failure.
struct Node {
    /// The node's `redis://` URL; may hold the password: never shown.
    url: String,
    shown: String,
    store: std::sync::Mutex<Option<RedisStore>>,
    failed: super::poll::ReconnectGate,
    connecting: tokio::sync::Mutex<()>,
}

impl Node {
    /// The node's connection. Without one, a connection attempt bounded by
    /// [`CONNECT_TIMEOUT`] runs in a task of its own, so that a caller who
    /// stops waiting (an operation bounded by the shorter node timeout) does
    /// not cancel it: a slow handshake (TLS on a busy host) still completes
    /// and serves the next call.
    async fn get(self: &Arc<Self>, node_timeout: Duration) -> Result<RedisStore> {
        if let Some(store) = lock(&self.store).clone() {
            return Ok(store);
        }
        let node = Arc::clone(self);
        tokio::spawn(async move { node.connect(node_timeout).await })
            .await
            .unwrap_or_else(|e| Err(Error::backend(BACKEND, format!("connect task failed: {e}"))))
    }

    async fn connect(&self, node_timeout: Duration) -> Result<RedisStore> {
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(store) = lock(&self.store).clone() {
            return Ok(store);
        }
        if self.failed.failed_within(RECONNECT_AFTER) {
            return Err(Error::unavailable(
                BACKEND,
                format!("node {} was unreachable a moment ago", self.shown),
            ));
        }
        match RedisStore::open_node(&self.url, CONNECT_TIMEOUT, node_timeout).await {
            Ok(store) => {
                *lock(&self.store) = Some(store.clone());
                self.failed.succeeded();
                Ok(store)
            }
            Err(e) => {
                self.failed.failed();
                Err(e)
            }
        }
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where one of this store's sessions has an entry.
#[derive(Debug, Clone, Copy)]
struct Placement {
    seq: u64,
    nodes: Mask,
}

/// What this store knows of a session it opened.
#[derive(Default)]
struct SessionState {
    /// Nodes that said the session is gone there: never used for it again.
    dead: Mask,
    entries: HashMap<Name, Placement>,
    /// One join at a time, so that two tasks of the session joining one
    /// name agree on one entry.
    joining: Arc<tokio::sync::Mutex<()>>,
}

/// A store over N independent Redis nodes.
pub struct RedlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    majority: usize,
    all: Mask,
    node_timeout: Duration,
    url: String,
    caps: Capabilities,
    sessions: std::sync::Mutex<HashMap<SessionKey, SessionState>>,
    /// The last seq this store proposed, and how far ahead of this client's
    /// clock the nodes' seqs were seen to be.
    last_placed: AtomicU64,
    /// Added to this client's clock when it proposes: learned from the
    /// nodes' floors (up) and ceilings (down).
    offset: std::sync::atomic::AtomicI64,
    /// A test's shift of this client's clock.
    clock_ahead_us: std::sync::atomic::AtomicI64,
}

store_debug!(RedlockStore: url, majority);

/// Splits a `redlock://` URL into one `redis://` URL per node and the node
/// timeout.
fn parse_url(url: &StoreUrl) -> Result<(Vec<String>, Duration)> {
    // redlocks:// is Redlock over rediss:// (TLS) nodes.
    let node_scheme = if url.scheme() == "redlocks" {
        "rediss"
    } else {
        "redis"
    };
    let db = url.path().trim_start_matches('/');
    let db = if db.is_empty() { "0" } else { db };
    if db.parse::<u32>().is_err() {
        return Err(url.invalid(format!("database {db:?} is not a number")));
    }
    if url.option("tls_ca").is_some() && node_scheme != "rediss" {
        return Err(url.invalid("tls_ca=PATH goes with redlocks:// only"));
    }
    let node_timeout = match url.option("node_timeout") {
        None => DEFAULT_NODE_TIMEOUT,
        Some(v) => humantime::parse_duration(v)
            .ok()
            .filter(|d| !d.is_zero() && *d <= Duration::from_secs(60))
            .ok_or_else(|| {
                url.invalid(format!(
                    "node_timeout={v:?} is not a duration from 1ms to 60s"
                ))
            })?,
    };
    let nodes = url.servers("node")?;
    if nodes.len() < 3 || nodes.len() > MAX_NODES || nodes.len() % 2 == 0 {
        return Err(url.invalid(format!(
            "Redlock needs an odd number of nodes from 3 to {MAX_NODES}, got {}",
            nodes.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (host, port) in &nodes {
        if !seen.insert((host.to_ascii_lowercase(), *port)) {
            return Err(url.invalid(format!("node {host}:{port} is listed twice")));
        }
    }
    let user = url.userinfo_as_written();
    let query = url.driver_query(&["node_timeout"]);
    let urls = nodes
        .iter()
        .map(|(h, p)| format!("{node_scheme}://{user}{h}:{p}/{db}{query}"))
        .collect();
    Ok((urls, node_timeout))
}

/// How the nodes answered one operation.
#[derive(Default)]
struct Tally {
    ok: Mask,
    lost: Mask,
    not_held: Mask,
    failed: Mask,
    conflict: Option<Error>,
    failure: Option<Error>,
}

impl Tally {
    fn note<T>(&mut self, i: usize, result: Result<T>) -> Option<T> {
        match result {
            Ok(v) => {
                self.ok |= bit(i);
                return Some(v);
            }
            Err(Error::SessionLost(_)) => self.lost |= bit(i),
            Err(Error::NotHeld(_)) => self.not_held |= bit(i),
            Err(e @ Error::Conflict { .. }) => self.conflict = Some(e),
            Err(e) => {
                self.failed |= bit(i);
                // An auth error says more than a timeout: keep it.
                if self.failure.is_none() || matches!(e, Error::Auth { .. }) {
                    self.failure = Some(e);
                }
            }
        }
        None
    }
}

impl RedlockStore {
    /// Opens a store from a `redlock://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (urls, node_timeout) = parse_url(&url)?;
        let n = urls.len();
        let nodes = urls
            .into_iter()
            .map(|u| {
                Arc::new(Node {
                    shown: mask_password(&u),
                    url: u,
                    store: std::sync::Mutex::new(None),
                    failed: Default::default(),
                    connecting: tokio::sync::Mutex::new(()),
                })
            })
            .collect();
        let store = RedlockStore {
            inner: Arc::new(Inner {
                nodes,
                majority: n / 2 + 1,
                all: ((1u32 << n) - 1) as Mask,
                node_timeout,
                url: url.masked().to_string(),
                caps: capabilities(),
                sessions: std::sync::Mutex::new(HashMap::new()),
                last_placed: AtomicU64::new(0),
                offset: std::sync::atomic::AtomicI64::new(0),
                clock_ahead_us: std::sync::atomic::AtomicI64::new(0),
            }),
        };
        // Fail now, not at the first lock, unless a majority answers; the
        // first connections get the connect timeout, not the node timeout.
        let all = store.inner.all;
        let mut tally = Tally::default();
        let answers = store
            .each_within(all, CONNECT_TIMEOUT + node_timeout, |_| async { Ok(()) })
            .await;
        for (i, result) in answers {
            tally.note(i, result);
        }
        store.majority_or_error(&tally)?;
        Ok(store)
    }

    /// Runs `op` on every node in `mask` at once, each bounded by the node
    /// timeout, and collects the answers by node.
    async fn each<T, F, Fut>(&self, mask: Mask, op: F) -> Vec<(usize, Result<T>)>
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.each_within(mask, self.inner.node_timeout, op).await
    }

    /// [`Self::each`] with each node's call bounded by `timeout`.
    async fn each_within<T, F, Fut>(
        &self,
        mask: Mask,
        timeout: Duration,
        op: F,
    ) -> Vec<(usize, Result<T>)>
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let node_timeout = self.inner.node_timeout;
        let calls = (0..self.inner.nodes.len())
            .filter(|i| mask & bit(*i) != 0)
            .map(|i| {
                let op = &op;
                async move {
                    let call = async {
                        let node = self.inner.nodes[i].get(node_timeout).await?;
                        op(node).await
                    };
                    let result = tokio::time::timeout(timeout, call)
                        .await
                        .unwrap_or_else(|_| {
                            Err(Error::unavailable(
                                BACKEND,
                                format!(
                                    "node {} did not answer within {timeout:?}",
                                    self.inner.nodes[i].shown
                                ),
                            ))
                        });
                    (i, result)
                }
            });
        futures_util::future::join_all(calls).await
    }

    /// Like [`Self::each`], with the answers tallied; the values of the
    /// nodes that answered come first.
    async fn tally<T, F, Fut>(&self, mask: Mask, op: F) -> (Vec<(usize, T)>, Tally)
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut tally = Tally::default();
        let mut values = Vec::new();
        for (i, result) in self.each(mask, op).await {
            if let Some(v) = tally.note(i, result) {
                values.push((i, v));
            }
        }
        (values, tally)
    }

    /// `Ok` when a majority answered; else the error that says why not.
    fn majority_or_error(&self, tally: &Tally) -> Result<()> {
        let (n, majority) = (self.inner.nodes.len(), self.inner.majority);
        if let Some(conflict) = &tally.conflict {
            return Err(match conflict {
                Error::Conflict { name, reason } => Error::Conflict {
                    name: name.clone(),
                    reason: reason.clone(),
                },
                _ => Error::backend(BACKEND, "conflict"),
            });
        }
        if count(tally.ok) >= majority {
            return Ok(());
        }
        // Could a majority still have said yes, had the failed nodes answered?
        if count(tally.ok | tally.failed) >= majority {
            if let Some(Error::Auth { reason, .. }) = &tally.failure {
                return Err(Error::Auth {
                    backend: BACKEND,
                    reason: reason.clone(),
                });
            }
            let why = tally
                .failure
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "{} of {n} nodes answered, a majority needs {majority}{why}",
                    count(tally.ok)
                ),
            ));
        }
        if count(tally.lost) >= count(tally.not_held) {
            Err(Error::SessionLost(crate::error::LostReason::Expired))
        } else {
            Err(Error::NotHeld(
                "a majority of nodes holds no such entry for this session",
            ))
        }
    }

    fn with_session<T>(&self, key: &SessionKey, f: impl FnOnce(&mut SessionState) -> T) -> T {
        let mut sessions = lock(&self.inner.sessions);
        f(sessions.entry(key.clone()).or_default())
    }

    /// The nodes worth asking about the session's entry `seq` of `name`.
    fn nodes_for(&self, key: &SessionKey, name: &Name, seq: Option<u64>) -> Mask {
        let all = self.inner.all;
        let sessions = lock(&self.inner.sessions);
        let Some(state) = sessions.get(key) else {
            return all;
        };
        match state.entries.get(name) {
            Some(p) if seq.is_none_or(|s| s == p.seq) => p.nodes & !state.dead,
            _ => all & !state.dead,
        }
    }

    fn mark_dead(&self, key: &SessionKey, lost: Mask) {
        if lost != 0 {
            if let Some(state) = lock(&self.inner.sessions).get_mut(key) {
                state.dead |= lost;
            }
        }
    }

    /// The next seq to propose: above `floor` (the highest seq a node said
    /// it has seen), at most `ceiling` (the most a node said it takes now,
    /// its clock plus its bound) if one was named, above this client's
    /// earlier placements, and near this client's clock in microseconds
    /// corrected by what the nodes answered (so it is usually taken at the
    /// first try, and a client whose clock is far ahead learns to aim lower).
    fn propose(&self, floor: u64, ceiling: Option<u64>) -> Result<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0)
            .saturating_add(self.inner.clock_ahead_us.load(Ordering::Relaxed));
        let mut offset = self.inner.offset.load(Ordering::Relaxed);
        if let Some(ceiling) = ceiling {
            let ceiling = i64::try_from(ceiling).unwrap_or(i64::MAX);
            offset = offset.min(
                ceiling
                    .saturating_sub(now)
                    .saturating_sub(AIM_BELOW_CEILING_US),
            );
        }
        let floor_i = i64::try_from(floor).unwrap_or(i64::MAX);
        if floor_i >= now.saturating_add(offset) {
            offset = floor_i.saturating_add(1).saturating_sub(now);
        }
        self.inner.offset.store(offset, Ordering::Relaxed);
        let last = self.inner.last_placed.load(Ordering::Relaxed);
        let aimed = u64::try_from(now.saturating_add(offset)).unwrap_or(0);
        let mut seq = aimed
            .max(floor.saturating_add(1))
            .max(last.saturating_add(1));
        if let Some(ceiling) = ceiling {
            if seq > ceiling {
                // The lowest seq that can still be taken; if even that is
                // above the ceiling, the node's counter ran ahead of its
                // clock (its clock stepped back) and it refuses until its
                // clock catches up.
                seq = floor.saturating_add(1).max(last.saturating_add(1));
            }
        }
        if seq >= MAX_SEQ {
            return Err(Error::backend(
                BACKEND,
                "a node's fencing counter is beyond 2^53; it cannot go higher",
            ));
        }
        Ok(seq)
    }

    /// Shifts this client's clock as Redlock sees it (a test of a client
    /// whose clock is wrong).
    #[doc(hidden)]
    pub fn shift_clock_for_tests(&self, by_us: i64) {
        self.inner.clock_ahead_us.store(by_us, Ordering::Relaxed);
    }

    /// Takes one hold of the session's entry `seq` off the nodes in `mask`
    /// (undoing a join that did not reach a majority).
    async fn undo(&self, key: &SessionKey, name: &Name, seq: u64, mask: Mask) {
        if mask != 0 {
            self.each(mask, |node| async move {
                node.leave(key, name, seq).await.map(|_| ())
            })
            .await;
        }
    }

    /// A join of a session that already has an entry here: one more hold,
    /// on the nodes that have it.
    async fn rejoin(
        &self,
        key: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
        placement: Placement,
    ) -> Result<Option<Joined>> {
        let seq = placement.seq;
        let (answers, mut tally) = self
            .tally(placement.nodes, |node| async move {
                node.join_at(key, name, kind, value, mode, Some(seq)).await
            })
            .await;
        self.mark_dead(key, tally.lost);
        let mut held = 0;
        let (mut granted, mut holds) = (0, 0);
        for (i, answer) in answers {
            match answer {
                NodeJoin::Placed(j) if j.seq == seq => {
                    held |= bit(i);
                    holds = holds.max(j.holds);
                    if j.granted {
                        granted |= bit(i);
                    }
                }
                NodeJoin::NotGranted(_) => {}
                _ => {
                    tally.ok &= !bit(i);
                    tally.failed |= bit(i);
                }
            }
        }
        let majority = self.inner.majority;
        if let Some(conflict) = tally.conflict.take() {
            self.undo(key, name, seq, held).await;
            return Err(conflict);
        }
        if count(tally.ok) < majority {
            self.undo(key, name, seq, held).await;
            return self.majority_or_error(&tally).map(|()| None);
        }
        if mode == JoinMode::IfGranted && count(granted) < majority {
            self.undo(key, name, seq, held).await;
            return Ok(None);
        }
        if count(held) < majority {
            self.undo(key, name, seq, held).await;
            tally.ok = held;
            self.majority_or_error(&tally)?;
        }
        Ok(Some(Joined {
            seq,
            granted: count(granted) >= majority,
            holds,
            first: false,
        }))
    }
}

#[async_trait]
impl Store for RedlockStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let (_, tally) = self
            .tally(self.inner.all, |node| {
                let opened = &opened;
                async move { node.open_session_as(opened, spec).await }
            })
            .await;
        if let Err(e) = self.majority_or_error(&tally) {
            self.undo_open(&opened.key, tally.ok);
            return Err(e);
        }
        // Nodes that did not take the session never see it again.
        let dead = self.inner.all & !tally.ok;
        self.with_session(&opened.key, |state| state.dead = dead);
        Ok(opened)
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let (dead, entries): (Mask, Vec<Placement>) = lock(&self.inner.sessions)
            .get(session)
            .map(|state| (state.dead, state.entries.values().copied().collect()))
            .unwrap_or_default();
        let (_, tally) = self
            .tally(self.inner.all & !dead, |node| async move {
                node.keep_alive(session).await
            })
            .await;
        self.mark_dead(session, tally.lost);
        let dead = dead | tally.lost;
        let majority = self.inner.majority;
        let confirmed = count(tally.ok) >= majority
            && entries
                .iter()
                .all(|p| count(p.nodes & tally.ok) >= majority);
        if confirmed {
            return Ok(());
        }
        let still_possible = count(self.inner.all & !dead) >= majority
            && entries.iter().all(|p| count(p.nodes & !dead) >= majority);
        if !still_possible {
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        let why = tally.failure.map(|e| format!(": {e}")).unwrap_or_default();
        Err(Error::unavailable(
            BACKEND,
            format!(
                "the renewal was confirmed by {} of {} nodes, not by a majority for every entry{why}",
                count(tally.ok),
                self.inner.nodes.len()
            ),
        ))
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let dead = lock(&self.inner.sessions)
            .get(session)
            .map_or(0, |state| state.dead);
        let (_, tally) = self
            .tally(self.inner.all & !dead, |node| async move {
                node.close_session(session).await
            })
            .await;
        lock(&self.inner.sessions).remove(session);
        if count(tally.ok | tally.lost | dead) >= self.inner.majority {
            Ok(())
        } else {
            self.majority_or_error(&tally)
        }
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        if let EntryKind::Permits { limit, .. } = kind {
            if limit > 1 {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    what: "semaphores with more than one permit (a majority of nodes cannot bound a count)",
                });
            }
        }
        let gate = self.with_session(session, |state| state.joining.clone());
        let _one_join_at_a_time = gate.lock().await;
        let (dead, placement) = self.with_session(session, |state| {
            (state.dead, state.entries.get(name).copied())
        });
        if let Some(placement) = placement {
            let placement = Placement {
                nodes: placement.nodes & !dead,
                ..placement
            };
            return self
                .rejoin(session, name, kind, value, mode, placement)
                .await;
        }
        let majority = self.inner.majority;
        let mut floor = 0;
        let mut ceiling: Option<u64> = None;
        let mut splits = 0;
        let mut confirmed = false;
        for attempt in 0..PLACE_ATTEMPTS {
            let dead = self.with_session(session, |state| state.dead);
            let seq = self.propose(floor, ceiling)?;
            let (answers, mut tally) = self
                .tally(self.inner.all & !dead, |node| async move {
                    node.join_at(session, name, kind, value, mode, Some(seq))
                        .await
                })
                .await;
            self.mark_dead(session, tally.lost);
            let (mut placed, mut granted, mut first, mut behind) = (0, 0, true, false);
            let mut lapsed: Vec<(usize, Watch)> = Vec::new();
            for (i, answer) in answers {
                match answer {
                    NodeJoin::Placed(j) if j.seq == seq => {
                        placed |= bit(i);
                        first &= j.first;
                        if j.granted {
                            granted |= bit(i);
                        }
                    }
                    NodeJoin::Placed(old) => {
                        // The node still has an older entry of this session
                        // here (a release that never arrived; it just took
                        // one more hold of it): remove it, and do not count
                        // the node this time.
                        tally.ok &= !bit(i);
                        tally.failed |= bit(i);
                        for _ in 0..old.holds {
                            self.undo_detached(session, name, old.seq, bit(i));
                        }
                    }
                    NodeJoin::Behind(f) => {
                        floor = floor.max(f);
                        behind = true;
                    }
                    NodeJoin::Ahead(c) => {
                        ceiling = Some(ceiling.map_or(c, |old| old.min(c)));
                        behind = true;
                    }
                    NodeJoin::NotGranted(watch) => lapsed.extend(watch.map(|w| (i, w))),
                }
            }
            let enough = match mode {
                JoinMode::Wait => count(placed) >= majority,
                JoinMode::IfGranted => count(granted) >= majority,
            };
            if enough && tally.conflict.is_none() {
                self.inner.last_placed.fetch_max(seq, Ordering::Relaxed);
                // A node that timed out may still take the entry later.
                self.undo_detached(session, name, seq, tally.failed);
                self.with_session(session, |state| {
                    state
                        .entries
                        .insert(name.clone(), Placement { seq, nodes: placed });
                });
                return Ok(Some(Joined {
                    seq,
                    granted: count(granted) >= majority,
                    holds: 1,
                    first,
                }));
            }
            self.undo(session, name, seq, placed | tally.failed).await;
            // Without a chance of a majority, say why.
            let usable = self.inner.all & !dead & !tally.lost;
            if tally.conflict.is_some() || count(usable & !tally.failed) < majority {
                tally.ok = 0;
                return match self.majority_or_error(&tally) {
                    Ok(()) => Err(Error::unavailable(BACKEND, "no majority of nodes")),
                    Err(e) => Err(e),
                };
            }
            if mode == JoinMode::IfGranted && !behind {
                // Held only by entries that lapsed by the nodes' clocks, on
                // enough nodes that a majority would grant without them
                // (say a node that missed a release while the others
                // granted): those clocks alone are not trusted, so each such
                // node's entries are watched for their TTL, ended where none
                // renewed, and the name tried once more.
                if !confirmed && !lapsed.is_empty() && count(granted) + lapsed.len() >= majority {
                    confirmed = true;
                    let confirms = lapsed.iter().map(|(i, watch)| async move {
                        let node = self.inner.nodes[*i].get(self.inner.node_timeout).await?;
                        node.confirm_expired(name, watch).await
                    });
                    futures_util::future::join_all(confirms).await;
                    continue;
                }
                if granted == 0 {
                    // Refused by every node that answered: it is taken.
                    return Ok(None);
                }
                // A split vote among try-locks racing for a free name.
                splits += 1;
                if splits >= SPLIT_ATTEMPTS {
                    return Ok(None);
                }
            }
            // Behind: again at once, above the floor. Split: again after a
            // short random pause, so that racing clients do not meet again.
            if !behind {
                tokio::time::sleep(jitter(attempt)).await;
            }
        }
        Err(Error::unavailable(
            BACKEND,
            format!("could not place the entry on a majority in {PLACE_ATTEMPTS} attempts"),
        ))
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let mask = self.nodes_for(session, name, Some(seq));
        let (answers, tally) = self
            .tally(
                mask,
                |node| async move { node.leave(session, name, seq).await },
            )
            .await;
        self.mark_dead(session, tally.lost);
        let holds = answers.iter().map(|(_, h)| *h).max().unwrap_or(0);
        if holds == 0 && !answers.is_empty() {
            // The nodes that did not answer keep the entry (their renewals
            // would keep it for the session's life): try them again.
            self.undo_detached(session, name, seq, tally.failed);
        }
        let gone: Mask = answers
            .iter()
            .filter(|(_, h)| *h == 0)
            .fold(0, |m, (i, _)| m | bit(*i));
        self.with_session(session, |state| {
            if let Some(p) = state.entries.get_mut(name) {
                if p.seq == seq {
                    p.nodes &= !gone;
                    if holds == 0 || p.nodes == 0 {
                        state.entries.remove(name);
                    }
                }
            }
        });
        self.majority_or_error(&tally)?;
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let mask = self.nodes_for(session, name, Some(seq));
        let timeout = self.inner.node_timeout;
        let mut waits: FuturesUnordered<_> = (0..self.inner.nodes.len())
            .filter(|i| mask & bit(*i) != 0)
            .map(|i| {
                let node = &self.inner.nodes[i];
                async move {
                    // A node that fails for a while is asked again: the
                    // session's own deadline ends the wait if need be.
                    loop {
                        let result = match node.get(timeout).await {
                            Ok(store) => store.await_grant(session, name, seq).await,
                            Err(e) => Err(e),
                        };
                        match result {
                            Err(e) if e.is_temporary() => {
                                tokio::time::sleep(POLL_MAX * 2).await;
                            }
                            other => return (i, other),
                        }
                    }
                }
            })
            .collect();
        let majority = self.inner.majority;
        let mut tally = Tally::default();
        let mut pending = count(mask);
        while let Some((i, result)) = waits.next().await {
            pending -= 1;
            tally.note(i, result);
            if count(tally.ok) >= majority {
                return Ok(());
            }
            if count(tally.ok) + pending < majority {
                self.mark_dead(session, tally.lost);
                return self.majority_or_error(&tally);
            }
        }
        self.majority_or_error(&tally)
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let mask = self.nodes_for(key, name, Some(seq));
        let (_, tally) = self
            .tally(mask, |node| async move {
                node.set_value(key, name, seq, value).await
            })
            .await;
        self.mark_dead(key, tally.lost);
        self.majority_or_error(&tally)
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move { node.queue(name).await })
            .await;
        self.majority_or_error(&tally)?;
        Ok(merge(
            answers.into_iter().map(|(_, q)| q).collect(),
            self.threshold(count(tally.ok)),
        ))
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let mut listening = Vec::new();
        for node in &self.inner.nodes {
            if let Ok(store) = node.get(self.inner.node_timeout).await {
                listening.push(store.listen_changes(name).await);
            }
        }
        let mut backoff = POLL_MIN;
        loop {
            let mut notified: Vec<_> = listening
                .iter()
                .map(|l| Box::pin(l.notify().notified()))
                .collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            let now = self.queue(name).await?.version;
            if now != version {
                return Ok(now);
            }
            let any = async {
                if notified.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures_util::future::select_all(notified).await;
                }
            };
            tokio::select! {
                () = any => backoff = POLL_MIN,
                () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(POLL_MAX),
            }
        }
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let (answers, tally) = self
            .tally(
                self.inner.all,
                |node| async move { node.names(prefix).await },
            )
            .await;
        self.majority_or_error(&tally)?;
        let threshold = self.threshold(count(tally.ok));
        let mut seen: HashMap<Name, usize> = HashMap::new();
        for (_, names) in answers {
            for name in names {
                *seen.entry(name).or_default() += 1;
            }
        }
        let mut names: Vec<Name> = seen
            .into_iter()
            .filter(|(_, n)| *n >= threshold)
            .map(|(name, _)| name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move { node.evict(name).await })
            .await;
        self.majority_or_error(&tally)?;
        Ok(answers.into_iter().map(|(_, n)| n).max().unwrap_or(0))
    }

    /// Ends the session on every node that has it; see `ended_live_session`
    /// for what the answers mean.
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        // A node looks through its session records in a few round trips
        // (see the Redis backend's), each bounded by the node timeout; the
        // whole look gets the connect timeout on top, as opening does.
        let timeout = CONNECT_TIMEOUT + self.inner.node_timeout;
        let mut tally = Tally::default();
        let mut ended: Mask = 0;
        for (i, result) in self
            .each_within(self.inner.all, timeout, |node| async move {
                node.evict_session(tag).await
            })
            .await
        {
            if tally.note(i, result) == Some(true) {
                ended |= bit(i);
            }
        }
        self.majority_or_error(&tally)?;
        ended_live_session(self.inner.nodes.len(), self.inner.majority, ended, tally.ok)
    }

    /// A token is admitted when a majority of nodes admits it, so a later
    /// admission's majority overlaps it in a node that refuses anything
    /// lower. A read, or a refusal, reports the highest token of a
    /// majority's answers only once a majority holds it (the nodes that
    /// answered lower are brought up to it first): so whatever a finished
    /// call reported, every later admission is at least that.
    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        if let FenceOp::Admit { value: Some(_), .. } = op {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "values written through a fence (independent nodes cannot agree on \
                       the order of writes without consensus; a fence's admission needs none)",
            });
        }
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move {
                node.fence_on_node(name, op).await
            })
            .await;
        self.majority_or_error(&tally)?;
        let highest = answers.iter().map(|(_, s)| s.highest).max().unwrap_or(0);
        let FenceOp::Admit { token, .. } = op else {
            self.spread_fence(name, highest, &answers).await?;
            return Ok(FenceState {
                admitted: true,
                highest,
                value: None,
            });
        };
        let admitted = answers.iter().filter(|(_, s)| s.admitted).count();
        if admitted >= self.inner.majority {
            return Ok(FenceState {
                admitted: true,
                highest: token,
                value: None,
            });
        }
        if admitted == answers.len() {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "token {token} admitted by {admitted} nodes, a majority needs {}",
                    self.inner.majority
                ),
            ));
        }
        // A node saw a higher token: refusing is the safe side, once that
        // token is on a majority.
        self.spread_fence(name, highest, &answers).await?;
        Ok(FenceState {
            admitted: false,
            highest,
            value: None,
        })
    }
}

impl RedlockStore {
    /// Makes sure a majority of nodes has admitted at least `highest`,
    /// admitting it on the nodes among `answers` that hold less.
    async fn spread_fence(
        &self,
        name: &Name,
        highest: u64,
        answers: &[(usize, FenceState)],
    ) -> Result<()> {
        let mut holding: Mask = answers
            .iter()
            .filter(|(_, s)| s.highest >= highest)
            .fold(0, |m, (i, _)| m | bit(*i));
        let behind: Mask = answers
            .iter()
            .filter(|(_, s)| s.highest < highest)
            .fold(0, |m, (i, _)| m | bit(*i));
        if count(holding) >= self.inner.majority || behind == 0 {
            return if count(holding) >= self.inner.majority {
                Ok(())
            } else {
                Err(Error::unavailable(BACKEND, "too few nodes answered"))
            };
        }
        let op = FenceOp::Admit {
            token: highest,
            value: None,
        };
        let (caught_up, _) = self
            .tally(
                behind,
                |node| async move { node.fence_on_node(name, op).await },
            )
            .await;
        for (i, state) in caught_up {
            if state.highest >= highest {
                holding |= bit(i);
            }
        }
        if count(holding) >= self.inner.majority {
            Ok(())
        } else {
            Err(Error::unavailable(
                BACKEND,
                format!(
                    "token {highest} is held by {} nodes, a majority needs {}",
                    count(holding),
                    self.inner.majority
                ),
            ))
        }
    }
}

impl RedlockStore {
    /// On how many of `answered` nodes an entry must show to count: every
    /// entry on a majority shows on at least this many of them.
    fn threshold(&self, answered: usize) -> usize {
        let n = self.inner.nodes.len();
        (self.inner.majority + answered).saturating_sub(n).max(1)
    }

    /// [`Self::undo`] in the background.
    fn undo_detached(&self, key: &SessionKey, name: &Name, seq: u64, mask: Mask) {
        if mask == 0 {
            return;
        }
        let store = RedlockStore {
            inner: self.inner.clone(),
        };
        let (key, name) = (key.clone(), name.clone());
        crate::task::spawn_detached(async move { store.undo(&key, &name, seq, mask).await });
    }

    fn undo_open(&self, key: &SessionKey, opened: Mask) {
        if opened == 0 {
            return;
        }
        let store = RedlockStore {
            inner: self.inner.clone(),
        };
        let key = key.clone();
        crate::task::spawn_detached(async move {
            store
                .each(opened, |node| {
                    let key = key.clone();
                    async move { node.close_session(&key).await }
                })
                .await;
        });
    }
}

/// Whether ending a session by its tag ended a live one, from the nodes
/// that `answered` and those of them that `ended` it. A session lives while
/// a majority keeps it (its renewals need one), so: ended on a majority, it
/// was live and is over; kept by fewer than a majority even counting every
/// node that did not answer, it was not live (what a node ended was left
/// over, as by a close that missed it); in between, the nodes that did not
/// answer decide, and nobody can say yet.
fn ended_live_session(n: usize, majority: usize, ended: Mask, answered: Mask) -> Result<bool> {
    let unanswered = n.saturating_sub(count(answered));
    if count(ended) >= majority {
        Ok(true)
    } else if count(ended) + unanswered < majority {
        Ok(false)
    } else {
        Err(Error::unavailable(
            BACKEND,
            format!(
                "the session was ended on {} of {n} nodes, a majority needs {majority}, and \
                 {unanswered} did not answer: it may have been live (it cannot renew now)",
                count(ended)
            ),
        ))
    }
}

/// A short random pause that grows with the attempt: 1 to 4·(attempt+1) ms.
fn jitter(attempt: u32) -> Duration {
    let mut b = [0u8; 2];
    let r = getrandom::fill(&mut b)
        .map(|()| u16::from_le_bytes(b))
        .unwrap_or(7);
    let span = 4 * (u64::from(attempt.min(8)) + 1);
    Duration::from_millis(1 + u64::from(r) % span)
}

/// One queue from the nodes' queues: an entry counts when it shows on at
/// least `threshold` of them, and is granted when as many granted it.
fn merge(queues: Vec<Queue>, threshold: usize) -> Queue {
    struct Seen {
        entry: Entry,
        shows: usize,
        grants: usize,
        expiries: Vec<Duration>,
        values: Vec<Vec<u8>>,
    }
    let mut by_seq: HashMap<u64, Seen> = HashMap::new();
    for q in queues {
        for e in q.entries {
            let seen = by_seq.entry(e.seq).or_insert_with(|| Seen {
                entry: e.clone(),
                shows: 0,
                grants: 0,
                expiries: Vec::new(),
                values: Vec::new(),
            });
            seen.shows += 1;
            seen.grants += usize::from(e.granted);
            seen.expiries.push(e.expires_in);
            seen.entry.holds = seen.entry.holds.max(e.holds);
            if e.granted_at.is_some()
                && (seen.entry.granted_at.is_none() || e.granted_at < seen.entry.granted_at)
            {
                seen.entry.granted_at = e.granted_at;
            }
            seen.values.push(e.value);
        }
    }
    let mut entries: Vec<Entry> = by_seq
        .into_values()
        .filter(|s| s.shows >= threshold)
        .map(|mut s| {
            s.entry.granted = s.grants >= threshold;
            if !s.entry.granted {
                s.entry.granted_at = None;
            }
            // The entry lasts while `threshold` nodes still have it.
            s.expiries.sort_unstable_by(|a, b| b.cmp(a));
            s.entry.expires_in = s.expiries[threshold - 1];
            s.entry.value = most_common(s.values);
            s.entry
        })
        .collect();
    entries.sort_by_key(|e| e.seq);
    Queue {
        version: fingerprint(&entries),
        entries,
    }
}

fn most_common(mut values: Vec<Vec<u8>>) -> Vec<u8> {
    values.sort();
    let mut best: (usize, usize) = (0, 0); // (count, index)
    let mut i = 0;
    while i < values.len() {
        let j = values[i..].iter().take_while(|v| **v == values[i]).count();
        if j > best.0 {
            best = (j, i);
        }
        i += j;
    }
    values.swap_remove(best.1)
}

/// A version for a merged queue: a hash of what observers can see, so it
/// changes whenever the queue does (the nodes' own versions differ).
fn fingerprint(entries: &[Entry]) -> u64 {
    let mut f = super::poll::Fingerprint::default();
    for e in entries {
        f.bytes(&e.seq.to_le_bytes());
        f.bytes(&[u8::from(e.granted)]);
        f.bytes(&e.holds.to_le_bytes());
        f.bytes(&(e.value.len() as u64).to_le_bytes());
        f.bytes(&e.value);
        f.bytes(e.session_tag.as_bytes());
    }
    f.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<(Vec<String>, Duration)> {
        parse_url(&StoreUrl::parse(url, &URL)?)
    }

    #[test]
    fn urls() {
        let (urls, t) = parse("redlock://:pw@a:1,b:2,c:3/2?prefix=x&node_timeout=50ms").unwrap();
        assert_eq!(urls[1], "redis://:pw@b:2/2?prefix=x");
        assert_eq!(t, Duration::from_millis(50));
        for bad in [
            "redlock://a:1,b:2",
            "redlock://a:1,b:2,c:3,d:4",
            "redlock://a:1,a:1,b:2",
            "redlock://a,b:2,c:3",
            "redlock://a:1,b:2,c:3?node_timeout=forever",
            "redlock://a:1,b:2,c:3?nosuch=1",
            "redlock://a:1,b:2,c:3/x",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let e = parse("redlock://:hunter2@a:1,b:2").unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
    }

    #[test]
    fn a_session_ended_by_tag_counts_on_a_majority() {
        let all: Mask = 0b111;
        // Ended on a majority: it was live.
        assert!(ended_live_session(3, 2, 0b011, all).unwrap());
        assert!(ended_live_session(3, 2, 0b011, 0b011).unwrap());
        // Nowhere, or only where a close was missed: not live.
        assert!(!ended_live_session(3, 2, 0, all).unwrap());
        assert!(!ended_live_session(3, 2, 0b001, all).unwrap());
        // One node ended it and the silent one may have had it too.
        assert!(ended_live_session(3, 2, 0b001, 0b011).is_err());
        assert!(ended_live_session(5, 3, 0b00011, 0b01111).is_err());
        assert!(!ended_live_session(5, 3, 0b00001, 0b01111).unwrap());
    }

    #[test]
    fn merging() {
        let entry = |seq, granted| Entry {
            seq,
            kind: EntryKind::Exclusive,
            session_tag: "t".into(),
            label: "l".into(),
            value: vec![],
            granted,
            granted_at: None,
            expires_in: Duration::from_secs(1),
            holds: 1,
        };
        let q = |entries| Queue {
            version: 0,
            entries,
        };
        // seq 5 on all three, granted on two; seq 7 on one node only.
        let merged = merge(
            vec![
                q(vec![entry(5, true), entry(7, false)]),
                q(vec![entry(5, true)]),
                q(vec![entry(5, false)]),
            ],
            2,
        );
        assert_eq!(merged.entries.len(), 1);
        assert!(merged.entries[0].granted);
        assert_eq!(
            most_common(vec![b"a".to_vec(), b"b".to_vec(), b"b".to_vec()]),
            b"b"
        );
    }
}
