//! `zk://[user:password@]host:port[,host:port…][/path]`: ZooKeeper, the
//! recipe of Curator's `InterProcessMutex` over the tenure contract.
//! `zks://…?tls_ca=PATH` connects to the servers' secure client port over
//! TLS (the `tls` feature), trusting that CA and checking the host name.
//!
//! - A tenure session is a ZooKeeper session of its own (one client
//!   connection), with the TTL as its session timeout; a server that
//!   negotiates a shorter timeout is refused, since the holder would learn of
//!   an expiry too late. The client library pings by itself; a renewal is a
//!   round trip that also checks that the session's node and every entry
//!   of the session still exist, so an evicted holder learns of it at its
//!   next renewal. The session's node, `PATH/s/TAG`, is an ephemeral node
//!   its own client makes when it opens (one round trip more), and the
//!   session as other stores can see it.
//! - `evict` cannot end another client's session either: it deletes the
//!   holders' entries, then the markers of the values bound to them (see
//!   below), so those read as gone when it returns. A session of the same
//!   store is also forgotten at once (its later calls fail with
//!   `SessionLost`) and its other entries deleted. Another store's session
//!   (the usual case: `tenure release --force` runs in a process of its
//!   own) has its markers found by listing the children of every fence and
//!   cell node (1 round trip for `PATH/r`, then 1 multi-read per 256
//!   names) and deleted by path; its next bound write then fails with
//!   `SessionLost`, since a bound write checks, in its `multi`, that the
//!   session's node and every entry of its session still exist. The
//!   sessions' nodes go too.
//! - `evict_session` deletes the session's node (a tag whose node is not
//!   there is no live session: `false`), then, for another store's session,
//!   its entries, found by listing the children of every queue (1 round
//!   trip for `PATH/q`, then 1 multi-read per 256 names), then the rest as
//!   `evict` does. Its owner's next renewal finds the node gone.
//! - A name's queue is the ephemeral-sequential children of one persistent
//!   node per name, `PATH/q/NAME`. A child's name carries the session's tag
//!   and the entry's kind, so one listing says who is granted
//!   ([`crate::queue::grants`]); its data holds the hold count, label and
//!   value. The fencing token is the child's `czxid`: ZooKeeper's
//!   transaction id never goes back, even if a parent node were recreated
//!   (which resets the sequence counter).
//! - A waiter watches only the child whose deletion can grant it (the one
//!   just ahead for a mutex, the last writer ahead for a reader; a
//!   semaphore waiter watches the list of children), and reports an expired
//!   session instead of waiting on.
//! - Disconnected is not lost: the library reconnects within the session.
//!   But a renewal that cannot be confirmed leaves the local deadline where
//!   it was, so `lost()` fires once the session may have expired; a session
//!   that expired is never replaced silently by a new one.
//! - Fences and cells share one namespace, apart from the queues': one
//!   persistent node per name, `PATH/r/NAME`, made by the name's first write
//!   and never deleted, whose data says what it is (`F\tHIGHEST\tHAS\n` or
//!   `C\tOWNER\tHAS\n`, then the value). A first write is a `create`, which
//!   fails if the name is already the other kind's: the kind check is atomic.
//!   ZooKeeper cannot compare data, so a fence admits a token with a
//!   `setData` conditional on the data version it read, and reads again on
//!   `BadVersion`. A cell's version is its node's `mzxid`, the id of the
//!   transaction that last set its data: every write and delete is a
//!   `setData` (a delete writes a tombstone), so each gets a new one, and
//!   since transaction ids only grow, ensemble-wide, a version is never
//!   reused, even if the node is deleted and made again (by hand, or from a
//!   backup), which restarts its data version at 0. Changes to the node's
//!   children (the markers) leave it. The data version is only what the
//!   conditional writes name; a node whose data version reached 2^31 - 1 is
//!   not written again (a typed `Error::Backend`), since the server's next
//!   would wrap to negative numbers, where -1 means any version. A value
//!   bound to a session names the session's tag in the data, and the
//!   session's own client creates an ephemeral child `PATH/r/NAME/TAG` in
//!   the same `multi`: the value is live while that marker exists (one read
//!   of the data and the children tells). A cell write is one `multi`: for
//!   a bound write, a check of each of its session's entries; the
//!   conditional `setData` (on a first write, a `create` then a `setData`,
//!   whose answer carries the new mzxid where a `create`'s in a `multi` may
//!   not); the deletion of the markers of earlier owners (which fails if
//!   the current owner's has vanished) or a check of the writer's own; and
//!   the new marker. The version a write returns is its `setData`'s mzxid,
//!   the one a read then sees. Closing a session deletes its markers at
//!   once.
//! - Round trips: a fence read or a cell get is 1 (a `sync` pipelined with a
//!   multi-read). Writes are optimistic: the store remembers the last node
//!   it saw per name (bounded), so an admit, put or delete is 1 round trip
//!   (the conditional write) when nobody else wrote since this store last
//!   saw the node, such as a put right after a get or a holder writing
//!   through its fence again (for a cell: the remembered node's mzxid is
//!   the expected version, and the write is conditional on its remembered
//!   data version); 2 when it remembers nothing (a read, then the write); 3
//!   when what it remembers is stale (the refused write, a read, the
//!   write); more only under contention (at most 64 tries, then
//!   `Unavailable`). A refused token or a version mismatch is answered from
//!   a fresh read only: 1, or 2 when the remembered node was stale. The
//!   first fence or cell ever written under `PATH` also makes `PATH/r`.
//! - Linearizable reads: a follower of a multi-server ensemble may lag the
//!   leader, so every register read sends a `sync` just ahead of it on the
//!   same connection (the server then answers the read only after catching
//!   up with the leader; pipelined, it adds no round trip). Writes are
//!   conditional on the data version, which the leader checks, so a stale
//!   read or remembered node can only make a write fail and be read again.
//!   (`sync` is not itself a quorum operation: during a leader change a read
//!   may still lag, ZOOKEEPER-2136.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use zookeeper_client as zk;

use super::codec;
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    kind_conflict, Capabilities, CellWrite, Entry, EntryKind, Expect, FenceOp, FenceState,
    JoinMode, JoinRequest, Joined, Name, OpenedSession, Queue, SessionKey, SessionSpec, Store,
    Versioned,
};

const BACKEND: &str = "zookeeper";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the store looks for sessions nobody renews any more.
const REAP_EVERY: Duration = Duration::from_millis(50);
/// How often an observer looks again for value changes it has no watch on.
const OBSERVE_POLL: Duration = Duration::from_millis(200);

/// How many conditional writes a fence or cell operation tries before it
/// gives up (each failed try means the node changed since it was read).
const REGISTER_TRIES: usize = 64;
/// The most register nodes, and bytes of their values, a store remembers
/// for its optimistic writes; past either, it forgets them all.
const SEEN_NODES: usize = 4096;
const SEEN_BYTES: usize = 4 << 20;
/// How many register nodes one multi-read lists the children of when
/// `evict` looks for another store's session's markers.
const SCAN_BATCH: usize = 256;

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["max_sessions", "tls_ca"]);

/// How many sessions a store opens at most unless its URL says otherwise
/// (`max_sessions=N`, 0 for no limit). Each session is a ZooKeeper
/// connection, and a server takes at most `maxClientCnxns` (60 by default)
/// from one address; this leaves room for the store's own connection and a
/// few others from the same host.
const DEFAULT_MAX_SESSIONS: usize = 50;

/// The ZooKeeper backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // The server's minSessionTimeout (2 × tickTime) may be higher.
        min_ttl: Duration::from_millis(400),
        max_ttl: Duration::from_secs(24 * 3600),
        grant_times: false,
        ..Capabilities::durable_store(
            BACKEND,
            "the ZooKeeper server's session clock",
            "acquire: 1 (a create and the list, pipelined: the list is sent right behind the create; 2 on a name's first use); a try-lock reads the name's node first: 1 when the queue would not grant it, 2 when it would (a non-fair lock's tries do not read first), release: 1 (delete), renew: 1 (a multi-read of the session's entries); fence read, cell get: 1 (a sync pipelined with a multi-read); fence admit, cell put, cell delete: 1 (a conditional setData or multi) when nobody wrote since this store last saw the node, 2 when it saw none (read + write), 3 when what it saw is stale; a refusal or a mismatch 1 or 2",
        )
    }
}

/// A session being connected, counted until dropped.
struct OpeningSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for OpeningSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A store in one ZooKeeper ensemble.
#[derive(Clone)]
pub struct ZkStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Connect string (no chroot: paths below are absolute).
    hosts: String,
    auth: Option<Vec<u8>>,
    /// `zks://`: how to connect over TLS.
    tls: Option<Tls>,
    base: String,
    url: String,
    caps: Capabilities,
    /// For reads that belong to no session (queue, names, observers).
    admin: zk::Client,
    sessions: std::sync::Mutex<HashMap<SessionKey, Arc<ZkSession>>>,
    /// Sessions being opened (connecting), counted against `max_sessions`.
    opening: std::sync::atomic::AtomicUsize,
    /// The most sessions open at once; 0: no limit.
    max_sessions: usize,
    wakeups: AtomicU64,
    /// Listings of a queue made by waiters (see [`ZkStore::waiter_listings`]).
    waiter_listings: AtomicU64,
    /// The fence and cell nodes last seen, for optimistic writes.
    seen: std::sync::Mutex<Seen>,
}

/// A tenure session: its own ZooKeeper client, and where its entries are.
struct ZkSession {
    client: zk::Client,
    tag: String,
    label: String,
    ttl: Duration,
    /// When the session ends unless renewed: the client library pings the
    /// server by itself, so the store ends a session nobody renews, as a
    /// lease would end (see [`ZkStore::reap`]).
    deadline: std::sync::Mutex<tokio::time::Instant>,
    entries: tokio::sync::Mutex<HashMap<Name, Mine>>,
    /// The cells this session has bound a value to: where its markers may be.
    cells: std::sync::Mutex<HashSet<Name>>,
}

/// One entry of this session.
#[derive(Debug, Clone)]
struct Mine {
    child: String,
    seq: u64,
    kind: EntryKind,
    holds: u32,
    value: Vec<u8>,
    /// The child whose deletion may grant this entry, as the join's
    /// listing named it, for the entry's first wait (which then need not
    /// list the queue again); `None` once taken, or to list first.
    blocker: Option<String>,
}

store_debug!(ZkStore: url, base);

fn zk_err(e: zk::Error) -> Error {
    match e {
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved => lost(),
        zk::Error::AuthFailed | zk::Error::NoAuth => Error::Auth {
            backend: BACKEND,
            reason: e.to_string(),
        },
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::Throttled
        | zk::Error::Custom(_) => Error::unavailable(BACKEND, e.to_string()),
        other => Error::backend(BACKEND, other.to_string()),
    }
}

fn lost() -> Error {
    Error::SessionLost(crate::error::LostReason::Expired)
}

type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Bounds a call; the outer error is the timeout, the inner ZooKeeper's.
async fn call_raw<T>(fut: impl std::future::Future<Output = ZkResult<T>>) -> Result<ZkResult<T>> {
    tokio::time::timeout(CALL_TIMEOUT, fut)
        .await
        .map_err(|_| Error::unavailable(BACKEND, format!("no answer within {CALL_TIMEOUT:?}")))
}

async fn call<T>(fut: impl std::future::Future<Output = ZkResult<T>>) -> Result<T> {
    call_raw(fut).await?.map_err(zk_err)
}

use super::poll::{retrying, RETRY_FOR};

/// The queue, the class its node holds and whether the session's node is
/// there, from the answer of [`ZkStore::session_checking_reader`]'s
/// multi-read.
fn listed_checking_session(results: Vec<zk::MultiReadResult>) -> Result<(Listing, Vec<u8>)> {
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

/// A name as one path segment: bytes outside `[A-Za-z0-9_-]` as `%XX`.
fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_name(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A child's name before the sequence: `TAG_KIND_`, where KIND is `X`,
/// `S` or `P<count>of<limit>`.
fn child_prefix(tag: &str, kind: EntryKind) -> String {
    let letter = codec::kind_letter(kind);
    match kind {
        EntryKind::Permits { count, limit } => format!("{tag}_{letter}{count}of{limit}_"),
        _ => format!("{tag}_{letter}_"),
    }
}

/// One child as its name tells: (tag, kind, sequence).
fn parse_child(child: &str) -> Option<(&str, EntryKind, i64)> {
    let mut f = child.splitn(3, '_');
    let (tag, kind, seq) = (f.next()?, f.next()?, f.next()?);
    let (letter, permits) = kind.split_at(kind.len().min(1));
    let (count, limit) = match permits.split_once("of") {
        Some((count, limit)) => (count.parse().ok()?, limit.parse().ok()?),
        None if permits.is_empty() => (0, 0),
        None => return None,
    };
    let kind = codec::kind_from_letter(BACKEND, letter, count, limit).ok()?;
    Some((tag, kind, seq.parse().ok()?))
}

/// The class of a name, kept as its node's data: entries of one class may
/// share a name (a lock's exclusive and shared entries; a semaphore's of
/// one limit), entries of two may not (see [`crate::queue::check_compatible`]).
fn class_of(kind: EntryKind) -> Vec<u8> {
    match kind {
        EntryKind::Exclusive | EntryKind::Shared => b"L".to_vec(),
        EntryKind::Permits { limit, .. } => format!("P{limit}").into_bytes(),
    }
}

/// An entry's data: `HOLDS\tLABEL\n` then the value.
fn encode_data(holds: u32, label: &str, value: &[u8]) -> Vec<u8> {
    let mut out = format!("{holds}\t{label}\n").into_bytes();
    out.extend_from_slice(value);
    out
}

fn decode_data(raw: &[u8]) -> (u32, String, Vec<u8>) {
    let nl = raw.iter().position(|b| *b == b'\n').unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..nl]);
    let (holds, label) = head.split_once('\t').unwrap_or((&head, ""));
    (
        holds.parse().unwrap_or(1),
        label.to_string(),
        raw.get(nl + 1..).map(<[u8]>::to_vec).unwrap_or_default(),
    )
}

/// What a fence's or cell's node holds (its data).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reg {
    /// A fence: the highest token admitted, and the value last written
    /// through it.
    Fence {
        highest: u64,
        value: Option<Vec<u8>>,
    },
    /// A cell: the tag of the session its value is bound to, and the value
    /// (`None`: deleted).
    Cell {
        owner: Option<String>,
        value: Option<Vec<u8>>,
    },
}

/// A fence's or cell's node as read: its data version, the transaction that
/// last set its data, what it holds, and its children (the markers of
/// sessions a value was bound to, by tag).
#[derive(Debug, Clone)]
struct Node {
    /// What a conditional `setData` names; never a cell's version.
    data_version: i32,
    /// The node's `mzxid`: a cell's version (see [`cell_version`]). -1 when
    /// not known (a fence made by a `create` whose answer carried no stat).
    mzxid: i64,
    reg: Reg,
    markers: Vec<String>,
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
    fn fence(self, name: &Name) -> Result<(u64, Option<Vec<u8>>)> {
        match self.reg {
            Reg::Fence { highest, value } => Ok((highest, value)),
            Reg::Cell { .. } => Err(kind_conflict(name, "a cell", "a fence")),
        }
    }

    /// The cell's live value: none when deleted or when the session it is
    /// bound to has gone (its marker with it). A fence is a conflict.
    fn cell(&self, name: &Name) -> Result<Option<(&[u8], u64)>> {
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
    fn cell_version(&self, name: &Name) -> Result<Option<u64>> {
        Ok(self.cell(name)?.map(|(_, version)| version))
    }
}

/// A cell's version for its node's `mzxid`: the id of the transaction that
/// last set the node's data. Transaction ids only grow, ensemble-wide, so a
/// version is never reused, even by a node deleted and made again.
fn cell_version(mzxid: i64) -> Result<u64> {
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
fn next_version(version: i32) -> Result<i32> {
    version.checked_add(1).ok_or_else(|| {
        Error::backend(
            BACKEND,
            "this fence or cell has used up ZooKeeper's 2^31 data versions",
        )
    })
}

/// The stat of the one `setData` of a successful register write.
fn written_stat(path: &str, results: &[zk::MultiWriteResult]) -> Result<zk::Stat> {
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

/// A fence's or cell's data: `KIND\tFIELD\tHAS\n` then the value, where
/// HAS is 1 when there is a value (which may not be empty, so 0 is none).
fn encode_register(kind: char, field: &str, value: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!("{kind}\t{field}\t{}\n", u8::from(value.is_some())).into_bytes();
    out.extend_from_slice(value.unwrap_or_default());
    out
}

fn encode_fence(highest: u64, value: Option<&[u8]>) -> Vec<u8> {
    encode_register('F', &highest.to_string(), value)
}

fn encode_cell(owner: Option<&str>, value: Option<&[u8]>) -> Vec<u8> {
    encode_register('C', owner.unwrap_or(""), value)
}

fn decode_register(raw: &[u8]) -> Option<Reg> {
    let nl = raw.iter().position(|b| *b == b'\n')?;
    let (head, rest) = raw.split_at(nl);
    let body = rest.get(1..)?;
    let mut fields = std::str::from_utf8(head).ok()?.split('\t');
    let (kind, field, has) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let value = match has {
        "1" => Some(body.to_vec()),
        "0" if body.is_empty() => None,
        _ => return None,
    };
    match kind {
        "F" => Some(Reg::Fence {
            highest: field.parse().ok()?,
            value,
        }),
        "C" => Some(Reg::Cell {
            owner: (!field.is_empty()).then(|| field.to_string()),
            value,
        }),
        _ => None,
    }
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
struct Seen {
    nodes: HashMap<Name, Node>,
    bytes: usize,
}

/// A multi's outcome: done, or the index and error of the operation that
/// failed (and then nothing changed).
type Multi = std::result::Result<Vec<zk::MultiWriteResult>, (usize, zk::Error)>;

/// Commits a multi, bounded as [`call`] is.
async fn commit(writer: &mut zk::MultiWriter<'_>) -> Result<Multi> {
    match tokio::time::timeout(CALL_TIMEOUT, writer.commit()).await {
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer within {CALL_TIMEOUT:?}"),
        )),
        Ok(Ok(results)) => Ok(Ok(results)),
        Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => Ok(Err((index, source))),
        Ok(Err(zk::MultiWriteError::RequestFailed { source })) => Err(zk_err(source)),
    }
}

/// A register operation that lost the race for its node too many times.
fn contended(name: &Name) -> Error {
    Error::unavailable(
        BACKEND,
        format!("{name:?} changed under this call {REGISTER_TRIES} times in a row; try again"),
    )
}

/// A name's children in queue order.
struct Listing {
    children: Vec<(String, String, EntryKind)>, // (child, tag, kind)
    granted: Vec<bool>,
}

fn listing(mut names: Vec<String>) -> Listing {
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
fn queue_start(sorted: &[u32]) -> usize {
    let n = sorted.len();
    (0..n)
        .max_by_key(|&i| sorted[(i + 1) % n].wrapping_sub(sorted[i]))
        .map_or(0, |i| (i + 1) % n)
}

impl Listing {
    fn position(&self, child: &str) -> Option<usize> {
        self.children.iter().position(|c| c.0 == child)
    }

    /// The child whose deletion may grant the one at `i` (None: watch the
    /// whole list, for a semaphore).
    fn blocker(&self, i: usize) -> Option<&str> {
        let kinds: Vec<EntryKind> = self.children.iter().map(|c| c.2).collect();
        super::poll::blocker(&kinds, i).map(|j| self.children[j].0.as_str())
    }
}

/// What a `zk://` URL asks for.
struct Parsed {
    hosts: String,
    auth: Option<Vec<u8>>,
    base: String,
    max_sessions: usize,
    /// `zks://`: the CA file to trust.
    tls_ca: Option<String>,
}

fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    url.servers("server")?;
    let tls = url.scheme() == "zks";
    if tls && !cfg!(feature = "tls") {
        return Err(Error::BackendDisabled {
            backend: "zookeeper over TLS (zks://)",
            feature: "tls",
        });
    }
    let tls_ca = match url.option("tls_ca") {
        Some(path) if !tls => {
            return Err(url.invalid(format!("tls_ca={path} goes with zks:// only")))
        }
        Some("") | None if tls => {
            return Err(url.invalid(
                "zks:// needs tls_ca=PATH: the ZooKeeper client trusts only the CA it is given",
            ))
        }
        other => other.map(str::to_string),
    };
    let base = match url.path().trim_end_matches('/') {
        "" => "/tenure".to_string(),
        p if p
            .split('/')
            .skip(1)
            .all(|s| !s.is_empty() && s != "." && s != "..") =>
        {
            p.to_string()
        }
        p => return Err(url.invalid(format!("bad path {p:?}"))),
    };
    // ZooKeeper's digest scheme takes `user:password`, decoded.
    let auth = url.user().map(|user| match url.password() {
        Some(password) => format!("{user}:{password}").into_bytes(),
        None => user.as_bytes().to_vec(),
    });
    let max_sessions = match url.option("max_sessions") {
        None => DEFAULT_MAX_SESSIONS,
        Some(v) => v.parse().map_err(|_| {
            url.invalid(format!(
                "max_sessions must be a whole number (0: no limit), not {v:?}"
            ))
        })?,
    };
    Ok(Parsed {
        hosts: url.authority().to_string(),
        auth,
        base,
        max_sessions,
        tls_ca,
    })
}

/// TLS to the servers' secure client port (`zks://`): the client library's
/// options, and the same trust for [`Tls::diagnose`].
#[derive(Clone)]
struct Tls {
    #[cfg(feature = "tls")]
    options: zk::TlsOptions,
    #[cfg(feature = "tls")]
    probe: Arc<rustls::ClientConfig>,
    #[cfg(feature = "tls")]
    servers: Vec<(String, u16)>,
}

#[cfg(not(feature = "tls"))]
impl Tls {
    fn load(_url: &StoreUrl, _ca: &str) -> Result<Tls> {
        Err(Error::BackendDisabled {
            backend: "zookeeper over TLS (zks://)",
            feature: "tls",
        })
    }

    fn connector(&self, connector: zk::Connector) -> zk::Connector {
        connector
    }

    async fn connect(&self, connector: zk::Connector, hosts: &str) -> ZkResult<zk::Client> {
        connector.connect(hosts).await
    }

    async fn diagnose(&self) -> Option<Error> {
        None
    }
}

#[cfg(feature = "tls")]
impl Tls {
    /// Reads the CA file `ca` (a bad one is a bad URL).
    fn load(url: &StoreUrl, ca: &str) -> Result<Tls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let pem =
            std::fs::read_to_string(ca).map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        let options = zk::TlsOptions::new()
            .with_pem_ca(&pem)
            .map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        // The library builds its rustls configuration with the process's
        // default crypto provider; with more than one compiled in (etcd's
        // TLS brings ring) there is none until someone installs one.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = (*provider).clone().install_default();
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        }
        let probe = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::backend(BACKEND, format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls {
            options,
            probe: Arc::new(probe),
            servers: url.servers("server")?,
        })
    }

    fn connector(&self, connector: zk::Connector) -> zk::Connector {
        connector.with_tls(self.options.clone())
    }

    async fn connect(&self, connector: zk::Connector, hosts: &str) -> ZkResult<zk::Client> {
        connector.secure_connect(hosts).await
    }

    /// Why no server could be reached over TLS, if a server answered but
    /// its certificate is not trusted (the client library reports only
    /// that no host could be reached): a handshake of our own with each
    /// server, with the same trust, each bounded by [`CONNECT_TIMEOUT`].
    async fn diagnose(&self) -> Option<Error> {
        for (host, port) in &self.servers {
            let config = self.probe.clone();
            let (host, port) = (host.clone(), *port);
            let shown = format!("{host}:{port}");
            let handshake = tokio::task::spawn_blocking(move || handshake(config, &host, port));
            if let Ok(Ok(Some(reason))) = tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
                return Some(Error::backend(BACKEND, format!("TLS: {shown}: {reason}")));
            }
        }
        None
    }
}

/// A TLS handshake with `host:port`: the reason the server's certificate
/// is refused, or `None` if it is accepted or the server cannot be reached.
#[cfg(feature = "tls")]
fn handshake(config: Arc<rustls::ClientConfig>, host: &str, port: u16) -> Option<String> {
    use std::net::ToSocketAddrs;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut socket = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).ok()?;
    socket.set_read_timeout(Some(CONNECT_TIMEOUT)).ok()?;
    socket.set_write_timeout(Some(CONNECT_TIMEOUT)).ok()?;
    let mut conn = rustls::ClientConnection::new(config, name).ok()?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut socket) {
            // rustls's own refusals come as InvalidData; the rest is I/O.
            return match e.kind() {
                std::io::ErrorKind::InvalidData => Some(e.to_string()),
                _ => None,
            };
        }
    }
    None
}

impl ZkStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let parsed = parse_url(&url)?;
        let tls = match &parsed.tls_ca {
            Some(ca) => Some(Tls::load(&url, ca)?),
            None => None,
        };
        let admin = connect(
            &parsed.hosts,
            parsed.auth.as_deref(),
            tls.as_ref(),
            Duration::from_secs(10),
        )
        .await?;
        let store = ZkStore {
            inner: Arc::new(Inner {
                hosts: parsed.hosts,
                auth: parsed.auth,
                tls,
                base: parsed.base,
                url: url.masked().to_string(),
                caps: capabilities(),
                admin,
                sessions: std::sync::Mutex::new(HashMap::new()),
                opening: std::sync::atomic::AtomicUsize::new(0),
                max_sessions: parsed.max_sessions,
                wakeups: AtomicU64::new(0),
                waiter_listings: AtomicU64::new(0),
                seen: std::sync::Mutex::new(Seen::default()),
            }),
        };
        let acls = store.acls();
        let options = zk::CreateMode::Persistent.with_acls(acls);
        call(
            store
                .inner
                .admin
                .mkdir(&format!("{}/q", store.inner.base), &options),
        )
        .await?;
        let weak = Arc::downgrade(&store.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REAP_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                ZkStore { inner }.reap().await;
            }
        });
        Ok(store)
    }

    /// Ends the sessions whose renewals stopped (a detached session, or one
    /// whose owner stopped renewing) at their deadline.
    async fn reap(&self) {
        let now = tokio::time::Instant::now();
        let expired: Vec<SessionKey> = {
            let sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            sessions
                .iter()
                .filter(|(_, s)| *s.deadline.lock().unwrap_or_else(|e| e.into_inner()) <= now)
                .map(|(k, _)| k.clone())
                .collect()
        };
        for key in expired {
            let _ = self.close_session(&key).await;
        }
    }

    /// Opens a store from a `zk://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    /// How many times waiters of this store were woken to look at their
    /// queue again (for the no-thundering-herd test).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// How many times waiters of this store listed their queue's children
    /// (a waiter's first wait needs none: tested).
    pub fn waiter_listings(&self) -> u64 {
        self.inner.waiter_listings.load(Ordering::Relaxed)
    }

    fn acls(&self) -> zk::Acls<'static> {
        // With digest credentials, nodes belong to that user.
        if self.inner.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    fn name_path(&self, name: &Name) -> String {
        format!("{}/q/{}", self.inner.base, encode_name(name.as_str()))
    }

    fn session(&self, key: &SessionKey) -> Result<Arc<ZkSession>> {
        let sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sessions.get(key).cloned().ok_or_else(lost)
    }

    /// Counts a session about to connect against `max_sessions`, or refuses
    /// it with a typed error that says what to change. The slot is a
    /// connect in progress until dropped (by then the session is in
    /// `sessions`, or failed).
    fn reserve_session(&self) -> Result<OpeningSlot<'_>> {
        let sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let opening = &self.inner.opening;
        let open = sessions.len() + opening.load(Ordering::Acquire);
        let max = self.inner.max_sessions;
        if max != 0 && open >= max {
            return Err(Error::InvalidArgument {
                what: "number of ZooKeeper sessions",
                reason: format!(
                    "this store already has {open} sessions open (max_sessions={max}); each is a \
                     ZooKeeper connection, and the server refuses more than its maxClientCnxns \
                     (60 by default) from one address: raise maxClientCnxns (0: no limit) and \
                     give the store URL ?max_sessions=N (0: no limit)"
                ),
            });
        }
        opening.fetch_add(1, Ordering::AcqRel);
        Ok(OpeningSlot(opening))
    }

    fn forget(&self, key: &SessionKey) -> Option<Arc<ZkSession>> {
        let mut sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        sessions.remove(key)
    }

    async fn list(&self, client: &zk::Client, name: &Name) -> Result<Listing> {
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
    /// Also returns the class the name's node holds (see [`class_of`]).
    async fn list_checking_session(
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
    fn session_checking_reader<'c>(
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
    async fn class_and_count(&self, client: &zk::Client, name: &Name) -> Result<(Vec<u8>, i32)> {
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

    /// The node of the fence or cell `name`.
    fn register_path(&self, name: &Name) -> String {
        format!("{}/r/{}", self.inner.base, encode_name(name.as_str()))
    }

    /// The node that says the session `tag` is live: an ephemeral node of
    /// the session's own client, which `evict_session` deletes.
    fn session_path(&self, tag: &str) -> String {
        format!("{}/s/{tag}", self.inner.base)
    }

    /// Makes the node of a new session with the session's own client (and
    /// `PATH/s` on first use). A create tried again after a lost answer may
    /// find the node there: it is this session's if it is its ephemeral.
    async fn create_session_node(&self, client: &zk::Client, tag: &str) -> Result<()> {
        let path = self.session_path(tag);
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(self.acls());
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let failure = match call_raw(client.create(&path, &[], &ephemeral)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(zk::Error::NodeExists)) => {
                    let stat = call(client.check_stat(&path)).await?;
                    if stat.is_some_and(|s| s.ephemeral_owner == client.session_id().0) {
                        return Ok(());
                    }
                    // Another live session's tag (or a node put by hand):
                    // this one could never be told apart from it.
                    return Err(Error::backend(
                        BACKEND,
                        format!("{path} already exists: not a new session's"),
                    ));
                }
                Ok(Err(zk::Error::NoNode)) => {
                    let dir = format!("{}/s", self.inner.base);
                    let parent = zk::CreateMode::Persistent.with_acls(self.acls());
                    match call_raw(client.create(&dir, &[], &parent)).await? {
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes the node of the session `tag` (with the store's client: any
    /// client may delete another session's ephemeral node), and says
    /// whether it was there. Once a delete's answer was lost, a retry that
    /// finds nothing cannot tell whether the lost one deleted it: it counts
    /// as there.
    async fn delete_session_node(&self, tag: &str) -> Result<bool> {
        let path = self.session_path(tag);
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut unsure = false;
        loop {
            let failure = match call_raw(self.inner.admin.delete(&path, None)).await {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(zk::Error::NoNode)) => return Ok(unsure),
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

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.inner.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node as this store last saw it: only a guess, for a conditional
    /// write that fails if it is stale.
    fn last_seen(&self, name: &Name) -> Option<Node> {
        self.seen().nodes.get(name).cloned()
    }

    /// Remembers a node just read, or just written unless a later state of
    /// it is remembered already (calls finish in any order; `mzxid` orders
    /// them, even across a node deleted and made again by hand). A read
    /// replaces whatever was remembered.
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

    fn remember(&self, name: &Name, node: Node, read: bool) {
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

    fn forget_seen(&self, name: &Name) {
        let mut seen = self.seen();
        if let Some(old) = seen.nodes.remove(name) {
            seen.bytes = seen.bytes.saturating_sub(old.size());
        }
    }

    /// Reads the fence's or cell's node (data and markers in one
    /// multi-read), after a `sync` sent just ahead of it on the same
    /// connection, so a follower answers only once it has caught up with the
    /// leader: the read sees every write completed before it began.
    async fn read_register(&self, name: &Name) -> Result<Option<Node>> {
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

    /// Makes `PATH/r`, the parent of every fence and cell, on first use.
    async fn make_register_dir(&self) -> Result<()> {
        let dir = format!("{}/r", self.inner.base);
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match call_raw(self.inner.admin.create(&dir, &[], &options)).await? {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(zk_err(e)),
        }
    }

    /// Ends what is left of the sessions `tags` once `evict` has deleted
    /// their entries: when this returns, the values bound to them read as
    /// gone. A session of this store is forgotten (its later calls fail with
    /// `SessionLost`, and dropping its client ends its ZooKeeper session) and
    /// its other entries and markers are deleted where it knows they are.
    /// Another store's session cannot be reached: its markers are found by
    /// listing the children of every register node (`find_markers`), and
    /// deleted by path (the store's client may delete another session's
    /// ephemeral node). A bound write that session makes afterwards fails,
    /// since its entry check finds the deleted entry gone.
    ///
    /// On an error, markers may remain until the sessions end (a session of
    /// this store as soon as its client is dropped, another store's at its
    /// next renewal).
    async fn end_evicted(&self, tags: &HashSet<String>) -> Result<()> {
        let local: Vec<Arc<ZkSession>> = {
            let mut sessions = self
                .inner
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let keys: Vec<SessionKey> = sessions
                .iter()
                .filter(|(_, s)| tags.contains(&s.tag))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| sessions.remove(k)).collect()
        };
        let mut paths = Vec::new();
        for session in &local {
            // The entries stay in the session's map, so that a bound write
            // under way still checks the evicted one and finds it gone (see
            // `cell_put`). `cells` is read only after `evict` deleted that
            // entry: a write that adds its name later fails its check, one
            // that committed earlier added its name before.
            let entries = session.entries.lock().await;
            paths.extend(
                entries
                    .iter()
                    .map(|(name, mine)| format!("{}/{}", self.name_path(name), mine.child)),
            );
            drop(entries);
            let cells: Vec<Name> = session
                .cells
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain()
                .collect();
            paths.extend(
                cells
                    .iter()
                    .map(|name| format!("{}/{}", self.register_path(name), session.tag)),
            );
        }
        // And the sessions' nodes, so that their owners' next renewals fail
        // even if they hold nothing else.
        paths.extend(tags.iter().map(|tag| self.session_path(tag)));
        let remote: HashSet<&str> = tags
            .iter()
            .map(String::as_str)
            .filter(|tag| !local.iter().any(|s| s.tag == *tag))
            .collect();
        if !remote.is_empty() {
            paths.extend(self.find_markers(&remote).await?);
        }
        let admin = &self.inner.admin;
        let deletes = paths.iter().map(|path| {
            retrying(move || async move {
                match call_raw(admin.delete(path, None)).await? {
                    Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                    Err(e) => Err(zk_err(e)),
                }
            })
        });
        let results = futures_util::future::join_all(deletes).await;
        drop(local);
        results.into_iter().collect()
    }

    /// The markers of the sessions `tags` under every fence and cell node:
    /// one listing of `PATH/r`, then one multi-read of children per
    /// [`SCAN_BATCH`] names.
    async fn find_markers(&self, tags: &HashSet<&str>) -> Result<Vec<String>> {
        let dir = format!("{}/r", self.inner.base);
        self.find_children(&dir, |marker| tags.contains(marker))
            .await
    }

    /// The entries of the session `tag` in every queue: one listing of
    /// `PATH/q`, then one multi-read of children per [`SCAN_BATCH`] names.
    async fn find_entries(&self, tag: &str) -> Result<Vec<String>> {
        let dir = format!("{}/q", self.inner.base);
        self.find_children(&dir, |child| {
            parse_child(child).is_some_and(|(owner, _, _)| owner == tag)
        })
        .await
    }

    /// The paths `dir/NODE/CHILD` of the grandchildren of `dir` that `keep`
    /// keeps.
    async fn find_children(&self, dir: &str, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
        let admin = &self.inner.admin;
        let nodes = retrying(|| async {
            match call_raw(admin.list_children(dir)).await? {
                Ok(nodes) => Ok(nodes),
                Err(zk::Error::NoNode) => Ok(Vec::new()),
                Err(e) => Err(zk_err(e)),
            }
        })
        .await?;
        let mut found = Vec::new();
        for batch in nodes.chunks(SCAN_BATCH) {
            let results = retrying(|| async {
                let mut reader = admin.new_multi_reader();
                for node in batch {
                    reader
                        .add_get_children(&format!("{dir}/{node}"))
                        .map_err(zk_err)?;
                }
                call(reader.commit()).await
            })
            .await?;
            if results.len() != batch.len() {
                return Err(Error::backend(
                    BACKEND,
                    format!("an unexpected answer to a read of {dir}'s children"),
                ));
            }
            for (node, result) in batch.iter().zip(results) {
                match result {
                    zk::MultiReadResult::Children { children } => found.extend(
                        children
                            .into_iter()
                            .filter(|child| keep(child))
                            .map(|child| format!("{dir}/{node}/{child}")),
                    ),
                    // Deleted meanwhile: it has no children.
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => {}
                    zk::MultiReadResult::Error { err } => return Err(zk_err(err)),
                    _ => {
                        return Err(Error::backend(
                            BACKEND,
                            format!("an unexpected answer to a read of {dir}/{node}"),
                        ))
                    }
                }
            }
        }
        Ok(found)
    }

    /// Admits `token` through the fence `name` (see [`Store::fence`]).
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
}

async fn connect(
    hosts: &str,
    auth: Option<&[u8]>,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(timeout)
        .with_connection_timeout(CONNECT_TIMEOUT.min(timeout));
    if let Some(auth) = auth {
        connector = connector.with_auth("digest", auth);
    }
    let connector = connector.with_fail_eagerly();
    let connected = match tls {
        None => {
            tokio::time::timeout(
                CONNECT_TIMEOUT + Duration::from_secs(1),
                connector.connect(hosts),
            )
            .await
        }
        Some(tls) => {
            tokio::time::timeout(
                CONNECT_TIMEOUT + Duration::from_secs(1),
                tls.connect(tls.connector(connector), hosts),
            )
            .await
        }
    };
    let e = match connected {
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(e)) => zk_err(e),
        Err(_) => Error::unavailable(BACKEND, "connect timed out"),
    };
    // Over TLS, an untrusted certificate is not worth retrying: say so.
    if let (true, Some(tls)) = (e.is_temporary(), tls) {
        if let Some(refused) = tls.diagnose().await {
            return Err(refused);
        }
    }
    Err(e)
}

/// A version for a queue: a hash of its children's ids and data versions.
fn fingerprint(data: &[Option<(Vec<u8>, zk::Stat)>]) -> u64 {
    super::poll::fingerprint(
        data.iter()
            .flatten()
            .flat_map(|(_, stat)| [stat.czxid as u64, stat.mzxid as u64]),
    )
}

#[async_trait]
impl Store for ZkStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let _slot = self.reserve_session()?;
        let client = connect(
            &self.inner.hosts,
            self.inner.auth.as_deref(),
            self.inner.tls.as_ref(),
            spec.ttl,
        )
        .await?;
        let negotiated = client.session_timeout();
        if negotiated < spec.ttl {
            return Err(Error::InvalidArgument {
                what: "session TTL",
                reason: format!(
                    "the ZooKeeper server allows at most {negotiated:?} (its maxSessionTimeout), less than the TTL {:?}",
                    spec.ttl
                ),
            });
        }
        let OpenedSession { key, tag } = OpenedSession::random()?;
        // Until this node goes, the session is live: `evict_session` finds
        // a session by it, and deletes it to tell its renewals.
        self.create_session_node(&client, &tag).await?;
        let label = super::poll::printable(&spec.label);
        let session = Arc::new(ZkSession {
            client,
            tag: tag.clone(),
            label,
            ttl: spec.ttl,
            deadline: std::sync::Mutex::new(tokio::time::Instant::now() + spec.ttl),
            entries: tokio::sync::Mutex::new(HashMap::new()),
            cells: std::sync::Mutex::new(HashSet::new()),
        });
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), session);
        Ok(OpenedSession { key, tag })
    }

    async fn keep_alive(&self, key: &SessionKey) -> Result<()> {
        let session = self.session(key)?;
        let expired = *session.deadline.lock().unwrap_or_else(|e| e.into_inner())
            <= tokio::time::Instant::now();
        if expired || session.client.state().is_terminated() {
            // Never revive a session past its deadline.
            let _ = self.close_session(key).await;
            return Err(lost());
        }
        let entries: Vec<(Name, Mine)> = session
            .entries
            .lock()
            .await
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect();
        let sent = tokio::time::Instant::now();
        // One round trip that proves the session alive now and finds out
        // whether an entry was removed (evicted) behind its back.
        let mut reader = session.client.new_multi_reader();
        reader
            .add_get_data(&self.session_path(&session.tag))
            .map_err(zk_err)?;
        for (name, mine) in &entries {
            reader
                .add_get_data(&format!("{}/{}", self.name_path(name), mine.child))
                .map_err(zk_err)?;
        }
        let results = call(reader.commit()).await.inspect_err(|e| {
            if matches!(e, Error::SessionLost(_)) {
                self.forget(key);
            }
        })?;
        match results.first() {
            Some(zk::MultiReadResult::Data { .. }) => {}
            // The session's node is gone: `evict_session` ended it, perhaps
            // from another store.
            Some(zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            }) => {
                self.forget(key);
                return Err(lost());
            }
            Some(zk::MultiReadResult::Error { err }) => return Err(zk_err(err.clone())),
            _ => return Err(Error::backend(BACKEND, "an unexpected answer to a renewal")),
        }
        let missing: Vec<&(Name, Mine)> = results
            .iter()
            .skip(1)
            .zip(&entries)
            .filter(|(r, _)| !matches!(r, zk::MultiReadResult::Data { .. }))
            .map(|(_, e)| e)
            .collect();
        // An entry released while this renewal was under way is not gone
        // behind the session's back: only one it still has counts.
        let gone = if missing.is_empty() {
            false
        } else {
            let now = session.entries.lock().await;
            missing
                .iter()
                .any(|(name, mine)| now.get(name).is_some_and(|m| m.child == mine.child))
        };
        if gone {
            // Never go on with a session that lost an entry.
            self.forget(key);
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        let mut deadline = session.deadline.lock().unwrap_or_else(|e| e.into_inner());
        *deadline = (*deadline).max(sent + session.ttl);
        Ok(())
    }

    async fn close_session(&self, key: &SessionKey) -> Result<()> {
        let Some(session) = self.forget(key) else {
            return Ok(());
        };
        // Remove the entries now rather than when the server gets to the
        // session's end, so the next holder need not wait for it.
        let entries: Vec<(Name, Mine)> = session.entries.lock().await.drain().collect();
        let deletes = entries.iter().map(|(name, mine)| {
            let path = format!("{}/{}", self.name_path(name), mine.child);
            let client = session.client.clone();
            async move { call(client.delete(&path, None)).await }
        });
        // And its cells' markers, so that the values bound to it are gone
        // when this returns (the server would drop them only once it ends
        // the connection's session).
        let cells: Vec<Name> = session
            .cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let markers = cells.iter().map(|name| {
            let path = format!("{}/{}", self.register_path(name), session.tag);
            let client = session.client.clone();
            async move {
                match call_raw(client.delete(&path, None)).await {
                    Ok(Ok(()) | Err(zk::Error::NoNode)) => Ok(()),
                    Ok(Err(e)) => Err(zk_err(e)),
                    Err(e) => Err(e),
                }
            }
        });
        // And its node, so that `evict_session` no longer finds it.
        let node = async {
            let path = self.session_path(&session.tag);
            let _ = call(session.client.delete(&path, None)).await;
        };
        futures_util::future::join3(
            futures_util::future::join_all(deletes),
            futures_util::future::join_all(markers),
            node,
        )
        .await;
        drop(session);
        Ok(())
    }

    async fn join(&self, key: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let session = self.session(key)?;
        let mut entries = session.entries.lock().await;
        let dir = self.name_path(name);
        if let Some(mine) = entries.get(name).cloned() {
            // Reentrant: one more hold of the same entry.
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
            return Ok(Some(Joined {
                seq: mine.seq,
                granted: list.granted[i],
                holds,
                first: false,
            }));
        }
        let class = class_of(kind);
        if mode == JoinMode::IfGranted && !request.likely_free {
            // A try reads first (a read is served from the server's memory;
            // a create and its delete go through the quorum): on a queue that
            // would not grant it, that read is the whole answer. An exclusive
            // try on a queue of its own class is refused on the node's child
            // count alone, whatever the queue's length; any other try lists
            // the queue (a class the node holds may be a moment stale while
            // a join of another class is being refused or recorded: only a
            // refusal is ever answered from it).
            let (held_class, count) = self.class_and_count(&session.client, name).await?;
            if count > 0 && kind == EntryKind::Exclusive && held_class == class {
                return Ok(None);
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
                    return Ok(None);
                }
            }
        }
        let prefix = child_prefix(&session.tag, kind);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let data = encode_data(1, &session.label, value);
        // The create and the list that finds the new child in the queue go
        // out back to back on the session's connection: ZooKeeper answers a
        // client's requests in order, so the list is read after the child
        // is made, and the two take one round trip. Anything but two clean
        // answers (the name's first use, a lost answer) takes the careful
        // path: `create_entry`, then a list of its own.
        // (Each request is sent when its future is made, in this order.)
        let mut reader = self.session_checking_reader(&session, name)?;
        let child_path = format!("{dir}/{prefix}");
        let created = session.client.create(&child_path, &data, &options);
        let listed = reader.commit();
        let (created, listed) =
            futures_util::future::join(call_raw(created), call_raw(listed)).await;
        let (stat, child, sequence, listed) = match created {
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
                    .create_entry(&session, name, &prefix, &data, &options, &class, unsure)
                    .await?;
                (stat, child, sequence, None)
            }
        };
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
            let written = retrying(|| async {
                let mut writer = session.client.new_multi_writer();
                writer.add_check_version(&path, -1).map_err(zk_err)?;
                writer.add_set_data(&dir, &class, None).map_err(zk_err)?;
                match commit(&mut writer).await? {
                    Ok(_) => Ok(()),
                    Err((0, zk::Error::NoNode)) => Err(lost()),
                    Err((_, e)) => Err(zk_err(e)),
                }
            })
            .await;
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

    async fn leave(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
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

    async fn await_grant(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let session = self.session(key)?;
        let (child, mut joined_behind) = {
            let mut entries = session.entries.lock().await;
            match entries.get_mut(name) {
                Some(m) if m.seq == seq => (m.child.clone(), m.blocker.take()),
                _ => return Err(Error::NotHeld("this session holds no such entry")),
            }
        };
        let dir = self.name_path(name);
        let (client, dir_ref) = (&session.client, &dir);
        let watch_node = |blocker: String| async move {
            call(client.check_and_watch_stat(&format!("{dir_ref}/{blocker}")))
                .await
                .map(|(stat, watcher)| stat.map(|_| watcher))
        };
        loop {
            // Closed or ended by the store (no renewals) while waiting.
            self.session(key)?;
            let watched = match joined_behind.take() {
                // The first turn watches the blocker the join's listing
                // named, without listing again: the watch is set against
                // its node as it is now (gone already: list, as after any
                // wake-up), and nothing is ever queued ahead of an entry
                // later.
                Some(blocker) => watch_node(blocker).await,
                None => {
                    self.inner.waiter_listings.fetch_add(1, Ordering::Relaxed);
                    let list = self.list(&session.client, name).await?;
                    let Some(i) = list.position(&child) else {
                        return Err(Error::NotHeld("the entry is no longer in the queue"));
                    };
                    if list.granted[i] {
                        return Ok(());
                    }
                    match list.blocker(i) {
                        Some(blocker) => watch_node(blocker.to_string()).await,
                        // Set against the children as they are now: if they
                        // changed since the listing, look again instead of
                        // waiting.
                        None => call(session.client.list_and_watch_children(&dir))
                            .await
                            .map(|(children, watcher)| {
                                let now = listing(children);
                                let same = now.children.len() == list.children.len()
                                    && now
                                        .children
                                        .iter()
                                        .zip(&list.children)
                                        .all(|(a, b)| a.0 == b.0);
                                same.then_some(watcher)
                            }),
                    }
                }
            };
            let event = match watched {
                Ok(Some(watcher)) => watcher.changed().await,
                // The blocker went (or the list changed) between the
                // listing and the watch.
                Ok(None) => continue,
                // The session's own deadline ends a wait that cannot reach
                // the ensemble.
                Err(e) if e.is_temporary() => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                return Err(lost());
            }
            self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
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

    async fn queue(&self, name: &Name) -> Result<Queue> {
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

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let dir = self.name_path(name);
        loop {
            // Children changes are pushed; value changes (a proclaim) are
            // seen by looking again every OBSERVE_POLL.
            let watch = call(self.inner.admin.list_and_watch_children(&dir)).await;
            let now = self.queue(name).await?.version;
            if now != version {
                return Ok(now);
            }
            match watch {
                Ok((_, watcher)) => {
                    let _ = tokio::time::timeout(OBSERVE_POLL, watcher.changed()).await;
                }
                Err(_) => tokio::time::sleep(OBSERVE_POLL).await,
            }
        }
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
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
            let Ok(name) = Name::new(&name) else { continue };
            if !self.list(admin, &name).await?.children.is_empty() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        // ZooKeeper cannot end another client's session: the holders'
        // entries are deleted, then the values bound to their sessions (see
        // `end_evicted`). Each holder learns it at its next renewal, or at
        // its next bound cell write, which checks its entries.
        let admin = &self.inner.admin;
        let list = self.list(admin, name).await?;
        let dir = self.name_path(name);
        let deletes = list
            .children
            .iter()
            .zip(&list.granted)
            .filter(|(_, granted)| **granted)
            .map(|((child, tag, _), _)| {
                let path = format!("{dir}/{child}");
                async move { call(admin.delete(&path, None)).await.ok().map(|()| tag) }
            });
        let tags: HashSet<String> = futures_util::future::join_all(deletes)
            .await
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        if !tags.is_empty() {
            self.end_evicted(&tags).await?;
        }
        Ok(tags.len())
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        // Tags are hex: anything else names no session (and must not be
        // put into a path or a child's name).
        if tag.is_empty() || !tag.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Ok(false);
        }
        // The session's node is the session as others can see it: deleting
        // it is the eviction (one of two racing finds it), and the owner's
        // next renewal or bound write fails for it.
        if !self.delete_session_node(tag).await? {
            return Ok(false);
        }
        let local = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|s| s.tag == tag);
        if !local {
            // Another store's session: its entries (held and waiting) are
            // deleted now, so the waiters behind are woken at once rather
            // than when its owner finds out. `end_evicted` knows a local
            // session's entries itself.
            let paths = self.find_entries(tag).await?;
            let admin = &self.inner.admin;
            let deletes = paths.iter().map(|path| {
                retrying(move || async move {
                    match call_raw(admin.delete(path, None)).await? {
                        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                        Err(e) => Err(zk_err(e)),
                    }
                })
            });
            let results: Vec<Result<()>> = futures_util::future::join_all(deletes).await;
            results.into_iter().collect::<Result<()>>()?;
        }
        self.end_evicted(&HashSet::from([tag.to_string()])).await?;
        Ok(true)
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
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

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let Some(node) = self.read_register(name).await? else {
            return Ok(None);
        };
        Ok(node.cell(name)?.map(|(value, version)| Versioned {
            value: value.to_vec(),
            version,
        }))
    }

    async fn cell_put(
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
            // A bound write first checks that its session's node is still
            // there and that it still has every entry it knows of (version
            // -1: any): one that vanished was evicted, perhaps by another
            // store, which could not end the session itself (see `evict`).
            if let Some((_, session)) = &session {
                writer
                    .add_check_version(&self.session_path(&session.tag), -1)
                    .map_err(zk_err)?;
            }
            // The index of the first entry's check.
            let checked = usize::from(session.is_some());
            let entries: Vec<(Name, String)> = match &session {
                Some((_, session)) => session
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
            // The index of the node's own first operation.
            let first = checked + entries.len();
            let mut marked = false;
            match &node {
                None => {
                    // Made with a tombstone and set at once, in the same
                    // transaction: a `setData`'s answer carries the new
                    // mzxid, a `create`'s in a multi may not (ZOOKEEPER-4026).
                    writer
                        .add_create(&path, &encode_cell(None, None), &persistent)
                        .map_err(zk_err)?;
                    writer.add_set_data(&path, &data, Some(0)).map_err(zk_err)?;
                }
                Some(node) => {
                    next_version(node.data_version)?;
                    writer
                        .add_set_data(&path, &data, Some(node.data_version))
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
                    .add_create(&format!("{path}/{tag}"), &[], &ephemeral)
                    .map_err(zk_err)?;
            }
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

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Parsed> {
        parse_url(&StoreUrl::parse(url, &URL)?)
    }

    /// A name's sequence counter wraps (signed 32 bits, never reset): the
    /// queue keeps the order of creation across 2^31 and 2^32, and only
    /// its first entry is granted.
    #[test]
    fn queue_order_survives_the_sequence_counters_wraps() {
        let prefix = child_prefix("abc", EntryKind::Exclusive);
        for created in [
            ["2147483646", "2147483647", "-2147483648", "-2147483647"],
            ["-000000002", "-000000001", "0000000000", "0000000001"],
            ["0000000005", "0000000006", "0000000007", "0000000008"],
        ] {
            let mut shuffled: Vec<String> =
                created.iter().map(|s| format!("{prefix}{s}")).collect();
            shuffled.swap(0, 3);
            shuffled.swap(1, 2);
            let list = listing(shuffled);
            let order: Vec<&str> = list.children.iter().map(|c| &c.0[prefix.len()..]).collect();
            assert_eq!(order, created);
            assert_eq!(list.granted, [true, false, false, false]);
        }
        assert_eq!(queue_start(&[]), 0);
        assert_eq!(queue_start(&[7]), 0);
    }

    #[test]
    fn names_and_children() {
        for name in ["a", "x'); DROP --", "a/b", ".", "..", "é ü"] {
            let e = encode_name(name);
            assert!(!e.contains('/') && e != "." && e != "..", "{e}");
            assert_eq!(decode_name(&e).as_deref(), Some(name));
        }
        let kind = EntryKind::Permits { count: 2, limit: 5 };
        let child = format!("{}{}", child_prefix("abc", kind), "0000000007");
        assert_eq!(parse_child(&child), Some(("abc", kind, 7)));
        let (h, l, v) = decode_data(&encode_data(3, "host 1", b"v\nw"));
        assert_eq!((h, l.as_str(), v.as_slice()), (3, "host 1", &b"v\nw"[..]));
    }

    #[test]
    fn registers() {
        let value = b"v\n\tw".to_vec();
        let fence = Reg::Fence {
            highest: (i64::MAX - 1) as u64,
            value: Some(value.clone()),
        };
        let data = encode_fence((i64::MAX - 1) as u64, Some(&value));
        assert_eq!(decode_register(&data), Some(fence));
        let none = Reg::Fence {
            highest: 0,
            value: None,
        };
        assert_eq!(decode_register(&encode_fence(0, None)), Some(none));
        let bound = Reg::Cell {
            owner: Some("abc".into()),
            value: Some(b"x".to_vec()),
        };
        let data = encode_cell(Some("abc"), Some(b"x"));
        assert_eq!(decode_register(&data), Some(bound));
        let tombstone = Reg::Cell {
            owner: None,
            value: None,
        };
        assert_eq!(decode_register(&encode_cell(None, None)), Some(tombstone));
        // Malformed data is none of them (the caller's typed error), never a panic.
        for bad in [
            &b""[..],
            b"\n",
            b"F\t1\t1",
            b"F\tx\t0\n",
            b"F\t-1\t0\n",
            b"F\t1\t0\nv",
            b"F\t1\t2\n",
            b"F\t1\t0\t\n",
            b"X\t1\t0\n",
            b"C\t\n",
            b"\xff\t1\t0\n",
        ] {
            assert_eq!(decode_register(bad), None, "{bad:?}");
        }
        assert_eq!(cell_version(7).ok(), Some(7));
        assert!(cell_version(0).is_err());
        assert!(cell_version(-1).is_err());
        assert!(next_version(i32::MAX).is_err());
    }

    #[test]
    fn urls() {
        let p = parse("zk://u:p@a:1,b:2/app/locks").unwrap();
        assert_eq!(p.hosts, "a:1,b:2");
        assert_eq!(p.base, "/app/locks");
        assert_eq!(p.auth.as_deref(), Some(&b"u:p"[..]));
        assert_eq!(parse("zk://a:1").unwrap().base, "/tenure");
        for bad in ["zk://a", "zk://a:1/x/../y", "zk://a:1?x=1", "zk://a:1//x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // TLS: zks:// with its CA; the CA only with zks://.
        let p = parse("zks://a:1/app?tls_ca=/ca.pem");
        match cfg!(feature = "tls") {
            true => assert_eq!(p.unwrap().tls_ca.as_deref(), Some("/ca.pem")),
            false => assert!(matches!(
                p,
                Err(Error::BackendDisabled { feature: "tls", .. })
            )),
        }
        assert!(matches!(
            parse("zk://a:1?tls_ca=/ca.pem"),
            Err(Error::InvalidUrl { .. })
        ));
        if cfg!(feature = "tls") {
            assert!(matches!(parse("zks://a:1"), Err(Error::InvalidUrl { .. })));
        }
    }
}
