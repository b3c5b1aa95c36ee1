#![doc = include_str!("memory.md")]
//!
//! # How this backend is built
//!
//! `memory://`: the reference backend, in this process only.
//!
//! Every other backend is compared with this one. State sits behind one mutex;
//! expiry is judged by tokio's monotonic clock, and a reaper task ends each
//! session at its deadline so that waiters and observers are woken on time.
//!
//! Like the stores, it does work per call that does not grow with a queue's
//! length: sessions are indexed by expiry, a queue is ordered by token, and a
//! change settles the granted entries and the first waiter only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{
    kind_conflict, Build, Capabilities, CellWrite, Entry, EntryKind, Expect, FenceOp, FenceState,
    JoinMode, JoinRequest, Joined, Name, OpenedSession, Queue, SessionBuild, SessionKey, SessionSpec, Store,
    Versioned,
};

const BACKEND: &str = "memory";

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::file(&[]);

/// The memory backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(1),
        durable: false,
        multi_process: false,
        min_ttl: Duration::from_millis(10),
        ..Capabilities::durable_store(
            BACKEND,
            "this process's monotonic clock",
            "none (in-process)",
        )
    }
}

/// A store that lives in this process. Cheap to clone; clones share state.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
    caps: Arc<Capabilities>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    reaper: Arc<Notify>,
    reaper_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    wakeups: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reaper.notify_one();
    }
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<SessionKey, SessionRec>,
    /// Every session by its deadline (and its number, to tell ties apart).
    by_expiry: BTreeMap<(Instant, u64), SessionKey>,
    by_tag: HashMap<String, SessionKey>,
    names: BTreeMap<Name, NameRec>,
    registers: HashMap<Name, Register>,
    next_tag: u64,
}

/// A fence or a cell. A cell that loses its value keeps its version, so
/// that versions are never reused for the name.
#[derive(Debug)]
enum Register {
    Fence {
        highest: u64,
        value: Option<Vec<u8>>,
    },
    Cell {
        version: u64,
        value: Option<Vec<u8>>,
        owner: Option<SessionKey>,
    },
}

impl State {
    /// The cell's live value and version, if it is a cell; a fence is a
    /// conflict.
    fn cell(&self, name: &Name) -> Result<(u64, Option<Versioned>)> {
        match self.registers.get(name) {
            None => Ok((0, None)),
            Some(Register::Fence { .. }) => Err(kind_conflict(name, "a fence", "a cell")),
            Some(Register::Cell {
                version,
                value,
                owner,
            }) => {
                let live = owner.as_ref().is_none_or(|o| self.sessions.contains_key(o));
                let current = value.as_ref().filter(|_| live).map(|value| Versioned {
                    value: value.clone(),
                    version: *version,
                });
                Ok((*version, current))
            }
        }
    }
}

#[derive(Debug)]
struct SessionRec {
    number: u64,
    tag: String,
    label: String,
    ttl: Duration,
    expires: Instant,
    /// The build that opened it (always this one: the store lives in this
    /// process).
    build: Build,
    /// The names this session has an entry on.
    names: HashSet<Name>,
}

#[derive(Debug)]
struct NameRec {
    last_seq: u64,
    version: watch::Sender<u64>,
    /// The queue, in order: tokens only grow.
    entries: BTreeMap<u64, EntryRec>,
    /// Each session's entry here (a session has at most one per name).
    by_session: HashMap<SessionKey, u64>,
}

impl NameRec {
    fn new() -> Self {
        NameRec {
            last_seq: 0,
            version: watch::channel(0).0,
            entries: BTreeMap::new(),
            by_session: HashMap::new(),
        }
    }

    /// The session's entry with token `seq`.
    fn entry(&self, session: &SessionKey, seq: u64) -> Option<&EntryRec> {
        self.entries.get(&seq).filter(|e| &e.session == session)
    }

    fn entry_mut(&mut self, session: &SessionKey, seq: u64) -> Option<&mut EntryRec> {
        self.entries.get_mut(&seq).filter(|e| &e.session == session)
    }
}

#[derive(Debug)]
struct EntryRec {
    seq: u64,
    kind: EntryKind,
    session: SessionKey,
    value: Vec<u8>,
    holds: u32,
    granted: bool,
    granted_at: Option<SystemTime>,
    wake: Arc<Notify>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                reaper: Arc::new(Notify::new()),
                reaper_task: Mutex::new(None),
                wakeups: AtomicU64::new(0),
            }),
            caps: Arc::new(capabilities()),
        }
    }

    pub(crate) fn open_url(url: StoreUrl) -> Result<Self> {
        if !url.path().is_empty() {
            return Err(url.invalid("memory:// takes no host or path"));
        }
        Ok(Self::new())
    }

    /// How many times a waiter has been woken since the store was made: one
    /// per grant (and one per waiting entry removed). A release wakes the next
    /// waiter only, never the whole queue.
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the state half-written
        // in a way later calls depend on, so a poisoned lock is still usable.
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        self.purge(&mut state, Instant::now());
        state
    }

    /// Ends every session whose deadline has passed (the first ones by
    /// deadline only) and settles their queues.
    fn purge(&self, state: &mut State, now: Instant) {
        while let Some(entry) = state.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.remove_session(state, &key);
        }
    }

    fn remove_session(&self, state: &mut State, key: &SessionKey) {
        let Some(session) = state.sessions.remove(key) else {
            return;
        };
        state.by_expiry.remove(&(session.expires, session.number));
        state.by_tag.remove(&session.tag);
        for name in &session.names {
            let Some(rec) = state.names.get_mut(name) else {
                continue;
            };
            let Some(seq) = rec.by_session.remove(key) else {
                continue;
            };
            if let Some(e) = rec.entries.remove(&seq) {
                // Wake a waiter of the removed entry so it can report.
                if !e.granted {
                    e.wake.notify_waiters();
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.settle(rec);
        }
    }

    /// Grants what a change made grantable (a walk from the head over the
    /// granted entries and the first waiter), wakes exactly those entries
    /// and bumps the version.
    fn settle(&self, rec: &mut NameRec) {
        let mut walk = queue::GrantWalk::new();
        for entry in rec.entries.values_mut() {
            if !walk.admit(entry.kind) {
                break;
            }
            if !entry.granted {
                entry.granted = true;
                entry.granted_at = Some(SystemTime::now());
                // Every task waiting on this entry (a session's reentrant
                // waiters share it) registered under the state lock.
                entry.wake.notify_waiters();
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        rec.version.send_modify(|v| *v += 1);
    }

    /// Starts the reaper on the current runtime, again if the runtime that
    /// ran it before is gone.
    fn start_reaper(&self) {
        let mut task = self
            .inner
            .reaper_task
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let wake = self.inner.reaper.clone();
        let caps = self.caps.clone();
        *task = Some(tokio::spawn(reap(weak, wake, caps)));
    }

    fn session<'a>(state: &'a State, key: &SessionKey) -> Result<&'a SessionRec> {
        state
            .sessions
            .get(key)
            .ok_or(Error::SessionLost(crate::error::LostReason::Expired))
    }
}

async fn reap(weak: Weak<Inner>, wake: Arc<Notify>, caps: Arc<Capabilities>) {
    loop {
        let next = {
            let Some(inner) = weak.upgrade() else { return };
            let store = MemoryStore {
                inner,
                caps: caps.clone(),
            };
            let state = store.lock(); // purges
            state.by_expiry.keys().next().map(|(at, _)| *at)
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// `at + d`, or a century from now if that overflows.
fn far_add(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(at)
}

fn entry_view(state: &State, e: &EntryRec, now: Instant) -> Entry {
    let (tag, label, expires_in) = match state.sessions.get(&e.session) {
        Some(s) => (
            s.tag.clone(),
            s.label.clone(),
            s.expires.saturating_duration_since(now),
        ),
        None => (String::new(), String::new(), Duration::ZERO),
    };
    Entry {
        seq: e.seq,
        kind: e.kind,
        session_tag: tag,
        label,
        value: e.value.clone(),
        granted: e.granted,
        granted_at: e.granted_at,
        expires_in,
        holds: e.holds,
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.start_reaper();
        let key = SessionKey::new(crate::store::random_hex(16)?);
        let mut state = self.lock();
        state.next_tag += 1;
        let number = state.next_tag;
        let tag = format!("m{number}");
        let expires = far_add(Instant::now(), spec.ttl);
        state.sessions.insert(
            key.clone(),
            SessionRec {
                number,
                tag: tag.clone(),
                label: spec.label.clone(),
                ttl: spec.ttl,
                expires,
                build: Build::this(""),
                names: HashSet::new(),
            },
        );
        state.by_expiry.insert((expires, number), key.clone());
        state.by_tag.insert(tag.clone(), key.clone());
        drop(state);
        self.inner.reaper.notify_one();
        Ok(OpenedSession { key, tag })
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let mut state = self.lock();
        let rec = state
            .sessions
            .get_mut(session)
            .ok_or(Error::SessionLost(crate::error::LostReason::Expired))?;
        let was = (rec.expires, rec.number);
        rec.expires = far_add(Instant::now(), rec.ttl);
        let now = (rec.expires, rec.number);
        state.by_expiry.remove(&was);
        state.by_expiry.insert(now, session.clone());
        Ok(())
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        // Every session of the store is of this process, so of this build.
        Ok(Vec::new())
    }

    async fn session_builds(&self) -> Result<Vec<SessionBuild>> {
        let state = self.lock();
        let mut all: Vec<SessionBuild> = state
            .sessions
            .values()
            .map(|s| SessionBuild::new(s.tag.clone(), s.label.clone(), Some(s.build.clone())))
            .collect();
        all.sort_by(|a, b| a.tag.cmp(&b.tag));
        Ok(all)
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let mut state = self.lock();
        self.remove_session(&mut state, session);
        Ok(())
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let mut state = self.lock();
        Self::session(&state, session)?;
        let rec = state.names.entry(name.clone()).or_insert_with(NameRec::new);
        let own_seq = rec.by_session.get(session).copied();
        if let Some(own) = own_seq.and_then(|seq| rec.entries.get_mut(&seq)) {
            queue::check_same_kind(name, own.kind, kind)?;
            if mode == JoinMode::IfGranted && !own.granted {
                return Ok(None);
            }
            own.holds += 1;
            return Ok(Some(Joined {
                seq: own.seq,
                granted: own.granted,
                holds: own.holds,
                first: false,
            }));
        }
        // Every entry agrees in kind with every other (each was checked on
        // joining), so the head stands for them all.
        let head = rec.entries.values().next().map(|e| e.kind);
        queue::check_compatible(name, kind, head)?;
        // A new entry goes last: it is granted only if every entry is, and
        // the rule admits it after them.
        let mut walk = queue::GrantWalk::new();
        let granted = rec
            .entries
            .values()
            .all(|e| e.granted && walk.admit(e.kind))
            && walk.admit(kind);
        if mode == JoinMode::IfGranted && !granted {
            return Ok(None);
        }
        rec.last_seq += 1;
        let seq = rec.last_seq;
        rec.by_session.insert(session.clone(), seq);
        rec.entries.insert(
            seq,
            EntryRec {
                seq,
                kind,
                session: session.clone(),
                value: value.to_vec(),
                holds: 1,
                granted,
                granted_at: granted.then(SystemTime::now),
                wake: Arc::new(Notify::new()),
            },
        );
        rec.version.send_modify(|v| *v += 1);
        if let Some(s) = state.sessions.get_mut(session) {
            s.names.insert(name.clone());
        }
        Ok(Some(Joined {
            seq,
            granted,
            holds: 1,
            first: seq == 1,
        }))
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let mut state = self.lock();
        Self::session(&state, session)?;
        let rec = state
            .names
            .get_mut(name)
            .ok_or(Error::NotHeld("no such entry"))?;
        let entry = rec
            .entry_mut(session, seq)
            .ok_or(Error::NotHeld("this session has no such entry"))?;
        entry.holds -= 1;
        let holds = entry.holds;
        if holds == 0 {
            rec.entries.remove(&seq);
            rec.by_session.remove(session);
            self.settle(rec);
            if let Some(s) = state.sessions.get_mut(session) {
                s.names.remove(name);
            }
        }
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        loop {
            let wake = {
                let state = self.lock();
                Self::session(&state, session)?;
                let entry = state
                    .names
                    .get(name)
                    .and_then(|rec| rec.entry(session, seq))
                    .ok_or(Error::NotHeld("this session has no such entry"))?;
                if entry.granted {
                    return Ok(());
                }
                entry.wake.clone()
            };
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Look again now that this task is registered: a grant between the
            // first look and `enable` would otherwise be missed.
            {
                let state = self.lock();
                Self::session(&state, session)?;
                let granted = state
                    .names
                    .get(name)
                    .and_then(|rec| rec.entry(session, seq))
                    .ok_or(Error::NotHeld("this session has no such entry"))?
                    .granted;
                if granted {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let mut state = self.lock();
        Self::session(&state, key)?;
        let rec = state
            .names
            .get_mut(name)
            .ok_or(Error::NotHeld("no such entry"))?;
        let entry = rec
            .entry_mut(key, seq)
            .filter(|e| e.granted)
            .ok_or(Error::NotHeld(
                "this session holds no granted entry with that token",
            ))?;
        entry.value = value.to_vec();
        rec.version.send_modify(|v| *v += 1);
        Ok(())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let state = self.lock();
        let now = Instant::now();
        Ok(match state.names.get(name) {
            Some(rec) => Queue {
                version: *rec.version.borrow(),
                entries: rec
                    .entries
                    .values()
                    .map(|e| entry_view(&state, e, now))
                    .collect(),
            },
            None => Queue::default(),
        })
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let mut rx = {
            let mut state = self.lock();
            let rec = state.names.entry(name.clone()).or_insert_with(NameRec::new);
            rec.version.subscribe()
        };
        let seen = rx
            .wait_for(|v| *v != version)
            .await
            .map_err(|_| Error::backend(BACKEND, "the store was dropped"))?;
        Ok(*seen)
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let state = self.lock();
        Ok(state
            .names
            .iter()
            .filter(|(n, rec)| n.as_str().starts_with(prefix) && !rec.entries.is_empty())
            .map(|(n, _)| n.clone())
            .collect())
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let mut state = self.lock();
        let holders: Vec<SessionKey> = state
            .names
            .get(name)
            .map(|rec| {
                rec.entries
                    .values()
                    .take_while(|e| e.granted)
                    .map(|e| e.session.clone())
                    .collect()
            })
            .unwrap_or_default();
        for key in &holders {
            self.remove_session(&mut state, key);
        }
        Ok(holders.len())
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let mut state = self.lock();
        let key = state.by_tag.get(tag).cloned();
        if let Some(key) = &key {
            self.remove_session(&mut state, key);
        }
        Ok(key.is_some())
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let mut state = self.lock();
        let register = match state.registers.get_mut(name) {
            Some(register) => register,
            None if op == FenceOp::Read => {
                return Ok(FenceState {
                    admitted: true,
                    ..FenceState::default()
                })
            }
            None => state
                .registers
                .entry(name.clone())
                .or_insert(Register::Fence {
                    highest: 0,
                    value: None,
                }),
        };
        let Register::Fence { highest, value } = register else {
            return Err(kind_conflict(name, "a cell", "a fence"));
        };
        let admitted = match op {
            FenceOp::Read => true,
            FenceOp::Admit { token, value: new } => {
                let admitted = token >= *highest;
                if admitted {
                    *highest = token;
                    if let Some(new) = new {
                        *value = Some(new.to_vec());
                    }
                }
                admitted
            }
        };
        Ok(FenceState {
            admitted,
            highest: *highest,
            value: value.clone(),
        })
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        Ok(self.lock().cell(name)?.1)
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let mut state = self.lock();
        let (stored, current) = state.cell(name)?;
        if let Some(owner) = owner {
            Self::session(&state, owner)?;
        }
        let current = current.map(|c| c.version);
        if !crate::queue::cell_expected(current, expect) {
            return Ok(CellWrite::Mismatch(current));
        }
        let version = stored + 1;
        state.registers.insert(
            name.clone(),
            Register::Cell {
                version,
                value: Some(value.to_vec()),
                owner: owner.cloned(),
            },
        );
        Ok(CellWrite::Done(version))
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let mut state = self.lock();
        let (stored, current) = state.cell(name)?;
        let current = current.map(|c| c.version);
        if current != Some(version) {
            return Ok(CellWrite::Mismatch(current));
        }
        state.registers.insert(
            name.clone(),
            Register::Cell {
                version: stored,
                value: None,
                owner: None,
            },
        );
        Ok(CellWrite::Done(stored))
    }
}
