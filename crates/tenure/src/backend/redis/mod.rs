#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `redis://[:password@]host:port/db[?prefix=NAME]`: one Lua script per
//! operation (`EVALSHA`), so every operation is atomic and one round trip.
//!
//! All keys share the hash tag `{NAME}` (default `{tenure}`): one cluster slot,
//! so a script may touch sessions and queues together. Where the calls go
//! (one server, the master Sentinel names, the node of a Redis Cluster that
//! holds the slot) is `master.rs`'s and `cluster.rs`'s business. Waiters are woken by
//! pub/sub on a channel of their own entry (a release wakes only the next
//! waiter); a holder that expires silently is noticed by polling no later
//! than its expiry. Fencing counters are seeded from Redis's `TIME` in
//! microseconds when missing, so they do not go back even if Redis loses its
//! data (as long as a name saw fewer than a million changes per second on
//! average: the counter also counts versions).

mod cluster;
mod connect;
mod layout;
mod master;
mod node;
mod pubsub;
mod reply;
mod script;
mod store;

use std::sync::Arc;
use std::time::Duration;

use super::url::UrlRules;
use crate::store::{Capabilities, Wake};
use pubsub::Wakeups;
#[cfg(feature = "redlock")]
pub(crate) use connect::{parse_max_ttl, DEFAULT_MAX_TTL};

#[cfg(feature = "redlock")]
pub(crate) use node::NodeJoin;

const BACKEND: &str = "redis";
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

/// The version of what this build keeps in Redis (its *format*): 5,
/// format 4 (whose marker, the `PREFIX:sessions` key, says 4: what builds
/// of 0.1.0 require) and beside it the build each session was opened by.
pub(crate) const FORMAT: &str = "5";

/// A Redis server answers PING with `+PONG`, or with an error (`-NOAUTH`,
/// `-DENIED`, `-LOADING`): either way, in RESP.
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> = Some(&PING);

pub(crate) const PING: crate::backend::probe::Greeting = crate::backend::probe::Greeting {
    protocol: "Redis",
    hello: b"PING\r\n",
    answers: |b| matches!(b.first(), Some(b'+' | b'-')),
    tls_schemes: &["rediss", "rediss+sentinel", "rediss+cluster"],
};

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules =
    UrlRules::servers(&[
        "prefix",
        "tls_ca",
        "sentinel_username",
        "sentinel_password",
        "replicas",
        "replicas_timeout",
        "max_ttl",
    ])
    .with_fragment();

/// The Redis backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(8),
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        wake: Wake::pub_sub(POLL_MAX),
        // `max_ttl=` (a keyspace found empty grants nothing for this long).
        max_ttl: connect::DEFAULT_MAX_TTL,
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock (a holder renewed on it is watched for its TTL); Redis's TIME only hints",
            "acquire: 1 (EVALSHA), release: 1, renew: 1",
        )
    }
}

/// A store on one Redis server.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

/// `replicas=N`: how many replicas must acknowledge what a grant, a
/// renewal or a fence depends on, and how long to wait for them.
#[derive(Debug, Clone, Copy)]
struct Replicas {
    count: u32,
    within: Duration,
}

struct Inner {
    master: master::Master,
    replicas: Option<Replicas>,
    script: redis::Script,
    prefix: String,
    sessions_key: String,
    /// `P:moving`, never written (see [`RedisStore::invocation`]).
    moving_key: String,
    /// The database number the URL selects (in a release's grant message).
    db: String,
    url: String,
    caps: Capabilities,
    /// Script calls made so far (see [`RedisStore::round_trips`]).
    round_trips: std::sync::atomic::AtomicU64,
    wakeups: Wakeups,
}

store_debug!(RedisStore: url, prefix);
