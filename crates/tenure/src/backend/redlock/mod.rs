#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `redlock://[:password@]host:port,host:port,host:port[/db][?prefix=NAME&node_timeout=250ms]`
//! (`redlocks://` for TLS, with `tls_ca=PATH` as for `rediss://`):
//! Redlock over N independent Redis nodes (N odd, 3 to 15), with fencing
//! tokens and a fair queue.
//!
//! Every node runs the Redis backend's own script on its own copy of the
//! queues. An entry's seq is *proposed* by the client and is the same on
//! every node; a node takes it only if it is above every seq that node has
//! seen for the name, else it answers with that highest seq and the client
//! proposes again. So every node's queue is in seq order, and:
//!
//! - an entry counts as queued once a majority of nodes took it (else it is
//!   removed everywhere and proposed again), and as granted once a majority
//!   granted it. Two exclusive grants would need a node where both are
//!   first: impossible. Grants follow seq order, so the queue is FIFO.
//! - the seq is the fencing token. A later holder's majority overlaps an
//!   earlier holder's in at least one node, which saw the earlier seq
//!   before it took the later one: tokens strictly increase per name while
//!   a majority keeps its data. A node that lost its data (restarted empty)
//!   seeds its floor from its own `TIME` in microseconds, as the Redis
//!   backend does.
//! - the session lives on every node with the same secret. A renewal holds
//!   only when a majority confirms it *and* every entry of the session is
//!   still confirmed on a majority; a node that says the session is gone is
//!   never used for it again. The session's local deadline (send time of
//!   the last confirmed renewal + TTL − drift, drift = 1 % + 2 ms) is
//!   Redlock's validity time: `lost()` fires at it.
//! - a node that restarts empty must stay down for at least the longest TTL
//!   in use (Redlock's delayed restart), or a lock it forgot could be
//!   granted twice.
//!
//! Round trips: one per node, in parallel, for acquire (two when a node has
//! seen a seq above this client's clock, as after a clock step), release and
//! renewal.

mod connect;
mod fence;
mod join;
mod merge;
mod quorum;
mod sessions;
mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::url::UrlRules;
use crate::store::{Capabilities, SessionKey, Wake};
use connect::Node;
use sessions::SessionState;

const BACKEND: &str = "redlock";
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

/// The version of what this build keeps on each node: the Redis store's.
pub(crate) const FORMAT: &str = super::redis::FORMAT;

/// Each node is a Redis server: the same greeting.
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> =
    Some(&crate::backend::probe::Greeting {
        tls_schemes: &["redlocks"],
        ..super::redis::PING
    });

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["prefix", "node_timeout", "tls_ca", "max_ttl"]);

/// The Redlock backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(20),
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        // Per-node admission cannot bound a count of three or more entries
        // (they need not share a node): no semaphores above one permit.
        permits: false,
        // A claim undone after a split vote uses up a node's "never used"
        // mark: a per-tick schedule may skip a tick (never run one twice).
        exact_first: false,
        // A value, or a compare-and-set, that every client reads alike needs
        // the nodes to agree on one order of writes: consensus, which
        // independent nodes do not have. A fence's admission is a maximum,
        // which a majority keeps without it.
        fence_values: false,
        cells: false,
        wake: Wake::pub_sub(POLL_MAX),
        min_ttl: Duration::from_millis(300),
        // `max_ttl=` (each node, found empty, grants nothing for this long).
        max_ttl: crate::backend::redis::DEFAULT_MAX_TTL,
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock, on each node (a majority must agree); the nodes' TIME only hints",
            "acquire: 1 per node in parallel (2 after a clock step), release: 1 per node, renew: 1 per node",
        )
    }
}

/// A set of nodes, one bit each.
type Mask = u16;

fn count(mask: Mask) -> usize {
    mask.count_ones() as usize
}

fn bit(i: usize) -> Mask {
    1 << i
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A store over N independent Redis nodes.
pub struct RedlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Node>>,
    majority: usize,
    all: Mask,
    node_timeout: Duration,
    url: String,
    caps: Capabilities,
    sessions: std::sync::Mutex<HashMap<SessionKey, SessionState>>,
    /// The last seq this store proposed, and how far ahead of this client's
    /// clock the nodes' seqs were seen to be.
    last_placed: AtomicU64,
    /// Added to this client's clock when it proposes: learned from the
    /// nodes' floors (up) and ceilings (down).
    offset: std::sync::atomic::AtomicI64,
    /// A test's shift of this client's clock.
    clock_ahead_us: std::sync::atomic::AtomicI64,
}

store_debug!(RedlockStore: url, majority);
