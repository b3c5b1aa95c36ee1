//! Sessions: each its own ZooKeeper client and session node, what it
//! holds, its renewals, its end, and the reaping of the ones nobody renews.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::call::{call, call_raw, lost, zk_err};
use super::connect::connect;
use super::{ZkStore, BACKEND};
use crate::backend::poll::{retrying, RETRY_FOR};
use crate::error::{Error, Result};
use crate::store::{EntryKind, Name, OpenedSession, SessionKey, SessionSpec};

/// How often the store looks for sessions nobody renews any more.
pub(super) const REAP_EVERY: Duration = Duration::from_millis(50);

/// A session being connected, counted until dropped.
struct OpeningSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for OpeningSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A tenure session: its own ZooKeeper client, and where its entries are.
pub(super) struct ZkSession {
    pub(super) client: zk::Client,
    pub(super) tag: String,
    pub(super) label: String,
    pub(super) ttl: Duration,
    /// When the session ends unless renewed: the client library pings the
    /// server by itself, so the store ends a session nobody renews, as a
    /// lease would end (see [`ZkStore::reap`]).
    pub(super) deadline: std::sync::Mutex<tokio::time::Instant>,
    pub(super) entries: tokio::sync::Mutex<HashMap<Name, Mine>>,
    /// The cells this session has bound a value to: where its markers may be.
    pub(super) cells: std::sync::Mutex<HashSet<Name>>,
}

/// One entry of this session.
#[derive(Debug, Clone)]
pub(super) struct Mine {
    pub(super) child: String,
    pub(super) seq: u64,
    pub(super) kind: EntryKind,
    pub(super) holds: u32,
    pub(super) value: Vec<u8>,
    /// The child whose deletion may grant this entry, as the join's
    /// listing named it, for the entry's first wait (which then need not
    /// list the queue again); `None` once taken, or to list first.
    pub(super) blocker: Option<String>,
}

impl ZkStore {
    /// Ends the sessions whose renewals stopped (a detached session, or one
    /// whose owner stopped renewing) at their deadline.
    pub(super) async fn reap(&self) {
        let now = tokio::time::Instant::now();
        let expired: Vec<SessionKey> = {
            let sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            sessions
                .iter()
                .filter(|(_, s)| *s.deadline.lock().unwrap_or_else(|e| e.into_inner()) <= now)
                .map(|(k, _)| k.clone())
                .collect()
        };
        for key in expired {
            let _ = self.end_session(&key).await;
        }
    }

    pub(super) fn session(&self, key: &SessionKey) -> Result<Arc<ZkSession>> {
        let sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sessions.get(key).cloned().ok_or_else(lost)
    }

    /// Counts a session about to connect against `max_sessions`, or refuses
    /// it with a typed error that says what to change. The slot is a
    /// connect in progress until dropped (by then the session is in
    /// `sessions`, or failed).
    fn reserve_session(&self) -> Result<OpeningSlot<'_>> {
        let sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let opening = &self.inner.opening;
        let open = sessions.len() + opening.load(Ordering::Acquire);
        let max = self.inner.max_sessions;
        if max != 0 && open >= max {
            return Err(Error::InvalidArgument {
                what: "number of ZooKeeper sessions",
                reason: format!(
                    "this store already has {open} sessions open (max_sessions={max}); each is a \
                     ZooKeeper connection, and the server refuses more than its maxClientCnxns \
                     (60 by default) from one address: raise maxClientCnxns (0: no limit) and \
                     give the store URL ?max_sessions=N (0: no limit)"
                ),
            });
        }
        opening.fetch_add(1, Ordering::AcqRel);
        Ok(OpeningSlot(opening))
    }

    pub(super) fn forget(&self, key: &SessionKey) -> Option<Arc<ZkSession>> {
        let mut sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sessions.remove(key)
    }

    /// Makes the node of a new session with the session's own client (and
    /// `PATH/s` on first use). A create tried again after a lost answer may
    /// find the node there: it is this session's if it is its ephemeral.
    async fn create_session_node(&self, client: &zk::Client, tag: &str, data: &[u8]) -> Result<()> {
        let path = self.session_path(tag);
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(self.acls());
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let failure = match call_raw(client.create(&path, data, &ephemeral)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(zk::Error::NodeExists)) => {
                    let stat = call(client.check_stat(&path)).await?;
                    if stat.is_some_and(|s| s.ephemeral_owner == client.session_id().0) {
                        return Ok(());
                    }
                    // Another live session's tag (or a node put by hand):
                    // this one could never be told apart from it.
                    return Err(Error::backend(
                        BACKEND,
                        format!("{path} already exists: not a new session's"),
                    ));
                }
                Ok(Err(zk::Error::NoNode)) => {
                    let dir = format!("{}/s", self.inner.base);
                    let parent = zk::CreateMode::Persistent.with_acls(self.acls());
                    match call_raw(client.create(&dir, &[], &parent)).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => continue,
                        Err(e) => zk_err(e),
                    }
                }
                Ok(Err(e)) => zk_err(e),
                Err(timeout) => timeout,
            };
            if !failure.is_temporary() || tokio::time::Instant::now() >= deadline {
                return Err(failure);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Store::session_builds`](crate::store::Store::session_builds):
    /// every session node (each there until its session ends), with the
    /// build and label a session of format 2 keeps in it.
    pub(super) async fn list_session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        const BATCH: usize = 256;
        let admin = &self.inner.admin;
        let dir = format!("{}/s", self.inner.base);
        let tags = retrying(|| async {
            match call_raw(admin.list_children(&dir)).await? {
                Ok(tags) => Ok(tags),
                Err(zk::Error::NoNode) => Ok(Vec::new()),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await?;
        let mut all = Vec::new();
        for batch in tags.chunks(BATCH) {
            let results = retrying(|| async {
                let mut reader = admin.new_multi_reader();
                for tag in batch {
                    reader.add_get_data(&self.session_path(tag)).map_err(zk_err)?;
                }
                call(reader.commit()).await
            })
            .await?;
            for (tag, result) in batch.iter().zip(results) {
                // A session that ended between the listing and the read is gone.
                let zk::MultiReadResult::Data { data, .. } = result else {
                    continue;
                };
                let text = String::from_utf8_lossy(&data).into_owned();
                let (build, label) = text.split_once('\n').unwrap_or((text.as_str(), ""));
                all.push(crate::store::SessionBuild::new(
                    tag.clone(),
                    label.to_string(),
                    crate::store::Build::decode(build),
                ));
            }
        }
        all.sort_by(|a, b| a.tag.cmp(&b.tag));
        Ok(all)
    }

    /// ZooKeeper keeps no marker older builds read: this records that the
    /// upgrade was finished (`PATH/format`), and older builds started later
    /// are not refused.
    pub(super) async fn mark_format(&self) -> Result<Vec<String>> {
        let admin = &self.inner.admin;
        let path = format!("{}/format", self.inner.base);
        let data = super::FORMAT.as_bytes();
        retrying(|| async {
            let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
            match call_raw(admin.create(&path, data, &persistent)).await? {
                Ok(_) => Ok(()),
                Err(zk::Error::NodeExists) => call(admin.set_data(&path, data, None)).await.map(|_| ()),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await?;
        Ok(vec![format!(
            "{path} = {} (builds of 0.1.0 do not read it: stop them all before finishing)",
            super::FORMAT
        )])
    }

    /// Deletes the node of the session `tag` (with the store's client: any
    /// client may delete another session's ephemeral node), and says
    /// whether it was there. Once a delete's answer was lost, a retry that
    /// finds nothing cannot tell whether the lost one deleted it: it counts
    /// as there.
    pub(super) async fn delete_session_node(&self, tag: &str) -> Result<bool> {
        let path = self.session_path(tag);
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut unsure = false;
        loop {
            let failure = match call_raw(self.inner.admin.delete(&path, None)).await {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(zk::Error::NoNode)) => return Ok(unsure),
                Ok(Err(e)) => zk_err(e),
                Err(timeout) => timeout,
            };
            if !failure.is_temporary() || tokio::time::Instant::now() >= deadline {
                return Err(failure);
            }
            unsure = true;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Store::open_session`](crate::store::Store::open_session):
    /// A ZooKeeper client of its own, and its session node.
    pub(super) async fn start_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let _slot = self.reserve_session()?;
        let client = connect(
            &self.inner.hosts,
            self.inner.auth.as_deref(),
            self.inner.tls.as_ref(),
            spec.ttl,
        )
        .await?;
        let negotiated = client.session_timeout();
        if negotiated < spec.ttl {
            return Err(Error::InvalidArgument {
                what: "session TTL",
                reason: format!(
                    "the ZooKeeper server allows at most {negotiated:?} (its maxSessionTimeout), less than the TTL {:?}",
                    spec.ttl
                ),
            });
        }
        let OpenedSession { key, tag } = OpenedSession::random()?;
        // Until this node goes, the session is live: `evict_session` finds
        // a session by it, and deletes it to tell its renewals.
        let label = crate::backend::poll::printable(&spec.label);
        // Format 2: the node's data is the build that opened the session and
        // its label (format 1 left it empty, and never reads it).
        let build = crate::store::Build::this(super::FORMAT).encode();
        let data = format!("{build}\n{label}");
        self.create_session_node(&client, &tag, data.as_bytes())
            .await?;
        let session = Arc::new(ZkSession {
            client,
            tag: tag.clone(),
            label,
            ttl: spec.ttl,
            deadline: std::sync::Mutex::new(tokio::time::Instant::now() + spec.ttl),
            entries: tokio::sync::Mutex::new(HashMap::new()),
            cells: std::sync::Mutex::new(HashSet::new()),
        });
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), session);
        Ok(OpenedSession { key, tag })
    }

    /// [`Store::keep_alive`](crate::store::Store::keep_alive):
    /// One multi-read of the session's node and entries.
    pub(super) async fn renew_session(&self, key: &SessionKey) -> Result<()> {
        let session = self.session(key)?;
        let expired = *session.deadline.lock().unwrap_or_else(|e| e.into_inner())
            <= tokio::time::Instant::now();
        if expired || session.client.state().is_terminated() {
            // Never revive a session past its deadline.
            let _ = self.end_session(key).await;
            return Err(lost());
        }
        let entries: Vec<(Name, Mine)> = session
            .entries
            .lock()
            .await
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect();
        let sent = tokio::time::Instant::now();
        // One round trip that proves the session alive now and finds out
        // whether an entry was removed (evicted) behind its back.
        let mut reader = session.client.new_multi_reader();
        reader
            .add_get_data(&self.session_path(&session.tag))
            .map_err(zk_err)?;
        for (name, mine) in &entries {
            reader
                .add_get_data(&format!("{}/{}", self.name_path(name), mine.child))
                .map_err(zk_err)?;
        }
        let results = call(reader.commit()).await.inspect_err(|e| {
            if matches!(e, Error::SessionLost(_)) {
                self.forget(key);
            }
        })?;
        match results.first() {
            Some(zk::MultiReadResult::Data { .. }) => {}
            // The session's node is gone: `evict_session` ended it, perhaps
            // from another store.
            Some(zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            }) => {
                self.forget(key);
                return Err(lost());
            }
            Some(zk::MultiReadResult::Error { err }) => return Err(zk_err(err.clone())),
            _ => return Err(Error::backend(BACKEND, "an unexpected answer to a renewal")),
        }
        let missing: Vec<&(Name, Mine)> = results
            .iter()
            .skip(1)
            .zip(&entries)
            .filter(|(r, _)| !matches!(r, zk::MultiReadResult::Data { .. }))
            .map(|(_, e)| e)
            .collect();
        // An entry released while this renewal was under way is not gone
        // behind the session's back: only one it still has counts.
        let gone = if missing.is_empty() {
            false
        } else {
            let now = session.entries.lock().await;
            missing
                .iter()
                .any(|(name, mine)| now.get(name).is_some_and(|m| m.child == mine.child))
        };
        if gone {
            // Never go on with a session that lost an entry.
            self.forget(key);
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        let mut deadline = session.deadline.lock().unwrap_or_else(|e| e.into_inner());
        *deadline = (*deadline).max(sent + session.ttl);
        Ok(())
    }

    /// [`Store::close_session`](crate::store::Store::close_session):
    /// Its entries, markers and node deleted now.
    pub(super) async fn end_session(&self, key: &SessionKey) -> Result<()> {
        let Some(session) = self.forget(key) else {
            return Ok(());
        };
        // Remove the entries now rather than when the server gets to the
        // session's end, so the next holder need not wait for it.
        let entries: Vec<(Name, Mine)> = session.entries.lock().await.drain().collect();
        let deletes = entries.iter().map(|(name, mine)| {
            let path = format!("{}/{}", self.name_path(name), mine.child);
            let client = session.client.clone();
            async move {
                match call_raw(client.delete(&path, None)).await {
                    Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(()),
                    Ok(Err(e)) => Err(zk_err(e)),
                    Err(e) => Err(e),
                }
            }
        });
        // And its cells' markers, so that the values bound to it are gone
        // when this returns (the server would drop them only once it ends
        // the connection's session).
        let cells: Vec<Name> = session
            .cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let markers = cells.iter().map(|name| {
            let path = format!("{}/{}", self.register_path(name), session.tag);
            let client = session.client.clone();
            async move {
                match call_raw(client.delete(&path, None)).await {
                    Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(()),
                    Ok(Err(e)) => Err(zk_err(e)),
                    Err(e) => Err(e),
                }
            }
        });
        // And its node, so that `evict_session` no longer finds it.
        let node = async {
            let path = self.session_path(&session.tag);
            match call_raw(session.client.delete(&path, None)).await {
                Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(()),
                Ok(Err(e)) => Err(zk_err(e)),
                Err(e) => Err(e),
            }
        };
        let (deleted, unmarked, unlisted) = futures_util::future::join3(
            futures_util::future::join_all(deletes),
            futures_util::future::join_all(markers),
            node,
        )
        .await;
        drop(session);
        // A delete the server did not answer: the entries stay until the
        // server ends the connection's session (within its TTL), which the
        // caller is told rather than a close that did not happen.
        deleted.into_iter().chain(unmarked).collect::<Result<Vec<()>>>()?;
        unlisted
    }
}
