//! Joining a name's queue: one transaction that puts the session's entry
//! and reads back what decides its grant, the read a try makes first where
//! that transaction alone cannot decide, and one more hold of an entry the
//! session already has.

use std::ops::ControlFlow;
use std::time::Duration;

use super::layout::{aux_value, split_key, Layout};
use super::queue::{get_kvs, revision_of, Read};
use super::rpc::{self, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnResponse};
use super::{bad, call, lost, EtcdStore, BACKEND, CAS_ATTEMPTS};
use crate::backend::poll::{retrying, RETRY_FOR};
use crate::error::{Error, Result};
use crate::store::{EntryKind, JoinMode, JoinRequest, Joined, Name, SessionKey, Store};

/// One join's fixed parts, shared by its attempts.
struct Joining<'a> {
    session: &'a SessionKey,
    name: &'a Name,
    kind: EntryKind,
    value: &'a [u8],
    mode: JoinMode,
    lease: i64,
    secret: &'a str,
    /// The session's entry in the name's queue.
    entry: Vec<u8>,
    /// The prefix of the name's queue.
    qp: Vec<u8>,
    /// Names this join's entry, so that an attempt after a lost answer
    /// knows its own.
    nonce: String,
}

/// What one attempt of a join decided.
enum Attempt {
    /// The join's answer.
    Done(Option<Joined>),
    /// Again: the queue changed in between, or the entry seen went away.
    Again,
    /// Again after a temporary failure lost the transaction's answer: it may
    /// have taken effect unseen.
    AnswerLost,
}

impl EtcdStore {
    /// [`Store::join`]: joins the name's queue, one attempt after another
    /// while the queue changes under them.
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
        let j = Joining {
            session,
            name,
            kind,
            value,
            mode,
            lease,
            secret,
            entry: self.entry_key(name, lease),
            qp: self.queue_prefix(name),
            nonce: crate::store::random_hex(8)?,
        };
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        // Whether an earlier attempt may have taken effect unseen.
        let mut unsure = false;
        for _ in 0..CAS_ATTEMPTS {
            match self.join_once(&j, unsure, deadline).await? {
                Attempt::Done(joined) => return Ok(joined),
                Attempt::Again => {}
                Attempt::AnswerLost => {
                    unsure = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(Error::unavailable(BACKEND, "too many concurrent changes"))
    }

    /// One attempt: the compares that keep the write right (for a try, that
    /// the name is free, or that a new entry would be granted), the
    /// transaction, and what its answer decides.
    async fn join_once(
        &self,
        j: &Joining<'_>,
        unsure: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Attempt> {
        let (name, kind, mode, lease) = (j.name, j.kind, j.mode, j.lease);
        let mut when = vec![
            self.secret_matches(lease, j.secret),
            Compare::create_revision(j.entry.clone(), CompareOp::Equal, 0),
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
                Compare::create_revision(j.qp.clone(), CompareOp::Equal, 0)
                    .with_range(rpc::prefix_end(&j.qp)),
            );
        } else if mode == JoinMode::IfGranted {
            let checked = if kind == EntryKind::Exclusive {
                self.try_into_empty(j, unsure).await?
            } else {
                self.try_if_granted(j, unsure).await?
            };
            match checked {
                ControlFlow::Break(decided) => return Ok(decided),
                ControlFlow::Continue(compare) => when.push(compare),
            }
        }
        let exclusive = kind == EntryKind::Exclusive;
        let txn = self.join_txn(j, when, write_first);
        let resp = match call(self.client().txn(txn)).await {
            Err(e) if e.is_temporary() && tokio::time::Instant::now() < deadline => {
                return Ok(Attempt::AnswerLost);
            }
            other => other?,
        };
        match (resp.succeeded(), exclusive) {
            (false, true) => self.exclusive_refused(j, &resp, write_first, unsure).await,
            (true, true) => self.exclusive_joined(j, &resp).await,
            (false, false) => self.refused_with_queue(j, &resp, unsure).await,
            (true, false) => self.joined_with_queue(j, &resp).await,
        }
    }

    /// A try-lock on etcd's own layout (no busy key): only into an empty
    /// queue. etcd checks a compare over a range by reading every key in
    /// it, so first one read (our entry, any one entry) and the write only
    /// if the queue looked empty: then the compare that it still is.
    async fn try_into_empty(
        &self,
        j: &Joining<'_>,
        unsure: bool,
    ) -> Result<ControlFlow<Attempt, Compare>> {
        let (name, kind, lease, qp) = (j.name, j.kind, j.lease, &j.qp);
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.secret_key(lease), None),
            TxnOp::get(j.entry.clone(), None),
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
                let joined = self.join_existing(j, read, i, unsure).await?;
                return Ok(ControlFlow::Break(Attempt::Done(joined)));
            }
            return Ok(ControlFlow::Break(Attempt::Again));
        }
        let others = get_kvs(ops.get(2))?;
        if !others.is_empty() {
            let kinds = others
                .iter()
                .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                .collect::<Result<Vec<_>>>()?;
            crate::queue::check_compatible(name, kind, kinds)?;
            return Ok(ControlFlow::Break(Attempt::Done(None)));
        }
        Ok(ControlFlow::Continue(
            Compare::create_revision(qp.clone(), CompareOp::Equal, 0)
                .with_range(rpc::prefix_end(qp)),
        ))
    }

    /// Readers and permits: only if a new entry would be granted; the
    /// queue must not change in between (the compare returned).
    async fn try_if_granted(
        &self,
        j: &Joining<'_>,
        unsure: bool,
    ) -> Result<ControlFlow<Attempt, Compare>> {
        let (name, kind, lease, qp) = (j.name, j.kind, j.lease, &j.qp);
        let read = self.read(lease, name).await?;
        if let Some(i) = read.position(lease) {
            let joined = self.join_existing(j, read, i, unsure).await?;
            return Ok(ControlFlow::Break(Attempt::Done(joined)));
        }
        let mut kinds: Vec<EntryKind> = read.rows.iter().map(|r| r.kind).collect();
        crate::queue::check_compatible(name, kind, kinds.iter().copied())?;
        kinds.push(kind);
        if !crate::queue::grants(&kinds)
            .last()
            .copied()
            .unwrap_or(false)
        {
            return Ok(ControlFlow::Break(Attempt::Done(None)));
        }
        Ok(ControlFlow::Continue(
            Compare::mod_revision(qp.clone(), CompareOp::Less, read.revision + 1)
                .with_range(rpc::prefix_end(qp)),
        ))
    }

    /// The join's transaction: when every compare holds, put the entry (with
    /// the busy key or the hold count) and read back what decides its grant;
    /// else read what says why not.
    fn join_txn(&self, j: &Joining<'_>, when: Vec<Compare>, write_first: bool) -> Txn {
        let (name, kind, lease, entry, nonce) = (j.name, j.kind, j.lease, &j.entry, &j.nonce);
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
                self.encode_entry(kind, nonce, j.value),
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
                aux_value(1, nonce),
                Some(PutOptions::new().with_lease(lease)),
            )),
            Layout::Tenure if exclusive => then.push(TxnOp::put(
                self.busy_key(name),
                format!("{lease:016x}"),
                Some(PutOptions::new().with_lease(lease)),
            )),
            Layout::Tenure => {}
        }
        Txn::new().when(when).and_then(then).or_else(if exclusive {
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
        })
    }

    /// An exclusive entry's transaction failed: the session is lost, its
    /// entry is there already, or the name is taken (or the entry never
    /// allowed); else again.
    async fn exclusive_refused(
        &self,
        j: &Joining<'_>,
        resp: &TxnResponse,
        write_first: bool,
        unsure: bool,
    ) -> Result<Attempt> {
        let (name, kind, mode, lease) = (j.name, j.kind, j.mode, j.lease);
        let ops = resp.op_responses();
        if get_kvs(ops.first())?.is_empty() {
            return Err(lost());
        }
        if !get_kvs(ops.get(1))?.is_empty() {
            // Our entry is there: one more hold (or this join's own
            // earlier attempt), decided on the whole queue.
            let read = self.read(lease, name).await?;
            if let Some(i) = read.position(lease) {
                return self
                    .join_existing(j, read, i, unsure)
                    .await
                    .map(Attempt::Done);
            }
            return Ok(Attempt::Again);
        }
        if write_first && !get_kvs(ops.get(2))?.is_empty() {
            // The busy key: an exclusive entry holds the name.
            return Ok(Attempt::Done(None));
        }
        if write_first {
            // Entries without a busy key (shared, permits, or an
            // exclusive one whose busy key a later waiter took
            // along), or a queue emptied since: one entry says which.
            let any = Txn::new().and_then(vec![self.any_op(name)]);
            let resp = retrying(|| self.txn(any.clone())).await?;
            let kvs = get_kvs(resp.op_responses().first())?.into_owned();
            if kvs.is_empty() {
                return Ok(Attempt::Again);
            }
            let others = kvs
                .iter()
                .map(|kv| self.decode_entry(kv.value()).map(|(kind, _, _)| kind))
                .collect::<Result<Vec<_>>>()?;
            crate::queue::check_compatible(name, kind, others)?;
            return Ok(Attempt::Done(None));
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
            return Ok(Attempt::Done(None));
        }
        Ok(Attempt::Again)
    }

    /// An exclusive entry is in: granted if nothing is ahead of it, and
    /// taken out again if the entry ahead or the head conflicts with it.
    async fn exclusive_joined(&self, j: &Joining<'_>, resp: &TxnResponse) -> Result<Attempt> {
        let (session, name, kind, entry) = (j.session, j.name, j.kind, &j.entry);
        let ops = resp.op_responses();
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
        Ok(Attempt::Done(Some(Joined {
            seq,
            granted: ahead.is_empty(),
            holds: 1,
            first,
        })))
    }

    /// A shared or permit entry's transaction failed, with the queue read
    /// back: the session is lost, its entry is there already, or again.
    async fn refused_with_queue(
        &self,
        j: &Joining<'_>,
        resp: &TxnResponse,
        unsure: bool,
    ) -> Result<Attempt> {
        let (name, lease) = (j.name, j.lease);
        let ops = resp.op_responses();
        if get_kvs(ops.first())?.is_empty() {
            return Err(lost());
        }
        let read = self.parse_read(name, &get_kvs(ops.get(1))?, revision_of(resp))?;
        if let Some(i) = read.position(lease) {
            return self
                .join_existing(j, read, i, unsure)
                .await
                .map(Attempt::Done);
        }
        // The queue changed between our read and the write: again.
        Ok(Attempt::Again)
    }

    /// A shared or permit entry is in, granted as the queue read back says,
    /// and taken out again if it conflicts with another entry.
    async fn joined_with_queue(&self, j: &Joining<'_>, resp: &TxnResponse) -> Result<Attempt> {
        let (session, name, kind, lease) = (j.session, j.name, j.kind, j.lease);
        let ops = resp.op_responses();
        let first = get_kvs(ops.first())?.is_empty();
        let read = self.parse_read(name, &get_kvs(ops.get(3))?, revision_of(resp))?;
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
        Ok(Attempt::Done(Some(Joined {
            seq: read.rows[i].seq,
            granted: read.granted[i],
            holds: 1,
            first,
        })))
    }

    /// The session's entry is at `i` of `read`: this join's own earlier
    /// attempt (same nonce, its answer lost), else one more hold of it.
    async fn join_existing(
        &self,
        j: &Joining<'_>,
        read: Read,
        i: usize,
        unsure: bool,
    ) -> Result<Option<Joined>> {
        if let Some(joined) = own_earlier_attempt(&read, i, unsure, &j.nonce) {
            return Ok(Some(joined));
        }
        self.rejoin(j.session, j.name, j.kind, j.mode, read).await
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
