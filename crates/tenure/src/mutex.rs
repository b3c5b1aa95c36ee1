//! A fair, reentrant distributed mutex with fencing tokens.

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::session::{Hold, LostReason, Session, Wait};
use crate::store::{EntryKind, Name};

/// A distributed mutex: at most one session holds a name at a time, as judged
/// by the store. Waiters are granted in arrival order.
///
/// The holder is the *session*: a second `lock()` of the same name through
/// the same session succeeds at once and counts one more hold (reentrancy, as
/// etcd's and Curator's locks). Tasks that must exclude each other use
/// sessions of their own.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let session = tenure::Session::new(&store).await?;
/// let mutex = tenure::Mutex::new(&session, "nightly-report")?;
/// let guard = mutex.lock().await?;
/// // Hand the token to the resource, which rejects any lower one.
/// assert!(guard.token() > 0);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    session: Session,
    name: Name,
}

impl Mutex {
    /// A mutex on `name`, held through `session`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for an empty, too
    /// long or control-character name.
    pub fn new(session: &Session, name: impl AsRef<str>) -> Result<Self> {
        Ok(Mutex {
            session: session.clone(),
            name: Name::new(name)?,
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// Waits until the lock is granted.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`](crate::Error::SessionLost) if the session ends
    /// while waiting; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue (in the background)
    /// and holds nothing.
    pub async fn lock(&self) -> Result<MutexGuard> {
        let acquired = self
            .session
            .acquire(&self.name, EntryKind::Exclusive, Vec::new(), Wait::Forever)
            .await?;
        guard(acquired)
    }

    /// Takes the lock only if it is free now (one store operation), else `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        let acquired = self
            .session
            .acquire(&self.name, EntryKind::Exclusive, Vec::new(), Wait::No)
            .await?;
        acquired.map(|a| guard(Some(a))).transpose()
    }

    /// Waits at most `timeout`; then [`Error::Timeout`](crate::Error::Timeout),
    /// having left the queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        let acquired = self
            .session
            .acquire(
                &self.name,
                EntryKind::Exclusive,
                Vec::new(),
                Wait::timeout(timeout),
            )
            .await?;
        guard(acquired)
    }
}

fn guard(acquired: Option<(Hold, crate::store::Joined)>) -> Result<MutexGuard> {
    // `acquire` returns `None` only when asked not to wait.
    let (hold, joined) = acquired.ok_or_else(crate::session::no_grant)?;
    Ok(MutexGuard {
        hold,
        holds: joined.holds,
    })
}

/// Proof of holding a [`Mutex`]. Owned (`'static + Send`), so it can move into
/// a spawned task.
///
/// Release it with [`MutexGuard::release`]. Dropping it releases too, but on a
/// best-effort basis: `Drop` cannot wait, so the release runs in a background
/// task (if a tokio runtime is running) and its outcome is not reported;
/// failing that, the store frees the lock when the session expires.
#[must_use = "the lock is released when the guard is dropped"]
#[derive(Debug)]
pub struct MutexGuard {
    hold: Hold,
    holds: u32,
}

impl MutexGuard {
    /// The fencing token: strictly greater than every token granted before on
    /// this name. Pass it to the resource you protect and have it reject
    /// lower ones.
    pub fn token(&self) -> u64 {
        self.hold.seq
    }

    /// The lock's name.
    pub fn name(&self) -> &Name {
        &self.hold.name
    }

    /// How many holds the session had on this lock when this guard was granted
    /// (1 unless reentered).
    pub fn hold_count(&self) -> u32 {
        self.holds
    }

    /// The session this lock is held through.
    pub fn session(&self) -> &Session {
        &self.hold.session
    }

    /// Resolves when the lock may no longer be held (the session's
    /// [`lost`](Session::lost)); stop touching the resource then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.session.lost()
    }

    /// Whether the lock may already be lost.
    pub fn is_lost(&self) -> bool {
        self.hold.session.is_lost()
    }

    /// Releases one hold; the lock is free once every hold is released.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`](crate::Error::SessionLost) if the session had
    /// already ended (the lock was released by the store then).
    ///
    /// # Cancel safety
    ///
    /// The release runs to completion even if this future is dropped.
    pub async fn release(self) -> Result<()> {
        self.hold.release().await.map(|_| ())
    }
}
