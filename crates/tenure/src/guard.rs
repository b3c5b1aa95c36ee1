//! The guards the lock recipes hand out: one type per kind of hold
//! ([`MutexGuard`], [`RwLockReadGuard`], [`RwLockWriteGuard`],
//! [`SemaphorePermit`]), as `tokio::sync` has, over one shared core.

use std::future::Future;

use crate::acquire::{no_grant, Hold, Order, Wait};
use crate::error::{LostReason, Result};
use crate::metrics::Recipe;
use crate::session::Session;
use crate::store::{EntryKind, Joined, Name};

/// What every guard holds: one hold of a queue entry.
#[derive(Debug)]
pub(crate) struct Held {
    hold: Hold,
    holds: u32,
    kind: EntryKind,
    /// A non-reentrant mutex's turn among its session's own holds, given
    /// back once the store's hold is released.
    pub(crate) gate: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// Takes an entry of `kind` on `name` for `recipe`: `Ok(None)` only for
/// [`Wait::No`] when it is not free now.
pub(crate) async fn take(
    session: &Session,
    name: &Name,
    kind: EntryKind,
    wait: Wait,
    recipe: Recipe,
) -> Result<Option<Held>> {
    take_in(session, name, kind, wait, Order::Fifo, recipe).await
}

/// [`take`] in the given order.
pub(crate) async fn take_in(
    session: &Session,
    name: &Name,
    kind: EntryKind,
    wait: Wait,
    order: Order,
    recipe: Recipe,
) -> Result<Option<Held>> {
    let acquired = session
        .acquire(name, kind, Vec::new(), wait, order, Some(recipe))
        .await?;
    match (wait, acquired) {
        (Wait::No, None) => Ok(None),
        (_, acquired) => Held::new(acquired, kind).map(Some),
    }
}

/// [`take`] for a waiting acquisition, which always ends in a grant or an error.
pub(crate) async fn take_waiting(
    session: &Session,
    name: &Name,
    kind: EntryKind,
    wait: Wait,
    recipe: Recipe,
) -> Result<Held> {
    take(session, name, kind, wait, recipe)
        .await?
        .ok_or_else(no_grant)
}

impl Held {
    fn new(acquired: Option<(Hold, Joined)>, kind: EntryKind) -> Result<Held> {
        // `acquire` returns `None` only when asked not to wait.
        let (hold, joined) = acquired.ok_or_else(no_grant)?;
        Ok(Held {
            hold,
            holds: joined.holds,
            kind,
            gate: None,
        })
    }
}

macro_rules! guard_type {
    ($(#[$doc:meta])* $guard:ident) => {
        $(#[$doc])*
        ///
        /// Owned (`'static + Send`), so it can move into a spawned task.
        /// Release it with `release().await`. Dropping it releases too, but
        /// on a best-effort basis: `Drop` cannot wait, so the release runs in
        /// a background task (if a tokio runtime is running) and its outcome
        /// is not reported; failing that, the store frees it when the session
        /// expires. The session's next ask for the name waits until that
        /// release has reached the store.
        #[must_use = "the lock is released when the guard is dropped"]
        #[derive(Debug)]
        pub struct $guard(pub(crate) Held);

        impl $guard {
            /// The fencing token: strictly greater than every token granted
            /// before on this name. Pass it to the resource you protect and
            /// have it reject lower ones.
            pub fn token(&self) -> u64 {
                self.0.hold.seq
            }

            /// The name held.
            pub fn name(&self) -> &Name {
                &self.0.hold.name
            }

            /// What the store holds for it: exclusive, shared, or permits.
            pub fn kind(&self) -> EntryKind {
                self.0.kind
            }

            /// How many holds the session had on this entry when this guard
            /// was granted (1 unless reentered).
            pub fn hold_count(&self) -> u32 {
                self.0.holds
            }

            /// The session this is held through.
            pub fn session(&self) -> &Session {
                &self.0.hold.session
            }

            /// Resolves when this may no longer be held (the session's
            /// [`lost`](Session::lost)); stop touching the resource then.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe.
            pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
                self.0.hold.session.lost()
            }

            /// Whether it may already be lost.
            pub fn is_lost(&self) -> bool {
                self.0.hold.session.is_lost()
            }

            /// Releases one hold; the name is free once every hold is released.
            ///
            /// # Errors
            ///
            /// [`Error::SessionLost`](crate::Error::SessionLost) if the session
            /// had already ended (the store released it then). A temporary
            /// error ([`Error::is_temporary`](crate::Error::is_temporary)):
            /// the store did not answer, so it may or may not have let go;
            /// the session then ends ([`LostReason::Unconfirmed`](crate::LostReason::Unconfirmed),
            /// its other holders are told), and its entries go with its
            /// close, or with its lease if the store does not answer that
            /// either. Lock again with a new session.
            ///
            /// # Cancel safety
            ///
            /// The release runs to completion even if this future is dropped.
            pub async fn release(self) -> Result<()> {
                let Held { hold, gate, .. } = self.0;
                let released = hold.release().await.map(|_| ());
                drop(gate);
                released
            }
        }
    };
}

guard_type!(
    /// Proof of holding a [`Mutex`](crate::Mutex).
    MutexGuard
);
guard_type!(
    /// Proof of holding the read side of an [`RwLock`](crate::RwLock):
    /// other readers may hold it too, no writer can.
    RwLockReadGuard
);
guard_type!(
    /// Proof of holding the write side of an [`RwLock`](crate::RwLock):
    /// nobody else holds either side.
    RwLockWriteGuard
);
guard_type!(
    /// Permits taken from a [`Semaphore`](crate::Semaphore).
    SemaphorePermit
);

impl SemaphorePermit {
    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        match self.0.kind {
            EntryKind::Permits { count, .. } => count,
            _ => 0,
        }
    }
}
