//! A fair distributed read-write lock.

use std::time::Duration;

use crate::acquire::Wait;
use crate::error::Result;
use crate::guard::{take, take_waiting, RwLockReadGuard, RwLockWriteGuard};
use crate::metrics::Recipe;
use crate::session::Session;
use crate::store::{EntryKind, Name};

/// A distributed read-write lock: readers share, a writer excludes everyone.
///
/// Fair: grants follow arrival order, so a waiting writer holds back the
/// readers that arrive after it, and writers are never starved. Every grant
/// carries a fencing token; a writer's token is greater than those of all
/// readers and writers granted before it.
///
/// A session holds one entry per name: a session that holds the read side
/// and asks for the write side (an upgrade) gets
/// [`Error::Conflict`](crate::Error::Conflict) instead of a deadlock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let (a, b) = (tenure::Session::new(&store).await?, tenure::Session::new(&store).await?);
/// let r1 = tenure::RwLock::new(&a, "config")?.read().await?;
/// let r2 = tenure::RwLock::new(&b, "config")?.read().await?; // readers share
/// assert!(tenure::RwLock::new(&b, "config")?.try_write().await.is_err()); // b already reads
/// r1.release().await?;
/// r2.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    session: Session,
    name: Name,
}

impl RwLock {
    /// A read-write lock on `name`, held through `session`.
    pub fn new(session: &Session, name: impl AsRef<str>) -> Result<Self> {
        Ok(RwLock {
            session: session.clone(),
            name: Name::new(name)?,
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// Waits for the read side.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue.
    pub async fn read(&self) -> Result<RwLockReadGuard> {
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Shared,
            Wait::Forever,
            Recipe::Read,
        )
        .await
        .map(RwLockReadGuard)
    }

    /// Waits for the write side.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::read`].
    pub async fn write(&self) -> Result<RwLockWriteGuard> {
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::Forever,
            Recipe::Write,
        )
        .await
        .map(RwLockWriteGuard)
    }

    /// The read side if it can be had now (no writer holds or waits).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::read`].
    pub async fn try_read(&self) -> Result<Option<RwLockReadGuard>> {
        take(
            &self.session,
            &self.name,
            EntryKind::Shared,
            Wait::No,
            Recipe::Read,
        )
        .await
        .map(|held| held.map(RwLockReadGuard))
    }

    /// The write side if the lock is free now.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::read`].
    pub async fn try_write(&self) -> Result<Option<RwLockWriteGuard>> {
        take(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::No,
            Recipe::Write,
        )
        .await
        .map(|held| held.map(RwLockWriteGuard))
    }

    /// Waits at most `timeout` for the read side.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::read`].
    pub async fn read_timeout(&self, timeout: Duration) -> Result<RwLockReadGuard> {
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Shared,
            Wait::timeout(timeout),
            Recipe::Read,
        )
        .await
        .map(RwLockReadGuard)
    }

    /// Waits at most `timeout` for the write side.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::read`].
    pub async fn write_timeout(&self, timeout: Duration) -> Result<RwLockWriteGuard> {
        take_waiting(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::timeout(timeout),
            Recipe::Write,
        )
        .await
        .map(RwLockWriteGuard)
    }
}
