#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
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

mod call;
mod connect;
mod evict;
mod join;
mod layout;
mod nodes;
mod queue;
mod registers;
mod session;
mod store;
#[cfg(test)]
mod tests;
mod wait;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::url::UrlRules;
use crate::store::{Capabilities, SessionKey};

use connect::Tls;
use nodes::Seen;
use session::ZkSession;

const BACKEND: &str = "zookeeper";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The version of this build's node layout (its *format*): 2, format 1
/// (which builds of 0.1.0 read and write; ZooKeeper keeps no marker of it)
/// with the build that opened each session and its label as the data of the
/// session's node, which format 1 leaves empty and never reads.
pub(crate) const FORMAT: &str = "2";

/// ZooKeeper answers the four-letter word `srvr` on its client port with
/// its version, or with a refusal when the word is not allowed.
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> =
    Some(&crate::backend::probe::Greeting {
        protocol: "ZooKeeper",
        hello: b"srvr",
        answers: |b| {
            b.starts_with(b"Zookeeper version") || b.starts_with(b"srvr is not executed")
        },
        tls_schemes: &["zks"],
    });

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["max_sessions", "tls_ca"]);

/// The ZooKeeper backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(80),
        // The server's minSessionTimeout (2 × tickTime) may be higher.
        min_ttl: Duration::from_millis(400),
        max_ttl: Duration::from_secs(24 * 3600),
        grant_times: false,
        expiry_times: false,
        ..Capabilities::durable_store(
            BACKEND,
            "the ZooKeeper server's session clock",
            "acquire: 1 (a create and the list, pipelined: the list is sent right behind the create; 2 on a name's first use); a try-lock reads the name's node first: 1 when the queue would not grant it, 2 when it would (a non-fair lock's tries do not read first), release: 1 (delete), renew: 1 (a multi-read of the session's entries); fence read, cell get: 1 (a sync pipelined with a multi-read); fence admit, cell put, cell delete: 1 (a conditional setData or multi) when nobody wrote since this store last saw the node, 2 when it saw none (read + write), 3 when what it saw is stale; a refusal or a mismatch 1 or 2",
        )
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

store_debug!(ZkStore: url, base);
