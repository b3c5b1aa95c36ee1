//! The guard every lock recipe hands out.

use std::future::Future;

use crate::error::Result;
use crate::session::{Hold, LostReason, Session, Wait};
use crate::store::{EntryKind, Joined, Name};

/// Proof of holding a lock: a [`Mutex`](crate::Mutex), a read or write
/// side of an [`RwLock`](crate::RwLock), or permits of a
/// [`Semaphore`](crate::Semaphore). Owned (`'static + Send`), so it can move into
/// a spawned task.
///
/// Release it with [`Guard::release`]. Dropping it releases too, but on a
/// best-effort basis: `Drop` cannot wait, so the release runs in a background
/// task (if a tokio runtime is running) and its outcome is not reported;
/// failing that, the store frees the lock when the session expires.
#[must_use = "the lock is released when the guard is dropped"]
#[derive(Debug)]
pub struct Guard {
    hold: Hold,
    holds: u32,
    kind: EntryKind,
}

/// Takes an entry of `kind` on `name`: `Ok(None)` only for [`Wait::No`]
/// when it is not free now.
pub(crate) async fn take(
    session: &Session,
    name: &Name,
    kind: EntryKind,
    wait: Wait,
) -> Result<Option<Guard>> {
    let acquired = session.acquire(name, kind, Vec::new(), wait).await?;
    match (wait, acquired) {
        (Wait::No, None) => Ok(None),
        (_, acquired) => Guard::new(acquired, kind).map(Some),
    }
}

/// [`take`] for a waiting acquisition, which always ends in a grant or an error.
pub(crate) async fn take_waiting(
    session: &Session,
    name: &Name,
    kind: EntryKind,
    wait: Wait,
) -> Result<Guard> {
    take(session, name, kind, wait)
        .await?
        .ok_or_else(crate::session::no_grant)
}

impl Guard {
    pub(crate) fn new(acquired: Option<(Hold, Joined)>, kind: EntryKind) -> Result<Guard> {
        // `acquire` returns `None` only when asked not to wait.
        let (hold, joined) = acquired.ok_or_else(crate::session::no_grant)?;
        Ok(Guard {
            hold,
            holds: joined.holds,
            kind,
        })
    }

    /// What this guard holds: exclusive, shared, or a number of permits.
    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// The fencing token: strictly greater than every token granted before on
    /// this name. Pass it to the resource you protect and have it reject
    /// lower ones.
    pub fn token(&self) -> u64 {
        self.hold.seq
    }

    /// The name held.
    pub fn name(&self) -> &Name {
        &self.hold.name
    }

    /// How many holds the session had on this entry when this guard was
    /// granted (1 unless reentered).
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

/// The guard of a [`Mutex`](crate::Mutex).
pub type MutexGuard = Guard;
