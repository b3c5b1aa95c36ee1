//! Sessions: a lease with a TTL, renewed in the background, and the one
//! signal of loss that everything a client holds depends on.

mod keepalive;
mod options;

use keepalive::{effective_deadline, keep_alive, mark_lost, renew, Deadline};
pub use options::{SessionOptions, DEFAULT_TTL};

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::store::{Name, SessionKey, SessionSpec, Store};
use crate::task::{finish, spawn_detached};

/// A lease on a store. Everything taken through a session is released by the
/// store when the session ends: closed, expired, or its process gone.
///
/// Cheap to clone; clones are the same session. The session is closed when
/// the last clone and the last guard taken through it are dropped
/// (best-effort: see [`Session::close`]).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    key: SessionKey,
    tag: String,
    label: String,
    ttl: Duration,
    drift: Duration,
    renew_every: Duration,
    deadline: StdMutex<Deadline>,
    lost: watch::Sender<Option<LostReason>>,
    task: StdMutex<Option<JoinHandle<()>>>,
    /// Left to expire in the store on drop instead of being closed.
    detached: std::sync::atomic::AtomicBool,
    /// Counted in `tenure_sessions_open` until it ends (once).
    counted_open: std::sync::atomic::AtomicBool,
    /// Non-reentrant mutexes' turns among this session's own holds, by
    /// name (entries no handle uses are pruned as others are added).
    gates: StdMutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// This session's calls that change a name's queue and may still be on
    /// their way after their caller stopped waiting (a join given up, a
    /// guard dropped), counted by name; see [`Session::settled`].
    unsettled: StdMutex<std::collections::HashMap<String, usize>>,
    /// How many there are on all names: most joins find none, and look no
    /// further.
    unsettled_total: std::sync::atomic::AtomicUsize,
    /// Told whenever such a call ends.
    settled: tokio::sync::Notify,
    /// What ends with the session ([`Session::tie`]): run once when it is
    /// lost or closed. The next id, and the hooks by id.
    on_end: StdMutex<(u64, std::collections::HashMap<u64, EndHook>)>,
}

type EndHook = Box<dyn FnOnce() + Send>;

impl Inner {
    /// Runs (and forgets) every hook tied to the session's life.
    fn run_end_hooks(&self) {
        let hooks: Vec<EndHook> = match self.on_end.lock() {
            Ok(mut slot) => slot.1.drain().map(|(_, hook)| hook).collect(),
            Err(_) => Vec::new(),
        };
        for hook in hooks {
            hook();
        }
    }

    fn backend(&self) -> &'static str {
        self.store.capabilities().backend
    }

    /// Takes the session out of `tenure_sessions_open`, once.
    fn ended(&self) {
        if self
            .counted_open
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            crate::metrics::session_ended(self.backend());
        }
    }
}

/// A call of a session on a name that may still be on its way (see
/// [`Session::unsettled`]); dropping it ends it.
#[derive(Debug)]
pub(crate) struct Unsettled {
    session: std::sync::Weak<Inner>,
    name: String,
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        let Some(inner) = self.session.upgrade() else {
            return;
        };
        let mut counts = inner.unsettled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.name);
            }
        }
        drop(counts);
        inner
            .unsettled_total
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        inner.settled.notify_waiters();
    }
}

/// A value that lives until it is dropped or its session ends (is lost or
/// closed), whichever comes first; dropping it then is a no-op. Metrics of a
/// hold or a term are tied so: a lost lease ends them at once, not when the
/// user drops the guard.
pub(crate) struct Tied<T: Send + 'static> {
    slot: Arc<StdMutex<Option<T>>>,
    session: Session,
    id: Option<u64>,
}

impl Session {
    /// The gate that orders this session's own holds of the non-reentrant
    /// mutex `name` (one per name, shared by every handle and clone).
    pub(crate) fn gate(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gate) = gates.get(name) {
            return gate.clone();
        }
        // Names no handle waits on or holds any more are let go here.
        gates.retain(|_, g| Arc::strong_count(g) > 1);
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        gates.insert(name.to_string(), gate.clone());
        gate
    }

    /// Counts a call of this session that changes `name`'s queue until the
    /// returned ticket is dropped: moved into whatever finishes the call in
    /// the background, it keeps the session's next join of `name` waiting
    /// ([`Session::settled`]).
    pub(crate) fn unsettled(&self, name: &Name) -> Unsettled {
        let mut counts = self
            .inner
            .unsettled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *counts.entry(name.as_str().to_string()).or_insert(0) += 1;
        self.inner
            .unsettled_total
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Unsettled {
            session: Arc::downgrade(&self.inner),
            name: name.as_str().to_string(),
        }
    }

    /// Whether a call of this session on `name` is still on its way.
    fn is_unsettled(&self, name: &Name) -> bool {
        let total = &self.inner.unsettled_total;
        if total.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return false;
        }
        let counts = self
            .inner
            .unsettled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counts.contains_key(name.as_str())
    }

    /// Resolves once no call of this session that changes `name`'s queue is
    /// still on its way: a join that met this session's own entry while its
    /// leave was in flight would reuse an entry about to go (and on a store
    /// of several nodes, find them in different states). Waits at most the
    /// session's TTL: a call that long unanswered has ended the session.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub(crate) async fn settled(&self, name: &Name) {
        if !self.is_unsettled(name) {
            return;
        }
        let waited = async {
            loop {
                let told = self.inner.settled.notified();
                tokio::pin!(told);
                told.as_mut().enable();
                if !self.is_unsettled(name) {
                    return;
                }
                told.await;
            }
        };
        if tokio::time::timeout(self.inner.ttl, waited).await.is_err() {
            tracing::debug!(%name, "a call of this session on the name is still unanswered");
        }
    }

    /// Ties `value` to this session's life (see [`Tied`]).
    pub(crate) fn tie<T: Send + 'static>(&self, value: T) -> Tied<T> {
        let slot = Arc::new(StdMutex::new(Some(value)));
        let mut tied = Tied {
            slot: slot.clone(),
            session: self.clone(),
            id: None,
        };
        if self.is_lost() {
            drop(tied.take());
            return tied;
        }
        let hook: EndHook = Box::new(move || {
            let value = slot.lock().ok().and_then(|mut s| s.take());
            drop(value);
        });
        if let Ok(mut hooks) = self.inner.on_end.lock() {
            let id = hooks.0;
            hooks.0 += 1;
            hooks.1.insert(id, hook);
            tied.id = Some(id);
        }
        // Lost meanwhile (before the hook was in): end it here.
        if self.is_lost() {
            self.inner.run_end_hooks();
        }
        tied
    }
}

impl<T: Send + 'static> Tied<T> {
    fn take(&mut self) -> Option<T> {
        self.slot.lock().ok().and_then(|mut s| s.take())
    }
}

impl<T: Send + 'static> Drop for Tied<T> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            if let Ok(mut hooks) = self.session.inner.on_end.lock() {
                hooks.1.remove(&id);
            }
        }
        drop(self.take());
    }
}

impl<T: Send + 'static> fmt::Debug for Tied<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tied").finish_non_exhaustive()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.inner.store.capabilities().backend)
            .field("tag", &self.inner.tag)
            .field("ttl", &self.inner.ttl)
            .field("lost", &*self.inner.lost.borrow())
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ended();
        if let Ok(mut task) = self.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
        let detached = self.detached.load(std::sync::atomic::Ordering::Relaxed);
        if self.lost.borrow().is_none() && !detached {
            let store = self.store.clone();
            let key = self.key.clone();
            spawn_detached(async move {
                if let Err(e) = store.close_session(&key).await {
                    tracing::debug!(error = %e, "closing a dropped session failed; it will expire");
                }
            });
        }
    }
}

/// The default public label of a session: `host:pid`.
pub fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

impl Session {
    /// Opens a session with default options.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> tenure::Result<()> {
    /// let store = tenure::open("memory://").await?;
    /// let session = tenure::Session::new(&store).await?;
    /// session.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn new(store: &Arc<dyn Store>) -> Result<Session> {
        Self::with_options(store, SessionOptions::default()).await
    }

    /// Opens a session.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a TTL outside the backend's range or a
    /// renew interval that does not fit in the TTL; store errors otherwise.
    pub async fn with_options(store: &Arc<dyn Store>, options: SessionOptions) -> Result<Session> {
        let (ttl, drift, renew_every) = options.checked(store.capabilities())?;
        let label = options.label.unwrap_or_else(default_label);
        let suspended_at_send = crate::clock::suspended();
        let sent = Instant::now();
        // Opened to the end even if the caller stops waiting (a session
        // half opened — without its build recorded — would be taken for an
        // older build's by `upgrade::finish`); one nobody will use is closed.
        let spec = SessionSpec {
            ttl,
            label: label.clone(),
        };
        let opening = {
            let store = store.clone();
            async move { store.open_session(&spec).await }
        };
        let abandoned = {
            let store = store.clone();
            move |opened: Result<crate::store::OpenedSession>| {
                if let Ok(opened) = opened {
                    crate::task::spawn_detached(async move {
                        let _ = store.close_session(&opened.key).await;
                    });
                }
            }
        };
        let opened = crate::task::finish(opening, abandoned).await?;
        let inner = Arc::new(Inner {
            store: store.clone(),
            key: opened.key,
            tag: opened.tag,
            label,
            ttl,
            drift,
            renew_every,
            deadline: StdMutex::new(Deadline {
                at: sent + ttl - drift,
                suspended: suspended_at_send,
            }),
            lost: watch::channel(None).0,
            task: StdMutex::new(None),
            detached: std::sync::atomic::AtomicBool::new(false),
            counted_open: std::sync::atomic::AtomicBool::new(false),
            on_end: StdMutex::new((0, std::collections::HashMap::new())),
            gates: StdMutex::new(std::collections::HashMap::new()),
            unsettled: StdMutex::new(std::collections::HashMap::new()),
            unsettled_total: std::sync::atomic::AtomicUsize::new(0),
            settled: tokio::sync::Notify::new(),
        });
        if crate::metrics::session_opened(inner.backend()) {
            inner
                .counted_open
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let task = tokio::spawn(keep_alive(Arc::downgrade(&inner), options.auto_renew));
        if let Ok(mut slot) = inner.task.lock() {
            *slot = Some(task);
        }
        Ok(Session { inner })
    }

    /// The store this session lives on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The public tag others see on this session's entries.
    pub fn tag(&self) -> &str {
        &self.inner.tag
    }

    /// The public label it was opened with (`host:pid` by default).
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The session's TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// How often the background task renews.
    pub fn renew_interval(&self) -> Duration {
        self.inner.renew_every
    }

    pub(crate) fn key(&self) -> &SessionKey {
        &self.inner.key
    }

    /// The local deadline: if no renewal is confirmed by then, the session is
    /// lost. Computed from when the last confirmed renewal was *sent*, minus the
    /// drift allowance, so it always comes before the store's own expiry.
    pub fn deadline(&self) -> Instant {
        effective_deadline(&self.inner)
    }

    /// Why the session ended, or `None` while it lives.
    ///
    /// From the local deadline on this says the session is lost, even
    /// before the background task that marks it has run (a busy scheduler,
    /// a process that was stopped): the answer depends on the clock only.
    pub fn lost_reason(&self) -> Option<LostReason> {
        if let Some(reason) = *self.inner.lost.borrow() {
            return Some(reason);
        }
        if Instant::now() >= effective_deadline(&self.inner) {
            // Marked here too, so the answer never goes back to "alive" (a
            // renewal answered after the deadline does not revive it).
            mark_lost(&self.inner, LostReason::Unconfirmed);
            return *self.inner.lost.borrow();
        }
        None
    }

    /// Whether the session has ended.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Resolves the moment this client can no longer be sure it holds its
    /// lease: the store said it expired, or the local deadline passed with no
    /// confirmed renewal, or the session was closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. The future does not borrow the session, so it can move
    /// into a spawned task.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.inner.lost.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(reason) => reason.unwrap_or(LostReason::Closed),
                Err(_) => LostReason::Closed,
            }
        }
    }

    /// Renews the lease now. The background task does this on its own unless
    /// the session was opened with `auto_renew(false)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal whose answer is not awaited simply does not move
    /// the local deadline.
    pub async fn renew(&self) -> Result<()> {
        renew(&self.inner).await
    }

    /// Closes the session: the store releases everything it holds at once.
    /// Dropping the last handle does the same on a best-effort basis (when a
    /// tokio runtime is still running); otherwise the store expires it.
    ///
    /// # Errors
    ///
    /// The store's error; [`Error::Unavailable`] if the store has not
    /// answered within the session's TTL. Renewals stop when the close
    /// begins, so by then the store has ended the session on its own (or
    /// will, as soon as it runs again); the close goes on in the background.
    ///
    /// # Cancel safety
    ///
    /// The close runs to completion in a spawned task even if this future is
    /// dropped.
    pub async fn close(&self) -> Result<()> {
        if let Ok(mut task) = self.inner.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
        mark_lost(&self.inner, LostReason::Closed);
        let store = self.inner.store.clone();
        let key = self.inner.key.clone();
        let closing = finish(async move { store.close_session(&key).await }, |_| {});
        let ttl = self.inner.ttl;
        match tokio::time::timeout(ttl, closing).await {
            Ok(closed) => closed,
            Err(_) => Err(Error::unavailable(
                self.inner.backend(),
                format!(
                    "the close was not answered within the session's TTL ({ttl:?}); \
                     the session expires without it"
                ),
            )),
        }
    }

    /// Stops renewing and leaves the session to expire in the store: what it
    /// holds stays held for about one TTL more, then goes (a record's life).
    pub(crate) fn detach(&self) {
        self.inner
            .detached
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut task) = self.inner.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
    }

    /// Ends the session because a release or a join went unanswered: the
    /// store may or may not have done it, and a session that does not know
    /// what it holds cannot go on (a retry could give back another guard's
    /// hold of a reentrant entry; taking the name again would take the old
    /// entry with its old token; an entry it never learnt of would be held
    /// for as long as it lives). Its holders are told ([`LostReason::Unconfirmed`]);
    /// its entries go with its close, or with its lease if that is not
    /// answered either.
    pub(crate) fn end_unconfirmed(&self) {
        if let Ok(mut task) = self.inner.task.lock() {
            if let Some(task) = task.take() {
                task.abort();
            }
        }
        mark_lost(&self.inner, LostReason::Unconfirmed);
        let store = self.inner.store.clone();
        let key = self.inner.key.clone();
        crate::task::spawn_detached(async move {
            let _ = store.close_session(&key).await;
        });
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(reason) => Err(Error::SessionLost(reason)),
        }
    }
}
