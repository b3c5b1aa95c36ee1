//! Joining a name's queue, holding an entry again, leaving it, and setting
//! its value.

use std::collections::HashMap;
use std::time::Duration;

use zookeeper_client as zk;

use super::call::{call, call_raw, commit, lost, zk_err};
use super::layout::{child_prefix, class_of, encode_data, parse_child};
use super::queue::{listed_checking_session, Listing};
use super::session::{Mine, ZkSession};
use super::{ZkStore, BACKEND};
use crate::backend::poll::{retrying, RETRY_FOR};
use crate::error::{Error, Result};
use crate::store::{EntryKind, JoinMode, JoinRequest, Joined, Name, SessionKey};

impl ZkStore {
    /// [`Store::join`](crate::store::Store::join):
    /// A new child in the name's queue, or one more hold of this session's.
    pub(super) async fn join_queue(
        &self,
        key: &SessionKey,
        request: JoinRequest<'_>,
    ) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let session = self.session(key)?;
        let mut entries = session.entries.lock().await;
        let dir = self.name_path(name);
        if let Some(mine) = entries.get(name).cloned() {
            return self
                .hold_again(&session, &mut entries, name, kind, mode, mine)
                .await;
        }
        let class = class_of(kind);
        if mode == JoinMode::IfGranted
            && !request.likely_free
            && self.refused_by_read(&session, name, kind, &class).await?
        {
            return Ok(None);
        }
        let prefix = child_prefix(&session.tag, kind);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let data = encode_data(1, &session.label, value);
        let (stat, child, sequence, listed) = self
            .create_and_list(&session, name, &prefix, &data, &options, &class)
            .await?;
        let path = format!("{dir}/{child}");
        // From here on, a failure must not leave the child behind unknown
        // to the session: it would block the name until the session ends.
        let remove = || async {
            retrying(|| async {
                match call_raw(session.client.delete(&path, None)).await? {
                    Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                    Err(e) => Err(zk_err(e)),
                }
            })
            .await
        };
        let listed = match listed {
            Some(Ok(listed)) if listed.0.position(&child).is_some() => Ok(listed),
            Some(Err(e @ Error::SessionLost(_))) => Err(e),
            _ => self.list_checking_session(&session, name).await,
        };
        let seq = u64::try_from(stat.czxid).map_err(|e| Error::backend(BACKEND, e));
        let (list, held_class) = match (seq.as_ref(), listed) {
            (Ok(_), Ok((list, held_class))) if list.position(&child).is_some() => {
                (list, held_class)
            }
            (_, Err(e)) => {
                remove().await?;
                return Err(e);
            }
            _ => {
                remove().await?;
                return Err(Error::backend(BACKEND, "the new entry is not in the list"));
            }
        };
        let seq = seq?;
        let i = list
            .position(&child)
            .ok_or_else(|| Error::backend(BACKEND, "the new entry is not in the list"))?;
        let others = list
            .children
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, c)| c.2);
        let refuse = match crate::queue::check_compatible(name, kind, others) {
            Err(e) => Some(Err(e)),
            Ok(()) if mode == JoinMode::IfGranted && !list.granted[i] => Some(Ok(None)),
            Ok(()) => None,
        };
        if let Some(answer) = refuse {
            remove().await?;
            return answer;
        }
        if held_class != class {
            // The name changes class (a lock's name now a semaphore's, or
            // the reverse): an entry of another class could not have joined
            // beside ours, so the node says ours before this join answers.
            // Only while our entry is there: one ended meanwhile (its
            // session evicted) must not relabel a name another class has
            // taken since.
            let written = self.set_class(&session, &path, &dir, &class).await;
            if let Err(e) = written {
                remove().await?;
                return Err(e);
            }
        }
        entries.insert(
            name.clone(),
            Mine {
                blocker: (!list.granted[i])
                    .then(|| list.blocker(i).map(str::to_string))
                    .flatten(),
                child,
                seq,
                kind,
                holds: 1,
                value: value.to_vec(),
            },
        );
        Ok(Some(Joined {
            seq,
            granted: list.granted[i],
            holds: 1,
            // The parent's first child ever has sequence 0.
            first: sequence == 0,
        }))
    }

    /// Reentrant: one more hold of the entry `mine` this session has for
    /// `name` already.
    async fn hold_again(
        &self,
        session: &ZkSession,
        entries: &mut HashMap<Name, Mine>,
        name: &Name,
        kind: EntryKind,
        mode: JoinMode,
        mine: Mine,
    ) -> Result<Option<Joined>> {
        let dir = self.name_path(name);
        crate::queue::check_same_kind(name, mine.kind, kind)?;
        let list = self.list(&session.client, name).await?;
        let i = list.position(&mine.child).ok_or_else(lost)?;
        if mode == JoinMode::IfGranted && !list.granted[i] {
            return Ok(None);
        }
        let holds = mine.holds + 1;
        let path = format!("{dir}/{}", mine.child);
        call(session.client.set_data(
            &path,
            &encode_data(holds, &session.label, &mine.value),
            None,
        ))
        .await?;
        entries.insert(
            name.clone(),
            Mine {
                holds,
                blocker: None,
                ..mine.clone()
            },
        );
        Ok(Some(Joined {
            seq: mine.seq,
            granted: list.granted[i],
            holds,
            first: false,
        }))
    }

    /// Whether a try is refused on a read of the queue, before any create.
    /// A try reads first (a read is served from the server's memory; a
    /// create and its delete go through the quorum): on a queue that would
    /// not grant it, that read is the whole answer. An exclusive try on a
    /// queue of its own class is refused on the node's child count alone,
    /// whatever the queue's length; any other try lists the queue (a class
    /// the node holds may be a moment stale while a join of another class
    /// is being refused or recorded: only a refusal is ever answered from
    /// it).
    async fn refused_by_read(
        &self,
        session: &ZkSession,
        name: &Name,
        kind: EntryKind,
        class: &[u8],
    ) -> Result<bool> {
        let (held_class, count) = self.class_and_count(&session.client, name).await?;
        if count > 0 && kind == EntryKind::Exclusive && held_class == class {
            return Ok(true);
        }
        // An empty queue grants anything: the list after the create
        // checks the rest.
        if count > 0 {
            let list = self.list(&session.client, name).await?;
            let kinds: Vec<EntryKind> = list.children.iter().map(|c| c.2).collect();
            crate::queue::check_compatible(name, kind, kinds.iter().copied())?;
            let mut with_ours = kinds;
            with_ours.push(kind);
            if !crate::queue::grants(&with_ours)
                .last()
                .copied()
                .unwrap_or(false)
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Makes the session's child for `name` and lists the queue: its stat,
    /// name and sequence, and the listing (`None`: list again).
    ///
    /// The create and the list that finds the new child in the queue go
    /// out back to back on the session's connection: ZooKeeper answers a
    /// client's requests in order, so the list is read after the child is
    /// made, and the two take one round trip. Anything but two clean
    /// answers (the name's first use, a lost answer) takes the careful
    /// path: `create_entry`, then a list of its own.
    async fn create_and_list(
        &self,
        session: &ZkSession,
        name: &Name,
        prefix: &str,
        data: &[u8],
        options: &zk::CreateOptions<'_>,
        class: &[u8],
    ) -> Result<(zk::Stat, String, i64, Option<Result<(Listing, Vec<u8>)>>)> {
        // (Each request is sent when its future is made, in this order.)
        let mut reader = self.session_checking_reader(session, name)?;
        let child_path = format!("{}/{prefix}", self.name_path(name));
        let created = session.client.create(&child_path, data, options);
        let listed = reader.commit();
        let (created, listed) =
            futures_util::future::join(call_raw(created), call_raw(listed)).await;
        Ok(match created {
            Ok(Ok((stat, sequence))) => {
                let listed = match listed {
                    Ok(Ok(answer)) => Some(listed_checking_session(answer)),
                    _ => None,
                };
                (
                    stat,
                    format!("{prefix}{sequence}"),
                    sequence.into_i64(),
                    listed,
                )
            }
            created => {
                // Only the name's first use (no node to create under) says
                // for certain that nothing was made; any other failure, a
                // lost connection above all, may follow a create that
                // happened, so its child is looked for first.
                let unsure = !matches!(created, Ok(Err(zk::Error::NoNode)));
                let (stat, child, sequence) = self
                    .create_entry(session, name, prefix, data, options, class, unsure)
                    .await?;
                (stat, child, sequence, None)
            }
        })
    }

    /// Makes the name's node at `dir` say `class`, only while the entry at
    /// `path` is there.
    async fn set_class(
        &self,
        session: &ZkSession,
        path: &str,
        dir: &str,
        class: &[u8],
    ) -> Result<()> {
        retrying(|| async {
            let mut writer = session.client.new_multi_writer();
            writer.add_check_version(path, -1).map_err(zk_err)?;
            writer.add_set_data(dir, class, None).map_err(zk_err)?;
            match commit(&mut writer).await? {
                Ok(_) => Ok(()),
                Err((0, zk::Error::NoNode)) => Err(lost()),
                Err((_, e)) => Err(zk_err(e)),
            }
        })
        .await
    }

    /// Creates the session's child for `name` (and the name's node on first
    /// use). A create whose answer was lost may have happened: the child is
    /// then found by its prefix, which only this session uses, rather than
    /// made twice (`unsure`: an earlier create's answer was lost already).
    /// Returns its stat, name and sequence.
    #[allow(clippy::too_many_arguments)]
    async fn create_entry(
        &self,
        session: &ZkSession,
        name: &Name,
        prefix: &str,
        data: &[u8],
        options: &zk::CreateOptions<'_>,
        class: &[u8],
        mut unsure: bool,
    ) -> Result<(zk::Stat, String, i64)> {
        let dir = self.name_path(name);
        let path = format!("{dir}/{prefix}");
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            if unsure {
                let children = call(session.client.list_children(&dir)).await;
                if let Ok(children) = children {
                    if let Some(child) = children.into_iter().find(|c| c.starts_with(prefix)) {
                        let stat =
                            call(session.client.check_stat(&format!("{dir}/{child}"))).await?;
                        if let (Some(stat), Some((_, _, seq))) = (stat, parse_child(&child)) {
                            return Ok((stat, child, seq));
                        }
                    }
                }
            }
            let failure = match call_raw(session.client.create(&path, data, options)).await {
                Ok(Ok((stat, sequence))) => {
                    let seq = sequence.into_i64();
                    return Ok((stat, format!("{prefix}{sequence}"), seq));
                }
                Ok(Err(zk::Error::NoNode)) => {
                    // The name's first use: make its node, then try again.
                    let parent = zk::CreateMode::Persistent.with_acls(self.acls());
                    match call_raw(session.client.create(&dir, class, &parent)).await? {
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
            unsure = true;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Store::leave`](crate::store::Store::leave):
    /// One hold less, the child deleted with the last.
    pub(super) async fn leave_queue(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let session = self.session(key)?;
        let mut entries = session.entries.lock().await;
        let Some(mine) = entries.get(name).filter(|m| m.seq == seq).cloned() else {
            return Err(Error::NotHeld("this session holds no such entry"));
        };
        let path = format!("{}/{}", self.name_path(name), mine.child);
        if mine.holds > 1 {
            let holds = mine.holds - 1;
            call(session.client.set_data(
                &path,
                &encode_data(holds, &session.label, &mine.value),
                None,
            ))
            .await?;
            entries.insert(name.clone(), Mine { holds, ..mine });
            return Ok(holds);
        }
        retrying(|| async {
            match call_raw(session.client.delete(&path, None)).await? {
                // Gone already (evicted, or an earlier try whose answer was
                // lost): the hold is gone all the same.
                Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await?;
        entries.remove(name);
        Ok(0)
    }

    /// [`Store::set_value`](crate::store::Store::set_value):
    /// The granted entry's data rewritten.
    pub(super) async fn set_entry_value(
        &self,
        key: &SessionKey,
        name: &Name,
        seq: u64,
        value: &[u8],
    ) -> Result<()> {
        let session = self.session(key)?;
        let mut entries = session.entries.lock().await;
        let Some(mine) = entries.get(name).filter(|m| m.seq == seq).cloned() else {
            return Err(Error::NotHeld("this session holds no such entry"));
        };
        let list = self.list(&session.client, name).await?;
        match list.position(&mine.child) {
            Some(i) if list.granted[i] => {}
            _ => return Err(Error::NotHeld("this session's entry is not granted")),
        }
        let path = format!("{}/{}", self.name_path(name), mine.child);
        call(
            session
                .client
                .set_data(&path, &encode_data(mine.holds, &session.label, value), None),
        )
        .await?;
        entries.insert(
            name.clone(),
            Mine {
                value: value.to_vec(),
                ..mine
            },
        );
        Ok(())
    }
}
