//! A fence's or cell's node as read (data, versions and markers), and the
//! nodes this store remembers for its optimistic writes.

use std::collections::HashMap;

use zookeeper_client as zk;

use super::call::{call, zk_err};
use super::layout::{decode_register, Reg};
use super::{ZkStore, BACKEND};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
use crate::store::{kind_conflict, Name};

/// The most register nodes, and bytes of their values, a store remembers
/// for its optimistic writes; past either, it forgets them all.
const SEEN_NODES: usize = 4096;
const SEEN_BYTES: usize = 4 << 20;

/// A fence's or cell's node as read: its data version, the transaction that
/// last set its data, what it holds, and its children (the markers of
/// sessions a value was bound to, by tag).
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// What a conditional `setData` names; never a cell's version.
    pub(super) data_version: i32,
    /// The node's `mzxid`: a cell's version (see [`cell_version`]). -1 when
    /// not known (a fence made by a `create` whose answer carried no stat).
    pub(super) mzxid: i64,
    pub(super) reg: Reg,
    pub(super) markers: Vec<String>,
}

impl Node {
    /// Roughly what remembering it costs.
    fn size(&self) -> usize {
        let value = match &self.reg {
            Reg::Fence { value, .. } | Reg::Cell { value, .. } => {
                value.as_ref().map_or(0, Vec::len)
            }
        };
        64 + value + self.markers.iter().map(|m| m.len() + 24).sum::<usize>()
    }

    /// The fence's highest token and value; a cell is a conflict.
    pub(super) fn fence(self, name: &Name) -> Result<(u64, Option<Vec<u8>>)> {
        match self.reg {
            Reg::Fence { highest, value } => Ok((highest, value)),
            Reg::Cell { .. } => Err(kind_conflict(name, "a cell", "a fence")),
        }
    }

    /// The cell's live value: none when deleted or when the session it is
    /// bound to has gone (its marker with it). A fence is a conflict.
    pub(super) fn cell(&self, name: &Name) -> Result<Option<(&[u8], u64)>> {
        match &self.reg {
            Reg::Fence { .. } => Err(kind_conflict(name, "a fence", "a cell")),
            Reg::Cell { owner, value } => {
                let live = owner.as_ref().is_none_or(|o| self.markers.contains(o));
                match value.as_deref().filter(|_| live) {
                    Some(value) => Ok(Some((value, cell_version(self.mzxid)?))),
                    None => Ok(None),
                }
            }
        }
    }

    /// The cell's live version.
    pub(super) fn cell_version(&self, name: &Name) -> Result<Option<u64>> {
        Ok(self.cell(name)?.map(|(_, version)| version))
    }
}

/// A cell's version for its node's `mzxid`: the id of the transaction that
/// last set the node's data. Transaction ids only grow, ensemble-wide, so a
/// version is never reused, even by a node deleted and made again.
pub(super) fn cell_version(mzxid: i64) -> Result<u64> {
    u64::try_from(mzxid).ok().filter(|v| *v > 0).ok_or_else(|| {
        Error::backend(
            BACKEND,
            format!("a cell node with no transaction id ({mzxid})"),
        )
    })
}

/// Checks that a conditional write at data version `version` is safe: the
/// server's 32-bit data version would wrap past 2^31 - 1 to negative
/// numbers, where -1 means "any version" and would make the write
/// unconditional, so such a node is not written.
pub(super) fn next_version(version: i32) -> Result<i32> {
    version.checked_add(1).ok_or_else(|| {
        Error::backend(
            BACKEND,
            "this fence or cell has used up ZooKeeper's 2^31 data versions",
        )
    })
}

/// The stat of the one `setData` of a successful register write.
pub(super) fn written_stat(path: &str, results: &[zk::MultiWriteResult]) -> Result<zk::Stat> {
    results
        .iter()
        .find_map(|r| match r {
            zk::MultiWriteResult::SetData { stat } => Some(*stat),
            _ => None,
        })
        .filter(|stat| stat.mzxid > 0 && stat.version >= 0)
        .ok_or_else(|| {
            Error::backend(
                BACKEND,
                format!("an unexpected answer to a write of {path}: no stat of its setData"),
            )
        })
}

/// The answer to a multi-read of a register node's data and children.
fn parse_register(path: &str, results: Vec<zk::MultiReadResult>) -> Result<Option<Node>> {
    let mut results = results.into_iter();
    match (results.next(), results.next()) {
        (
            Some(zk::MultiReadResult::Data { data, stat }),
            Some(zk::MultiReadResult::Children { children }),
        ) => {
            let reg = decode_register(&data).ok_or_else(|| {
                Error::backend(
                    BACKEND,
                    format!("the node {path} holds no tenure fence or cell"),
                )
            })?;
            if stat.version < 0 || stat.mzxid <= 0 {
                return Err(Error::backend(
                    BACKEND,
                    format!(
                        "the node {path} has a data version {} and an mzxid {}",
                        stat.version, stat.mzxid
                    ),
                ));
            }
            Ok(Some(Node {
                data_version: stat.version,
                mzxid: stat.mzxid,
                reg,
                markers: children,
            }))
        }
        (
            Some(zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            }),
            _,
        ) => Ok(None),
        (Some(zk::MultiReadResult::Error { err }), _)
        | (_, Some(zk::MultiReadResult::Error { err })) => Err(zk_err(err)),
        _ => Err(Error::backend(
            BACKEND,
            format!("an unexpected answer to a read of {path}"),
        )),
    }
}

/// The register nodes a store last saw, bounded (see [`SEEN_NODES`]).
#[derive(Default)]
pub(super) struct Seen {
    nodes: HashMap<Name, Node>,
    bytes: usize,
}

impl ZkStore {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.inner.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node as this store last saw it: only a guess, for a conditional
    /// write that fails if it is stale.
    pub(super) fn last_seen(&self, name: &Name) -> Option<Node> {
        self.seen().nodes.get(name).cloned()
    }

    /// Remembers a node just read, or just written unless a later state of
    /// it is remembered already (calls finish in any order; `mzxid` orders
    /// them, even across a node deleted and made again by hand). A read
    /// replaces whatever was remembered.
    pub(super) fn remember(&self, name: &Name, node: Node, read: bool) {
        let mut seen = self.seen();
        if let Some(old) = seen.nodes.get(name) {
            if !read && old.mzxid > node.mzxid {
                return;
            }
        }
        if let Some(old) = seen.nodes.remove(name) {
            seen.bytes = seen.bytes.saturating_sub(old.size());
        }
        let size = node.size();
        if seen.nodes.len() >= SEEN_NODES || seen.bytes + size > SEEN_BYTES {
            seen.nodes.clear();
            seen.bytes = 0;
        }
        seen.bytes += size;
        seen.nodes.insert(name.clone(), node);
    }

    pub(super) fn forget_seen(&self, name: &Name) {
        let mut seen = self.seen();
        if let Some(old) = seen.nodes.remove(name) {
            seen.bytes = seen.bytes.saturating_sub(old.size());
        }
    }

    /// Reads the fence's or cell's node (data and markers in one
    /// multi-read), after a `sync` sent just ahead of it on the same
    /// connection, so a follower answers only once it has caught up with the
    /// leader: the read sees every write completed before it began.
    pub(super) async fn read_register(&self, name: &Name) -> Result<Option<Node>> {
        let path = self.register_path(name);
        let admin = &self.inner.admin;
        let node = retrying(|| async {
            // Both requests go out now, in this order; one round trip.
            let sync = admin.sync(&self.inner.base);
            let mut reader = admin.new_multi_reader();
            reader.add_get_data(&path).map_err(zk_err)?;
            reader.add_get_children(&path).map_err(zk_err)?;
            let read = reader.commit();
            let (synced, read) = tokio::join!(call(sync), call(read));
            synced?;
            parse_register(&path, read?)
        })
        .await?;
        match &node {
            Some(node) => self.remember(name, node.clone(), true),
            None => self.forget_seen(name),
        }
        Ok(node)
    }
}
