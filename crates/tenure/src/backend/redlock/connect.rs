//! The nodes: the URL split into one `redis://` URL per node, each node's
//! connection (made on first use, again after a failure), and opening the
//! store once a majority answers.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::quorum::Tally;
use super::{capabilities, lock, Inner, Mask, RedlockStore, BACKEND, URL};
use crate::backend::redis::RedisStore;
use crate::backend::url::{mask_password, StoreUrl};
use crate::error::{Error, Result};

const MAX_NODES: usize = 15;
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a node that could not be reached is left alone before the next
/// connection attempt (calls meanwhile fail at once).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// Bound of one connection attempt to a node (TCP, TLS, AUTH, script load).
/// Operations stay bounded by the node timeout; see [`Node::get`].
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One Redis node, connected on first use and again after a failure.
pub(super) struct Node {
    /// The node's `redis://` URL; may hold the password: never shown.
    url: String,
    pub(super) shown: String,
    store: std::sync::Mutex<Option<RedisStore>>,
    failed: crate::backend::poll::ReconnectGate,
    connecting: tokio::sync::Mutex<()>,
}

impl Node {
    /// The node's connection. Without one, a connection attempt bounded by
    /// [`CONNECT_TIMEOUT`] runs in a task of its own, so that a caller who
    /// stops waiting (an operation bounded by the shorter node timeout) does
    /// not cancel it: a slow handshake (TLS on a busy host) still completes
    /// and serves the next call.
    pub(super) async fn get(self: &Arc<Self>, node_timeout: Duration) -> Result<RedisStore> {
        if let Some(store) = lock(&self.store).clone() {
            return Ok(store);
        }
        let node = Arc::clone(self);
        tokio::spawn(async move { node.connect(node_timeout).await })
            .await
            .unwrap_or_else(|e| Err(Error::backend(BACKEND, format!("connect task failed: {e}"))))
    }

    async fn connect(&self, node_timeout: Duration) -> Result<RedisStore> {
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(store) = lock(&self.store).clone() {
            return Ok(store);
        }
        if self.failed.failed_within(RECONNECT_AFTER) {
            return Err(Error::unavailable(
                BACKEND,
                format!("node {} was unreachable a moment ago", self.shown),
            ));
        }
        match RedisStore::open_node(&self.url, CONNECT_TIMEOUT, node_timeout).await {
            Ok(store) => {
                *lock(&self.store) = Some(store.clone());
                self.failed.succeeded();
                Ok(store)
            }
            Err(e) => {
                self.failed.failed();
                Err(e)
            }
        }
    }
}

/// Splits a `redlock://` URL into one `redis://` URL per node and the node
/// timeout.
pub(super) fn parse_url(url: &StoreUrl) -> Result<(Vec<String>, Duration)> {
    // redlocks:// is Redlock over rediss:// (TLS) nodes.
    let node_scheme = if url.scheme() == "redlocks" {
        "rediss"
    } else {
        "redis"
    };
    let db = url.path().trim_start_matches('/');
    let db = if db.is_empty() { "0" } else { db };
    if db.parse::<u32>().is_err() {
        return Err(url.invalid(format!("database {db:?} is not a number")));
    }
    if url.option("tls_ca").is_some() && node_scheme != "rediss" {
        return Err(url.invalid("tls_ca=PATH goes with redlocks:// only"));
    }
    let node_timeout = match url.option("node_timeout") {
        None => DEFAULT_NODE_TIMEOUT,
        Some(v) => humantime::parse_duration(v)
            .ok()
            .filter(|d| !d.is_zero() && *d <= Duration::from_secs(60))
            .ok_or_else(|| {
                url.invalid(format!(
                    "node_timeout={v:?} is not a duration from 1ms to 60s"
                ))
            })?,
    };
    let nodes = url.servers("node")?;
    if nodes.len() < 3 || nodes.len() > MAX_NODES || nodes.len() % 2 == 0 {
        return Err(url.invalid(format!(
            "Redlock needs an odd number of nodes from 3 to {MAX_NODES}, got {}",
            nodes.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (host, port) in &nodes {
        if !seen.insert((host.to_ascii_lowercase(), *port)) {
            return Err(url.invalid(format!("node {host}:{port} is listed twice")));
        }
    }
    let user = url.userinfo_encoded();
    let query = url.driver_query(&["node_timeout"]);
    let urls = nodes
        .iter()
        .map(|(h, p)| format!("{node_scheme}://{user}{h}:{p}/{db}{query}"))
        .collect();
    Ok((urls, node_timeout))
}

impl RedlockStore {
    /// Opens a store from a `redlock://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (urls, node_timeout) = parse_url(&url)?;
        let n = urls.len();
        let nodes = urls
            .into_iter()
            .map(|u| {
                Arc::new(Node {
                    shown: mask_password(&u),
                    url: u,
                    store: std::sync::Mutex::new(None),
                    failed: Default::default(),
                    connecting: tokio::sync::Mutex::new(()),
                })
            })
            .collect();
        let store = RedlockStore {
            inner: Arc::new(Inner {
                nodes,
                majority: n / 2 + 1,
                all: ((1u32 << n) - 1) as Mask,
                node_timeout,
                url: url.masked().to_string(),
                caps: crate::store::Capabilities {
                    max_ttl: crate::backend::redis::parse_max_ttl(&url)?,
                    ..capabilities()
                },
                sessions: std::sync::Mutex::new(HashMap::new()),
                last_placed: AtomicU64::new(0),
                offset: std::sync::atomic::AtomicI64::new(0),
                clock_ahead_us: std::sync::atomic::AtomicI64::new(0),
            }),
        };
        // Fail now, not at the first lock, unless a majority answers; the
        // first connections get the connect timeout, not the node timeout.
        let all = store.inner.all;
        let mut tally = Tally::default();
        let answers = store
            .each_within(all, CONNECT_TIMEOUT + node_timeout, |_| async { Ok(()) })
            .await;
        for (i, result) in answers {
            tally.note(i, result);
        }
        store.majority_or_error(&tally)?;
        Ok(store)
    }
}
