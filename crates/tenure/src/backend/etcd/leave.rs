//! A holder's writes to its entry: leaving (one hold, or the entry with its
//! last hold) and setting the entry's value.

use std::time::Duration;

use super::layout::{aux_value, parse_aux, with_granted_mark, Layout};
use super::queue::get_kvs;
use super::rpc::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use super::{bad, call, lost, split_key, EtcdStore, BACKEND, CAS_ATTEMPTS};
use crate::backend::poll::RETRY_FOR;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Name, SessionKey};

impl EtcdStore {
    /// [`Store::leave`]: one hold less, the entry gone with its last.
    pub(super) async fn leave_queue(
        &self,
        session: &SessionKey,
        name: &Name,
        seq: u64,
    ) -> Result<u32> {
        let (lease, secret) = split_key(session)?;
        let entry = self.entry_key(name, lease);
        let holds_key = self.holds_key(name, lease);
        let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut unsure = false;
        for _ in 0..CAS_ATTEMPTS {
            // The usual case, one hold: delete the entry if it is still the
            // one acquired with this seq.
            let (one_hold, then) = match self.inner.layout {
                Layout::Tenure => (
                    Compare::create_revision(holds_key.clone(), CompareOp::Equal, 0),
                    vec![
                        TxnOp::delete(entry.clone(), None),
                        // The busy key goes with the entry that wrote it.
                        TxnOp::txn(
                            Txn::new()
                                .when(vec![Compare::value(
                                    self.busy_key(name),
                                    CompareOp::Equal,
                                    format!("{lease:016x}"),
                                )])
                                .and_then(vec![TxnOp::delete(self.busy_key(name), None)]),
                        ),
                    ],
                ),
                Layout::Etcd => (
                    Compare::value(holds_key.clone(), CompareOp::Less, aux_value(2, "")),
                    vec![
                        TxnOp::delete(entry.clone(), None),
                        TxnOp::delete(holds_key.clone(), None),
                    ],
                ),
            };
            let txn = Txn::new()
                .when(vec![
                    self.secret_matches(lease, secret),
                    Compare::create_revision(entry.clone(), CompareOp::Equal, seq),
                    one_hold,
                ])
                .and_then(then)
                .or_else(vec![
                    TxnOp::get(self.secret_key(lease), None),
                    TxnOp::get(entry.clone(), None),
                    TxnOp::get(holds_key.clone(), None),
                ]);
            let resp = match call(self.client().txn(txn)).await {
                Err(e) if e.is_temporary() && tokio::time::Instant::now() < deadline => {
                    unsure = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                other => other?,
            };
            if resp.succeeded() {
                return Ok(0);
            }
            let ops = resp.op_responses();
            if get_kvs(ops.first())?.is_empty() {
                return Err(lost());
            }
            let mine = get_kvs(ops.get(1))?;
            if mine.first().map(|kv| kv.create_revision()) != Some(seq) {
                if unsure && mine.is_empty() {
                    // An earlier attempt deleted it; its answer was lost.
                    return Ok(0);
                }
                return Err(Error::NotHeld("this session holds no such entry"));
            }
            let holds_kvs = get_kvs(ops.get(2))?;
            let Some(h) = holds_kvs.first() else {
                if self.inner.layout == Layout::Etcd {
                    // No hold count (deleted by hand): one hold.
                    let txn = Txn::new()
                        .when(vec![
                            self.secret_matches(lease, secret),
                            Compare::create_revision(entry.clone(), CompareOp::Equal, seq),
                            Compare::create_revision(holds_key.clone(), CompareOp::Equal, 0),
                        ])
                        .and_then(vec![TxnOp::delete(entry.clone(), None)]);
                    if call(self.client().txn(txn)).await?.succeeded() {
                        return Ok(0);
                    }
                }
                continue;
            };
            let (holds, nonce) = match self.inner.layout {
                Layout::Tenure => std::str::from_utf8(h.value())
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .map(|n| (n, String::new()))
                    .ok_or_else(|| bad("a hold count"))?,
                Layout::Etcd => parse_aux(h.value())?,
            };
            let left = holds.saturating_sub(1);
            // tenure's layout keeps no count for one hold; etcd's keeps the
            // nonce with it until the entry goes.
            let change = if left > 1 || self.inner.layout == Layout::Etcd {
                TxnOp::put(
                    holds_key.clone(),
                    self.holds_value(left, &nonce),
                    Some(PutOptions::new().with_lease(lease)),
                )
            } else {
                TxnOp::delete(holds_key.clone(), None)
            };
            let txn = Txn::new()
                .when(vec![
                    self.secret_matches(lease, secret),
                    Compare::create_revision(entry.clone(), CompareOp::Equal, seq),
                    Compare::mod_revision(holds_key.clone(), CompareOp::Equal, h.mod_revision()),
                ])
                .and_then(vec![change]);
            if call(self.client().txn(txn)).await?.succeeded() {
                return Ok(left);
            }
        }
        Err(Error::unavailable(BACKEND, "too many concurrent changes"))
    }

    /// [`Store::set_value`]: the value of the session's granted entry.
    pub(super) async fn write_value(
        &self,
        key: &SessionKey,
        name: &Name,
        seq: u64,
        value: &[u8],
    ) -> Result<()> {
        let (lease, secret) = split_key(key)?;
        for _ in 0..CAS_ATTEMPTS {
            let read = self.read(lease, name).await?;
            let i = match read.position(lease) {
                Some(i) if read.rows[i].seq == seq && read.granted[i] => i,
                _ => return Err(Error::NotHeld("this session holds no granted entry here")),
            };
            let row = &read.rows[i];
            let mut raw = self.encode_entry(row.kind, &row.nonce, value);
            if row.marked {
                raw = with_granted_mark(&raw).unwrap_or(raw);
            }
            let txn = Txn::new()
                .when(vec![
                    self.secret_matches(lease, secret),
                    Compare::mod_revision(row.key.clone(), CompareOp::Equal, row.mod_rev),
                ])
                .and_then(vec![TxnOp::put(
                    row.key.clone(),
                    raw,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            if call(self.client().txn(txn)).await?.succeeded() {
                return Ok(());
            }
        }
        Err(Error::unavailable(BACKEND, "too many concurrent changes"))
    }
}
