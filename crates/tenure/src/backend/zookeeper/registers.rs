//! Fences and cells: admitting a token, and a cell's get, put and delete,
//! each a conditional write shaped by the node this store last saw.

use zookeeper_client as zk;

use super::call::{call_raw, commit, lost, zk_err};
use super::layout::{encode_cell, encode_fence, Reg};
use super::nodes::{cell_version, next_version, written_stat, Node};
use super::session::ZkSession;
use super::{ZkStore, BACKEND};
use crate::error::{Error, Result};
use crate::store::{CellWrite, Expect, FenceOp, FenceState, Name, SessionKey, Versioned};

/// How many conditional writes a fence or cell operation tries before it
/// gives up (each failed try means the node changed since it was read).
const REGISTER_TRIES: usize = 64;

/// A register operation that lost the race for its node too many times.
fn contended(name: &Name) -> Error {
    Error::unavailable(
        BACKEND,
        format!("{name:?} changed under this call {REGISTER_TRIES} times in a row; try again"),
    )
}

impl ZkStore {
    /// A fence just written with `token` as its highest: remembered, and
    /// the answer.
    fn admitted(
        &self,
        name: &Name,
        data_version: i32,
        mzxid: i64,
        token: u64,
        value: Option<Vec<u8>>,
    ) -> FenceState {
        self.remember(
            name,
            Node {
                data_version,
                mzxid,
                reg: Reg::Fence {
                    highest: token,
                    value: value.clone(),
                },
                markers: Vec::new(),
            },
            false,
        );
        FenceState {
            admitted: true,
            highest: token,
            value,
        }
    }

    /// Makes `PATH/r`, the parent of every fence and cell, on first use.
    async fn make_register_dir(&self) -> Result<()> {
        let dir = format!("{}/r", self.inner.base);
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match call_raw(self.inner.admin.create(&dir, &[], &options)).await? {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(zk_err(e)),
        }
    }

    /// Admits `token` through the fence `name` (see [`Store::fence`](crate::store::Store::fence)).
    async fn admit(&self, name: &Name, token: u64, value: Option<&[u8]>) -> Result<FenceState> {
        let path = self.register_path(name);
        let admin = &self.inner.admin;
        let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
        // The node, and whether it was read just now: a remembered node
        // only shapes a conditional write; every answer that is not a
        // successful write comes from a fresh read.
        let mut known = self.last_seen(name).map(|node| (Some(node), false));
        for _ in 0..REGISTER_TRIES {
            let (node, fresh) = match known.take() {
                Some(known) => known,
                None => (self.read_register(name).await?, true),
            };
            let Some(node) = node else {
                // The name's first use: made with the token admitted, or
                // refused if someone made it meanwhile (as either kind).
                let data = encode_fence(token, value);
                match call_raw(admin.create(&path, &data, &persistent)).await? {
                    Ok((stat, _)) => {
                        // (A create's stat only orders what this store
                        // remembers.)
                        let mzxid = if stat.is_invalid() { -1 } else { stat.mzxid };
                        let value = value.map(<[u8]>::to_vec);
                        return Ok(self.admitted(name, 0, mzxid, token, value));
                    }
                    Err(zk::Error::NoNode) => {
                        self.make_register_dir().await?;
                        known = Some((None, true));
                    }
                    Err(zk::Error::NodeExists) => {}
                    Err(e) => return Err(zk_err(e)),
                }
                continue;
            };
            let version = node.data_version;
            let (highest, old) = match node.fence(name) {
                Ok(fence) => fence,
                Err(e) if fresh => return Err(e),
                Err(_) => continue,
            };
            if token < highest {
                if fresh {
                    return Ok(FenceState {
                        admitted: false,
                        highest,
                        value: old,
                    });
                }
                continue;
            }
            next_version(version)?;
            let value = value.map(<[u8]>::to_vec).or(old);
            let data = encode_fence(token, value.as_deref());
            match call_raw(admin.set_data(&path, &data, Some(version))).await? {
                Ok(stat) => return Ok(self.admitted(name, stat.version, stat.mzxid, token, value)),
                Err(zk::Error::BadVersion | zk::Error::NoNode) => self.forget_seen(name),
                Err(e) => return Err(zk_err(e)),
            }
        }
        Err(contended(name))
    }

    /// [`Store::fence`](crate::store::Store::fence):
    /// An admit, or a read of the fence's node.
    pub(super) async fn fence_op(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        match op {
            FenceOp::Admit { token, value } => self.admit(name, token, value).await,
            FenceOp::Read => match self.read_register(name).await? {
                None => Ok(FenceState {
                    admitted: true,
                    ..FenceState::default()
                }),
                Some(node) => {
                    let (highest, value) = node.fence(name)?;
                    Ok(FenceState {
                        admitted: true,
                        highest,
                        value,
                    })
                }
            },
        }
    }

    /// [`Store::cell_get`](crate::store::Store::cell_get):
    /// A read of the cell's node.
    pub(super) async fn get_cell(&self, name: &Name) -> Result<Option<Versioned>> {
        let Some(node) = self.read_register(name).await? else {
            return Ok(None);
        };
        Ok(node.cell(name)?.map(|(value, version)| Versioned {
            value: value.to_vec(),
            version,
        }))
    }

    /// [`Store::cell_put`](crate::store::Store::cell_put):
    /// One conditional multi per try.
    pub(super) async fn put_cell(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        // A bound value is written through its session's own client, so
        // that the marker is that session's ephemeral node.
        let session = match owner {
            Some(key) => Some((key, self.session(key)?)),
            None => None,
        };
        let (client, tag) = match &session {
            Some((_, session)) => (&session.client, Some(session.tag.as_str())),
            None => (&self.inner.admin, None),
        };
        let path = self.register_path(name);
        let data = encode_cell(tag, Some(value));
        let persistent = zk::CreateMode::Persistent.with_acls(self.acls());
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(self.acls());
        // As in `admit`: a remembered node only shapes a conditional write.
        let mut known = self.last_seen(name).map(|node| (Some(node), false));
        for _ in 0..REGISTER_TRIES {
            let (node, fresh) = match known.take() {
                Some(known) => known,
                None => (self.read_register(name).await?, true),
            };
            let current = match node.as_ref().map(|n| n.cell_version(name)).transpose() {
                Ok(current) => current.flatten(),
                Err(e) if fresh => return Err(e),
                Err(_) => continue,
            };
            if !crate::queue::cell_expected(current, expect) {
                if fresh {
                    return Ok(CellWrite::Mismatch(current));
                }
                continue;
            }
            let mut writer = client.new_multi_writer();
            let entries = self
                .add_session_checks(&mut writer, session.as_ref().map(|(_, s)| &**s))
                .await?;
            // The index of the first entry's check.
            let checked = usize::from(session.is_some());
            // The index of the node's own first operation.
            let first = checked + entries.len();
            add_cell_write(
                &mut writer,
                &path,
                &data,
                node.as_ref(),
                tag,
                &persistent,
                &ephemeral,
            )?;
            if let Some((_, session)) = &session {
                // Before the marker may exist, so that closing the session
                // deletes it even if this call is dropped mid-flight.
                session
                    .cells
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone());
            }
            match commit(&mut writer).await? {
                Ok(results) => {
                    let stat = written_stat(&path, &results)?;
                    let version = cell_version(stat.mzxid)?;
                    self.remember(
                        name,
                        Node {
                            data_version: stat.version,
                            mzxid: stat.mzxid,
                            reg: Reg::Cell {
                                owner: tag.map(str::to_string),
                                value: Some(value.to_vec()),
                            },
                            markers: tag.map(str::to_string).into_iter().collect(),
                        },
                        false,
                    );
                    return Ok(CellWrite::Done(version));
                }
                // The session's node is gone: evicted.
                Err((0, zk::Error::NoNode)) if checked == 1 => {
                    if let Some((key, _)) = &session {
                        self.forget(key);
                    }
                    return Err(lost());
                }
                // One of the session's entries is gone: evicted, unless the
                // session released it meanwhile (then try again).
                Err((i, zk::Error::NoNode)) if i < first => {
                    if let (Some((key, session)), Some((entry_name, child))) =
                        (&session, entries.get(i - checked))
                    {
                        let still = session
                            .entries
                            .lock()
                            .await
                            .get(entry_name)
                            .is_some_and(|m| &m.child == child);
                        if still {
                            // As a renewal that finds an entry gone does.
                            self.forget(key);
                            return Err(lost());
                        }
                    }
                    known = Some((node, fresh));
                }
                // No `PATH/r` yet: the name is unused.
                Err((i, zk::Error::NoNode)) if i == first && node.is_none() => {
                    self.make_register_dir().await?;
                    known = Some((None, true));
                }
                // The node changed since it was seen.
                Err((_, zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists)) => {
                    self.forget_seen(name)
                }
                Err((_, e)) => return Err(zk_err(e)),
            }
        }
        Err(contended(name))
    }

    /// Adds a bound write's checks to `writer`: a bound write first checks
    /// that its session's node is still there and that it still has every
    /// entry it knows of (version -1: any): one that vanished was evicted,
    /// perhaps by another store, which could not end the session itself
    /// (see `evict`). Returns the entries checked, in the order of their
    /// checks (after the session's node's).
    async fn add_session_checks(
        &self,
        writer: &mut zk::MultiWriter<'_>,
        session: Option<&ZkSession>,
    ) -> Result<Vec<(Name, String)>> {
        if let Some(session) = session {
            writer
                .add_check_version(&self.session_path(&session.tag), -1)
                .map_err(zk_err)?;
        }
        let entries: Vec<(Name, String)> = match session {
            Some(session) => session
                .entries
                .lock()
                .await
                .iter()
                .map(|(name, mine)| (name.clone(), mine.child.clone()))
                .collect(),
            None => Vec::new(),
        };
        for (entry_name, child) in &entries {
            writer
                .add_check_version(&format!("{}/{child}", self.name_path(entry_name)), -1)
                .map_err(zk_err)?;
        }
        Ok(entries)
    }

    /// [`Store::cell_delete`](crate::store::Store::cell_delete):
    /// A tombstone written, and the markers deleted.
    pub(super) async fn delete_cell(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let path = self.register_path(name);
        let tombstone = encode_cell(None, None);
        let mut known = self.last_seen(name).map(|node| (Some(node), false));
        for _ in 0..REGISTER_TRIES {
            let (node, fresh) = match known.take() {
                Some(known) => known,
                None => (self.read_register(name).await?, true),
            };
            let current = match node.as_ref().map(|n| n.cell_version(name)).transpose() {
                Ok(current) => current.flatten(),
                Err(e) if fresh => return Err(e),
                Err(_) => continue,
            };
            let Some(node) = node.filter(|_| current == Some(version)) else {
                if fresh {
                    return Ok(CellWrite::Mismatch(current));
                }
                continue;
            };
            // The node stays, with a tombstone: the `setData` gives it a new
            // mzxid, which the next write's exceeds.
            next_version(node.data_version)?;
            let mut writer = self.inner.admin.new_multi_writer();
            writer
                .add_set_data(&path, &tombstone, Some(node.data_version))
                .map_err(zk_err)?;
            for marker in &node.markers {
                writer
                    .add_delete(&format!("{path}/{marker}"), None)
                    .map_err(zk_err)?;
            }
            match commit(&mut writer).await? {
                Ok(results) => {
                    let stat = written_stat(&path, &results)?;
                    let version = cell_version(stat.mzxid)?;
                    self.remember(
                        name,
                        Node {
                            data_version: stat.version,
                            mzxid: stat.mzxid,
                            reg: Reg::Cell {
                                owner: None,
                                value: None,
                            },
                            markers: Vec::new(),
                        },
                        false,
                    );
                    return Ok(CellWrite::Done(version));
                }
                Err((_, zk::Error::BadVersion | zk::Error::NoNode | zk::Error::NodeExists)) => {
                    self.forget_seen(name)
                }
                Err((_, e)) => return Err(zk_err(e)),
            }
        }
        Err(contended(name))
    }
}

/// Adds a cell write's own operations to `writer`: the conditional
/// `setData` of the node (made first when there is none), the markers of
/// earlier owners deleted or the writer's own checked, and the writer's
/// new marker.
fn add_cell_write(
    writer: &mut zk::MultiWriter<'_>,
    path: &str,
    data: &[u8],
    node: Option<&Node>,
    tag: Option<&str>,
    persistent: &zk::CreateOptions<'_>,
    ephemeral: &zk::CreateOptions<'_>,
) -> Result<()> {
    let mut marked = false;
    match node {
        None => {
            // Made with a tombstone and set at once, in the same
            // transaction: a `setData`'s answer carries the new
            // mzxid, a `create`'s in a multi may not (ZOOKEEPER-4026).
            writer
                .add_create(path, &encode_cell(None, None), persistent)
                .map_err(zk_err)?;
            writer.add_set_data(path, data, Some(0)).map_err(zk_err)?;
        }
        Some(node) => {
            next_version(node.data_version)?;
            writer
                .add_set_data(path, data, Some(node.data_version))
                .map_err(zk_err)?;
            // Earlier owners' markers go (a vanished one fails the
            // multi: the value it kept alive is gone); the writer's
            // own is checked (version -1: any).
            for marker in &node.markers {
                let marker_path = format!("{path}/{marker}");
                if Some(marker.as_str()) == tag {
                    marked = true;
                    writer.add_check_version(&marker_path, -1)
                } else {
                    writer.add_delete(&marker_path, None)
                }
                .map_err(zk_err)?;
            }
        }
    }
    if let (Some(tag), false) = (tag, marked) {
        writer
            .add_create(&format!("{path}/{tag}"), &[], ephemeral)
            .map_err(zk_err)?;
    }
    Ok(())
}
