//! The `Store` impl: each operation asked of the nodes and decided by a
//! majority (placing entries: `join.rs`; fencing: `fence.rs`).

use std::collections::HashMap;

use async_trait::async_trait;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::connect::CONNECT_TIMEOUT;
use super::merge::merge;
use super::quorum::{ended_live_session, Tally};
use super::sessions::Placement;
use super::{bit, count, lock, Mask, RedlockStore, BACKEND, POLL_MAX, POLL_MIN};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, EntryKind, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession, Queue,
    SessionKey, SessionSpec, Store,
};

#[async_trait]
impl Store for RedlockStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let (_, tally) = self
            .tally(self.inner.all, |node| {
                let opened = &opened;
                async move { node.open_session_as(opened, spec).await }
            })
            .await;
        if let Err(e) = self.majority_or_error(&tally) {
            self.undo_open(&opened.key, tally.ok);
            return Err(e);
        }
        // Nodes that did not take the session never see it again.
        let dead = self.inner.all & !tally.ok;
        self.with_session(&opened.key, |state| state.dead = dead);
        // The build, on the nodes that took the session: a node that misses
        // it only makes the session look older to a listing (see
        // `session_builds`), never newer.
        let key = &opened.key;
        let _ = self
            .tally(tally.ok, |node| async move { node.record_build(key).await })
            .await;
        Ok(opened)
    }

    /// The marker retired on every node that answers; a majority must.
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move {
                node.retire_older_layouts().await
            })
            .await;
        self.majority_or_error(&tally)?;
        Ok(answers.into_iter().flat_map(|(_, changed)| changed).collect())
    }

    /// Every node declared new; a majority must answer, and a node where a
    /// session lives refuses for all.
    async fn declare_new(&self) -> Result<Vec<String>> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move {
                match node.declare_new_prefix().await {
                    Err(Error::InvalidArgument { reason, .. }) => Ok(Err(reason)),
                    other => other.map(Ok),
                }
            })
            .await;
        self.majority_or_error(&tally)?;
        let mut changed = Vec::new();
        for (_, answer) in answers {
            changed.extend(answer.map_err(|reason| Error::InvalidArgument {
                what: "store",
                reason,
            })?);
        }
        Ok(changed)
    }

    /// Every session a majority of nodes answered for, as any node that
    /// answered knows it (a session on one node only counts), with the build
    /// any of them recorded.
    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move {
                node.session_builds_by_secret().await
            })
            .await;
        self.majority_or_error(&tally)?;
        let mut merged: HashMap<String, (String, String, Option<String>)> = HashMap::new();
        for (_, sessions) in answers {
            for (secret, (tag, label, build)) in sessions {
                let slot = merged.entry(secret).or_insert((tag, label, None));
                if slot.2.is_none() {
                    slot.2 = build;
                }
            }
        }
        Ok(crate::store::SessionBuild::listed(merged.into_values()))
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let (dead, entries): (Mask, Vec<Placement>) = lock(&self.inner.sessions)
            .get(session)
            .map(|state| (state.dead, state.entries.values().copied().collect()))
            .unwrap_or_default();
        let (_, tally) = self
            .tally(self.inner.all & !dead, |node| async move {
                node.keep_alive(session).await
            })
            .await;
        self.mark_dead(session, tally.lost);
        let dead = dead | tally.lost;
        let majority = self.inner.majority;
        let confirmed = count(tally.ok) >= majority
            && entries
                .iter()
                .all(|p| count(p.nodes & tally.ok) >= majority);
        if confirmed {
            return Ok(());
        }
        let still_possible = count(self.inner.all & !dead) >= majority
            && entries.iter().all(|p| count(p.nodes & !dead) >= majority);
        if !still_possible {
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        let why = tally.failure.map(|e| format!(": {e}")).unwrap_or_default();
        Err(Error::unavailable(
            BACKEND,
            format!(
                "the renewal was confirmed by {} of {} nodes, not by a majority for every entry{why}",
                count(tally.ok),
                self.inner.nodes.len()
            ),
        ))
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let dead = lock(&self.inner.sessions)
            .get(session)
            .map_or(0, |state| state.dead);
        let (_, tally) = self
            .tally(self.inner.all & !dead, |node| async move {
                node.close_session(session).await
            })
            .await;
        lock(&self.inner.sessions).remove(session);
        if count(tally.ok | tally.lost | dead) >= self.inner.majority {
            Ok(())
        } else {
            self.majority_or_error(&tally)
        }
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        if let EntryKind::Permits { limit, .. } = kind {
            if limit > 1 {
                return Err(Error::Unsupported {
                    backend: BACKEND,
                    what: "semaphores with more than one permit (a majority of nodes cannot bound a count)",
                });
            }
        }
        let gate = self.with_session(session, |state| state.joining.clone());
        let _one_join_at_a_time = gate.lock().await;
        let (dead, placement) = self.with_session(session, |state| {
            (state.dead, state.entries.get(name).copied())
        });
        if let Some(placement) = placement {
            let placement = Placement {
                nodes: placement.nodes & !dead,
                ..placement
            };
            return self
                .rejoin(session, name, kind, value, mode, placement)
                .await;
        }
        self.place(session, name, kind, value, mode).await
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let mask = self.nodes_for(session, name, Some(seq));
        let (answers, tally) = self
            .tally(
                mask,
                |node| async move { node.leave(session, name, seq).await },
            )
            .await;
        self.mark_dead(session, tally.lost);
        let holds = answers.iter().map(|(_, h)| *h).max().unwrap_or(0);
        if holds == 0 && !answers.is_empty() {
            // The nodes that did not answer keep the entry (their renewals
            // would keep it for the session's life): try them again.
            self.undo_detached(session, name, seq, tally.failed);
        }
        let gone: Mask = answers
            .iter()
            .filter(|(_, h)| *h == 0)
            .fold(0, |m, (i, _)| m | bit(*i));
        self.with_session(session, |state| {
            if let Some(p) = state.entries.get_mut(name) {
                if p.seq == seq {
                    p.nodes &= !gone;
                    if holds == 0 || p.nodes == 0 {
                        state.entries.remove(name);
                    }
                }
            }
        });
        self.majority_or_error(&tally)?;
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let mask = self.nodes_for(session, name, Some(seq));
        let timeout = self.inner.node_timeout;
        let mut waits: FuturesUnordered<_> = (0..self.inner.nodes.len())
            .filter(|i| mask & bit(*i) != 0)
            .map(|i| {
                let node = &self.inner.nodes[i];
                async move {
                    // A node that fails for a while is asked again: the
                    // session's own deadline ends the wait if need be.
                    loop {
                        let result = match node.get(timeout).await {
                            Ok(store) => store.await_grant(session, name, seq).await,
                            Err(e) => Err(e),
                        };
                        match result {
                            Err(e) if e.is_temporary() => {
                                tokio::time::sleep(POLL_MAX * 2).await;
                            }
                            other => return (i, other),
                        }
                    }
                }
            })
            .collect();
        let majority = self.inner.majority;
        let mut tally = Tally::default();
        let mut pending = count(mask);
        while let Some((i, result)) = waits.next().await {
            pending -= 1;
            tally.note(i, result);
            if count(tally.ok) >= majority {
                return Ok(());
            }
            if count(tally.ok) + pending < majority {
                self.mark_dead(session, tally.lost);
                return self.majority_or_error(&tally);
            }
        }
        self.majority_or_error(&tally)
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let mask = self.nodes_for(key, name, Some(seq));
        let (_, tally) = self
            .tally(mask, |node| async move {
                node.set_value(key, name, seq, value).await
            })
            .await;
        self.mark_dead(key, tally.lost);
        self.majority_or_error(&tally)
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move { node.queue(name).await })
            .await;
        self.majority_or_error(&tally)?;
        Ok(merge(
            answers.into_iter().map(|(_, q)| q).collect(),
            self.threshold(count(tally.ok)),
        ))
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let mut listening = Vec::new();
        for node in &self.inner.nodes {
            if let Ok(store) = node.get(self.inner.node_timeout).await {
                listening.push(store.listen_changes(name).await);
            }
        }
        let mut backoff = POLL_MIN;
        loop {
            let mut notified: Vec<_> = listening
                .iter()
                .map(|l| Box::pin(l.notify().notified()))
                .collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            let now = self.queue(name).await?.version;
            if now != version {
                return Ok(now);
            }
            let any = async {
                if notified.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures_util::future::select_all(notified).await;
                }
            };
            tokio::select! {
                () = any => backoff = POLL_MIN,
                () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(POLL_MAX),
            }
        }
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let (answers, tally) = self
            .tally(
                self.inner.all,
                |node| async move { node.names(prefix).await },
            )
            .await;
        self.majority_or_error(&tally)?;
        let threshold = self.threshold(count(tally.ok));
        let mut seen: HashMap<Name, usize> = HashMap::new();
        for (_, names) in answers {
            for name in names {
                *seen.entry(name).or_default() += 1;
            }
        }
        let mut names: Vec<Name> = seen
            .into_iter()
            .filter(|(_, n)| *n >= threshold)
            .map(|(name, _)| name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move { node.evict(name).await })
            .await;
        self.majority_or_error(&tally)?;
        Ok(answers.into_iter().map(|(_, n)| n).max().unwrap_or(0))
    }

    /// Ends the session on every node that has it; see `ended_live_session`
    /// for what the answers mean.
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        // A node looks through its session records in a few round trips
        // (see the Redis backend's), each bounded by the node timeout; the
        // whole look gets the connect timeout on top, as opening does.
        let timeout = CONNECT_TIMEOUT + self.inner.node_timeout;
        let mut tally = Tally::default();
        let mut ended: Mask = 0;
        for (i, result) in self
            .each_within(self.inner.all, timeout, |node| async move {
                node.evict_session(tag).await
            })
            .await
        {
            if tally.note(i, result) == Some(true) {
                ended |= bit(i);
            }
        }
        self.majority_or_error(&tally)?;
        ended_live_session(self.inner.nodes.len(), self.inner.majority, ended, tally.ok)
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.fence_on_majority(name, op).await
    }
}
