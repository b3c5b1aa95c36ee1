//! Fences and cells: the kind key that says what a name is, the value key,
//! and every operation as one transaction.

use super::queue::{get_kvs, revision_of};
use super::rpc::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use super::{bad, etcd_err, lease_not_found, lost, split_key, EtcdStore, BACKEND, CALL_TIMEOUT};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{CellWrite, Expect, FenceOp, FenceState, Name, SessionKey, Versioned};

/// What a register's kind key says its name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Register {
    /// A fence, with the highest token it has admitted.
    Fence(u64),
    /// A cell.
    Cell,
}

/// A cell's kind key.
pub(super) const CELL_MARK: &[u8] = b"c";

/// The first byte of a fence's kind key.
pub(super) const FENCE_MARK: u8 = b'f';

/// Digits of a fence's token in its kind key: every `u64`.
pub(super) const TOKEN_DIGITS: usize = 20;

/// A fence's kind key with its highest token: `f` and the token as 20
/// zero-padded digits, so that etcd, which compares values as bytes, orders
/// them as numbers.
pub(super) fn fence_mark(token: u64) -> Vec<u8> {
    format!(
        "{}{token:0width$}",
        FENCE_MARK as char,
        width = TOKEN_DIGITS
    )
    .into_bytes()
}

/// What a fence's kind key must be below for `token` to be admitted: its
/// mark followed by one more byte, so that a mark of an equal token (a
/// prefix of it) is below too.
pub(super) fn fence_ceiling(token: u64) -> Vec<u8> {
    let mut ceiling = fence_mark(token);
    ceiling.push(0);
    ceiling
}

/// The register a read of its kind key found, if any.
fn register_kind(kvs: &[KeyValue]) -> Result<Option<Register>> {
    kvs.first()
        .map(|kv| register_kind_of(kv.value()))
        .transpose()
}

/// The register a kind key's value names.
pub(super) fn register_kind_of(mark: &[u8]) -> Result<Register> {
    match mark {
        CELL_MARK => Ok(Register::Cell),
        [FENCE_MARK, digits @ ..]
            if digits.len() == TOKEN_DIGITS && digits.iter().all(u8::is_ascii_digit) =>
        {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
                .map(Register::Fence)
                .ok_or_else(|| bad("a fence's token out of range"))
        }
        _ => Err(bad("a fence's or a cell's kind key")),
    }
}

/// The value a read of a value key found, if any.
fn stored_value(kvs: &[KeyValue]) -> Option<Vec<u8>> {
    kvs.first().map(|kv| kv.value().to_vec())
}

/// A cell's version: its value key's mod revision.
fn cell_version(kv: &KeyValue) -> Result<u64> {
    u64::try_from(kv.mod_revision())
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| bad("a cell's mod revision"))
}

/// A version to compare a mod revision with: one no key has (etcd's
/// revisions never reach `i64::MAX`) for a version that is not a revision.
pub(super) fn revision_arg(version: u64) -> i64 {
    i64::try_from(version)
        .ok()
        .filter(|v| *v > 0)
        .unwrap_or(i64::MAX)
}

/// The revision a successful write happened at: the new version.
fn written_at(resp: &TxnResponse) -> Result<u64> {
    u64::try_from(revision_of(resp))
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("a write without its revision"))
}

/// The branch a transaction took, following a nested transaction that is
/// the only operation of an `else` branch: whether it was a `then` branch,
/// and its answers.
fn branch_taken(resp: &TxnResponse) -> (bool, Vec<TxnOpResponse<'_>>) {
    let mut succeeded = resp.succeeded();
    let mut ops = resp.op_responses();
    while !succeeded {
        let inner = match ops.as_slice() {
            [TxnOpResponse::Txn(inner)] => *inner,
            _ => break,
        };
        succeeded = inner.succeeded();
        ops = inner.op_responses();
    }
    (succeeded, ops)
}

/// The answer to a cell write whose compares failed on a name that is a
/// cell or nothing: the cell's current version.
fn cell_mismatch(kind: Option<Register>, value: &[KeyValue]) -> Result<CellWrite> {
    let current = match (kind, value.first()) {
        (Some(Register::Cell), Some(kv)) => Some(cell_version(kv)?),
        _ => None,
    };
    Ok(CellWrite::Mismatch(current))
}

/// A fence's name used as a cell, or a cell's as a fence.
fn kind_conflict(name: &Name, is: Register) -> Error {
    match is {
        Register::Cell => crate::store::kind_conflict(name, "a cell", "a fence"),
        Register::Fence(_) => crate::store::kind_conflict(name, "a fence", "a cell"),
    }
}

impl EtcdStore {
    /// A fence's or a cell's kind: [`CELL_MARK`], or a fence's highest
    /// token ([`fence_mark`]). Never on a lease and never deleted, so a name
    /// stays what it first was.
    fn register_key(&self, name: &Name) -> Vec<u8> {
        self.key(&format!("r/{name}"))
    }

    /// A fence's or a cell's value (a cell's on its owner's lease, if bound);
    /// a cell's version is this key's mod revision.
    fn value_key(&self, name: &Name) -> Vec<u8> {
        self.key(&format!("v/{name}"))
    }

    /// Reads a register's kind and value in one transaction (linearizable).
    async fn register_read(&self, name: &Name) -> Result<(Option<Register>, Vec<KeyValue>)> {
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.register_key(name), None),
            TxnOp::get(self.value_key(name), None),
        ]);
        let resp = retrying(|| self.txn(txn.clone())).await?;
        let ops = resp.op_responses();
        let kind = register_kind(&get_kvs(ops.first())?)?;
        Ok((kind, get_kvs(ops.get(1))?.to_vec()))
    }

    /// [`Store::fence`]: reads a fence, or admits a token.
    pub(super) async fn fence_op(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let (token, new) = match op {
            FenceOp::Read => {
                let (kind, value) = self.register_read(name).await?;
                let highest = match kind {
                    None => 0,
                    Some(Register::Fence(highest)) => highest,
                    Some(cell) => return Err(kind_conflict(name, cell)),
                };
                return Ok(FenceState {
                    admitted: true,
                    highest,
                    value: stored_value(&value).filter(|_| kind.is_some()),
                });
            }
            FenceOp::Admit { token, value } => (token, value),
        };
        let kind_key = self.register_key(name);
        let value_key = self.value_key(name);
        // Admitting: the new highest, and the value (or a read of the value
        // kept). Not retried after a lost answer: a second try could refuse
        // the token that the first admitted.
        let mut admit = vec![TxnOp::put(kind_key.clone(), fence_mark(token), None)];
        admit.push(match new {
            Some(value) => TxnOp::put(value_key.clone(), value, None),
            None => TxnOp::get(value_key.clone(), None),
        });
        // A fence whose highest is at most the token: a mark between `f`
        // and the token's ceiling (a cell's mark is below `f`).
        let raise = Txn::new()
            .when(vec![
                Compare::value(kind_key.clone(), CompareOp::Greater, vec![FENCE_MARK]),
                Compare::value(kind_key.clone(), CompareOp::Less, fence_ceiling(token)),
            ])
            .and_then(admit.clone())
            .or_else(vec![
                TxnOp::get(kind_key.clone(), None),
                TxnOp::get(value_key.clone(), None),
            ]);
        // A name never used is admitted at once; etcd fails a value compare
        // on a missing key, hence the outer compare.
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                kind_key,
                CompareOp::Equal,
                0,
            )])
            .and_then(admit)
            .or_else(vec![TxnOp::txn(raise)]);
        let resp = self.txn(txn).await?;
        let (admitted, ops) = branch_taken(&resp);
        if admitted {
            let value = match new {
                Some(value) => Some(value.to_vec()),
                None => stored_value(&get_kvs(ops.get(1))?),
            };
            return Ok(FenceState {
                admitted,
                highest: token,
                value,
            });
        }
        match register_kind(&get_kvs(ops.first())?)? {
            Some(Register::Fence(highest)) if highest > token => Ok(FenceState {
                admitted,
                highest,
                value: stored_value(&get_kvs(ops.get(1))?),
            }),
            Some(Register::Cell) => Err(kind_conflict(name, Register::Cell)),
            _ => Err(bad("a fence refused a token at least its highest")),
        }
    }

    /// [`Store::cell_get`]: a cell's value and version.
    pub(super) async fn read_cell(&self, name: &Name) -> Result<Option<Versioned>> {
        match self.register_read(name).await? {
            (Some(fence @ Register::Fence(_)), _) => Err(kind_conflict(name, fence)),
            (None, _) => Ok(None),
            (Some(Register::Cell), value) => value
                .first()
                .map(|kv| {
                    Ok(Versioned {
                        value: kv.value().to_vec(),
                        version: cell_version(kv)?,
                    })
                })
                .transpose(),
        }
    }

    /// [`Store::cell_put`]: writes a cell if it is as expected.
    pub(super) async fn write_cell(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let kind_key = self.register_key(name);
        let value_key = self.value_key(name);
        let owner = owner.map(split_key).transpose()?;
        // The owner's secret, compared in the same transaction: its session
        // is alive, so its lease is (the secret's key is on it).
        let alive: Vec<Compare> = owner
            .iter()
            .map(|(lease, secret)| self.secret_matches(*lease, secret))
            .collect();
        let put = TxnOp::put(
            value_key.clone(),
            value,
            owner.map(|(lease, _)| PutOptions::new().with_lease(lease)),
        );
        let mut look = vec![
            TxnOp::get(kind_key.clone(), None),
            TxnOp::get(value_key.clone(), None),
        ];
        if let Some((lease, _)) = owner {
            look.push(TxnOp::get(self.secret_key(lease), None));
        }
        let mut when = alive.clone();
        when.push(Compare::value(
            kind_key.clone(),
            CompareOp::Equal,
            CELL_MARK,
        ));
        when.push(match expect {
            Expect::Absent => Compare::create_revision(value_key.clone(), CompareOp::Equal, 0),
            Expect::Version(v) => {
                Compare::mod_revision(value_key.clone(), CompareOp::Equal, revision_arg(v))
            }
        });
        let write = Txn::new()
            .when(when)
            .and_then(vec![put.clone()])
            .or_else(look);
        let txn = match expect {
            // A name never used becomes a cell with its first value; etcd
            // fails a value compare on a missing key, hence the outer one.
            Expect::Absent => {
                let mut fresh = alive;
                fresh.push(Compare::create_revision(
                    kind_key.clone(),
                    CompareOp::Equal,
                    0,
                ));
                Txn::new()
                    .when(fresh)
                    .and_then(vec![TxnOp::put(kind_key, CELL_MARK, None), put])
                    .or_else(vec![TxnOp::txn(write)])
            }
            Expect::Version(_) => write,
        };
        // Not retried after a lost answer: a second try would report a
        // mismatch with the first one's own write.
        let mut client = self.client();
        let resp = tokio::time::timeout(CALL_TIMEOUT, client.txn(txn))
            .await
            .map_err(|_| Error::unavailable(BACKEND, format!("no answer within {CALL_TIMEOUT:?}")))?
            .map_err(|e| {
                if owner.is_some() && lease_not_found(&e) {
                    lost()
                } else {
                    etcd_err(e)
                }
            })?;
        let (done, ops) = branch_taken(&resp);
        if done {
            return Ok(CellWrite::Done(written_at(&resp)?));
        }
        let kind = register_kind(&get_kvs(ops.first())?)?;
        if let Some(fence @ Register::Fence(_)) = kind {
            return Err(kind_conflict(name, fence));
        }
        if let Some((_, secret)) = owner {
            let kept = get_kvs(ops.get(2))?;
            if kept.first().map(|kv| kv.value()) != Some(secret.as_bytes()) {
                return Err(lost());
            }
        }
        cell_mismatch(kind, &get_kvs(ops.get(1))?)
    }

    /// [`Store::cell_delete`]: deletes a cell if it is at `version`.
    pub(super) async fn delete_cell(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let kind_key = self.register_key(name);
        let value_key = self.value_key(name);
        let txn = Txn::new()
            .when(vec![
                Compare::value(kind_key.clone(), CompareOp::Equal, CELL_MARK),
                Compare::mod_revision(value_key.clone(), CompareOp::Equal, revision_arg(version)),
            ])
            .and_then(vec![TxnOp::delete(value_key.clone(), None)])
            .or_else(vec![
                TxnOp::get(kind_key, None),
                TxnOp::get(value_key, None),
            ]);
        // Not retried after a lost answer, as for a put.
        let resp = self.txn(txn).await?;
        if resp.succeeded() {
            // The delete's revision: the next write's is higher.
            return Ok(CellWrite::Done(written_at(&resp)?));
        }
        let ops = resp.op_responses();
        let kind = register_kind(&get_kvs(ops.first())?)?;
        if let Some(fence @ Register::Fence(_)) = kind {
            return Err(kind_conflict(name, fence));
        }
        cell_mismatch(kind, &get_kvs(ops.get(1))?)
    }
}
