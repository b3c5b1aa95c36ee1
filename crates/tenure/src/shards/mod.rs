//! Shard ownership: a group's N shards, each owned by at most one live
//! member at a time, with a fencing token per shard.

mod assign;
mod engine;
mod view;

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::group::Group;
use crate::session::Session;
use crate::store::Name;

pub(crate) use assign::{assign, seat_id, Seat};
pub use view::{shard_map, ShardState, ShardView};

/// Where a group's shards are locked: `tenure.shard:GROUP/INDEX`.
pub const SHARD_PREFIX: &str = "tenure.shard:";

/// A granted shard's hand-out ([`Shard::handout`]): waiting in the
/// owner's channel, handed out by `next()`, or withdrawn by a revocation
/// that came first.
pub(crate) const PENDING: u8 = 0;
pub(crate) const DELIVERED: u8 = 1;
pub(crate) const WITHDRAWN: u8 = 2;

/// Withdraws a granted shard that `next()` has not handed out, so it never
/// will; `false` if it was handed out first. One atomic step decides.
pub(crate) fn withdraw(handout: &AtomicU8) -> bool {
    handout
        .compare_exchange(PENDING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// The most shards a group may have.
pub const MAX_SHARDS: u32 = 65_536;

/// How long a member that must give a shard up has, by default, between
/// being told ([`Shard::revoked`]) and the release.
pub const DEFAULT_SHARD_GRACE: Duration = Duration::from_secs(10);

pub(crate) fn shard_name_text(group: &str, index: u32) -> String {
    format!("{SHARD_PREFIX}{group}/{index}")
}

/// A group's N shards, owned by its live members: each shard by at most one
/// member at any time, each grant of a shard with a fencing token above
/// every earlier one of that shard.
///
/// **Who owns what.** Every member computes the same map from the group's
/// member list (their ids and weights): a pure function, so no member
/// writes the map down and no assigner can fail. The map is balanced (with
/// equal weights each member owns ⌊N/M⌋ or ⌈N/M⌉ shards; weights share
/// the shards out in proportion, and a weight of 0 owns none) and sticky
/// (a join or a leave moves about N/M shards, not all of them).
///
/// **Why it is safe while members disagree.** Each shard is a lock
/// (`tenure.shard:GROUP/INDEX`): the map only says which shards a member
/// asks for. A member whose view of the group is behind may wait for a
/// shard another still holds, but the store never grants one shard twice.
///
/// **Handover is drain, then release.** A member that must give a shard up
/// is told ([`Shard::revoked`]) and has the grace
/// ([`Shards::grace`]) to finish; then the shard is released and the member
/// the map now names, already waiting for it, is granted it at once. A
/// member whose session is lost loses every shard as a lock holder does:
/// [`Shard::lost`] resolves before the store can grant them to anyone else.
///
/// **How fast.** A join or a graceful leave settles within the store's
/// change latency plus the grace. A member that dies or stands still loses
/// its shards when its lease ends: within the TTL and one renew interval,
/// then the change latency (where a watcher confirms expiry, up to a TTL
/// more). The library guide's shards page (`docs/shards.md`) has the
/// figures.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let session = tenure::Session::new(&store).await?;
/// let mut owner = tenure::Shards::new(&session, "ingest", 4)?.join().await?;
/// // Alone in the group, this member owns all four shards.
/// let mut owned = Vec::new();
/// for _ in 0..4 {
///     let shard = owner.next().await?;
///     assert!(shard.token() > 0);
///     owned.push(shard.index());
/// }
/// owned.sort();
/// assert_eq!(owned, [0, 1, 2, 3]);
/// owner.leave().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Shards {
    session: Session,
    group: Group,
    shards: u32,
    weight: u32,
    value: Vec<u8>,
    grace: Duration,
}

impl Shards {
    /// The `shards` shards (1 to 65,536) of the group `group`, owned
    /// through `session`. Every member of a group gives the same count.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a count out of range;
    /// [`Error::InvalidName`] for a bad group name.
    pub fn new(session: &Session, group: impl AsRef<str>, shards: u32) -> Result<Shards> {
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(Error::InvalidArgument {
                what: "shards",
                reason: format!("a group has 1 to {MAX_SHARDS} shards, not {shards}"),
            });
        }
        Ok(Shards {
            group: Group::new(session.store(), group)?,
            session: session.clone(),
            shards,
            weight: 1,
            value: Vec::new(),
            grace: DEFAULT_SHARD_GRACE,
        })
    }

    /// This member's weight (default 1): members own shards in proportion
    /// to their weights; a weight of 0 owns none (a standby that is listed).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// This member's value in the group's list ([`Member::value`](crate::Member::value)).
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }

    /// How long a revoked shard is kept for its work to finish (default
    /// [`DEFAULT_SHARD_GRACE`]); the shard is released sooner when its
    /// [`Shard`] is released or dropped.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The group.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Joins the group and starts owning shards: the grants come through
    /// [`ShardOwner::next`].
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] when the group's members give another shard
    /// count; [`Error::Unsupported`] on a store without shared entries;
    /// [`Error::InvalidArgument`] for a value over 64 KiB; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it completes, the member leaves again.
    pub async fn join(self) -> Result<ShardOwner> {
        let others = self.group.members().await?;
        if let Some(other) = others
            .iter()
            .find(|m| m.shards != 0 && m.shards != self.shards)
        {
            return Err(Error::Conflict {
                name: self.group.name().to_string(),
                reason: format!(
                    "its members have {} shards (member {} from {}), not {}",
                    other.shards, other.id, other.label, self.shards
                ),
            });
        }
        let membership = self
            .group
            .join_as(&self.session, self.weight, self.shards, &self.value)
            .await?;
        let (granted_tx, granted) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(ShardStatus::default());
        let (leave_tx, leave_rx) = oneshot::channel();
        let member = membership.id();
        let task = tokio::spawn(
            engine::Engine::new(self, membership, granted_tx, status_tx, leave_rx).run(),
        );
        Ok(ShardOwner {
            member,
            granted,
            status,
            leave: Some(leave_tx),
            task: Some(task),
        })
    }
}

/// What a member owns and is owed, as of the last change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// How many members the map counts (live, with a weight or not).
    pub members: usize,
    /// The shards the map gives this member, in order.
    pub assigned: Vec<u32>,
    /// The shards it holds now (revoked ones still draining included).
    pub owned: Vec<u32>,
    /// Whether it owns exactly what the map gives it, with nothing draining.
    pub settled: bool,
}

/// A member of a shard group at work ([`Shards::join`]). Dropped, it leaves
/// the group at once: its shards are released without a grace.
#[derive(Debug)]
pub struct ShardOwner {
    member: u64,
    granted: mpsc::UnboundedReceiver<Shard>,
    status: watch::Receiver<ShardStatus>,
    leave: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl ShardOwner {
    /// This member's id in the group ([`Member::id`](crate::Member::id)).
    pub fn member_id(&self) -> u64 {
        self.member
    }

    /// The next shard granted to this member. Every shard the map gives it
    /// comes here once per grant; a shard given up and granted again comes
    /// again, with a higher token.
    ///
    /// # Errors
    ///
    /// [`Error::SessionLost`] once the session is lost (every shard is lost
    /// with it: join again with a new session); store errors that ended
    /// the member.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a shard not yet returned stays for the next call.
    pub async fn next(&mut self) -> Result<Shard> {
        while let Some(shard) = self.granted.recv().await {
            // Handed out, unless the engine withdrew it first (revoked
            // before it came out here: released at once). One atomic step
            // decides, so a shard is never both.
            if shard
                .handout
                .compare_exchange(PENDING, DELIVERED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(shard);
            }
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok(Ok(())) => Err(Error::NotHeld("this member has left its group")),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(Error::backend(
                    "tenure",
                    format!("the shard task ended: {e}"),
                )),
            },
            None => Err(Error::NotHeld("this member has left its group")),
        }
    }

    /// What this member owns and is owed now.
    pub fn status(&self) -> ShardStatus {
        self.status.borrow().clone()
    }

    /// Resolves at the next change of [`ShardOwner::status`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn changed(&mut self) -> Result<ShardStatus> {
        self.status
            .changed()
            .await
            .map_err(|_| Error::NotHeld("this member has left its group"))?;
        Ok(self.status())
    }

    /// Leaves the group: revokes every shard it owns, gives each its grace
    /// (or less, as each [`Shard`] is released), releases them and leaves.
    ///
    /// # Cancel safety
    ///
    /// Once called, the leave goes on in the background if this future is
    /// dropped.
    pub async fn leave(mut self) -> Result<()> {
        // Shards granted but never handed out have no work to wait for.
        self.granted.close();
        while self.granted.try_recv().is_ok() {}
        if let Some(leave) = self.leave.take() {
            let _ = leave.send(());
        }
        match self.task.take() {
            Some(task) => task
                .await
                .map_err(|e| Error::backend("tenure", format!("the shard task ended: {e}")))?,
            None => Ok(()),
        }
    }
}

/// Where a shard stands, as its owner's engine tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Owned.
    Owned,
    /// Revoked: released at this instant, or sooner once the [`Shard`] is
    /// released.
    Revoked(Instant),
    /// Released (or lost with the session): stop.
    Released,
}

/// One shard this member owns: its index, its fencing token, and the
/// signals to stop. The member holds the shard whether or not this handle
/// is kept; dropping or releasing it says the work on it is over (a
/// revoked shard is then released at once, without waiting for the grace).
#[derive(Debug)]
pub struct Shard {
    index: u32,
    shards: u32,
    token: u64,
    name: Name,
    session: Session,
    standing: watch::Receiver<Standing>,
    /// Dropped with the handle: the engine then knows the work is over.
    _done: oneshot::Sender<()>,
    /// Whether [`ShardOwner::next`] handed it out ([`DELIVERED`]) or the
    /// engine withdrew it before ([`WITHDRAWN`]): one withdrawn has no
    /// work to wait for.
    handout: Arc<AtomicU8>,
}

impl Shard {
    /// The shard's index, from 0 to [`Shard::shards`] - 1.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many shards the group has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The fencing token of this grant: above every earlier grant of this
    /// shard, to whichever member. Pass it to the resource, which refuses
    /// lower ones (a [`Fence`](crate::Fence) per shard, say).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lock the shard is in the store (`tenure.shard:GROUP/INDEX`).
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The session it is held through.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Resolves when the member must give the shard up (the map moved it,
    /// or the member is leaving), with the instant it will be released
    /// unless released sooner: finish the work by then. Resolves at once
    /// for a shard already released or lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn revoked(&self) -> impl Future<Output = Instant> + Send + 'static {
        let mut standing = self.standing.clone();
        async move {
            loop {
                let now = *standing.borrow_and_update();
                match now {
                    Standing::Revoked(at) => return at,
                    Standing::Released => return Instant::now(),
                    Standing::Owned => {}
                }
                if standing.changed().await.is_err() {
                    return Instant::now();
                }
            }
        }
    }

    /// Whether the shard is revoked, released or lost.
    pub fn is_revoked(&self) -> bool {
        *self.standing.borrow() != Standing::Owned || self.session.is_lost()
    }

    /// Resolves when the shard may no longer be held: released after its
    /// grace, or lost with the session (before anyone else can be granted
    /// it). Stop touching the resource then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut standing = self.standing.clone();
        let session = self.session.lost();
        async move {
            let released = async move {
                while *standing.borrow_and_update() != Standing::Released {
                    if standing.changed().await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                () = released => {}
                _ = session => {}
            }
        }
    }

    /// Whether the shard may no longer be held.
    pub fn is_lost(&self) -> bool {
        *self.standing.borrow() == Standing::Released || self.session.is_lost()
    }

    /// Says the work on this shard is over: a revoked shard is released at
    /// once; one still owned stays this member's until the map moves it.
    pub fn release(self) {}
}
