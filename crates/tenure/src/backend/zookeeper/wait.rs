//! Waiting: for an entry's grant, watching only the child whose deletion
//! can grant it, and for a change to a queue an observer looks at.

use std::sync::atomic::Ordering;
use std::time::Duration;

use zookeeper_client as zk;

use super::call::{call, lost};
use super::queue::listing;
use super::ZkStore;
use crate::error::{Error, Result};
use crate::store::{Name, SessionKey};

/// How often an observer looks again for value changes it has no watch on.
const OBSERVE_POLL: Duration = Duration::from_millis(200);

impl ZkStore {
    /// How many times waiters of this store were woken to look at their
    /// queue again (for the no-thundering-herd test).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// How many times waiters of this store listed their queue's children
    /// (a waiter's first wait needs none: tested).
    pub fn waiter_listings(&self) -> u64 {
        self.inner.waiter_listings.load(Ordering::Relaxed)
    }

    /// [`Store::await_grant`](crate::store::Store::await_grant):
    /// A watch on the child whose deletion may grant the entry.
    pub(super) async fn wait_for_grant(
        &self,
        key: &SessionKey,
        name: &Name,
        seq: u64,
    ) -> Result<()> {
        let session = self.session(key)?;
        let (child, mut joined_behind) = {
            let mut entries = session.entries.lock().await;
            match entries.get_mut(name) {
                Some(m) if m.seq == seq => (m.child.clone(), m.blocker.take()),
                _ => return Err(Error::NotHeld("this session holds no such entry")),
            }
        };
        let dir = self.name_path(name);
        let (client, dir_ref) = (&session.client, &dir);
        let watch_node = |blocker: String| async move {
            call(client.check_and_watch_stat(&format!("{dir_ref}/{blocker}")))
                .await
                .map(|(stat, watcher)| stat.map(|_| watcher))
        };
        loop {
            // Closed or ended by the store (no renewals) while waiting.
            self.session(key)?;
            let watched = match joined_behind.take() {
                // The first turn watches the blocker the join's listing
                // named, without listing again: the watch is set against
                // its node as it is now (gone already: list, as after any
                // wake-up), and nothing is ever queued ahead of an entry
                // later.
                Some(blocker) => watch_node(blocker).await,
                None => {
                    self.inner.waiter_listings.fetch_add(1, Ordering::Relaxed);
                    let list = self.list(&session.client, name).await?;
                    let Some(i) = list.position(&child) else {
                        return Err(Error::NotHeld("the entry is no longer in the queue"));
                    };
                    if list.granted[i] {
                        return Ok(());
                    }
                    match list.blocker(i) {
                        Some(blocker) => watch_node(blocker.to_string()).await,
                        // Set against the children as they are now: if they
                        // changed since the listing, look again instead of
                        // waiting.
                        None => call(session.client.list_and_watch_children(&dir))
                            .await
                            .map(|(children, watcher)| {
                                let now = listing(children);
                                let same = now.children.len() == list.children.len()
                                    && now
                                        .children
                                        .iter()
                                        .zip(&list.children)
                                        .all(|(a, b)| a.0 == b.0);
                                same.then_some(watcher)
                            }),
                    }
                }
            };
            let event = match watched {
                Ok(Some(watcher)) => watcher.changed().await,
                // The blocker went (or the list changed) between the
                // listing and the watch.
                Ok(None) => continue,
                // The session's own deadline ends a wait that cannot reach
                // the ensemble.
                Err(e) if e.is_temporary() => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                return Err(lost());
            }
            self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`Store::wait_changed`](crate::store::Store::wait_changed):
    /// A watch on the children, and a look every `OBSERVE_POLL`.
    pub(super) async fn wait_for_change(&self, name: &Name, version: u64) -> Result<u64> {
        let dir = self.name_path(name);
        loop {
            // Children changes are pushed; value changes (a proclaim) are
            // seen by looking again every OBSERVE_POLL.
            let watch = call(self.inner.admin.list_and_watch_children(&dir)).await;
            let now = self.read_queue(name).await?.version;
            if now != version {
                return Ok(now);
            }
            match watch {
                Ok((_, watcher)) => {
                    let _ = tokio::time::timeout(OBSERVE_POLL, watcher.changed()).await;
                }
                Err(_) => tokio::time::sleep(OBSERVE_POLL).await,
            }
        }
    }
}
