//! `etcd://[user:password@]host:port[,host:port…][?prefix=NAME]`: etcd v3,
//! the recipe of etcd's `concurrency` package over the tenure contract.
//!
//! - A session is a lease (TTL in whole seconds, rounded up) kept alive by
//!   [`Store::keep_alive`] over one keep-alive stream per lease. Its secret
//!   lives in a key of the lease, and every write compares it in the same
//!   transaction, so only the session's owner can act for it. Its public
//!   tag is in `PREFIX/si/<lease>`, so ending one session by its tag is
//!   revoking the lease of the info key that has it.
//! - A name's queue is the keys `PREFIX/n/NAME\0q<lease>` (one per session,
//!   attached to its lease), ordered by create revision; the create revision
//!   is the fencing token (etcd's revision never goes back, across restarts
//!   and leader changes). Grants follow [`crate::queue::grants`]. A reentrant
//!   hold count above one lives in `PREFIX/n/NAME\0h<lease>`.
//! - Joining is one transaction: compare the secret and that the session has
//!   no entry, put the entry, and read the queue back (a try-lock of an
//!   exclusive entry also compares that the queue is empty). Releasing is one
//!   transaction that compares the entry's create revision, so a release can
//!   never delete a newer acquisition (etcd #22082).
//! - A waiter watches only the entry whose deletion can grant it (the one
//!   just ahead for a mutex, the last writer ahead for a reader; a semaphore
//!   waiter watches its queue) and its own entry; after each wake-up it reads
//!   the queue again, linearizably, and finds its own entry there or reports
//!   the loss: a grant is never reported for an entry whose lease is gone.
//! - Fences and cells share `PREFIX/r/NAME`, which says what the name is
//!   (`c` for a cell; `f` and the highest token admitted, as 20 zero-padded
//!   digits so that etcd's byte-wise value compares order tokens as
//!   numbers) and is never deleted, so a name stays a fence or a cell. The
//!   value is `PREFIX/v/NAME` (a bound cell's on its owner's lease); a
//!   cell's version is that key's mod revision, which etcd never reuses, not
//!   even after a delete or an expiry. Every operation is one transaction,
//!   so one round trip: a read gets both keys; an admit compares the token
//!   with the mark (`f` < mark < the token's own mark followed by one byte)
//!   and a cell write compares the kind, the value key's create or mod
//!   revision and, when bound, the owner's secret. A name never used is
//!   taken in the same transaction: its compares fail on a missing key, so
//!   they sit in a nested transaction (etcd ≥ 3.3) under an outer compare
//!   that the kind key does not exist.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
mod rpc;

use rpc::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchOptions,
};

use super::codec;
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, CellWrite, Entry, EntryKind, Expect, FenceOp, FenceState, JoinMode, JoinRequest,
    Joined, Name, OpenedSession, Queue, SessionKey, SessionSpec, Store, Versioned,
};

const BACKEND: &str = "etcd";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every unary call (watches are not bounded).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The most operations etcd takes in one transaction by default
/// (`--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;
/// Attempts of a compare-and-swap that lost a race with another writer.
const CAS_ATTEMPTS: usize = 16;
/// Session info keys read per request when looking for a tag.
const SCAN_PAGE: i64 = 512;

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["prefix", "tls_ca", "layout"]);

/// The etcd backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        min_ttl: Duration::from_secs(2),
        grant_times: false,
        ..Capabilities::durable_store(
            BACKEND,
            "etcd's lease clock (the raft leader's), TTL in whole seconds",
            "acquire: 1 (txn; a try-lock 2: a read, then the txn if the queue looked empty), release: 1 (txn), renew: 1 (lease keep-alive), fence/cell: 1 (txn)",
        )
    }
}

/// Where a name's queue lives in etcd's keyspace (`?layout=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// tenure's own: `PREFIX/n/NAME\0q<lease>`, the entry's kind in its
    /// value; every kind of entry.
    Tenure,
    /// etcd's `concurrency` recipe (`etcdctl lock`/`elect`, Go's `Mutex` and
    /// `Election`): `NAME/<lease in hex>`, the value the user's own;
    /// exclusive entries only. A hold count and the join's nonce live in
    /// tenure's own `PREFIX/h/NAME\0<lease>`, which etcd's recipe never reads.
    Etcd,
}

/// The capabilities of a store with `layout`.
fn capabilities_of(layout: Layout) -> Capabilities {
    match layout {
        Layout::Tenure => capabilities(),
        Layout::Etcd => Capabilities {
            shared: false,
            permits: false,
            ..capabilities()
        },
    }
}

/// A hold count with its layout's formatting: etcd's layout pads it to ten
/// digits, so that etcd's byte-wise compare (`< 0000000002`) tells one hold
/// from more, and the join's nonce follows it.
fn aux_value(holds: u32, nonce: &str) -> Vec<u8> {
    format!("{holds:010}\t{nonce}").into_bytes()
}

fn parse_aux(raw: &[u8]) -> Result<(u32, String)> {
    let text = std::str::from_utf8(raw).map_err(|_| bad("a hold count"))?;
    let (n, nonce) = text.split_once('\t').unwrap_or((text, ""));
    let n = n.parse::<u32>().map_err(|_| bad("a hold count"))?;
    Ok((n, nonce.to_string()))
}

/// A store in one etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    layout: Layout,
    url: String,
    caps: Capabilities,
    keepers: tokio::sync::Mutex<HashMap<i64, Arc<tokio::sync::Mutex<Keeper>>>>,
    wakeups: AtomicU64,
    looks: AtomicU64,
    calls: AtomicU64,
}

struct Keeper {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

store_debug!(EtcdStore: url, prefix);

fn etcd_err(e: rpc::Error) -> Error {
    use tonic::Code;
    match e {
        rpc::Error::Status(status) => {
            let message = status.message().to_string();
            let auth = message.contains("authentication failed")
                || message.contains("invalid auth token")
                || message.contains("user name is empty");
            match status.code() {
                _ if auth => Error::Auth {
                    backend: BACKEND,
                    reason: message,
                },
                Code::Unauthenticated | Code::PermissionDenied => Error::Auth {
                    backend: BACKEND,
                    reason: message,
                },
                // Connection failures come as Unavailable or Unknown.
                Code::Unavailable
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Cancelled => Error::unavailable(BACKEND, message),
                _ => Error::backend(BACKEND, message),
            }
        }
        rpc::Error::Transport(e) => Error::unavailable(BACKEND, e),
        rpc::Error::Stream(e) if e.contains("not found") => lost(),
        rpc::Error::Stream(e) => Error::unavailable(BACKEND, e),
    }
}

/// Whether a call failed because the lease it names does not exist.
fn lease_not_found(e: &rpc::Error) -> bool {
    matches!(e, rpc::Error::Status(s) if s.code() == tonic::Code::NotFound)
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::backend(BACKEND, format!("unexpected answer from etcd: {what}"))
}

/// Bounds a unary call.
async fn call<T>(
    fut: impl std::future::Future<Output = std::result::Result<T, rpc::Error>>,
) -> Result<T> {
    tokio::time::timeout(CALL_TIMEOUT, fut)
        .await
        .map_err(|_| Error::unavailable(BACKEND, format!("no answer within {CALL_TIMEOUT:?}")))?
        .map_err(etcd_err)
}

use super::poll::{retrying, RETRY_FOR};

/// What an `etcd://` URL asks for.
struct Parsed {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    prefix: String,
    layout: Layout,
    /// `etcds://`: TLS, trusting the system's roots or this CA file. Read
    /// only with the `tls` feature (without it, `etcds://` is refused).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Option<Option<String>>,
}

fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    let tls = url.scheme() == "etcds";
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (etcds://) without the cargo feature `tls`",
        });
    }
    if !url.path().trim_end_matches('/').is_empty() {
        return Err(url.invalid("etcd:// takes no path; use ?prefix=NAME"));
    }
    let scheme = if tls { "https" } else { "http" };
    let endpoints = url
        .servers("endpoint")?
        .iter()
        .map(|(h, p)| format!("{scheme}://{h}:{p}"))
        .collect();
    let user = url
        .user()
        .map(|u| (u.to_string(), url.password().unwrap_or("").to_string()));
    let prefix = match url.option("prefix") {
        None => "tenure",
        Some(p) if !p.is_empty() && !p.contains('\0') => p,
        Some(p) => return Err(url.invalid(format!("prefix={p:?} must be non-empty"))),
    };
    let layout = match url.option("layout") {
        None | Some("tenure") => Layout::Tenure,
        Some("etcd") => Layout::Etcd,
        Some(other) => {
            return Err(url.invalid(format!(
                "layout={other:?}: the layouts are `tenure` (the default) and `etcd`"
            )))
        }
    };
    let ca = match url.option("tls_ca") {
        Some(path) if !tls || path.is_empty() => {
            return Err(url.invalid("tls_ca=PATH goes with etcds:// only"))
        }
        other => other.map(str::to_string),
    };
    Ok(Parsed {
        endpoints,
        user,
        prefix: prefix.to_string(),
        layout,
        tls: tls.then_some(ca),
    })
}

/// A session key: 16 hex digits of the lease, then the secret.
fn split_key(key: &SessionKey) -> Result<(i64, &str)> {
    let s = key.secret();
    let lease = s
        .get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|l| l as i64)
        .ok_or(Error::SessionLost(crate::error::LostReason::Expired))?;
    Ok((lease, &s[16..]))
}

/// An entry's value: `KIND\tCOUNT\tLIMIT\tNONCE\n` then the user's value.
/// The nonce names the join that put it, so a join tried again after a lost
/// answer knows its own entry.
fn encode(kind: EntryKind, nonce: &str, value: &[u8]) -> Vec<u8> {
    let (_, count, limit) = codec::kind_code(kind);
    let letter = codec::kind_letter(kind);
    let mut out = format!("{letter}\t{count}\t{limit}\t{nonce}\n").into_bytes();
    out.extend_from_slice(value);
    out
}

fn decode(raw: &[u8]) -> Result<(EntryKind, String, Vec<u8>)> {
    let nl = raw
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("an entry without a header"))?;
    let head = std::str::from_utf8(&raw[..nl]).map_err(bad)?;
    let mut f = head.split('\t');
    let (k, c, l, nonce) = (f.next(), f.next(), f.next(), f.next());
    let num = |v: Option<&str>| -> Result<i64> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("an entry header"))
    };
    let kind = codec::kind_from_letter(BACKEND, k.unwrap_or_default(), num(c)?, num(l)?)?;
    Ok((
        kind,
        nonce.unwrap_or_default().to_string(),
        raw[nl + 1..].to_vec(),
    ))
}

/// The header field an exclusive entry gains when its holder is granted
/// after waiting. Its deletion then tells the waiter just behind it, from
/// the watch event alone, that nothing is left ahead: nothing was ahead of
/// a granted exclusive entry, and entries only join at the back. So a
/// handoff costs no read of the queue, which etcd answers in `O(n)` (it
/// sorts a range by create revision by reading every key of it). Older
/// readers ignore the field.
const GRANTED_MARK: &str = "g";

/// Whether `raw` is an exclusive entry marked [`GRANTED_MARK`].
fn marked_granted(raw: &[u8]) -> bool {
    let head = match raw.iter().position(|b| *b == b'\n') {
        Some(nl) => &raw[..nl],
        None => return false,
    };
    let mut fields = head.split(|b| *b == b'\t');
    fields.next() == Some(codec::kind_letter(EntryKind::Exclusive).as_bytes())
        && fields.nth(3) == Some(GRANTED_MARK.as_bytes())
}

/// `raw` with [`GRANTED_MARK`] added, if it has a header and no mark yet.
fn with_granted_mark(raw: &[u8]) -> Option<Vec<u8>> {
    let nl = raw.iter().position(|b| *b == b'\n')?;
    if raw[..nl].iter().filter(|b| **b == b'\t').count() != 3 {
        return None;
    }
    let mut out = raw[..nl].to_vec();
    out.push(b'\t');
    out.extend_from_slice(GRANTED_MARK.as_bytes());
    out.extend_from_slice(&raw[nl..]);
    Some(out)
}

/// One entry of a queue as read from etcd.
#[derive(Debug, Clone)]
struct Row {
    key: Vec<u8>,
    seq: u64,
    mod_rev: i64,
    lease: i64,
    kind: EntryKind,
    nonce: String,
    value: Vec<u8>,
    holds: u32,
    /// Marked [`GRANTED_MARK`] (tenure's layout only).
    marked: bool,
}

/// A name's queue as read at one revision.
struct Read {
    rows: Vec<Row>,
    granted: Vec<bool>,
    revision: i64,
    /// Hold-count keys: lease -> (holds, mod revision).
    holds: HashMap<i64, (u32, i64)>,
}

impl Read {
    fn position(&self, lease: i64) -> Option<usize> {
        self.rows.iter().position(|r| r.lease == lease)
    }
}

fn revision_of(resp: &TxnResponse) -> i64 {
    resp.header().map(|h| h.revision()).unwrap_or(0)
}

/// The keys a read in a transaction found, borrowed; a nested transaction
/// of reads (etcd's layout reads a name as two ranges) answers all of them,
/// in order (then copied, once).
fn get_kvs<'a>(op: Option<&TxnOpResponse<'a>>) -> Result<std::borrow::Cow<'a, [KeyValue]>> {
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

impl EtcdStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let parsed = parse_url(&url)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3));
        if let Some((name, password)) = &parsed.user {
            options = options.with_user(name.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(ca) = &parsed.tls {
            let mut config = rpc::TlsOptions::new();
            match ca {
                Some(path) => {
                    let pem = std::fs::read(path)
                        .map_err(|e| url.invalid(format!("tls_ca={path}: {e}")))?;
                    config = config.ca_certificate(rpc::Certificate::from_pem(pem));
                }
                None => config = config.with_native_roots(),
            }
            options = options.with_tls(config);
        }
        let client = tokio::time::timeout(
            CONNECT_TIMEOUT + Duration::from_secs(1),
            Client::connect(parsed.endpoints.clone(), Some(options)),
        )
        .await
        .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
        .map_err(|e| match etcd_err(e) {
            // Connecting authenticates: a refusal there is about the user.
            Error::Backend { source, .. } if parsed.user.is_some() => Error::Auth {
                backend: BACKEND,
                reason: source.to_string(),
            },
            other => other,
        })?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                prefix: parsed.prefix,
                layout: parsed.layout,
                url: url.masked().to_string(),
                caps: capabilities_of(parsed.layout),
                keepers: tokio::sync::Mutex::new(HashMap::new()),
                wakeups: AtomicU64::new(0),
                looks: AtomicU64::new(0),
                calls: AtomicU64::new(0),
            }),
        };
        // Fail now, not at the first lock, if the cluster does not answer.
        let mut client = store.client();
        call(client.get(store.key("meta"), None)).await?;
        Ok(store)
    }

    /// Opens a store from an `etcd://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    /// How many times waiters of this store were woken to look at their
    /// queue again (for the no-thundering-herd test).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// How many times a waiter has read its queue to learn its turn (a read
    /// etcd answers in `O(n)`). A waiter behind an entry that left marked
    /// granted reads nothing: in a run of handoffs only the first reads.
    pub fn queue_looks(&self) -> u64 {
        self.inner.looks.load(Ordering::Relaxed)
    }

    /// The client for one call (counted by [`Self::calls`]).
    fn client(&self) -> Client {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.client.clone()
    }

    /// How many calls this store has started: transactions, reads, watches
    /// opened, lease grants and revocations. Renewals, sent on each lease's
    /// keep-alive stream, are not counted.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// One transaction, bounded by [`CALL_TIMEOUT`].
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let mut client = self.client();
        call(client.txn(txn)).await
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}/{rest}", self.inner.prefix).into_bytes()
    }

    fn secret_key(&self, lease: i64) -> Vec<u8> {
        self.key(&format!("sk/{lease:016x}"))
    }

    fn info_key(&self, lease: i64) -> Vec<u8> {
        self.key(&format!("si/{lease:016x}"))
    }

    /// Every key of a name (its entries and, in tenure's layout, hold
    /// counts) starts with this.
    fn name_prefix(&self, name: &Name) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => {
                let mut k = self.key(&format!("n/{name}"));
                k.push(0);
                k
            }
            Layout::Etcd => format!("{name}/").into_bytes(),
        }
    }

    /// tenure's layout: the lease of the newest exclusive entry, on that
    /// lease, deleted with that entry. So while it exists an entry does,
    /// and an exclusive try-lock is refused by one key's read (a range's
    /// costs etcd `O(n)`: it counts every key of a range, even with a limit).
    fn busy_key(&self, name: &Name) -> Vec<u8> {
        let mut k = self.name_prefix(name);
        k.push(b'b');
        k
    }

    fn queue_prefix(&self, name: &Name) -> Vec<u8> {
        let mut k = self.name_prefix(name);
        if self.inner.layout == Layout::Tenure {
            k.push(b'q');
        }
        k
    }

    fn entry_key(&self, name: &Name, lease: i64) -> Vec<u8> {
        let mut k = self.queue_prefix(name);
        match self.inner.layout {
            Layout::Tenure => k.extend_from_slice(format!("{lease:016x}").as_bytes()),
            // As etcd's recipe names it (Go's `%x` of the lease).
            Layout::Etcd => k.extend_from_slice(format!("{lease:x}").as_bytes()),
        }
        k
    }

    fn holds_key(&self, name: &Name, lease: i64) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => {
                let mut k = self.name_prefix(name);
                k.extend_from_slice(format!("h{lease:016x}").as_bytes());
                k
            }
            Layout::Etcd => {
                let mut k = self.aux_prefix(name);
                k.extend_from_slice(format!("{lease:016x}").as_bytes());
                k
            }
        }
    }

    /// etcd's layout: a name whose keys would mix with tenure's own (the
    /// prefix's) is refused: its queue would read sessions' secrets.
    fn check_recipe_name(&self, name: &Name) -> Result<()> {
        if self.inner.layout != Layout::Etcd {
            return Ok(());
        }
        let (n, p) = (format!("{name}/"), format!("{}/", self.inner.prefix));
        if n.starts_with(&p) || p.starts_with(&n) {
            return Err(Error::InvalidName {
                name: name.to_string(),
                reason: "with ?layout=etcd a name must not overlap the store's own ?prefix= (default `tenure`)",
            });
        }
        Ok(())
    }

    /// etcd's layout: where a name's hold counts and nonces live.
    fn aux_prefix(&self, name: &Name) -> Vec<u8> {
        let mut k = self.key(&format!("h/{name}"));
        k.push(0);
        k
    }

    /// A hold count as this layout writes it.
    fn holds_value(&self, holds: u32, nonce: &str) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => holds.to_string().into_bytes(),
            Layout::Etcd => aux_value(holds, nonce),
        }
    }

    /// An entry's value as this layout writes it.
    fn encode_entry(&self, kind: EntryKind, nonce: &str, value: &[u8]) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => encode(kind, nonce, value),
            Layout::Etcd => value.to_vec(),
        }
    }

    /// An entry's kind, nonce and value (etcd's layout: always exclusive;
    /// the nonce is in the hold-count key).
    fn decode_entry(&self, raw: &[u8]) -> Result<(EntryKind, String, Vec<u8>)> {
        match self.inner.layout {
            Layout::Tenure => decode(raw),
            Layout::Etcd => Ok((EntryKind::Exclusive, String::new(), raw.to_vec())),
        }
    }

    fn seen_key(&self, name: &Name) -> Vec<u8> {
        self.key(&format!("c/{name}"))
    }

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

    fn read_op(&self, name: &Name) -> TxnOp {
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
    fn latest_op(&self, name: &Name, limit: i64, before: Option<i64>) -> TxnOp {
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
    fn head_op(&self, name: &Name) -> TxnOp {
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
    fn any_op(&self, name: &Name) -> TxnOp {
        TxnOp::get(
            self.queue_prefix(name),
            Some(GetOptions::new().with_prefix().with_limit(1)),
        )
    }

    /// The queue from a read of [`Self::name_prefix`].
    fn parse_read(&self, name: &Name, kvs: &[KeyValue], revision: i64) -> Result<Read> {
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
            if let Ok(name) = Name::new(text) {
                names.push(name);
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Reads the session's secret and the name's queue in one transaction;
    /// a session whose secret is gone is lost.
    async fn read(&self, lease: i64, name: &Name) -> Result<Read> {
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

    fn secret_matches(&self, lease: i64, secret: &str) -> Compare {
        Compare::value(self.secret_key(lease), CompareOp::Equal, secret)
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

    /// The key whose deletion may grant the entry at `i`, and whether it is
    /// a prefix (a semaphore waiter watches its whole queue).
    fn blocker(&self, name: &Name, read: &Read, i: usize) -> (Vec<u8>, bool) {
        let kinds: Vec<EntryKind> = read.rows.iter().map(|r| r.kind).collect();
        match super::poll::blocker(&kinds, i) {
            Some(j) => (read.rows[j].key.clone(), false),
            None => (self.queue_prefix(name), true),
        }
    }
}

/// What a waiter learned from one look at its entry.
struct Look {
    /// `None` if granted; else the key to watch (a prefix if so said) and
    /// the revision to watch from.
    wait: Option<(Vec<u8>, bool, i64)>,
    /// An exclusive entry of tenure's layout: its stored value and mod
    /// revision, to mark it granted with ([`GRANTED_MARK`]).
    exclusive: Option<(Vec<u8>, i64)>,
}

impl EtcdStore {
    /// One look at the session's entry (`own`, created at `rev`). An
    /// exclusive entry reads only itself and the entry just ahead; the
    /// others read their queue.
    async fn look(&self, lease: i64, name: &Name, own: &[u8], rev: i64) -> Result<Look> {
        self.inner.looks.fetch_add(1, Ordering::Relaxed);
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.secret_key(lease), None),
            TxnOp::get(own.to_vec(), None),
            self.latest_op(name, 1, Some(rev)),
        ]);
        let resp = retrying(|| self.txn(txn.clone())).await?;
        let ops = resp.op_responses();
        if get_kvs(ops.first())?.is_empty() {
            return Err(lost());
        }
        let (mine, stored) = match get_kvs(ops.get(1))?.first() {
            Some(kv) if kv.create_revision() == rev => (
                self.decode_entry(kv.value())?.0,
                (kv.value().to_vec(), kv.mod_revision()),
            ),
            _ => return Err(Error::NotHeld("the entry is no longer in the queue")),
        };
        if mine == EntryKind::Exclusive {
            return Ok(Look {
                wait: get_kvs(ops.get(2))?
                    .first()
                    .map(|ahead| (ahead.key().to_vec(), false, revision_of(&resp) + 1)),
                exclusive: (self.inner.layout == Layout::Tenure).then_some(stored),
            });
        }
        let read = self.read(lease, name).await?;
        let i = match read.position(lease) {
            Some(i) if read.rows[i].seq as i64 == rev => i,
            _ => return Err(Error::NotHeld("the entry is no longer in the queue")),
        };
        let wait = (!read.granted[i]).then(|| {
            let (blocker, prefix) = self.blocker(name, &read, i);
            (blocker, prefix, read.revision + 1)
        });
        Ok(Look {
            wait,
            exclusive: None,
        })
    }

    /// Marks the session's exclusive entry `own` granted
    /// ([`GRANTED_MARK`]), if the session and the entry are as last seen
    /// (`stored`: its value and mod revision). True if written.
    async fn mark_granted(
        &self,
        lease: i64,
        secret: &str,
        own: &[u8],
        stored: &(Vec<u8>, i64),
    ) -> Result<bool> {
        let Some(marked) = with_granted_mark(&stored.0) else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when(vec![
                self.secret_matches(lease, secret),
                Compare::mod_revision(own.to_vec(), CompareOp::Equal, stored.1),
            ])
            .and_then(vec![TxnOp::put(
                own.to_vec(),
                marked,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        Ok(call(self.client().txn(txn)).await?.succeeded())
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

fn lost() -> Error {
    Error::SessionLost(crate::error::LostReason::Expired)
}

fn lease_of(hex: &[u8]) -> Result<i64> {
    std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|l| l as i64)
        .ok_or_else(|| bad("a lease id in a key"))
}

/// A version for a queue: a hash of what can change in it.
fn fingerprint(read: &Read) -> u64 {
    super::poll::fingerprint(
        read.rows
            .iter()
            .flat_map(|r| [r.seq, r.mod_rev as u64, u64::from(r.holds)]),
    )
}

/// What a register's kind key says its name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Register {
    /// A fence, with the highest token it has admitted.
    Fence(u64),
    /// A cell.
    Cell,
}

/// A cell's kind key.
const CELL_MARK: &[u8] = b"c";

/// The first byte of a fence's kind key.
const FENCE_MARK: u8 = b'f';

/// Digits of a fence's token in its kind key: every `u64`.
const TOKEN_DIGITS: usize = 20;

/// A fence's kind key with its highest token: `f` and the token as 20
/// zero-padded digits, so that etcd, which compares values as bytes, orders
/// them as numbers.
fn fence_mark(token: u64) -> Vec<u8> {
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
fn fence_ceiling(token: u64) -> Vec<u8> {
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
fn register_kind_of(mark: &[u8]) -> Result<Register> {
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
fn revision_arg(version: u64) -> i64 {
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

#[async_trait]
impl Store for EtcdStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        // The lease id is part of the key; the secret follows it.
        let OpenedSession { key, tag } = OpenedSession::random()?;
        let secret = key.secret().to_string();
        let ttl = i64::try_from(spec.ttl.as_millis().div_ceil(1000).max(1)).map_err(|_| {
            Error::InvalidArgument {
                what: "ttl",
                reason: "too long for etcd".into(),
            }
        })?;
        let mut client = self.client();
        let lease = retrying(|| async {
            let mut client = self.client();
            call(client.lease_grant(ttl, None)).await
        })
        .await?
        .id();
        let label = super::poll::printable(&spec.label);
        let on_lease = || Some(PutOptions::new().with_lease(lease));
        let txn = Txn::new().and_then(vec![
            TxnOp::put(self.secret_key(lease), secret.clone(), on_lease()),
            TxnOp::put(
                self.info_key(lease),
                format!("{tag}\t{}\t{label}", spec.ttl.as_millis()),
                on_lease(),
            ),
        ]);
        if let Err(e) = retrying(|| self.txn(txn.clone())).await {
            let _ = call(client.lease_revoke(lease)).await;
            return Err(e);
        }
        Ok(OpenedSession {
            key: SessionKey::new(format!("{:016x}{secret}", lease as u64)),
            tag,
        })
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let (lease, _) = split_key(session)?;
        let known = self.inner.keepers.lock().await.get(&lease).cloned();
        let keeper = match known {
            Some(k) => k,
            None => {
                // Made outside the map's lock: making it may take a while
                // (a leader election), and other sessions renew meanwhile.
                let (keeper, stream) = call(self.client().lease_keep_alive(lease)).await?;
                let k = Arc::new(tokio::sync::Mutex::new(Keeper { keeper, stream }));
                self.inner
                    .keepers
                    .lock()
                    .await
                    .entry(lease)
                    .or_insert(k)
                    .clone()
            }
        };
        let mut k = keeper.lock().await;
        let answer = async {
            k.keeper.keep_alive().await?;
            k.stream.message().await
        };
        let answer = tokio::time::timeout(CALL_TIMEOUT, answer).await;
        drop(k);
        match answer {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => Ok(()),
            Ok(Ok(Some(_))) => {
                self.inner.keepers.lock().await.remove(&lease);
                Err(lost())
            }
            other => {
                // A broken stream is made anew at the next renewal.
                self.inner.keepers.lock().await.remove(&lease);
                Err(match other {
                    Ok(Err(e)) => etcd_err(e),
                    _ => Error::unavailable(BACKEND, "the keep-alive stream ended"),
                })
            }
        }
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let (lease, _) = split_key(session)?;
        self.inner.keepers.lock().await.remove(&lease);
        let mut client = self.client();
        match tokio::time::timeout(CALL_TIMEOUT, client.lease_revoke(lease)).await {
            Ok(Ok(_)) => Ok(()),
            // Already gone.
            Ok(Err(e)) if lease_not_found(&e) => Ok(()),
            Ok(Err(e)) => Err(etcd_err(e)),
            Err(_) => Err(Error::unavailable(BACKEND, "no answer to the revoke")),
        }
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
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

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
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

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let (lease, secret) = split_key(session)?;
        let own = self.entry_key(name, lease);
        let rev = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        // Set when the entry just ahead left marked granted: this entry is
        // then the head, which marking it (one conditional write that also
        // checks the session and the entry) confirms without a read.
        let mut told_granted: Option<(Vec<u8>, i64)> = None;
        loop {
            if let Some(stored) = told_granted.take() {
                match self.mark_granted(lease, secret, &own, &stored).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(error = %e, "marking failed; looking again"),
                }
            }
            // The session's own deadline ends a wait that cannot reach etcd.
            let look = match self.look(lease, name, &own, rev).await {
                Err(e) if e.is_temporary() => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                other => other?,
            };
            let (blocker, prefix, from) = match look.wait {
                None => {
                    // Granted: mark it, so the next in line needs no read.
                    // Only speed depends on it, so a failure is not an error.
                    if let Some(stored) = &look.exclusive {
                        if let Err(e) = self.mark_granted(lease, secret, &own, stored).await {
                            tracing::debug!(error = %e, "marking a grant failed");
                        }
                    }
                    return Ok(());
                }
                Some(wait) => wait,
            };
            let options = |start: Option<i64>| {
                let mut options = WatchOptions::new();
                if let Some(start) = start {
                    options = options.with_start_revision(start);
                }
                if prefix {
                    options = options.with_prefix();
                } else if look.exclusive.is_some() {
                    options = options.with_prev_kv();
                }
                options
            };
            let mut client = self.client();
            let mut stream = match client
                .watch(blocker.clone(), Some(options(Some(from))))
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "watch failed; looking again shortly");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // The watch from the look's revision misses nothing, but when
            // etcd has moved past that revision it is an "unsynced" watcher,
            // which etcd catches up only every 100 ms: on a busy name every
            // handoff waited up to that long. A twin from now on is served
            // at once; the first covers what came between.
            let _ = stream.watch(blocker.clone(), Some(options(None))).await;
            // The waiter's own entry too: its deletion (lease expired,
            // evicted) must end the wait.
            let _ = stream
                .watch(
                    own.clone(),
                    Some(WatchOptions::new().with_start_revision(from)),
                )
                .await;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            break;
                        }
                        let deleted = |ev: &&rpc::Event| {
                            ev.event_type() == EventType::Delete
                                && ev.kv().is_some_and(|kv| {
                                    kv.key() == own.as_slice()
                                        || (prefix && kv.key().starts_with(&blocker))
                                        || kv.key() == blocker.as_slice()
                                })
                        };
                        if let Some(ev) = resp.events().iter().find(deleted) {
                            let ahead_granted = !prefix
                                && ev.kv().is_some_and(|kv| kv.key() == blocker.as_slice())
                                && ev.prev_kv().is_some_and(|p| marked_granted(p.value()));
                            if ahead_granted {
                                told_granted = look.exclusive.clone();
                            }
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "watch ended; looking again");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        break;
                    }
                }
            }
            self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
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

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.queue_at(name).await.map(|(q, _)| q)
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        loop {
            let (queue, revision) = self.queue_at(name).await?;
            if queue.version != version {
                return Ok(queue.version);
            }
            let mut client = self.client();
            let (mut first_pass, mut first_aux) = (true, true);
            let options = WatchOptions::new()
                .with_start_revision(revision + 1)
                .with_prefix();
            match client.watch(self.name_prefix(name), Some(options)).await {
                Ok(mut stream) => loop {
                    if first_pass {
                        first_pass = false;
                        // A twin from now on, served at once (see
                        // `await_grant`); the first covers what came between.
                        let twin = WatchOptions::new().with_prefix();
                        let _ = stream.watch(self.name_prefix(name), Some(twin)).await;
                    }
                    if self.inner.layout == Layout::Etcd && first_aux {
                        // Hold counts live apart in this layout.
                        first_aux = false;
                        let _ = stream
                            .watch(
                                self.aux_prefix(name),
                                Some(
                                    WatchOptions::new()
                                        .with_start_revision(revision + 1)
                                        .with_prefix(),
                                ),
                            )
                            .await;
                    }
                    match stream.message().await {
                        Ok(Some(resp)) if resp.events().is_empty() && !resp.canceled() => {}
                        Ok(_) => break,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            break;
                        }
                    }
                },
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
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
            names.push(Name::new(name)?);
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.check_recipe_name(name)?;
        let resp = call(
            self.client()
                .txn(Txn::new().and_then(vec![self.read_op(name)])),
        )
        .await?;
        let read = self.parse_read(name, &get_kvs(resp.op_responses().first())?, 0)?;
        let mut leases: Vec<i64> = read
            .rows
            .iter()
            .zip(&read.granted)
            .filter(|(_, g)| **g)
            .map(|(r, _)| r.lease)
            // A key on no lease (put by hand) has no session to end.
            .filter(|lease| *lease != 0)
            .collect();
        leases.dedup();
        for lease in &leases {
            let _ = call(self.client().lease_revoke(*lease)).await;
        }
        Ok(leases.len())
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let Some(lease) = self.lease_tagged(tag).await? else {
            return Ok(false);
        };
        // Every key of the session (secret, info, entries, hold counts,
        // bound cells) is on its lease, in both layouts: revoking it ends
        // them all at once, wakes the watchers behind, and the owner's next
        // keep-alive hears TTL 0.
        let mut client = self.client();
        match tokio::time::timeout(CALL_TIMEOUT, client.lease_revoke(lease)).await {
            Ok(Ok(())) => Ok(true),
            // Expired or ended by someone else since it was found.
            Ok(Err(e)) if lease_not_found(&e) => Ok(false),
            Ok(Err(e)) => Err(etcd_err(e)),
            Err(_) => Err(Error::unavailable(BACKEND, "no answer to the revoke")),
        }
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
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

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
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

    async fn cell_put(
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

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
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

impl EtcdStore {
    /// The lease of the live session tagged `tag`, if any. It is found
    /// among this prefix's session info keys (`PREFIX/si/<lease>`, each put
    /// on its session's lease), so a lease of another prefix, or of no
    /// tenure session at all, is never the answer.
    async fn lease_tagged(&self, tag: &str) -> Result<Option<i64>> {
        // Tags are hex; a tab could never be one (it ends the tag in the
        // info value), nor could nothing.
        if tag.is_empty() || tag.contains('\t') {
            return Ok(None);
        }
        let head = self.key("si/");
        let end = rpc::prefix_end(&head);
        let mut from = head.clone();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(SCAN_PAGE);
            let resp = retrying(|| {
                let (mut client, from, options) = (self.client(), from.clone(), options.clone());
                async move { call(client.get(from, Some(options))).await }
            })
            .await?;
            let kvs = resp.kvs();
            for kv in kvs {
                let Some(hex) = kv.key().strip_prefix(head.as_slice()) else {
                    continue;
                };
                // Exactly a lease id: anything longer is the key of another
                // prefix that starts with this one's (`PREFIX/si/x/si/…`).
                if hex.len() != 16 {
                    continue;
                }
                let Ok(lease) = lease_of(hex) else { continue };
                // A key put by hand, on no lease or another one, is no
                // session of ours.
                if lease == 0 || kv.lease() != lease {
                    continue;
                }
                let own = kv.value().split(|b| *b == b'\t').next().unwrap_or_default();
                if own == tag.as_bytes() {
                    return Ok(Some(lease));
                }
            }
            match kvs.last() {
                Some(last) if kvs.len() as i64 >= SCAN_PAGE => {
                    // Just after the last key read.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(None),
            }
        }
    }

    /// The queue and the revision it was read at.
    async fn queue_at(&self, name: &Name) -> Result<(Queue, i64)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Parsed> {
        parse_url(&StoreUrl::parse(url, &URL)?)
    }

    #[test]
    fn urls() {
        let p = parse("etcd://u:p%40ss@a:1,b:2?prefix=x").unwrap();
        assert_eq!(p.endpoints, ["http://a:1", "http://b:2"]);
        assert_eq!(p.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(p.prefix, "x");
        for bad in ["etcd://a", "etcd://a:x", "etcd://a:1?nosuch=1", "etcd://:1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let Err(e) = parse("etcd://u:hunter2@a") else {
            panic!("a URL without a port was taken");
        };
        assert!(!e.to_string().contains("hunter2"));
        assert_eq!(parse("etcds://a:1").is_ok(), cfg!(feature = "tls"));
        assert!(parse("etcd://a:1?tls_ca=/x").is_err());
        assert_eq!(parse("etcd://a:1").unwrap().layout, Layout::Tenure);
        assert_eq!(
            parse("etcd://a:1?layout=etcd").unwrap().layout,
            Layout::Etcd
        );
        assert!(parse("etcd://a:1?layout=zk").is_err());
    }

    #[test]
    fn hold_counts_order_as_numbers_in_etcds_layout() {
        // leave's one-hold compare: value < aux_value(2, "").
        let two = aux_value(2, "");
        assert!(aux_value(1, "nonce") < two);
        for n in [2, 10, 11, 123_456] {
            assert!(aux_value(n, "n") >= two, "{n}");
        }
        assert_eq!(
            parse_aux(&aux_value(12, "ab")).unwrap(),
            (12, "ab".to_string())
        );
        assert!(parse_aux(b"x\ty").is_err());
    }

    #[test]
    fn a_granted_mark_is_read_only_on_exclusive_entries_and_ignored_by_decode() {
        let plain = encode(EntryKind::Exclusive, "n1", b"v\tw\nx");
        assert!(!marked_granted(&plain));
        let marked = with_granted_mark(&plain).expect("a header");
        assert!(marked_granted(&marked));
        assert!(with_granted_mark(&marked).is_none(), "marked once");
        let (kind, nonce, value) = decode(&marked).expect("decodes");
        assert_eq!(
            (kind, nonce.as_str(), value.as_slice()),
            (EntryKind::Exclusive, "n1", &b"v\tw\nx"[..])
        );
        let shared = with_granted_mark(&encode(EntryKind::Shared, "n2", b"")).expect("a header");
        assert!(
            !marked_granted(&shared),
            "only an exclusive entry's mark counts"
        );
        assert!(!marked_granted(b"no header"));
        assert!(with_granted_mark(b"no header").is_none());
    }

    #[test]
    fn entries_round_trip() {
        let kind = EntryKind::Permits { count: 2, limit: 5 };
        let raw = encode(kind, "n1", b"a\nb\tc");
        assert_eq!(
            decode(&raw).unwrap(),
            (kind, "n1".to_string(), b"a\nb\tc".to_vec())
        );
        assert_eq!(rpc::prefix_end(b"ab"), b"ac");
        assert_eq!(rpc::prefix_end(b"a\xff"), b"b");
    }

    /// etcd compares values as bytes: a fence's mark must order tokens as
    /// numbers, and the admit compares (`f` < mark < ceiling) must hold
    /// exactly for a highest at most the token.
    #[test]
    fn fence_marks_order_as_numbers() {
        let tokens = [0, 1, 9, 10, 99, 100, 1 << 40, i64::MAX as u64, u64::MAX];
        for &a in &tokens {
            let mark = fence_mark(a);
            assert_eq!(mark.len(), 1 + TOKEN_DIGITS);
            assert!(mark.as_slice() > [FENCE_MARK].as_slice());
            assert!(CELL_MARK < [FENCE_MARK].as_slice());
            assert_eq!(register_kind_of(&mark).unwrap(), Register::Fence(a));
            for &b in &tokens {
                assert_eq!(mark.cmp(&fence_mark(b)), a.cmp(&b), "{a} vs {b}");
                assert_eq!(mark < fence_ceiling(b), a <= b, "{a} admitted by {b}");
            }
        }
        assert_eq!(register_kind_of(CELL_MARK).unwrap(), Register::Cell);
        for bad in [
            &b"f12"[..],
            b"f0000000000000000000x",
            b"f99999999999999999999",
            b"x",
            b"",
        ] {
            assert!(register_kind_of(bad).is_err(), "{bad:?}");
        }
        assert_eq!(revision_arg(0), i64::MAX);
        assert_eq!(revision_arg(u64::MAX), i64::MAX);
        assert_eq!(revision_arg(7), 7);
    }
}
