//! What this store remembers of the sessions it opened: the nodes that
//! lost each one, and where each of its entries is; undoing what a
//! majority did not take.

use std::collections::HashMap;
use std::sync::Arc;

use super::{lock, Mask, RedlockStore};
use crate::store::{Name, SessionKey, Store};

/// Where one of this store's sessions has an entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    pub(super) seq: u64,
    pub(super) nodes: Mask,
}

/// What this store knows of a session it opened.
#[derive(Default)]
pub(super) struct SessionState {
    /// Nodes that said the session is gone there: never used for it again.
    pub(super) dead: Mask,
    pub(super) entries: HashMap<Name, Placement>,
    /// One join at a time, so that two tasks of the session joining one
    /// name agree on one entry.
    pub(super) joining: Arc<tokio::sync::Mutex<()>>,
}

impl RedlockStore {
    pub(super) fn with_session<T>(
        &self,
        key: &SessionKey,
        f: impl FnOnce(&mut SessionState) -> T,
    ) -> T {
        let mut sessions = lock(&self.inner.sessions);
        f(sessions.entry(key.clone()).or_default())
    }

    /// The nodes worth asking about the session's entry `seq` of `name`.
    pub(super) fn nodes_for(&self, key: &SessionKey, name: &Name, seq: Option<u64>) -> Mask {
        let all = self.inner.all;
        let sessions = lock(&self.inner.sessions);
        let Some(state) = sessions.get(key) else {
            return all;
        };
        match state.entries.get(name) {
            Some(p) if seq.is_none_or(|s| s == p.seq) => p.nodes & !state.dead,
            _ => all & !state.dead,
        }
    }

    pub(super) fn mark_dead(&self, key: &SessionKey, lost: Mask) {
        if lost != 0 {
            if let Some(state) = lock(&self.inner.sessions).get_mut(key) {
                state.dead |= lost;
            }
        }
    }

    /// Takes one hold of the session's entry `seq` off the nodes in `mask`
    /// (undoing a join that did not reach a majority).
    pub(super) async fn undo(&self, key: &SessionKey, name: &Name, seq: u64, mask: Mask) {
        if mask != 0 {
            self.each(mask, |node| async move {
                node.leave(key, name, seq).await.map(|_| ())
            })
            .await;
        }
    }

    /// [`Self::undo`] in the background.
    pub(super) fn undo_detached(&self, key: &SessionKey, name: &Name, seq: u64, mask: Mask) {
        if mask == 0 {
            return;
        }
        let store = RedlockStore {
            inner: self.inner.clone(),
        };
        let (key, name) = (key.clone(), name.clone());
        crate::task::spawn_detached(async move { store.undo(&key, &name, seq, mask).await });
    }

    pub(super) fn undo_open(&self, key: &SessionKey, opened: Mask) {
        if opened == 0 {
            return;
        }
        let store = RedlockStore {
            inner: self.inner.clone(),
        };
        let key = key.clone();
        crate::task::spawn_detached(async move {
            store
                .each(opened, |node| {
                    let key = key.clone();
                    async move { node.close_session(&key).await }
                })
                .await;
        });
    }
}
