//! Sessions: a lease with a TTL, renewed in the background, and the one
//! signal of loss that everything a client holds depends on.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use crate::error::LostReason;
use crate::error::{Error, Result};
use crate::store::{SessionKey, SessionSpec, Store};
use crate::task::{finish, spawn_detached};

/// The smallest clock-drift allowance: stores count expiry in whole
/// milliseconds, so their deadline may round a millisecond or two earlier.
pub const MIN_DRIFT: Duration = Duration::from_millis(2);

/// The default session TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

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
            Some(reason) => Err(Error::SessionLost(reason)),
        }
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
        return Err(Error::SessionLost(reason));
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
        Err(Error::SessionLost(reason)) => {
            // The store's expiry comes after our deadline; an answer that the
            // session is gone, received before that deadline, cannot be an
            // expiry: the session was ended by someone.
            let reason = match reason {
                LostReason::Expired if Instant::now() < effective_deadline(inner) => {
                    LostReason::Evicted
                }
                other => other,
            };
            mark_lost(inner, reason);
            Err(Error::SessionLost(reason))
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
