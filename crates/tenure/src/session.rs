//! Sessions: a lease with a TTL, renewed in the background, and the one
//! signal of loss that everything a client holds depends on.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::store::{EntryKind, JoinMode, Joined, Name, SessionKey, SessionSpec, Store};

/// The smallest clock-drift allowance: stores count expiry in whole
/// milliseconds, so their deadline may round a millisecond or two earlier.
pub const MIN_DRIFT: Duration = Duration::from_millis(2);

/// The default session TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The store said the session had expired (or was evicted).
    Expired,
    /// No renewal was confirmed before the local deadline, so the store may
    /// already have expired the session.
    Unconfirmed,
    /// The session was closed by its owner.
    Closed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the store expired the session",
            LostReason::Unconfirmed => "no renewal was confirmed before the lease's local deadline",
            LostReason::Closed => "the session was closed",
        })
    }
}

/// How a session is opened.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    ttl: Duration,
    renew_every: Option<Duration>,
    drift: Option<Duration>,
    label: Option<String>,
    auto_renew: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: DEFAULT_TTL,
            renew_every: None,
            drift: None,
            label: None,
            auto_renew: true,
        }
    }
}

impl SessionOptions {
    /// Default options: a 15 s TTL renewed every 5 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the store keeps the session after its last renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often to renew (default: a third of the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How much faster the store's clock may run than ours over one TTL
    /// (default: 1% of the TTL plus 2 ms). The local deadline is this much
    /// earlier than the store's.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// A public label shown to others, such as `host:pid` (the default).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Whether a background task renews the lease (default: yes). Without it
    /// the owner calls [`Session::renew`] in time, and the session is lost at
    /// its local deadline otherwise.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }
}

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
    ttl: Duration,
    drift: Duration,
    renew_every: Duration,
    deadline: StdMutex<Deadline>,
    lost: watch::Sender<Option<LostReason>>,
    task: StdMutex<Option<JoinHandle<()>>>,
    /// Left to expire in the store on drop instead of being closed.
    detached: std::sync::atomic::AtomicBool,
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

/// Runs a clean-up future if a tokio runtime is at hand; otherwise the store's
/// expiry does the clean-up.
pub(crate) fn spawn_detached(fut: impl Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}

pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| Error::backend("os", format!("no randomness for a session secret: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
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
        let caps = store.capabilities();
        let ttl = options.ttl;
        if ttl < caps.min_ttl || ttl > caps.max_ttl {
            return Err(Error::InvalidArgument {
                what: "session TTL",
                reason: format!(
                    "{ttl:?} is outside the {} backend's range {:?}..={:?}",
                    caps.backend, caps.min_ttl, caps.max_ttl
                ),
            });
        }
        let drift = options
            .drift
            .unwrap_or(ttl / 100 + Duration::from_millis(2));
        let renew_every = options.renew_every.unwrap_or(ttl / 3);
        if drift < MIN_DRIFT || drift >= ttl / 2 {
            return Err(Error::InvalidArgument {
                what: "clock drift allowance",
                reason: format!(
                    "{drift:?} must be at least {MIN_DRIFT:?} (stores count in milliseconds) and under half the TTL {ttl:?}"
                ),
            });
        }
        if renew_every.is_zero() || renew_every >= ttl - drift {
            return Err(Error::InvalidArgument {
                what: "renew interval",
                reason: format!(
                    "{renew_every:?} must be above zero and below the TTL minus the drift allowance ({:?})",
                    ttl - drift
                ),
            });
        }
        let label = options.label.unwrap_or_else(default_label);
        let suspended_at_send = crate::clock::suspended();
        let sent = Instant::now();
        let opened = store.open_session(&SessionSpec { ttl, label }).await?;
        let inner = Arc::new(Inner {
            store: store.clone(),
            key: opened.key,
            tag: opened.tag,
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
        });
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
    pub fn lost_reason(&self) -> Option<LostReason> {
        *self.inner.lost.borrow()
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
        finish(async move { store.close_session(&key).await }, |_| {}).await
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

    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost_reason() {
            None => Ok(()),
            Some(LostReason::Closed) => Err(Error::SessionLost("the session was closed")),
            Some(_) => Err(Error::SessionLost("the session's lease is lost")),
        }
    }

    /// Joins a queue; cancel safe: if this future is dropped after the store
    /// took the entry, the entry is left again in the background.
    pub(crate) async fn join(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        mode: JoinMode,
    ) -> Result<Option<(Hold, Joined)>> {
        self.check_alive()?;
        let store = self.inner.store.clone();
        let key = self.inner.key.clone();
        let task_name = name.clone();
        let undo = {
            let (store, key, name) = (store.clone(), key.clone(), name.clone());
            move |result: Result<Option<Joined>>| {
                // The caller is gone: undo the join.
                if let Ok(Some(joined)) = result {
                    spawn_detached(async move {
                        let _ = store.leave(&key, &name, joined.seq).await;
                    });
                }
            }
        };
        let joined = finish(
            async move { store.join(&key, &task_name, kind, &value, mode).await },
            undo,
        )
        .await?;
        Ok(joined.map(|joined| {
            (
                Hold {
                    session: self.clone(),
                    name: name.clone(),
                    seq: joined.seq,
                    armed: true,
                },
                joined,
            )
        }))
    }

    /// Joins and waits for the grant, giving up at `deadline`; `None` when
    /// `wait` is false and the entry is not granted at once.
    pub(crate) async fn acquire(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        wait: Wait,
    ) -> Result<Option<(Hold, Joined)>> {
        let mode = match wait {
            Wait::No => JoinMode::IfGranted,
            _ => JoinMode::Wait,
        };
        let Some((hold, joined)) = self.join(name, kind, value, mode).await? else {
            return Ok(None);
        };
        if joined.granted {
            return Ok(Some((hold, joined)));
        }
        let store = self.inner.store.clone();
        let granted = store.await_grant(&self.inner.key, name, joined.seq);
        let deadline = async {
            match wait {
                Wait::Until(at, _) => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            result = granted => {
                result?;
                Ok(Some((hold, Joined { granted: true, ..joined })))
            }
            reason = self.lost() => Err(match reason {
                LostReason::Closed => Error::SessionLost("the session was closed while waiting"),
                _ => Error::SessionLost("the session's lease was lost while waiting"),
            }),
            () = deadline => {
                let waited = match wait { Wait::Until(_, d) => d, _ => Duration::ZERO };
                if let Err(e) = hold.release().await {
                    tracing::debug!(error = %e, "leaving the queue after a timeout failed");
                }
                Err(Error::Timeout(waited))
            }
        }
    }
}

/// The error for a waiting acquisition that came back without a grant, which
/// the recipes never expect.
pub(crate) fn no_grant() -> Error {
    Error::backend("tenure", "a waiting acquisition returned without a grant")
}

/// How long [`Session::acquire`] waits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    Forever,
    Until(Instant, Duration),
}

impl Wait {
    pub(crate) fn timeout(d: Duration) -> Wait {
        // A timeout too long to represent is no timeout.
        match Instant::now().checked_add(d) {
            Some(at) => Wait::Until(at, d),
            None => Wait::Forever,
        }
    }
}

/// Runs a store call to completion even if the caller stops waiting for it.
///
/// The call is polled right here, so the common path costs nothing extra. If
/// the caller drops this future before the call finished, the rest of the
/// call moves to a spawned task, and its output goes to `abandoned` (to undo
/// a join, say): a cancelled call leaves nothing behind.
pub(crate) async fn finish<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> T {
    Finishing {
        fut: Some(Box::pin(fut)),
        abandoned: Some(Box::new(abandoned)),
    }
    .await
}

type BoxedCall<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// See [`finish`].
struct Finishing<T: Send + 'static> {
    fut: Option<BoxedCall<T>>,
    abandoned: Option<Box<dyn FnOnce(T) + Send>>,
}

impl<T: Send + 'static> Future for Finishing<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        let Some(fut) = self.fut.as_mut() else {
            // Polled after completion: never happens through `finish`.
            return std::task::Poll::Pending;
        };
        match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => {
                self.fut = None;
                std::task::Poll::Ready(output)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Finishing<T> {
    fn drop(&mut self) {
        if let (Some(fut), Some(abandoned)) = (self.fut.take(), self.abandoned.take()) {
            spawn_detached(async move {
                abandoned(fut.await);
            });
        }
    }
}

/// One hold of a queue entry. Dropped while armed, it leaves the queue in the
/// background.
pub(crate) struct Hold {
    pub(crate) session: Session,
    pub(crate) name: Name,
    pub(crate) seq: u64,
    armed: bool,
}

impl Hold {
    /// Keeps the entry when this hold is dropped: it then lives as long as
    /// its session.
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// Leaves the queue once; runs to completion even if the caller's future
    /// is dropped.
    pub(crate) async fn release(mut self) -> Result<u32> {
        self.armed = false;
        let store = self.session.inner.store.clone();
        let key = self.session.inner.key.clone();
        let name = self.name.clone();
        let seq = self.seq;
        finish(async move { store.leave(&key, &name, seq).await }, |_| {}).await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.armed {
            let store = self.session.inner.store.clone();
            let key = self.session.inner.key.clone();
            let name = self.name.clone();
            let seq = self.seq;
            spawn_detached(async move {
                if let Err(e) = store.leave(&key, &name, seq).await {
                    tracing::debug!(error = %e, %name, "release on drop failed");
                }
            });
        }
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("name", &self.name)
            .field("seq", &self.seq)
            .finish()
    }
}

/// A local deadline on the monotonic clock, with how long the machine had
/// been suspended when it was set.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    suspended: Duration,
}

/// The deadline, moved earlier by any suspend since it was set: the store's
/// clock kept running while this process's monotonic clock stood still.
fn effective_deadline(inner: &Inner) -> Instant {
    let deadline = *inner.deadline.lock().unwrap_or_else(|e| e.into_inner());
    let slept = crate::clock::suspended().saturating_sub(deadline.suspended);
    deadline.at.checked_sub(slept).unwrap_or_else(Instant::now)
}

fn mark_lost(inner: &Inner, reason: LostReason) {
    let newly = inner.lost.send_if_modified(|slot| {
        if slot.is_none() {
            *slot = Some(reason);
            true
        } else {
            false
        }
    });
    if newly && reason != LostReason::Closed {
        tracing::warn!(tag = %inner.tag, %reason, "session lost");
        // The store may still count the session alive: end it so others need
        // not wait for its expiry.
        let store = inner.store.clone();
        let key = inner.key.clone();
        spawn_detached(async move {
            let _ = store.close_session(&key).await;
        });
    }
}

async fn renew(inner: &Inner) -> Result<()> {
    if let Some(reason) = *inner.lost.borrow() {
        return Err(Error::SessionLost(match reason {
            LostReason::Closed => "the session was closed",
            _ => "the session's lease is lost",
        }));
    }
    let suspended = crate::clock::suspended();
    let sent = Instant::now();
    match inner.store.keep_alive(&inner.key).await {
        Ok(()) => {
            let mut deadline = inner.deadline.lock().unwrap_or_else(|e| e.into_inner());
            let next = sent + inner.ttl - inner.drift;
            if next > deadline.at {
                *deadline = Deadline {
                    at: next,
                    suspended,
                };
            }
            Ok(())
        }
        Err(Error::SessionLost(why)) => {
            mark_lost(inner, LostReason::Expired);
            Err(Error::SessionLost(why))
        }
        Err(e) => Err(e),
    }
}

/// The background task: renews every `renew_every` (when asked to), retries
/// failed renewals quickly, and declares the session lost at the local
/// deadline. Holds only a weak reference so a dropped session ends it.
async fn keep_alive(weak: Weak<Inner>, auto_renew: bool) {
    let mut next_renew = Instant::now();
    let mut retry = Duration::from_millis(50);
    loop {
        let (deadline, every) = match weak.upgrade() {
            Some(inner) => {
                if inner.lost.borrow().is_some() {
                    return;
                }
                let deadline = effective_deadline(&inner);
                if Instant::now() >= deadline {
                    mark_lost(&inner, LostReason::Unconfirmed);
                    return;
                }
                (deadline, inner.renew_every)
            }
            None => return,
        };
        if next_renew <= Instant::now() {
            next_renew = Instant::now() + every;
        }
        let wake = if auto_renew {
            next_renew.min(deadline)
        } else {
            deadline
        };
        tokio::time::sleep_until(wake).await;
        if !auto_renew || Instant::now() < next_renew {
            continue;
        }
        let Some(inner) = weak.upgrade() else { return };
        // A renewal still unanswered at the deadline cannot help any more.
        match tokio::time::timeout_at(deadline, renew(&inner)).await {
            Ok(Ok(())) => {
                retry = Duration::from_millis(50);
            }
            Ok(Err(Error::SessionLost(_))) => return,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewal failed; retrying until the lease's deadline");
                next_renew = Instant::now() + retry.min(every);
                retry = (retry * 2).min(every);
            }
            Err(_) => {}
        }
    }
}
