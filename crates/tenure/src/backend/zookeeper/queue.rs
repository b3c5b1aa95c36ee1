//! A name's queue as its node's children list it: their order, who is
//! granted, and the reads of queues and names.

use std::time::Duration;

use zookeeper_client as zk;

use super::call::{call, call_raw, lost, zk_err};
use super::layout::{decode_data, decode_name, parse_child};
use super::session::ZkSession;
use super::{ZkStore, BACKEND};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
use crate::store::{Entry, EntryKind, Name, Queue};

/// The queue, the class its node holds and whether the session's node is
/// there, from the answer of [`ZkStore::session_checking_reader`]'s
/// multi-read.
pub(super) fn listed_checking_session(
    results: Vec<zk::MultiReadResult>,
) -> Result<(Listing, Vec<u8>)> {
    let mut results = results.into_iter();
    let children = match results.next() {
        Some(zk::MultiReadResult::Children { children }) => children,
        Some(zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        }) => Vec::new(),
        Some(zk::MultiReadResult::Error { err }) => return Err(zk_err(err)),
        _ => return Err(Error::backend(BACKEND, "unexpected multi-read answer")),
    };
    let class = match results.next() {
        Some(zk::MultiReadResult::Data { data, .. }) => data,
        Some(zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        }) => Vec::new(),
        Some(zk::MultiReadResult::Error { err }) => return Err(zk_err(err)),
        _ => return Err(Error::backend(BACKEND, "unexpected multi-read answer")),
    };
    match results.next() {
        Some(zk::MultiReadResult::Data { .. }) => Ok((listing(children), class)),
        Some(zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        }) => Err(lost()),
        Some(zk::MultiReadResult::Error { err }) => Err(zk_err(err)),
        _ => Err(Error::backend(BACKEND, "unexpected multi-read answer")),
    }
}

/// A name's children in queue order.
pub(super) struct Listing {
    pub(super) children: Vec<(String, String, EntryKind)>, // (child, tag, kind)
    pub(super) granted: Vec<bool>,
}

pub(super) fn listing(mut names: Vec<String>) -> Listing {
    let mut parsed: Vec<(i64, String, String, EntryKind)> = names
        .drain(..)
        .filter_map(|c| {
            let (tag, kind, seq) = parse_child(&c)?;
            Some((seq, tag.to_string(), c.clone(), kind))
        })
        .collect();
    // The suffix is the name node's signed 32-bit sequence counter, and
    // name nodes are never deleted: past 2^31 creates it goes negative,
    // past 2^32 it starts from 0 again. Read as unsigned it runs on past
    // the first wrap, and the queue starts after the widest gap between
    // its suffixes (a queue's live entries span far less than 2^31), so
    // its order stays the order of creation across either wrap.
    let key = |seq: i64| seq as i32 as u32;
    parsed.sort_by_key(|p| key(p.0));
    let keys: Vec<u32> = parsed.iter().map(|p| key(p.0)).collect();
    parsed.rotate_left(queue_start(&keys));
    let kinds: Vec<EntryKind> = parsed.iter().map(|p| p.3).collect();
    Listing {
        granted: crate::queue::grants(&kinds),
        children: parsed.into_iter().map(|(_, t, c, k)| (c, t, k)).collect(),
    }
}

/// Where a queue starts among its sorted sequence numbers read modulo
/// 2^32: after the widest gap from one to the next, around the circle.
pub(super) fn queue_start(sorted: &[u32]) -> usize {
    let n = sorted.len();
    (0..n)
        .max_by_key(|&i| sorted[(i + 1) % n].wrapping_sub(sorted[i]))
        .map_or(0, |i| (i + 1) % n)
}

impl Listing {
    pub(super) fn position(&self, child: &str) -> Option<usize> {
        self.children.iter().position(|c| c.0 == child)
    }

    /// The child whose deletion may grant the one at `i` (None: watch the
    /// whole list, for a semaphore).
    pub(super) fn blocker(&self, i: usize) -> Option<&str> {
        let kinds: Vec<EntryKind> = self.children.iter().map(|c| c.2).collect();
        crate::backend::poll::blocker(&kinds, i).map(|j| self.children[j].0.as_str())
    }
}

/// A version for a queue: a hash of its children's ids and data versions.
fn fingerprint(data: &[Option<(Vec<u8>, zk::Stat)>]) -> u64 {
    crate::backend::poll::fingerprint(
        data.iter()
            .flatten()
            .flat_map(|(_, stat)| [stat.czxid as u64, stat.mzxid as u64]),
    )
}

impl ZkStore {
    pub(super) async fn list(&self, client: &zk::Client, name: &Name) -> Result<Listing> {
        let dir = self.name_path(name);
        retrying(|| async {
            match call_raw(client.list_children(&dir)).await? {
                Ok(children) => Ok(listing(children)),
                Err(zk::Error::NoNode) => Ok(listing(Vec::new())),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await
    }

    /// Lists `name`'s queue and, in the same multi-read (one round trip),
    /// checks that the session's node is still there: a session ended by
    /// another store (`evict_session`) must not be granted a new entry
    /// before its owner's next renewal tells it. Either the ending store's
    /// search for the session's entries (after it deleted the node) finds a
    /// child made before this read, or this read finds the node gone.
    /// Also returns the class the name's node holds (see
    /// [`class_of`](super::layout::class_of)).
    pub(super) async fn list_checking_session(
        &self,
        session: &ZkSession,
        name: &Name,
    ) -> Result<(Listing, Vec<u8>)> {
        retrying(|| async {
            let answer = call(self.session_checking_reader(session, name)?.commit()).await?;
            listed_checking_session(answer)
        })
        .await
    }

    /// The multi-read of [`Self::list_checking_session`], not yet sent.
    pub(super) fn session_checking_reader<'c>(
        &self,
        session: &'c ZkSession,
        name: &Name,
    ) -> Result<zk::MultiReader<'c>> {
        let mut reader = session.client.new_multi_reader();
        reader
            .add_get_children(&self.name_path(name))
            .map_err(zk_err)?;
        reader.add_get_data(&self.name_path(name)).map_err(zk_err)?;
        reader
            .add_get_data(&self.session_path(&session.tag))
            .map_err(zk_err)?;
        Ok(reader)
    }

    /// The class `name`'s node holds and how many entries it has (one
    /// read, whatever the queue's length; none: no node yet).
    pub(super) async fn class_and_count(
        &self,
        client: &zk::Client,
        name: &Name,
    ) -> Result<(Vec<u8>, i32)> {
        let dir = self.name_path(name);
        retrying(|| async {
            match call_raw(client.get_data(&dir)).await? {
                Ok((class, stat)) => Ok((class, stat.num_children)),
                Err(zk::Error::NoNode) => Ok((Vec::new(), 0)),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await
    }

    /// The queue with each child's data and stat.
    async fn read(&self, name: &Name) -> Result<(Listing, Vec<Option<(Vec<u8>, zk::Stat)>>)> {
        let admin = &self.inner.admin;
        let list = self.list(admin, name).await?;
        let dir = self.name_path(name);
        let mut reader = admin.new_multi_reader();
        for (child, _, _) in &list.children {
            reader
                .add_get_data(&format!("{dir}/{child}"))
                .map_err(zk_err)?;
        }
        let results = if list.children.is_empty() {
            Vec::new()
        } else {
            call(reader.commit()).await?
        };
        let data = results
            .into_iter()
            .map(|r| match r {
                zk::MultiReadResult::Data { data, stat } => Some((data, stat)),
                _ => None,
            })
            .collect();
        Ok((list, data))
    }

    /// [`Store::queue`](crate::store::Store::queue):
    /// The children and their data.
    pub(super) async fn read_queue(&self, name: &Name) -> Result<Queue> {
        let (list, data) = self.read(name).await?;
        let version = fingerprint(&data);
        let mut entries = Vec::new();
        for (((_, tag, kind), granted), item) in list.children.iter().zip(&list.granted).zip(data) {
            // A child that went between the listing and the read is gone.
            let Some((raw, stat)) = item else { continue };
            let (holds, label, value) = decode_data(&raw);
            entries.push(Entry {
                seq: u64::try_from(stat.czxid).unwrap_or(0),
                kind: *kind,
                session_tag: tag.clone(),
                label,
                value,
                granted: *granted,
                granted_at: None,
                // ZooKeeper does not tell how long a session has left.
                expires_in: Duration::ZERO,
                holds,
            });
        }
        Ok(Queue { version, entries })
    }

    /// [`Store::names`](crate::store::Store::names):
    /// The names under `PATH/q` whose queue is not empty.
    pub(super) async fn list_names(&self, prefix: &str) -> Result<Vec<Name>> {
        let admin = &self.inner.admin;
        let all = call(admin.list_children(&format!("{}/q", self.inner.base))).await?;
        let mut names = Vec::new();
        for segment in all {
            let Some(name) = decode_name(&segment) else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            let Ok(name) = Name::stored(&name) else { continue };
            if !self.list(admin, &name).await?.children.is_empty() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}
