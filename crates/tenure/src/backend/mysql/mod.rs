#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `mysql://user:password@host:port/db[?prefix=NAME_]` (also `mariadb://`):
//! one stored-procedure CALL per operation (one round trip, one
//! transaction), except the common case of taking a free name and
//! releasing a lone holder, which is one plain `UPDATE` each; expiry by the
//! server's clock (`SYSDATE(3)`) only as a hint. Nothing can
//! notify a waiter, so waiters poll with a backoff (never past the next
//! expiry ahead of them); in this process a release wakes its next waiter
//! directly.
//!
//! Tables and procedures carry a prefix (default `tenure_`), are created on
//! first use under `GET_LOCK`, idempotently, and versioned in `PREFIXmeta`.
//! Fencing counters are plain columns, not `AUTO_INCREMENT` (which InnoDB may
//! reuse after a restart), so tokens never go back.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::Pool;

use super::poll::Listeners;
use super::sql::SqlStore;
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{Capabilities, Wake};

mod connect;
mod driver;
mod schema;
mod statements;

use connect::parse_url;
use schema::{MysqlSchema, SCHEMA_VERSION, UPGRADES_FROM};
pub use statements::fast_statements;

const BACKEND: &str = "mysql";
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
const RETRIES: usize = 5;

/// The version of what this build keeps in the database (its *format*):
/// 11, format 10 (whose marker, the meta table's `schema` row, says 10: what
/// builds of 0.1.0 require) and beside it the build each session was opened
/// by.
pub(crate) const FORMAT: &str = "11";

/// A MySQL or MariaDB server speaks first: a packet of protocol version 10,
/// or an error packet (0xff: "Host … is blocked", too many connections).
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> =
    Some(&crate::backend::probe::Greeting {
        protocol: "MySQL",
        hello: b"",
        answers: |b| matches!(b.get(4), Some(10 | 0xff)),
        tls_schemes: &[],
    });

/// How this backend reads its URL (the one parser: [`super::url`]).
// Besides our own options, the driver's own that we pass on.
pub(crate) const URL: UrlRules = UrlRules::servers(&[
    "prefix",
    "ssl-mode",
    "ssl-ca",
    "tcp_keepalive",
    "tcp_nodelay",
    "stmt_cache_size",
    "conn_ttl",
    "wait_timeout",
    "compression",
    "socket",
]);

/// The MySQL/MariaDB backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(80),
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        wake: Wake::local_or_poll(POLL_MIN, POLL_MAX),
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock (a holder renewed on it is watched for its TTL); the server's SYSDATE(3) only hints",
            "acquire: 1 (one statement on a free name, else a CALL; 2 when the statement finds the name never used, held or queued on, then for a second, or until an exclusive take of it is granted, the CALL at once), release: 1 (one statement for a hold this store knows to be in the row, else a CALL; 2 when another process's join moved that holder into the queue), renew: 1",
        )
    }
}

/// A store in one MySQL or MariaDB database: the SQL core over [`Mysql`].
pub type MysqlStore = SqlStore<Mysql>;

/// The MySQL/MariaDB driver of the SQL core: a connection pool; waiters in
/// this process are woken by the changes it makes, others poll.
#[derive(Clone)]
pub struct Mysql {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    prefix: String,
    url: String,
    /// [`FAST_JOIN`](statements::FAST_JOIN) and
    /// [`FAST_LEAVE`](statements::FAST_LEAVE) under this prefix.
    fast_join: String,
    fast_leave: String,
}

store_debug!(Mysql: url, prefix);

impl MysqlStore {
    /// Opens a store from a `mysql://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (opts, prefix) = parse_url(&url)?;
        let (fast_join, fast_leave) = fast_statements(&prefix);
        let driver = Mysql {
            inner: Arc::new(Inner {
                pool: Pool::new(opts),
                fast_join,
                fast_leave,
                prefix,
                url: url.masked().to_string(),
            }),
        };
        let mismatch = |v: &str| Error::SchemaMismatch {
            backend: BACKEND,
            url: driver.inner.url.clone(),
            found: format!("tables {}* have schema version {v:?}", driver.inner.prefix),
            expected: format!("version {SCHEMA_VERSION}"),
        };
        let mut conn = driver.conn().await?;
        // Its named lock must not outlive it in the pool (see `parse_url`).
        conn.reset_connection(true);
        let mut schema = MysqlSchema {
            conn,
            prefix: &driver.inner.prefix,
        };
        // Bounded, as every later statement is, but longer: the schema
        // may wait for another process that installs it.
        let setup = crate::backend::sql::CALL_TIMEOUT * 6;
        crate::backend::sql::answered_within(setup, BACKEND, async {
            crate::backend::sql::ensure_schema(
                &mut schema,
                SCHEMA_VERSION,
                FORMAT,
                UPGRADES_FROM,
                mismatch,
            )
            .await?;
            crate::backend::sql::ensure_additions(&mut schema).await
        })
        .await??;
        Ok(SqlStore {
            driver,
            caps: capabilities(),
            round_trips: Default::default(),
            joined: Default::default(),
            fast_hints: Default::default(),
            listeners: Listeners::default(),
        })
    }
}
