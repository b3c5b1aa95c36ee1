//! The task behind a [`ShardOwner`](super::ShardOwner): it watches the
//! group, computes the map, asks for the shards the map gives this member,
//! and revokes, drains and releases the others.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use super::{shard_name_text, Shard, ShardStatus, Shards, Standing};
use crate::acquire::{Hold, Order, Wait};
use crate::error::{Error, Result};
use crate::group::{members_of, until_next_lapse, Group, Membership};
use crate::metrics::NameTag;
use crate::session::Session;
use crate::store::{EntryKind, Joined, Name, Store};

/// After a store error, the map is read again this much later.
const RETRY_AFTER: Duration = Duration::from_millis(250);

/// Where the stores whose clock only hints at expiry
/// ([`Capabilities::watched_expiry`](crate::Capabilities::watched_expiry))
/// are concerned, a member's lapse changes no version: the engine looks
/// again at the next lapse, and at least this often.
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(30);

type Taken = (u32, u64, Result<Option<(Hold, Joined)>>);

enum Slot {
    /// Asked for (a waiting join), in the task `abort`; `generation` tells
    /// its answer from an older, aborted ask's.
    Taking {
        abort: AbortHandle,
        generation: u64,
        since: Instant,
    },
    Owned {
        hold: Hold,
        standing: watch::Sender<Standing>,
        done: oneshot::Receiver<()>,
        handout: Arc<AtomicU8>,
    },
    Draining {
        hold: Hold,
        standing: watch::Sender<Standing>,
        since: Instant,
    },
}

pub(super) struct Engine {
    session: Session,
    group: Group,
    shards: u32,
    grace: Duration,
    membership: Option<Membership>,
    member: u64,
    granted: mpsc::UnboundedSender<Shard>,
    status: watch::Sender<ShardStatus>,
    leave: oneshot::Receiver<()>,
    slots: HashMap<u32, Slot>,
    taking: JoinSet<Taken>,
    draining: JoinSet<u32>,
    generation: u64,
    assigned: BTreeSet<u32>,
    members: usize,
    metric: NameTag,
}

/// Aborts a task when dropped.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Engine {
    pub(super) fn new(
        shards: Shards,
        membership: Membership,
        granted: mpsc::UnboundedSender<Shard>,
        status: watch::Sender<ShardStatus>,
        leave: oneshot::Receiver<()>,
    ) -> Engine {
        let metric = NameTag::of(&Name::new(shards.group.name()).unwrap_or_else(|_| {
            // The group's name was checked when the group was made.
            shards.group.members_name().clone()
        }));
        Engine {
            session: shards.session,
            member: membership.id(),
            group: shards.group,
            shards: shards.shards,
            grace: shards.grace,
            membership: Some(membership),
            granted,
            status,
            leave,
            slots: HashMap::new(),
            taking: JoinSet::new(),
            draining: JoinSet::new(),
            generation: 0,
            assigned: BTreeSet::new(),
            members: 0,
            metric,
        }
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.session.store()
    }

    pub(super) async fn run(mut self) -> Result<()> {
        let (changed_tx, mut changed) = watch::channel(());
        let _watcher = AbortOnDrop(
            tokio::spawn(watch_versions(
                self.store().clone(),
                self.group.members_name().clone(),
                changed_tx,
            ))
            .abort_handle(),
        );
        let mut look: Option<Instant> = Some(Instant::now());
        let mut leaving = false;
        loop {
            if leaving && self.slots.is_empty() {
                return Ok(());
            }
            let lost = self.session.lost();
            tokio::select! {
                reason = lost => {
                    self.lose_all();
                    return Err(Error::SessionLost(reason));
                }
                graceful = &mut self.leave, if !leaving => {
                    leaving = true;
                    look = None;
                    self.start_leaving(graceful.is_ok()).await;
                }
                Ok(()) = changed.changed(), if !leaving => look = Some(Instant::now()),
                () = sleep_until(look), if look.is_some() && !leaving => {
                    look = match self.look().await {
                        Ok(next) => next,
                        Err(e) if e.is_temporary() => Some(Instant::now() + RETRY_AFTER),
                        Err(Error::SessionLost(reason)) => {
                            self.lose_all();
                            return Err(Error::SessionLost(reason));
                        }
                        Err(e) => return Err(e),
                    };
                }
                Some(taken) = self.taking.join_next(), if !self.taking.is_empty() => {
                    if let Ok((index, generation, result)) = taken {
                        match self.taken(index, generation, result) {
                            Ok(()) => {}
                            Err(Error::SessionLost(reason)) => {
                                self.lose_all();
                                return Err(Error::SessionLost(reason));
                            }
                            // Asked again at the next look.
                            Err(e) => {
                                tracing::debug!(error = %e, index, "asking for a shard failed");
                                look = Some(Instant::now() + RETRY_AFTER);
                            }
                        }
                    }
                }
                Some(drained) = self.draining.join_next(), if !self.draining.is_empty() => {
                    if let Ok(index) = drained {
                        self.release(index);
                    }
                }
            }
        }
    }

    /// Reads the group, computes the map and acts on it; says when to look
    /// again without a change.
    async fn look(&mut self) -> Result<Option<Instant>> {
        let queue = self.store().queue(self.group.members_name()).await?;
        let members = members_of(self.store(), &queue.entries);
        // Members of another count are not of this group's map (they were
        // refused at their join unless they raced it).
        let map = super::shard_map(&members, self.shards);
        self.members = members
            .iter()
            .filter(|m| !m.lapsed && m.shards == self.shards)
            .count();
        self.assigned = (0..self.shards)
            .filter(|&s| map[s as usize] == Some(self.member))
            .collect();
        self.apply();
        let next = self.store().capabilities().watched_expiry.then(|| {
            let lapse = until_next_lapse(self.store(), &queue.entries);
            Instant::now() + lapse.map_or(LOOK_AT_LEAST_EVERY, |d| d.min(LOOK_AT_LEAST_EVERY))
        });
        Ok(next)
    }

    /// Asks for what the map gives and revokes the rest.
    fn apply(&mut self) {
        let unwanted: Vec<u32> = self
            .slots
            .keys()
            .copied()
            .filter(|s| !self.assigned.contains(s))
            .collect();
        for index in unwanted {
            self.revoke(index, self.grace);
        }
        let wanted: Vec<u32> = self
            .assigned
            .iter()
            .copied()
            .filter(|s| !self.slots.contains_key(s))
            .collect();
        for index in wanted {
            self.ask(index);
        }
        self.publish();
    }

    fn ask(&mut self, index: u32) {
        let name = match Name::new(shard_name_text(self.group.name(), index)) {
            Ok(name) => name,
            // Checked for the largest index when the group was made.
            Err(e) => {
                tracing::warn!(error = %e, index, "a shard's name");
                return;
            }
        };
        self.generation += 1;
        let generation = self.generation;
        let session = self.session.clone();
        let abort = self.taking.spawn(async move {
            let result = session
                .acquire(
                    &name,
                    EntryKind::Exclusive,
                    Vec::new(),
                    Wait::Forever,
                    Order::Fifo,
                    None,
                )
                .await;
            (index, generation, result)
        });
        self.slots.insert(
            index,
            Slot::Taking {
                abort,
                generation,
                since: Instant::now(),
            },
        );
    }

    /// A waiting ask came back.
    fn taken(
        &mut self,
        index: u32,
        generation: u64,
        result: Result<Option<(Hold, Joined)>>,
    ) -> Result<()> {
        let since = match self.slots.get(&index) {
            Some(Slot::Taking {
                generation: current,
                since,
                ..
            }) if *current == generation => *since,
            // An ask given up on: what it took goes back (dropped, it
            // leaves in the background, before this session's next ask).
            _ => return result.map(drop),
        };
        self.slots.remove(&index);
        let (hold, joined) = result?.ok_or_else(crate::acquire::no_grant)?;
        let (standing, standing_rx) = watch::channel(Standing::Owned);
        let (done_tx, done) = oneshot::channel();
        let handout = Arc::new(AtomicU8::new(super::PENDING));
        let shard = Shard {
            handout: handout.clone(),
            index,
            shards: self.shards,
            token: joined.seq,
            name: hold.name.clone(),
            session: self.session.clone(),
            standing: standing_rx,
            _done: done_tx,
        };
        crate::metrics::shards_owned(&self.metric, 1.0);
        crate::metrics::shard_handover(&self.metric, "taken", since.elapsed().as_secs_f64());
        self.slots.insert(
            index,
            Slot::Owned {
                hold,
                standing,
                done,
                handout,
            },
        );
        // Nobody to hand it to (the owner is gone): it is revoked at the
        // owner's leave, which follows.
        let _ = self.granted.send(shard);
        self.publish();
        Ok(())
    }

    /// Stops asking for `index`, or tells its user to stop and releases it
    /// after `grace` (sooner if the user says it is done).
    fn revoke(&mut self, index: u32, grace: Duration) {
        match self.slots.remove(&index) {
            Some(Slot::Taking { abort, .. }) => abort.abort(),
            Some(Slot::Owned {
                hold,
                standing,
                done,
                handout,
            }) => {
                // Still waiting in the owner's channel: withdrawn (never
                // handed out after this), with no work to drain.
                let grace = if super::withdraw(&handout) {
                    Duration::ZERO
                } else {
                    grace
                };
                let deadline = Instant::now() + grace;
                let _ = standing.send(Standing::Revoked(deadline));
                self.draining.spawn(async move {
                    tokio::select! {
                        _ = done => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                    index
                });
                self.slots.insert(
                    index,
                    Slot::Draining {
                        hold,
                        standing,
                        since: Instant::now(),
                    },
                );
            }
            Some(draining @ Slot::Draining { .. }) => {
                self.slots.insert(index, draining);
            }
            None => {}
        }
    }

    /// A drained shard: its user is told it is released, then it is.
    fn release(&mut self, index: u32) {
        if let Some(Slot::Draining {
            hold,
            standing,
            since,
        }) = self.slots.remove(&index)
        {
            let _ = standing.send(Standing::Released);
            // Dropped, the hold leaves in the background, and this
            // session's next ask for the shard waits for that leave.
            drop(hold);
            crate::metrics::shards_owned(&self.metric, -1.0);
            crate::metrics::shard_handover(&self.metric, "given", since.elapsed().as_secs_f64());
        }
        self.publish();
    }

    async fn start_leaving(&mut self, graceful: bool) {
        // Out of the map first, so that the next owners queue up for the
        // shards while they drain.
        if let Some(membership) = self.membership.take() {
            if let Err(e) = membership.leave().await {
                tracing::debug!(error = %e, "leaving the group failed");
            }
        }
        self.assigned.clear();
        let grace = if graceful { self.grace } else { Duration::ZERO };
        let all: Vec<u32> = self.slots.keys().copied().collect();
        for index in all {
            self.revoke(index, grace);
        }
        self.publish();
    }

    /// The session is lost: so is every shard (the store may grant them to
    /// others once its lease is over).
    fn lose_all(&mut self) {
        for (_, slot) in self.slots.drain() {
            match slot {
                Slot::Taking { abort, .. } => abort.abort(),
                Slot::Owned {
                    hold,
                    standing,
                    handout,
                    ..
                } => {
                    // One still in the owner's channel is never handed out.
                    super::withdraw(&handout);
                    let _ = standing.send(Standing::Released);
                    hold.keep();
                    crate::metrics::shards_owned(&self.metric, -1.0);
                }
                Slot::Draining { hold, standing, .. } => {
                    let _ = standing.send(Standing::Released);
                    hold.keep();
                    crate::metrics::shards_owned(&self.metric, -1.0);
                }
            }
        }
        self.assigned.clear();
        self.publish();
    }

    fn publish(&self) {
        let owned: Vec<u32> = {
            let mut owned: Vec<u32> = self
                .slots
                .iter()
                .filter(|(_, s)| !matches!(s, Slot::Taking { .. }))
                .map(|(i, _)| *i)
                .collect();
            owned.sort_unstable();
            owned
        };
        let settled = self.membership.is_some()
            && self.slots.len() == self.assigned.len()
            && self
                .slots
                .iter()
                .all(|(i, s)| matches!(s, Slot::Owned { .. }) && self.assigned.contains(i));
        let status = ShardStatus {
            members: self.members,
            assigned: self.assigned.iter().copied().collect(),
            owned,
            settled,
        };
        let was = self.status.borrow().settled;
        if was != settled {
            let at = if settled {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64())
            } else {
                0.0
            };
            crate::metrics::shards_settled(&self.metric, at);
        }
        self.status.send_if_modified(|now| {
            let differs = *now != status;
            *now = status;
            differs
        });
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Says on `changed` every time the group's queue changes (and once at the
/// start, and after an error, so that nothing between is missed).
async fn watch_versions(store: Arc<dyn Store>, name: Name, changed: watch::Sender<()>) {
    let mut version = None;
    loop {
        let next = match version {
            None => store.queue(&name).await.map(|q| q.version),
            Some(v) => store.wait_changed(&name, v).await,
        };
        match next {
            Ok(v) => version = Some(v),
            Err(e) => {
                tracing::debug!(error = %e, "watching a group failed");
                version = None;
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
        if changed.send(()).is_err() {
            return;
        }
    }
}
