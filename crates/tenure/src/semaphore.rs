//! A fair distributed semaphore whose permits belong to sessions.

use std::time::Duration;

use crate::acquire::Wait;
use crate::error::{Error, Result};
use crate::guard::{take, take_waiting, SemaphorePermit};
use crate::metrics::Recipe;
use crate::session::Session;
use crate::store::{EntryKind, Name};

/// A distributed counting semaphore with `permits` permits in all.
///
/// Permits belong to the session that took them and vanish with it, so a
/// crashed client never leaks them (as Curator's InterProcessSemaphoreV2 and
/// `consul lock -n`). Fair: requests are granted in arrival order, so a large
/// request is not starved by small ones. Every client of one name must use
/// the same number of permits; a client that disagrees gets
/// [`Error::Conflict`] while others hold or wait.
///
/// A session takes permits once per name at a time: to hold more, release
/// and ask for the larger count.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let (a, b) = (tenure::Session::new(&store).await?, tenure::Session::new(&store).await?);
/// let pool = tenure::Semaphore::new(&a, "db-connections", 3)?;
/// let two = pool.acquire_many(2).await?;
/// let other = tenure::Semaphore::new(&b, "db-connections", 3)?;
/// assert!(other.try_acquire_many(2).await?.is_none()); // only 1 left
/// let one = other.try_acquire().await?.expect("one permit is free");
/// two.release().await?;
/// one.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    session: Session,
    name: Name,
    permits: u32,
}

impl Semaphore {
    /// A semaphore of `permits` permits on `name`, used through `session`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for zero permits; [`Error::InvalidName`].
    pub fn new(session: &Session, name: impl AsRef<str>, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::InvalidArgument {
                what: "semaphore permits",
                reason: "a semaphore needs at least one permit".into(),
            });
        }
        Ok(Semaphore {
            session: session.clone(),
            name: Name::new(name)?,
            permits,
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The number of permits in all.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn kind(&self, count: u32) -> Result<EntryKind> {
        if count == 0 || count > self.permits {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!("asked for {count} of {} permits", self.permits),
            });
        }
        Ok(EntryKind::Permits {
            count,
            limit: self.permits,
        })
    }

    /// Waits for one permit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue.
    pub async fn acquire(&self) -> Result<SemaphorePermit> {
        self.acquire_many(1).await
    }

    /// Waits for `count` permits at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn acquire_many(&self, count: u32) -> Result<SemaphorePermit> {
        take_waiting(
            &self.session,
            &self.name,
            self.kind(count)?,
            Wait::Forever,
            Recipe::Semaphore,
        )
        .await
        .map(SemaphorePermit)
    }

    /// One permit if one is free now and nobody waits ahead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit>> {
        self.try_acquire_many(1).await
    }

    /// `count` permits if they are free now and nobody waits ahead.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn try_acquire_many(&self, count: u32) -> Result<Option<SemaphorePermit>> {
        take(
            &self.session,
            &self.name,
            self.kind(count)?,
            Wait::No,
            Recipe::Semaphore,
        )
        .await
        .map(|held| held.map(SemaphorePermit))
    }

    /// Waits at most `timeout` for `count` permits.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn acquire_many_timeout(
        &self,
        count: u32,
        timeout: Duration,
    ) -> Result<SemaphorePermit> {
        take_waiting(
            &self.session,
            &self.name,
            self.kind(count)?,
            Wait::timeout(timeout),
            Recipe::Semaphore,
        )
        .await
        .map(SemaphorePermit)
    }
}
