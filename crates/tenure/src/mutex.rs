//! A reentrant distributed mutex with fencing tokens, fair (the default) or
//! not.

use std::time::Duration;

use crate::acquire::{no_grant, Order, Wait};
use crate::error::Result;
use crate::guard::{take, take_in, MutexGuard};
use crate::metrics::Recipe;
use crate::session::Session;
use crate::store::{EntryKind, Name};

/// A distributed mutex: at most one session holds a name at a time, as judged
/// by the store. Waiters are granted in arrival order, unless the mutex is
/// made non-fair with [`Mutex::fair`]`(false)`.
///
/// The holder is the *session*: a second `lock()` of the same name through
/// the same session succeeds at once and counts one more hold (reentrancy, as
/// Curator's locks). Tasks that must exclude each other use sessions of
/// their own.
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
    order: Order,
    reentrant: bool,
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
            order: Order::Fifo,
            reentrant: true,
        })
    }

    /// Fair (the default: waiters are granted in arrival order) or not.
    ///
    /// A non-fair lock is taken by whoever asks first after a release. A
    /// caller tries; refused, it waits in the name's *wake-up line*
    /// (`tenure.wake:NAME`, a queue of its own), in order of arrival. Only
    /// the first in that line watches the name: when the name changes and
    /// reads free, it tries, and a caller that asks at that moment (the
    /// releaser again, a newcomer) may win before it; it then waits for the
    /// next change. So a release wakes one waiter however many wait, and a
    /// waiter that loses goes back to watching.
    ///
    /// **Starvation bound.** A waiter that has waited
    /// [`Capabilities::barging_bound`](crate::Capabilities::barging_bound)
    /// since its first try (a few of the store's handoffs: `tenure backends`
    /// shows it) takes a place in the name's own queue, as a fair waiter
    /// does: it is granted at a release before any later try, as Go's
    /// `sync.Mutex` turns to handing over a lock whose waiter has waited a
    /// millisecond. Under sustained contention the lock then behaves as the
    /// fair one, at about twice its store operations per grant.
    ///
    /// What is granted is the same as the fair lock's: a fencing token
    /// greater than every earlier one on the name, held by the session
    /// (released within the TTL when the holder dies), reentrant,
    /// [`lost`](MutexGuard::lost) as everywhere. A fair and a non-fair mutex
    /// on one name are one lock: the fair one's queued waiters are granted
    /// before any non-fair try. An uncontended lock and release cost what
    /// the fair lock's cost (on some stores one read more: see their pages).
    /// Builds of 0.2.0 and before do not use the wake-up line: each of
    /// their non-fair waiters watches the name itself, and has no bound.
    ///
    /// Choose the non-fair lock when a release should go to whoever is
    /// ready now (a holder that takes the name again at once, a newcomer)
    /// rather than to a waiter that is slow to wake, and a waiter may wait
    /// up to the bound longer than its turn; choose the fair lock for
    /// strict arrival order. Under contention the fair lock is the faster
    /// one on most stores: its grant is made inside the release, whereas a
    /// barged grant needs a try that reaches the store after the release.
    /// The library guide's "Fair or not" (docs/library.md) has the figures
    /// of both.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> tenure::Result<()> {
    /// let store = tenure::open("memory://").await?;
    /// let session = tenure::Session::new(&store).await?;
    /// let mutex = tenure::Mutex::new(&session, "cache-refresh")?.fair(false);
    /// assert!(!mutex.is_fair());
    /// let guard = mutex.lock().await?;
    /// assert!(guard.token() > 0);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.order = match fair {
            true => Order::Fifo,
            false => Order::Barging,
        };
        self
    }

    /// Whether waiters are granted in arrival order.
    pub fn is_fair(&self) -> bool {
        self.order == Order::Fifo
    }

    /// Reentrant (the default: a second `lock` through the same session
    /// counts one more hold at once) or not, as Curator's
    /// `InterProcessSemaphoreMutex`: a second `lock` through the same
    /// session — from another task, a clone of the session or another
    /// handle on the name — then waits until the first hold is released,
    /// `try_lock` returns `None` and `lock_timeout` times out. The order
    /// among one session's own holds is kept in the process (a session
    /// lives in one); across sessions the store decides, as always.
    /// Only non-reentrant handles wait for each other: a reentrant handle
    /// on the same name and session still re-enters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> tenure::Result<()> {
    /// let store = tenure::open("memory://").await?;
    /// let session = tenure::Session::new(&store).await?;
    /// let mutex = tenure::Mutex::new(&session, "migration")?.reentrant(false);
    /// let guard = mutex.lock().await?;
    /// assert!(mutex.try_lock().await?.is_none());
    /// guard.release().await?;
    /// assert!(mutex.try_lock().await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// Whether a second `lock` through the same session re-enters at once.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    /// A non-reentrant mutex's turn among its session's own holds: `None`
    /// for a reentrant one, `Err(None)` when `wait` is over first (at once
    /// for [`Wait::No`]).
    async fn turn(
        &self,
        wait: Wait,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, Option<crate::Error>> {
        if self.reentrant {
            return Ok(None);
        }
        let gate = self.session.gate(self.name.as_str());
        if let Wait::No = wait {
            return gate.try_lock_owned().map(Some).map_err(|_| None);
        }
        let lost = self.session.lost();
        tokio::select! {
            turn = gate.lock_owned() => Ok(Some(turn)),
            reason = lost => Err(Some(crate::Error::SessionLost(reason))),
            () = wait.expired() => Err(Some(crate::Error::Timeout(wait.length()))),
        }
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
    /// and holds nothing. The session's next ask for the name waits until
    /// that leave has reached the store, so asking again at once gets the
    /// answer a first ask would.
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.take(Wait::Forever).await
    }

    /// Takes the lock only if it is free now (one store operation), else `None`.
    ///
    /// Where only a watching client may call a lease expired
    /// ([`Capabilities::watched_expiry`](crate::Capabilities::watched_expiry))
    /// and the lock is held only by
    /// sessions whose leases lapsed by the server's clock, it watches them
    /// for their TTL first (that clock alone is not trusted), then takes the
    /// lock if none renewed: it may then take up to a TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        let turn = match self.turn(Wait::No).await {
            Ok(turn) => turn,
            Err(None) => return Ok(None),
            Err(Some(e)) => return Err(e),
        };
        let held = take(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            Wait::No,
            Recipe::Mutex,
        )
        .await?;
        Ok(held.map(|mut held| {
            held.gate = turn;
            MutexGuard(held)
        }))
    }

    /// Waits at most `timeout`; then [`Error::Timeout`](crate::Error::Timeout),
    /// having left the queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.take(Wait::timeout(timeout)).await
    }

    async fn take(&self, wait: Wait) -> Result<MutexGuard> {
        let turn = self
            .turn(wait)
            .await
            .map_err(|e| e.unwrap_or_else(no_grant))?;
        let mut held = take_in(
            &self.session,
            &self.name,
            EntryKind::Exclusive,
            wait,
            self.order,
            Recipe::Mutex,
        )
        .await?
        .ok_or_else(no_grant)?;
        held.gate = turn;
        Ok(MutexGuard(held))
    }
}
