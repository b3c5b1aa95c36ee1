#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `postgres://user:password@host:port/db[?schema=NAME]`: one statement
//! (taking a free name, releasing a lone holder) or one PL/pgSQL function
//! call per operation (one round trip, one transaction), expiry confirmed by
//! a watching client, waiters woken by LISTEN/NOTIFY (a release's grant is
//! announced, and its waiter takes it without looking again).
//!
//! The tables and functions live in their own schema (default `tenure`),
//! created on first use under an advisory lock, idempotently, and versioned
//! in `SCHEMA.meta`. Every statement is parameterized.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use super::poll::{self, Listeners};
use super::sql::SqlStore;
use super::url::{StoreUrl, UrlRules};
use crate::error::Result;
use crate::store::{Capabilities, Wake};

mod connect;
mod driver;
mod listen;
mod schema;
mod statements;

use connect::{make_tls, parse_url, Connected, Tls};
pub use statements::fast_statements;

const BACKEND: &str = "postgres";
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
/// A LISTEN connection that failed to open is tried again after this long.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Deadlocks and serialization failures are retried this many times.
const RETRIES: usize = 5;

/// The version of what this build keeps in the database (its *format*):
/// 11, format 10 (whose marker, the meta table's `schema` row, says 10: what
/// builds of 0.1.0 require) and beside it the build each session was opened
/// by.
pub(crate) const FORMAT: &str = "11";

/// PostgreSQL answers an SSLRequest with one byte: `S`, `N` (or an `E`
/// error message), with or without TLS configured.
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> =
    Some(&crate::backend::probe::Greeting {
        protocol: "PostgreSQL",
        hello: &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f],
        answers: |b| matches!(b.first(), Some(b'S' | b'N' | b'E')),
        tls_schemes: &[],
    });

/// How this backend reads its URL (the one parser: [`super::url`]).
// Besides our own options, the driver's own that we pass on.
pub(crate) const URL: UrlRules = UrlRules::servers(&[
    "schema",
    "sslmode",
    "sslrootcert",
    "application_name",
    "connect_timeout",
    "options",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
    "channel_binding",
    "load_balance_hosts",
]);

/// The PostgreSQL backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(40),
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        wake: Wake::pub_sub(POLL_MAX),
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock (a holder renewed on it is watched for its TTL); the database's clock_timestamp() only hints",
            "acquire: 1 (one statement on a free name, else a function call; 2 when the statement finds the name never used, held, queued on or locked by another transaction, then for a second, or until an exclusive take of it is granted, the function at once), release: 1 (one statement for a hold this store knows to be in the row, else a function call; 2 when another process's join moved that holder into the queue), renew: 1",
        )
    }
}

/// A store in one PostgreSQL database: the SQL core over [`Postgres`].
pub type PostgresStore = SqlStore<Postgres>;

/// The PostgreSQL driver of the SQL core: one connection with prepared
/// statements, and one more that listens for notifications once a waiter
/// needs it.
#[derive(Clone)]
pub struct Postgres {
    inner: Arc<Inner>,
}

struct Inner {
    config: tokio_postgres::Config,
    tls: Tls,
    schema: String,
    url: String,
    conn: tokio::sync::Mutex<Option<Connected>>,
    listeners: Listeners,
    /// The LISTEN connection's client while it listens.
    listener: tokio::sync::Mutex<Option<Client>>,
    /// When opening the LISTEN connection last failed.
    listen_failed: poll::ReconnectGate,
}

store_debug!(Postgres: url, schema);

impl PostgresStore {
    /// Opens a store from a `postgres://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (config, schema, tls) = parse_url(&url)?;
        let tls = make_tls(&url, &tls)?;
        let listeners = Listeners::default();
        let driver = Postgres {
            inner: Arc::new(Inner {
                config,
                tls,
                url: url.masked().to_string(),
                conn: tokio::sync::Mutex::new(None),
                listeners: listeners.clone(),
                listener: tokio::sync::Mutex::new(None),
                listen_failed: poll::ReconnectGate::default(),
                schema,
            }),
        };
        driver.connected().await?;
        // The LISTEN connection opens with the first wait, not now: while
        // this process listens, every NOTIFY in the database wakes its
        // backend and this process, which a process that only takes free
        // locks need not pay for.
        Ok(SqlStore {
            driver,
            caps: capabilities(),
            round_trips: Default::default(),
            joined: Default::default(),
            fast_hints: Default::default(),
            listeners,
        })
    }
}
