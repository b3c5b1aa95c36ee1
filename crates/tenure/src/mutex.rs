//! A fair, reentrant distributed mutex with fencing tokens.

use std::time::Duration;

use crate::acquire::Wait;
use crate::error::Result;
use crate::guard::{take, take_waiting, MutexGuard};
use crate::metrics::Recipe;
use crate::session::Session;
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
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::Forever,
            Recipe::Mutex,
        )
        .await
        .map(MutexGuard)
    }

    /// Takes the lock only if it is free now (one store operation), else `None`.
    ///
    /// Where only a watching client may call a lease expired
    /// ([`Capabilities::watched_expiry`](crate::Capabilities::watched_expiry):
    /// PostgreSQL, MySQL, Redis, Redlock) and the lock is held only by
    /// sessions whose leases lapsed by the server's clock, it watches them
    /// for their TTL first (that clock alone is not trusted), then takes the
    /// lock if none renewed: it may then take up to a TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        take(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::No,
            Recipe::Mutex,
        )
        .await
        .map(|held| held.map(MutexGuard))
    }

    /// Waits at most `timeout`; then [`Error::Timeout`](crate::Error::Timeout),
    /// having left the queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::timeout(timeout),
            Recipe::Mutex,
        )
        .await
        .map(MutexGuard)
    }
}
