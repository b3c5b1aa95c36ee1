//! A name's queue as etcd holds it: the reads of it in a transaction, its
//! rows parsed (in either layout) with their grants, the queue with its
//! sessions' labels and time left, and the names that have one.

use std::collections::HashMap;
use std::time::Duration;

use super::layout::{lease_of, marked_granted, parse_aux, Layout};
use super::rpc::{
    GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use super::{bad, call, lost, EtcdStore};
use crate::backend::poll::retrying;
use crate::error::Result;
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Entry, EntryKind, Name, Queue};

/// The most operations etcd takes in one transaction by default
/// (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;

/// One entry of a queue as read from etcd.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) key: Vec<u8>,
    pub(super) seq: u64,
    pub(super) mod_rev: i64,
    pub(super) lease: i64,
    pub(super) kind: EntryKind,
    pub(super) nonce: String,
    pub(super) value: Vec<u8>,
    pub(super) holds: u32,
    /// Marked [`GRANTED_MARK`](super::layout::GRANTED_MARK) (tenure's
    /// layout only).
    pub(super) marked: bool,
}

/// A name's queue as read at one revision.
pub(super) struct Read {
    pub(super) rows: Vec<Row>,
    pub(super) granted: Vec<bool>,
    pub(super) revision: i64,
    /// Hold-count keys: lease -> (holds, mod revision).
    pub(super) holds: HashMap<i64, (u32, i64)>,
}

impl Read {
    pub(super) fn position(&self, lease: i64) -> Option<usize> {
        self.rows.iter().position(|r| r.lease == lease)
    }
}

pub(super) fn revision_of(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The keys a read in a transaction found, borrowed; a nested transaction
/// of reads (etcd's layout reads a name as two ranges) answers all of them,
/// in order (then copied, once).
pub(super) fn get_kvs<'a>(
    op: Option<&TxnOpResponse<'a>>,
) -> Result<std::borrow::Cow<'a, [KeyValue]>> {
    use std::borrow::Cow;
    match op {
        Some(TxnOpResponse::Get(g)) => Ok(Cow::Borrowed(g.kvs())),
        Some(TxnOpResponse::Txn(inner)) if inner.succeeded() => {
            let mut all = Vec::new();
            for op in inner.op_responses() {
                all.extend_from_slice(&get_kvs(Some(&op))?);
            }
            Ok(Cow::Owned(all))
        }
        _ => Err(bad("a transaction without its read")),
    }
}

/// A version for a queue: a hash of what can change in it.
fn fingerprint(read: &Read) -> u64 {
    crate::backend::poll::fingerprint(
        read.rows
            .iter()
            .flat_map(|r| [r.seq, r.mod_rev as u64, u64::from(r.holds)]),
    )
}

impl EtcdStore {
    pub(super) fn read_op(&self, name: &Name) -> TxnOp {
        let queue = TxnOp::get(
            self.name_prefix(name),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        );
        match self.inner.layout {
            Layout::Tenure => queue,
            // Two ranges, read as one (a nested transaction, whose answers
            // [`get_kvs`] joins): the queue, then the hold counts.
            Layout::Etcd => TxnOp::txn(Txn::new().and_then(vec![
                queue,
                TxnOp::get(self.aux_prefix(name), Some(GetOptions::new().with_prefix())),
            ])),
        }
    }

    /// The latest entries of `name`'s queue by create revision, newest
    /// first, at most `limit`, created before `before` if given: for an
    /// exclusive entry, the entry just ahead is all that decides its turn.
    /// (etcd sorts the range on the server; only these entries travel.)
    pub(super) fn latest_op(&self, name: &Name, limit: i64, before: Option<i64>) -> TxnOp {
        let mut options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(limit);
        if let Some(rev) = before {
            options = options.with_max_create_revision(rev - 1);
        }
        TxnOp::get(self.queue_prefix(name), Some(options))
    }

    /// The oldest entry of `name`'s queue (the head). Every entry of a
    /// queue agrees in kind with the head: the check that lets an entry stay
    /// compares it with everything ahead, the head included.
    pub(super) fn head_op(&self, name: &Name) -> TxnOp {
        TxnOp::get(
            self.queue_prefix(name),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    }

    /// Any one entry of `name`'s queue (the cheapest read: key order, limit
    /// one), to check a new entry's kind against.
    pub(super) fn any_op(&self, name: &Name) -> TxnOp {
        TxnOp::get(
            self.queue_prefix(name),
            Some(GetOptions::new().with_prefix().with_limit(1)),
        )
    }

    /// The queue from a read of [`Self::name_prefix`].
    pub(super) fn parse_read(&self, name: &Name, kvs: &[KeyValue], revision: i64) -> Result<Read> {
        if self.inner.layout == Layout::Etcd {
            return self.parse_recipe_read(name, kvs, revision);
        }
        let qp = self.queue_prefix(name);
        let np = self.name_prefix(name);
        let mut rows = Vec::new();
        let mut holds = HashMap::new();
        for kv in kvs {
            let key = kv.key();
            if let Some(hex) = key.strip_prefix(qp.as_slice()) {
                let (kind, nonce, value) = self.decode_entry(kv.value())?;
                rows.push(Row {
                    key: key.to_vec(),
                    seq: u64::try_from(kv.create_revision()).map_err(bad)?,
                    mod_rev: kv.mod_revision(),
                    lease: lease_of(hex)?,
                    kind,
                    nonce,
                    value,
                    holds: 1,
                    marked: marked_granted(kv.value()),
                });
            } else if let Some(rest) = key.strip_prefix(np.as_slice()) {
                if let Some(hex) = rest.strip_prefix(b"h") {
                    let n = std::str::from_utf8(kv.value())
                        .ok()
                        .and_then(|v| v.parse::<u32>().ok())
                        .ok_or_else(|| bad("a hold count"))?;
                    holds.insert(lease_of(hex)?, (n, kv.mod_revision()));
                }
            }
        }
        for row in &mut rows {
            if let Some((n, _)) = holds.get(&row.lease) {
                row.holds = *n;
            }
        }
        let kinds: Vec<EntryKind> = rows.iter().map(|r| r.kind).collect();
        Ok(Read {
            granted: crate::queue::grants(&kinds),
            rows,
            revision,
            holds,
        })
    }

    /// [`Self::parse_read`] in etcd's layout: the entries are the keys
    /// under `NAME/` (as etcd's recipe reads them: `a/b`'s keys are in
    /// `a`'s queue too), then the hold counts.
    fn parse_recipe_read(&self, name: &Name, kvs: &[KeyValue], revision: i64) -> Result<Read> {
        let qp = self.queue_prefix(name);
        let ap = self.aux_prefix(name);
        let mut rows = Vec::new();
        let mut holds = HashMap::new();
        let mut nonces = HashMap::new();
        for kv in kvs {
            let key = kv.key();
            if let Some(hex) = key.strip_prefix(ap.as_slice()) {
                let (n, nonce) = parse_aux(kv.value())?;
                let lease = lease_of(hex)?;
                holds.insert(lease, (n, kv.mod_revision()));
                nonces.insert(lease, nonce);
            } else if key.starts_with(&qp) {
                // As in etcd's recipe, every key under `NAME/` is an entry
                // (the range reads above count them all), whose session is
                // the lease it is on, whatever its key says.
                rows.push(Row {
                    key: key.to_vec(),
                    seq: u64::try_from(kv.create_revision()).map_err(bad)?,
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                    kind: EntryKind::Exclusive,
                    nonce: String::new(),
                    value: kv.value().to_vec(),
                    holds: 1,
                    marked: false,
                });
            }
        }
        for row in &mut rows {
            if let Some((n, _)) = holds.get(&row.lease) {
                row.holds = *n;
            }
            if let Some(nonce) = nonces.remove(&row.lease) {
                row.nonce = nonce;
            }
        }
        let kinds: Vec<EntryKind> = rows.iter().map(|r| r.kind).collect();
        Ok(Read {
            granted: crate::queue::grants(&kinds),
            rows,
            revision,
            holds,
        })
    }

    /// [`Store::names`] in etcd's layout: every key `NAME/<hex>` outside
    /// tenure's own prefix (one keys-only read of the range that starts
    /// with `prefix`: the whole keyspace for an empty one).
    async fn recipe_names(&self, prefix: &str) -> Result<Vec<Name>> {
        let options = GetOptions::new().with_keys_only();
        let options = if prefix.is_empty() {
            options.with_range(vec![0])
        } else {
            options.with_prefix()
        };
        let start = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.as_bytes().to_vec()
        };
        let resp = call(self.client().get(start, Some(options))).await?;
        let own = self.key("");
        let mut names = Vec::new();
        for kv in resp.kvs() {
            let key = kv.key();
            if key.starts_with(&own) || kv.lease() == 0 {
                continue;
            }
            let Some(slash) = key.iter().rposition(|b| *b == b'/') else {
                continue;
            };
            let Ok(text) = std::str::from_utf8(&key[..slash]) else {
                continue;
            };
            if let Ok(name) = Name::stored(text) {
                names.push(name);
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Reads the session's secret and the name's queue in one transaction;
    /// a session whose secret is gone is lost.
    pub(super) async fn read(&self, lease: i64, name: &Name) -> Result<Read> {
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.secret_key(lease), None),
            self.read_op(name),
        ]);
        let resp = retrying(|| self.txn(txn.clone())).await?;
        let ops = resp.op_responses();
        if get_kvs(ops.first())?.is_empty() {
            return Err(lost());
        }
        self.parse_read(name, &get_kvs(ops.get(1))?, revision_of(&resp))
    }

    /// [`Store::names`]: the names with a queue, in either layout.
    pub(super) async fn list_names(&self, prefix: &str) -> Result<Vec<Name>> {
        if self.inner.layout == Layout::Etcd {
            return self.recipe_names(prefix).await;
        }
        let start = self.key(&format!("n/{prefix}"));
        let resp = call(self.client().get(
            start,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ))
        .await?;
        let head = self.key("n/");
        let mut names = Vec::new();
        for kv in resp.kvs() {
            let Some(rest) = kv.key().strip_prefix(head.as_slice()) else {
                continue;
            };
            let Some(nul) = rest.iter().position(|b| *b == 0) else {
                continue;
            };
            if rest.get(nul + 1) != Some(&b'q') {
                continue;
            }
            let name = std::str::from_utf8(&rest[..nul]).map_err(bad)?;
            names.push(Name::stored(name)?);
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The queue and the revision it was read at.
    pub(super) async fn queue_at(&self, name: &Name) -> Result<(Queue, i64)> {
        self.check_recipe_name(name)?;
        let resp = retrying(|| self.txn(Txn::new().and_then(vec![self.read_op(name)]))).await?;
        let revision = revision_of(&resp);
        let read = self.parse_read(name, &get_kvs(resp.op_responses().first())?, revision)?;
        let version = fingerprint(&read);
        // Labels and time left, per session.
        let mut leases: Vec<i64> = read.rows.iter().map(|r| r.lease).collect();
        leases.sort_unstable();
        leases.dedup();
        let mut info: HashMap<i64, (String, String, Duration)> = HashMap::new();
        if !leases.is_empty() {
            // etcd takes at most 128 operations per transaction (its
            // --max-txn-ops): read the sessions' labels in chunks.
            let mut infos = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(MAX_TXN_OPS) {
                let gets: Vec<TxnOp> = chunk
                    .iter()
                    .map(|l| TxnOp::get(self.info_key(*l), None))
                    .collect();
                let resp = call(self.client().txn(Txn::new().and_then(gets))).await?;
                // Each session's info text, as read.
                infos.extend(resp.op_responses().iter().map(|op| {
                    match op {
                        TxnOpResponse::Get(g) => g
                            .kvs()
                            .first()
                            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                            .unwrap_or_default(),
                        _ => String::new(),
                    }
                }));
            }
            let lefts = futures_util::future::join_all(leases.iter().map(|l| {
                let mut client = self.client();
                let l = *l;
                async move { call(client.lease_time_to_live(l, None)).await }
            }))
            .await;
            for ((lease, text), left) in leases.iter().zip(infos).zip(lefts) {
                let mut f = text.splitn(3, '\t');
                let tag = f.next().unwrap_or_default().to_string();
                let _ttl = f.next();
                let label = f.next().unwrap_or_default().to_string();
                let left = left
                    .ok()
                    .map(|r| Duration::from_secs(u64::try_from(r.ttl().max(0)).unwrap_or(0)))
                    .unwrap_or_default();
                info.insert(*lease, (tag, label, left));
            }
        }
        let entries = read
            .rows
            .iter()
            .zip(&read.granted)
            .map(|(r, granted)| {
                let (tag, label, left) = info.get(&r.lease).cloned().unwrap_or_default();
                Entry {
                    seq: r.seq,
                    kind: r.kind,
                    session_tag: tag,
                    label,
                    value: r.value.clone(),
                    granted: *granted,
                    granted_at: None,
                    expires_in: left,
                    holds: r.holds,
                }
            })
            .collect();
        Ok((Queue { version, entries }, revision))
    }
}
