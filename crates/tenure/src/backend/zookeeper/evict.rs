//! Eviction: ending another holder's entries, or another session, and
//! then what is left of those sessions (their markers and nodes), found
//! by listing when the session is another store's.

use std::collections::HashSet;
use std::sync::Arc;

use zookeeper_client as zk;

use super::call::{call, call_raw, zk_err};
use super::layout::parse_child;
use super::session::ZkSession;
use super::{ZkStore, BACKEND};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
use crate::store::{Name, SessionKey};

/// How many register nodes one multi-read lists the children of when
/// `evict` looks for another store's session's markers.
const SCAN_BATCH: usize = 256;

impl ZkStore {
    /// [`Store::evict`](crate::store::Store::evict):
    /// The granted entries deleted, then what is left of their sessions.
    pub(super) async fn evict_holders(&self, name: &Name) -> Result<usize> {
        // ZooKeeper cannot end another client's session: the holders'
        // entries are deleted, then the values bound to their sessions (see
        // `end_evicted`). Each holder learns it at its next renewal, or at
        // its next bound cell write, which checks its entries.
        let admin = &self.inner.admin;
        let list = self.list(admin, name).await?;
        let dir = self.name_path(name);
        let deletes = list
            .children
            .iter()
            .zip(&list.granted)
            .filter(|(_, granted)| **granted)
            .map(|((child, tag, _), _)| {
                let path = format!("{dir}/{child}");
                async move { call(admin.delete(&path, None)).await.ok().map(|()| tag) }
            });
        let tags: HashSet<String> = futures_util::future::join_all(deletes)
            .await
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        if !tags.is_empty() {
            self.end_evicted(&tags).await?;
        }
        Ok(tags.len())
    }

    /// [`Store::evict_session`](crate::store::Store::evict_session):
    /// The session's node deleted, then its entries and markers.
    pub(super) async fn evict_tag(&self, tag: &str) -> Result<bool> {
        // Tags are hex: anything else names no session (and must not be
        // put into a path or a child's name).
        if tag.is_empty() || !tag.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Ok(false);
        }
        // The session's node is the session as others can see it: deleting
        // it is the eviction (one of two racing finds it), and the owner's
        // next renewal or bound write fails for it.
        if !self.delete_session_node(tag).await? {
            return Ok(false);
        }
        let local = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|s| s.tag == tag);
        if !local {
            // Another store's session: its entries (held and waiting) are
            // deleted now, so the waiters behind are woken at once rather
            // than when its owner finds out. `end_evicted` knows a local
            // session's entries itself.
            let paths = self.find_entries(tag).await?;
            let admin = &self.inner.admin;
            let deletes = paths.iter().map(|path| {
                retrying(move || async move {
                    match call_raw(admin.delete(path, None)).await? {
                        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                        Err(e) => Err(zk_err(e)),
                    }
                })
            });
            let results: Vec<Result<()>> = futures_util::future::join_all(deletes).await;
            results.into_iter().collect::<Result<()>>()?;
        }
        self.end_evicted(&HashSet::from([tag.to_string()])).await?;
        Ok(true)
    }

    /// Ends what is left of the sessions `tags` once `evict` has deleted
    /// their entries: when this returns, the values bound to them read as
    /// gone. A session of this store is forgotten (its later calls fail with
    /// `SessionLost`, and dropping its client ends its ZooKeeper session) and
    /// its other entries and markers are deleted where it knows they are.
    /// Another store's session cannot be reached: its markers are found by
    /// listing the children of every register node (`find_markers`), and
    /// deleted by path (the store's client may delete another session's
    /// ephemeral node). A bound write that session makes afterwards fails,
    /// since its entry check finds the deleted entry gone.
    ///
    /// On an error, markers may remain until the sessions end (a session of
    /// this store as soon as its client is dropped, another store's at its
    /// next renewal).
    async fn end_evicted(&self, tags: &HashSet<String>) -> Result<()> {
        let local: Vec<Arc<ZkSession>> = {
            let mut sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let keys: Vec<SessionKey> = sessions
                .iter()
                .filter(|(_, s)| tags.contains(&s.tag))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| sessions.remove(k)).collect()
        };
        let mut paths = Vec::new();
        for session in &local {
            // The entries stay in the session's map, so that a bound write
            // under way still checks the evicted one and finds it gone (see
            // `cell_put`). `cells` is read only after `evict` deleted that
            // entry: a write that adds its name later fails its check, one
            // that committed earlier added its name before.
            let entries = session.entries.lock().await;
            paths.extend(
                entries
                    .iter()
                    .map(|(name, mine)| format!("{}/{}", self.name_path(name), mine.child)),
            );
            drop(entries);
            let cells: Vec<Name> = session
                .cells
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
                .collect();
            paths.extend(
                cells
                    .iter()
                    .map(|name| format!("{}/{}", self.register_path(name), session.tag)),
            );
        }
        // And the sessions' nodes, so that their owners' next renewals fail
        // even if they hold nothing else.
        paths.extend(tags.iter().map(|tag| self.session_path(tag)));
        let remote: HashSet<&str> = tags
            .iter()
            .map(String::as_str)
            .filter(|tag| !local.iter().any(|s| s.tag == *tag))
            .collect();
        if !remote.is_empty() {
            paths.extend(self.find_markers(&remote).await?);
        }
        let admin = &self.inner.admin;
        let deletes = paths.iter().map(|path| {
            retrying(move || async move {
                match call_raw(admin.delete(path, None)).await? {
                    Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                    Err(e) => Err(zk_err(e)),
                }
            })
        });
        let results = futures_util::future::join_all(deletes).await;
        drop(local);
        results.into_iter().collect()
    }

    /// The markers of the sessions `tags` under every fence and cell node:
    /// one listing of `PATH/r`, then one multi-read of children per
    /// [`SCAN_BATCH`] names.
    async fn find_markers(&self, tags: &HashSet<&str>) -> Result<Vec<String>> {
        let dir = format!("{}/r", self.inner.base);
        self.find_children(&dir, |marker| tags.contains(marker))
            .await
    }

    /// The entries of the session `tag` in every queue: one listing of
    /// `PATH/q`, then one multi-read of children per [`SCAN_BATCH`] names.
    async fn find_entries(&self, tag: &str) -> Result<Vec<String>> {
        let dir = format!("{}/q", self.inner.base);
        self.find_children(&dir, |child| {
            parse_child(child).is_some_and(|(owner, _, _)| owner == tag)
        })
        .await
    }

    /// The paths `dir/NODE/CHILD` of the grandchildren of `dir` that `keep`
    /// keeps.
    async fn find_children(&self, dir: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
        let admin = &self.inner.admin;
        let nodes = retrying(|| async {
            match call_raw(admin.list_children(dir)).await? {
                Ok(nodes) => Ok(nodes),
                Err(zk::Error::NoNode) => Ok(Vec::new()),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await?;
        let mut found = Vec::new();
        for batch in nodes.chunks(SCAN_BATCH) {
            let results = retrying(|| async {
                let mut reader = admin.new_multi_reader();
                for node in batch {
                    reader
                        .add_get_children(&format!("{dir}/{node}"))
                        .map_err(zk_err)?;
                }
                call(reader.commit()).await
            })
            .await?;
            if results.len() != batch.len() {
                return Err(Error::backend(
                    BACKEND,
                    format!("an unexpected answer to a read of {dir}'s children"),
                ));
            }
            for (node, result) in batch.iter().zip(results) {
                match result {
                    zk::MultiReadResult::Children { children } => found.extend(
                        children
                            .into_iter()
                            .filter(|child| keep(child))
                            .map(|child| format!("{dir}/{node}/{child}")),
                    ),
                    // Deleted meanwhile: it has no children.
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => {}
                    zk::MultiReadResult::Error { err } => return Err(zk_err(err)),
                    _ => {
                        return Err(Error::backend(
                            BACKEND,
                            format!("an unexpected answer to a read of {dir}/{node}"),
                        ))
                    }
                }
            }
        }
        Ok(found)
    }
}
