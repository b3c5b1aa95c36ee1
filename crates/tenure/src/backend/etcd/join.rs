//! Joining a name's queue: one transaction that puts the session's entry
//! and reads back what decides its grant, the read a try makes first where
//! that transaction alone cannot decide, and one more hold of an entry the
//! session already has.

use std::time::Duration;

use super::layout::{aux_value, split_key, Layout};
use super::queue::{get_kvs, revision_of, Read};
use super::rpc::{self, Compare, CompareOp, PutOptions, Txn, TxnOp};
use super::{bad, call, lost, EtcdStore, BACKEND, CAS_ATTEMPTS};
use crate::backend::poll::{retrying, RETRY_FOR};
use crate::error::{Error, Result};
use crate::store::{EntryKind, JoinMode, JoinRequest, Joined, Name, SessionKey, Store};

impl EtcdStore {
    /// [`Store::join`]: joins the name's queue.
    pub(super) async fn join_queue(
        &self,
        session: &SessionKey,
        request: JoinRequest<'_>,
    ) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        if self.inner.layout == Layout::Etcd && kind != EntryKind::Exclusive {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "shared and permit entries with ?layout=etcd (etcd's lock recipe has only exclusive keys)",
            });
        }
        self.check_recipe_name(name)?;
        let (lease, secret) = split_key(session)?;
        let entry = self.entry_key(name, lease);
        let qp = self.queue_prefix(name);
        let nonce = crate::store::random_hex(8)?;
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        // Whether an earlier attempt may have taken effect unseen.
        let mut unsure = false;
        for _ in 0..CAS_ATTEMPTS {
            let mut when = vec![
                self.secret_matches(lease, secret),
                Compare::create_revision(entry.clone(), CompareOp::Equal, 0),
            ];
            // An exclusive try on the tenure layout writes first: one
            // transaction that takes a free name, and is refused on a held
            // one by the busy key alone, before the compare over the queue's
            // range (etcd stops at the first compare that fails).
            let write_first = mode == JoinMode::IfGranted
                && kind == EntryKind::Exclusive
                && self.inner.layout == Layout::Tenure;
            if write_first {
                when.push(Compare::create_revision(
                    self.busy_key(name),
                    CompareOp::Equal,
                    0,
                ));
                when.push(
                    Compare::create_revision(qp.clone(), CompareOp::Equal, 0)
                        .with_range(rpc::prefix_end(&qp)),
                );
            } else if mode == JoinMode::IfGranted {
                if kind == EntryKind::Exclusive {
                    // A try-lock on etcd's own layout (no busy key): only
                    // into an empty queue. etcd checks a compare over a
                    // range by reading every key in it, so first one read
                    // (our entry, any one entry) and the write only if the
                    // queue looked empty.
                    let txn = Txn::new().and_then(vec![
                        TxnOp::get(self.secret_key(lease), None),
                        TxnOp::get(entry.clone(), None),
                        self.any_op(name),
                    ]);
                    let resp = retrying(|| self.txn(txn.clone())).await?;
                    let ops = resp.op_responses();
                    if get_kvs(ops.first())?.is_empty() {
                        return Err(lost());
                    }
                    if !get_kvs(ops.get(1))?.is_empty() {
                        // Our entry is there: decided on the whole queue.
                        let read = self.read(lease, name).await?;
                        if let Some(i) = read.position(lease) {
                            return self
                                .join_existing(session, name, kind, mode, read, i, unsure, &nonce)
                                .await;
                        }
                        continue;
                    }
                    let others = get_kvs(ops.get(2))?;
                    if !others.is_empty() {
                        let kinds = others
                            .iter()
                            .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                            .collect::<Result<Vec<_>>>()?;
                        crate::queue::check_compatible(name, kind, kinds)?;
                        return Ok(None);
                    }
                    when.push(
                        Compare::create_revision(qp.clone(), CompareOp::Equal, 0)
                            .with_range(rpc::prefix_end(&qp)),
                    );
                } else {
                    // Readers and permits: only if a new entry would be
                    // granted; the queue must not change in between.
                    let read = self.read(lease, name).await?;
                    if let Some(i) = read.position(lease) {
                        return self
                            .join_existing(session, name, kind, mode, read, i, unsure, &nonce)
                            .await;
                    }
                    let mut kinds: Vec<EntryKind> = read.rows.iter().map(|r| r.kind).collect();
                    crate::queue::check_compatible(name, kind, kinds.iter().copied())?;
                    kinds.push(kind);
                    if !crate::queue::grants(&kinds)
                        .last()
                        .copied()
                        .unwrap_or(false)
                    {
                        return Ok(None);
                    }
                    when.push(
                        Compare::mod_revision(qp.clone(), CompareOp::Less, read.revision + 1)
                            .with_range(rpc::prefix_end(&qp)),
                    );
                }
            }
            // An exclusive entry reads back only itself and the entry just
            // ahead, and a failed exclusive attempt only its own entry and
            // one other: the queue's length costs nothing in transfer.
            let exclusive = kind == EntryKind::Exclusive;
            let mut then = vec![
                TxnOp::get(self.seen_key(name), None),
                // Written once: a put every time was one more revision per
                // join for etcd to write, index and compact.
                TxnOp::txn(
                    Txn::new()
                        .when(vec![Compare::create_revision(
                            self.seen_key(name),
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then(vec![TxnOp::put(self.seen_key(name), "", None)]),
                ),
                TxnOp::put(
                    entry.clone(),
                    self.encode_entry(kind, &nonce, value),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ];
            if exclusive {
                // The entry just ahead, and the head for the kind check: the
                // entry ahead may itself be one about to leave for a conflict.
                then.extend([self.latest_op(name, 2, None), self.head_op(name)]);
            } else {
                then.push(self.read_op(name));
            }
            // Last, so the answers above keep their places.
            match self.inner.layout {
                Layout::Etcd => then.push(TxnOp::put(
                    self.holds_key(name, lease),
                    aux_value(1, &nonce),
                    Some(PutOptions::new().with_lease(lease)),
                )),
                Layout::Tenure if exclusive => then.push(TxnOp::put(
                    self.busy_key(name),
                    format!("{lease:016x}"),
                    Some(PutOptions::new().with_lease(lease)),
                )),
                Layout::Tenure => {}
            }
            let txn = Txn::new().when(when).and_then(then).or_else(if exclusive {
                vec![
                    TxnOp::get(self.secret_key(lease), None),
                    TxnOp::get(entry.clone(), None),
                    match write_first {
                        true => TxnOp::get(self.busy_key(name), None),
                        false => self.any_op(name),
                    },
                ]
            } else {
                vec![TxnOp::get(self.secret_key(lease), None), self.read_op(name)]
            });
            let resp = match call(self.client().txn(txn)).await {
                Err(e) if e.is_temporary() && tokio::time::Instant::now() < deadline => {
                    unsure = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                other => other?,
            };
            let ops = resp.op_responses();
            if !resp.succeeded() && exclusive {
                if get_kvs(ops.first())?.is_empty() {
                    return Err(lost());
                }
                if !get_kvs(ops.get(1))?.is_empty() {
                    // Our entry is there: one more hold (or this join's own
                    // earlier attempt), decided on the whole queue.
                    let read = self.read(lease, name).await?;
                    if let Some(i) = read.position(lease) {
                        return self
                            .join_existing(session, name, kind, mode, read, i, unsure, &nonce)
                            .await;
                    }
                    continue;
                }
                if write_first && !get_kvs(ops.get(2))?.is_empty() {
                    // The busy key: an exclusive entry holds the name.
                    return Ok(None);
                }
                if write_first {
                    // Entries without a busy key (shared, permits, or an
                    // exclusive one whose busy key a later waiter took
                    // along), or a queue emptied since: one entry says which.
                    let any = Txn::new().and_then(vec![self.any_op(name)]);
                    let resp = retrying(|| self.txn(any.clone())).await?;
                    let kvs = get_kvs(resp.op_responses().first())?.into_owned();
                    if kvs.is_empty() {
                        continue;
                    }
                    let others = kvs
                        .iter()
                        .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                        .collect::<Result<Vec<_>>>()?;
                    crate::queue::check_compatible(name, kind, others)?;
                    return Ok(None);
                }
                if mode == JoinMode::IfGranted {
                    // Not into an empty queue: taken, unless it was never
                    // allowed at all (every entry agrees with the others, so
                    // any one stands for them).
                    let others = get_kvs(ops.get(2))?
                        .iter()
                        .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                        .collect::<Result<Vec<_>>>()?;
                    crate::queue::check_compatible(name, kind, others)?;
                    return Ok(None);
                }
                continue;
            }
            if resp.succeeded() && exclusive {
                let first = get_kvs(ops.first())?.is_empty();
                let latest = get_kvs(ops.get(3))?;
                let mine = latest
                    .iter()
                    .find(|kv| kv.key() == entry.as_slice())
                    .ok_or_else(|| bad("the new entry is not in the queue"))?;
                let seq = u64::try_from(mine.create_revision()).map_err(bad)?;
                let ahead = latest
                    .iter()
                    .filter(|kv| kv.key() != entry.as_slice())
                    .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                    .collect::<Result<Vec<_>>>()?;
                let head = get_kvs(ops.get(4))?
                    .iter()
                    .filter(|kv| kv.key() != entry.as_slice())
                    .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                    .collect::<Result<Vec<_>>>()?;
                let others = ahead.iter().chain(&head).copied();
                if let Err(e) = crate::queue::check_compatible(name, kind, others) {
                    self.leave(session, name, seq).await?;
                    return Err(e);
                }
                return Ok(Some(Joined {
                    seq,
                    granted: ahead.is_empty(),
                    holds: 1,
                    first,
                }));
            }
            if !resp.succeeded() {
                if get_kvs(ops.first())?.is_empty() {
                    return Err(lost());
                }
                let read = self.parse_read(name, &get_kvs(ops.get(1))?, revision_of(&resp))?;
                if let Some(i) = read.position(lease) {
                    return self
                        .join_existing(session, name, kind, mode, read, i, unsure, &nonce)
                        .await;
                }
                // The queue changed between our read and the write: again.
                continue;
            }
            let first = get_kvs(ops.first())?.is_empty();
            let read = self.parse_read(name, &get_kvs(ops.get(3))?, revision_of(&resp))?;
            let i = read
                .position(lease)
                .ok_or_else(|| bad("the new entry is not in the queue"))?;
            let others = read
                .rows
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, r)| r.kind);
            if let Err(e) = crate::queue::check_compatible(name, kind, others) {
                self.leave(session, name, read.rows[i].seq).await?;
                return Err(e);
            }
            return Ok(Some(Joined {
                seq: read.rows[i].seq,
                granted: read.granted[i],
                holds: 1,
                first,
            }));
        }
        Err(Error::unavailable(BACKEND, "too many concurrent changes"))
    }

    /// The session's entry is at `i` of `read`: this join's own earlier
    /// attempt (same nonce, its answer lost), else one more hold of it.
    #[allow(clippy::too_many_arguments)]
    async fn join_existing(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        mode: JoinMode,
        read: Read,
        i: usize,
        unsure: bool,
        nonce: &str,
    ) -> Result<Option<Joined>> {
        if let Some(joined) = own_earlier_attempt(&read, i, unsure, nonce) {
            return Ok(Some(joined));
        }
        self.rejoin(session, name, kind, mode, read).await
    }

    /// One more hold of the session's existing entry.
    async fn rejoin(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        mode: JoinMode,
        mut read: Read,
    ) -> Result<Option<Joined>> {
        let (lease, secret) = split_key(session)?;
        for _ in 0..CAS_ATTEMPTS {
            let Some(i) = read.position(lease) else {
                return Err(Error::NotHeld("the session's entry went away"));
            };
            let row = &read.rows[i];
            crate::queue::check_same_kind(name, row.kind, kind)?;
            let granted = read.granted[i];
            if mode == JoinMode::IfGranted && !granted {
                return Ok(None);
            }
            let (holds, holds_rev) = read.holds.get(&lease).copied().unwrap_or((1, 0));
            let txn = Txn::new()
                .when(vec![
                    self.secret_matches(lease, secret),
                    Compare::create_revision(row.key.clone(), CompareOp::Equal, row.seq as i64),
                    Compare::mod_revision(self.holds_key(name, lease), CompareOp::Equal, holds_rev),
                ])
                .and_then(vec![TxnOp::put(
                    self.holds_key(name, lease),
                    self.holds_value(holds + 1, &row.nonce),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let resp = call(self.client().txn(txn)).await?;
            if resp.succeeded() {
                return Ok(Some(Joined {
                    seq: row.seq,
                    granted,
                    holds: holds + 1,
                    first: false,
                }));
            }
            read = self.read(lease, name).await?;
        }
        Err(Error::unavailable(BACKEND, "too many concurrent changes"))
    }
}

/// The session's entry at `i`, if an earlier attempt of this very join
/// (same nonce) put it and its answer was lost: this join's result, rather
/// than one more hold. Whether the name was new is not known: say no.
fn own_earlier_attempt(read: &Read, i: usize, unsure: bool, nonce: &str) -> Option<Joined> {
    (unsure && read.rows[i].nonce == nonce).then(|| Joined {
        seq: read.rows[i].seq,
        granted: read.granted[i],
        holds: 1,
        first: false,
    })
}
