//! Placing an entry on a majority: the seq a client proposes, a first
//! join's attempts, and a rejoin of an entry this session already has.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::sessions::Placement;
use super::{bit, count, RedlockStore, BACKEND};
use crate::backend::poll::Watch;
use crate::backend::redis::NodeJoin;
use crate::error::{Error, Result};
use crate::store::{EntryKind, JoinMode, Joined, Name, SessionKey};

/// Attempts to place an entry on a majority before giving up.
const PLACE_ATTEMPTS: u32 = 16;
/// Attempts of a try-lock whose votes split (granted on some nodes, but on
/// no majority) before it reports the lock taken.
const SPLIT_ATTEMPTS: u32 = 5;
/// Largest seq a node's script keeps exactly (a Lua number).
const MAX_SEQ: u64 = 1 << 53;
/// How far below a node's ceiling (its clock plus the µs ahead it takes) a
/// client aims once it has heard of one.
const AIM_BELOW_CEILING_US: i64 = 1_000_000;

impl RedlockStore {
    /// The next seq to propose: above `floor` (the highest seq a node said
    /// it has seen), at most `ceiling` (the most a node said it takes now,
    /// its clock plus its bound) if one was named, above this client's
    /// earlier placements, and near this client's clock in microseconds
    /// corrected by what the nodes answered (so it is usually taken at the
    /// first try, and a client whose clock is far ahead learns to aim lower).
    fn propose(&self, floor: u64, ceiling: Option<u64>) -> Result<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0)
            .saturating_add(self.inner.clock_ahead_us.load(Ordering::Relaxed));
        let mut offset = self.inner.offset.load(Ordering::Relaxed);
        if let Some(ceiling) = ceiling {
            let ceiling = i64::try_from(ceiling).unwrap_or(i64::MAX);
            offset = offset.min(
                ceiling
                    .saturating_sub(now)
                    .saturating_sub(AIM_BELOW_CEILING_US),
            );
        }
        let floor_i = i64::try_from(floor).unwrap_or(i64::MAX);
        if floor_i >= now.saturating_add(offset) {
            offset = floor_i.saturating_add(1).saturating_sub(now);
        }
        self.inner.offset.store(offset, Ordering::Relaxed);
        let last = self.inner.last_placed.load(Ordering::Relaxed);
        let aimed = u64::try_from(now.saturating_add(offset)).unwrap_or(0);
        let mut seq = aimed
            .max(floor.saturating_add(1))
            .max(last.saturating_add(1));
        if let Some(ceiling) = ceiling {
            if seq > ceiling {
                // The lowest seq that can still be taken; if even that is
                // above the ceiling, the node's counter ran ahead of its
                // clock (its clock stepped back) and it refuses until its
                // clock catches up.
                seq = floor.saturating_add(1).max(last.saturating_add(1));
            }
        }
        if seq >= MAX_SEQ {
            return Err(Error::backend(
                BACKEND,
                "a node's fencing counter is beyond 2^53; it cannot go higher",
            ));
        }
        Ok(seq)
    }

    /// Shifts this client's clock as Redlock sees it (a test of a client
    /// whose clock is wrong).
    #[doc(hidden)]
    pub fn shift_clock_for_tests(&self, by_us: i64) {
        self.inner.clock_ahead_us.store(by_us, Ordering::Relaxed);
    }

    /// A join of a session that already has an entry here: one more hold,
    /// on the nodes that have it.
    pub(super) async fn rejoin(
        &self,
        key: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
        placement: Placement,
    ) -> Result<Option<Joined>> {
        let seq = placement.seq;
        let (answers, mut tally) = self
            .tally(placement.nodes, |node| async move {
                node.join_at(key, name, kind, value, mode, Some(seq)).await
            })
            .await;
        self.mark_dead(key, tally.lost);
        let mut held = 0;
        let (mut granted, mut holds) = (0, 0);
        for (i, answer) in answers {
            match answer {
                NodeJoin::Placed(j) if j.seq == seq => {
                    held |= bit(i);
                    holds = holds.max(j.holds);
                    if j.granted {
                        granted |= bit(i);
                    }
                }
                NodeJoin::NotGranted(_) => {}
                _ => {
                    tally.ok &= !bit(i);
                    tally.failed |= bit(i);
                }
            }
        }
        let majority = self.inner.majority;
        if let Some(conflict) = tally.conflict.take() {
            self.undo(key, name, seq, held).await;
            return Err(conflict);
        }
        if count(tally.ok) < majority {
            self.undo(key, name, seq, held).await;
            return self.majority_or_error(&tally).map(|()| None);
        }
        if mode == JoinMode::IfGranted && count(granted) < majority {
            self.undo(key, name, seq, held).await;
            return Ok(None);
        }
        if count(held) < majority {
            self.undo(key, name, seq, held).await;
            tally.ok = held;
            self.majority_or_error(&tally)?;
        }
        Ok(Some(Joined {
            seq,
            granted: count(granted) >= majority,
            holds,
            first: false,
        }))
    }

    /// A first join of the session's entry on `name`: a seq proposed to
    /// every node, again until a majority takes it (or, for a try-lock,
    /// grants it).
    pub(super) async fn place(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
    ) -> Result<Option<Joined>> {
        let majority = self.inner.majority;
        let mut floor = 0;
        let mut ceiling: Option<u64> = None;
        let mut splits = 0;
        let mut confirmed = false;
        for attempt in 0..PLACE_ATTEMPTS {
            let dead = self.with_session(session, |state| state.dead);
            let seq = self.propose(floor, ceiling)?;
            let (answers, mut tally) = self
                .tally(self.inner.all & !dead, |node| async move {
                    node.join_at(session, name, kind, value, mode, Some(seq))
                        .await
                })
                .await;
            self.mark_dead(session, tally.lost);
            let (mut placed, mut granted, mut first, mut behind) = (0, 0, true, false);
            let mut lapsed: Vec<(usize, Watch)> = Vec::new();
            for (i, answer) in answers {
                match answer {
                    NodeJoin::Placed(j) if j.seq == seq => {
                        placed |= bit(i);
                        first &= j.first;
                        if j.granted {
                            granted |= bit(i);
                        }
                    }
                    NodeJoin::Placed(old) => {
                        // The node still has an older entry of this session
                        // here (a release that never arrived; it just took
                        // one more hold of it): remove it, and do not count
                        // the node this time.
                        tally.ok &= !bit(i);
                        tally.failed |= bit(i);
                        for _ in 0..old.holds {
                            self.undo_detached(session, name, old.seq, bit(i));
                        }
                    }
                    NodeJoin::Behind(f) => {
                        floor = floor.max(f);
                        behind = true;
                    }
                    NodeJoin::Ahead(c) => {
                        ceiling = Some(ceiling.map_or(c, |old| old.min(c)));
                        behind = true;
                    }
                    NodeJoin::NotGranted(watch) => lapsed.extend(watch.map(|w| (i, w))),
                }
            }
            let enough = match mode {
                JoinMode::Wait => count(placed) >= majority,
                JoinMode::IfGranted => count(granted) >= majority,
            };
            if enough && tally.conflict.is_none() {
                self.inner.last_placed.fetch_max(seq, Ordering::Relaxed);
                // A node that timed out may still take the entry later.
                self.undo_detached(session, name, seq, tally.failed);
                self.with_session(session, |state| {
                    state
                        .entries
                        .insert(name.clone(), Placement { seq, nodes: placed });
                });
                return Ok(Some(Joined {
                    seq,
                    granted: count(granted) >= majority,
                    holds: 1,
                    first,
                }));
            }
            self.undo(session, name, seq, placed | tally.failed).await;
            // Without a chance of a majority, say why.
            let usable = self.inner.all & !dead & !tally.lost;
            if tally.conflict.is_some() || count(usable & !tally.failed) < majority {
                tally.ok = 0;
                return match self.majority_or_error(&tally) {
                    Ok(()) => Err(Error::unavailable(BACKEND, "no majority of nodes")),
                    Err(e) => Err(e),
                };
            }
            if mode == JoinMode::IfGranted && !behind {
                // Held only by entries that lapsed by the nodes' clocks, on
                // enough nodes that a majority would grant without them
                // (say a node that missed a release while the others
                // granted): those clocks alone are not trusted, so each such
                // node's entries are watched for their TTL, ended where none
                // renewed, and the name tried once more.
                if !confirmed && !lapsed.is_empty() && count(granted) + lapsed.len() >= majority {
                    confirmed = true;
                    let confirms = lapsed.iter().map(|(i, watch)| async move {
                        let node = self.inner.nodes[*i].get(self.inner.node_timeout).await?;
                        node.confirm_expired(name, watch).await
                    });
                    futures_util::future::join_all(confirms).await;
                    continue;
                }
                if granted == 0 {
                    // Refused by every node that answered: it is taken.
                    return Ok(None);
                }
                // A split vote among try-locks racing for a free name.
                splits += 1;
                if splits >= SPLIT_ATTEMPTS {
                    return Ok(None);
                }
            }
            // Behind: again at once, above the floor. Split: again after a
            // short random pause, so that racing clients do not meet again.
            if !behind {
                tokio::time::sleep(jitter(attempt)).await;
            }
        }
        Err(Error::unavailable(
            BACKEND,
            format!("could not place the entry on a majority in {PLACE_ATTEMPTS} attempts"),
        ))
    }
}

/// A short random pause that grows with the attempt: 1 to 4·(attempt+1) ms.
fn jitter(attempt: u32) -> Duration {
    let mut b = [0u8; 2];
    let r = getrandom::fill(&mut b)
        .map(|()| u16::from_le_bytes(b))
        .unwrap_or(7);
    let span = 4 * (u64::from(attempt.min(8)) + 1);
    Duration::from_millis(1 + u64::from(r) % span)
}
