//! `postgres://user:password@host:port/db[?schema=NAME]`: one statement
//! (taking a free name, releasing a lone holder) or one PL/pgSQL function
//! call per operation (one round trip, one transaction), expiry confirmed by
//! a watching client, waiters woken by LISTEN/NOTIFY (a release's grant is
//! announced, and its waiter takes it without looking again).
//!
//! The tables and functions live in their own schema (default `tenure`),
//! created on first use under an advisory lock, idempotently, and versioned
//! in `SCHEMA.meta`. Every statement is parameterized.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use tokio_postgres::types::{ToSql, Type};
#[cfg(not(feature = "tls"))]
use tokio_postgres::NoTls;
use tokio_postgres::{AsyncMessage, Client, Statement};

use super::poll::{self, Listeners};
use super::sql::{Arg, Cell, SqlDriver, SqlRow, SqlSchema, SqlStore};
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{Capabilities, Wake};

const BACKEND: &str = "postgres";
const SCHEMA_SQL: &str = include_str!("postgres.sql");
const SCHEMA_VERSION: &str = "10";
/// Schema versions this build upgrades in place: the schema's DDL is
/// idempotent (tables `IF NOT EXISTS`, functions `CREATE OR REPLACE`), and
/// versions 1 and 2 differ only in their functions (2: fast paths; 3: the
/// fast join reads the clock after the name's lock, and `settle` re-checks
/// an expiry as it ends the session; 4 walks queues from the head; 5 adds
/// the fences' and cells' table and functions; 6 counts renewals and ends
/// a session only when a watcher confirms it, never by the server's clock;
/// 7 adds `evict_session`, ending one session by its tag; 8 keeps a lone
/// holder in its name's row; 9 writes its helpers in PL/pgSQL, whose plans
/// are kept, and announces a release's grants on `SCHEMA_grant`; 10's
/// join says what a queued waiter's first look would).
const UPGRADES_FROM: &[&str] = &["1", "2", "3", "4", "5", "6", "7", "8", "9"];
/// Takes a name nobody holds or waits for (`queued` false) for a live
/// session: the lone holder goes into the name's row, with the next token.
/// One statement; no row when that case does not apply, and the `join`
/// function decides. It never waits for a lock (SKIP LOCKED), so its
/// snapshot is not older than the locks it takes: a join that would have
/// waited for the name goes to the function, which judges the session
/// after the wait. The session's row is key-share locked, as the foreign
/// key of an entry would (nothing deletes the session before this
/// commits: `open`'s collection skips it), and both rows are read again at
/// their newest version as they are locked, so two of these never both
/// take a name. Answers as `join` does, plus the notification.
const FAST_JOIN: &str = "WITH live AS (
    SELECT 1 FROM @s.sessions s WHERE s.id = $1 AND s.expires_ms > 0 FOR KEY SHARE SKIP LOCKED
), free AS (
    SELECT f.name FROM @s.names f
     WHERE f.name = $2 AND f.h_session IS NULL AND NOT f.queued AND EXISTS (SELECT 1 FROM live)
       FOR UPDATE SKIP LOCKED
)
UPDATE @s.names n
   SET last_seq = n.last_seq + 1, version = n.version + 1, h_seq = n.last_seq + 1,
       h_session = $1, h_kind = $3, h_count = $4, h_lim = $5, h_value = $6,
       h_granted_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  FROM free WHERE n.name = free.name
RETURNING 'ok'::text, n.last_seq, true, 1, n.last_seq = 1, pg_notify('@s_change', n.name)";
/// Releases the row holder `$3` of a live session; no row when that is not
/// the case (an entry in `entries`, a lost session, a name's row someone
/// has locked), and the `leave` function decides, so that a session ended
/// while this would have waited reads "lost". Answers as `leave` does.
const FAST_LEAVE: &str = "WITH held AS (
    SELECT f.name FROM @s.names f
     WHERE f.name = $2 AND f.h_seq = $3 AND f.h_session = $1
       AND EXISTS (SELECT 1 FROM @s.sessions s WHERE s.id = $1 AND s.expires_ms > 0)
       FOR UPDATE SKIP LOCKED
)
UPDATE @s.names n SET version = n.version + 1, h_seq = NULL, h_session = NULL, h_value = NULL
  FROM held WHERE n.name = held.name
RETURNING 'ok'::text, 0, pg_notify('@s_change', n.name)";
/// The take of a free name and the release of a lone holder, with the
/// schema `schema` filled in, as the driver prepares them; public only for
/// the bench's shapes (`bench/benches/shapes.rs`), which run them raw and
/// strip them down. Not an API.
#[doc(hidden)]
pub fn fast_statements(schema: &str) -> (String, String) {
    (
        FAST_JOIN.replace("@s", schema),
        FAST_LEAVE.replace("@s", schema),
    )
}
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
/// A LISTEN connection that failed to open is tried again after this long.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Deadlocks and serialization failures are retried this many times.
const RETRIES: usize = 5;

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

/// A live connection with its prepared statements.
#[derive(Clone)]
struct Connected {
    client: Arc<Client>,
    stmts: Arc<Statements>,
}

struct Statements {
    open: Statement,
    keep_alive: Statement,
    close: Statement,
    join: Statement,
    leave: Statement,
    fast_join: Statement,
    fast_leave: Statement,
    still_queued: Statement,
    look: Statement,
    set_value: Statement,
    version: Statement,
    rows: Statement,
    refresh: Statement,
    names: Statement,
    names_of: Statement,
    names_of_tag: Statement,
    evict: Statement,
    evict_session: Statement,
    fence: Statement,
    cell_get: Statement,
    cell_put: Statement,
    cell_delete: Statement,
    expire: Statement,
}

impl Statements {
    /// The statement that calls one of tenure's functions.
    fn routine(&self, routine: &str) -> Result<&Statement> {
        Ok(match routine {
            "close" => &self.close,
            "join" => &self.join,
            "leave" => &self.leave,
            "look" => &self.look,
            "set_value" => &self.set_value,
            "refresh" => &self.refresh,
            "evict" => &self.evict,
            "evict_session" => &self.evict_session,
            "fence" => &self.fence,
            "cell_get" => &self.cell_get,
            "cell_put" => &self.cell_put,
            "cell_delete" => &self.cell_delete,
            "expire" => &self.expire,
            other => return Err(Error::backend(BACKEND, format!("no routine {other}"))),
        })
    }
}

store_debug!(Postgres: url, schema);

fn pg_err(e: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    if let Some(code) = e.code() {
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return Error::Auth {
                backend: BACKEND,
                reason: e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_default(),
            };
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            // The URL names a database the server does not have.
            return Error::InvalidArgument {
                what: "database in the store URL",
                reason: e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| "it does not exist".into()),
            };
        }
        if *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
        {
            return Error::unavailable(BACKEND, e);
        }
        return Error::backend(BACKEND, e);
    }
    // A failed TLS handshake (a certificate not trusted, say) will not heal
    // by retrying: say so, with the reason.
    if e.to_string().contains("TLS") {
        let reason = std::error::Error::source(&e)
            .map(|s| format!("{e}: {s}"))
            .unwrap_or_else(|| e.to_string());
        return Error::backend(BACKEND, reason);
    }
    // No SQLSTATE: the connection itself failed.
    Error::unavailable(BACKEND, e)
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// libpq's `sslmode`, which tokio-postgres knows only in part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// TLS as the URL asks for it: libpq's meaning of `sslmode` and
/// `sslrootcert` (prefer and require encrypt without checking the
/// certificate, unless a root certificate is given; verify-ca checks the
/// chain; verify-full also the host name).
#[derive(Debug, Clone)]
struct TlsChoice {
    mode: SslMode,
    /// Read only with the `tls` feature (without it, TLS is refused).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    root_cert: Option<String>,
}

#[cfg(feature = "tls")]
type Tls = postgres_native_tls::MakeTlsConnector;
#[cfg(not(feature = "tls"))]
type Tls = NoTls;
type PgConnection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <Tls as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

#[cfg(feature = "tls")]
fn make_tls(url: &StoreUrl, choice: &TlsChoice) -> Result<Tls> {
    let mut builder = native_tls::TlsConnector::builder();
    let check_chain = matches!(choice.mode, SslMode::VerifyCa | SslMode::VerifyFull)
        || choice.root_cert.is_some();
    if !check_chain {
        builder.danger_accept_invalid_certs(true);
    }
    if choice.mode != SslMode::VerifyFull {
        builder.danger_accept_invalid_hostnames(true);
    }
    if let Some(path) = &choice.root_cert {
        let bad = |reason: String| url.invalid(format!("sslrootcert={path}: {reason}"));
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let cert = native_tls::Certificate::from_pem(&pem).map_err(|e| bad(e.to_string()))?;
        builder.add_root_certificate(cert);
    }
    let connector = builder
        .build()
        .map_err(|e| Error::backend(BACKEND, format!("TLS set-up: {e}")))?;
    Ok(postgres_native_tls::MakeTlsConnector::new(connector))
}

#[cfg(not(feature = "tls"))]
fn make_tls(_url: &StoreUrl, choice: &TlsChoice) -> Result<Tls> {
    match choice.mode {
        SslMode::Disable | SslMode::Prefer => Ok(NoTls),
        _ => Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (sslmode=require and stricter) without the cargo feature `tls`",
        }),
    }
}

/// Takes our `schema` option and libpq's TLS options, and parses the rest
/// as libpq does.
fn parse_url(url: &StoreUrl) -> Result<(tokio_postgres::Config, String, TlsChoice)> {
    let schema = match url.option("schema") {
        None => "tenure",
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 40
                && v.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !v.starts_with(|c: char| c.is_ascii_digit());
            if !ok {
                return Err(url.invalid(format!(
                    "schema must be 1-40 of a-z, 0-9 and _ (not starting with a digit), not {v:?}"
                )));
            }
            v
        }
    };
    let mode = match url.option("sslmode") {
        None | Some("allow") | Some("prefer") => SslMode::Prefer,
        Some("disable") => SslMode::Disable,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some(other) => {
            return Err(url.invalid(format!(
                "sslmode={other:?}; known: disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    let tls = TlsChoice {
        mode,
        root_cert: url
            .option("sslrootcert")
            .filter(|v| !v.is_empty())
            .map(str::to_string),
    };
    let cleaned = format!(
        "{}://{}{}{}{}",
        url.scheme(),
        url.userinfo_as_written(),
        url.authority(),
        url.path(),
        url.driver_query(&["schema", "sslmode", "sslrootcert"])
    );
    let mut config =
        tokio_postgres::Config::from_str(&cleaned).map_err(|e| url.invalid(e.to_string()))?;
    config.connect_timeout(CONNECT_TIMEOUT);
    if config.get_application_name().is_none() {
        config.application_name("tenure");
    }
    config.ssl_mode(match tls.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    Ok((config, schema.to_string(), tls))
}

/// An argument as the statement's parameter type wants it.
fn to_sql(arg: &Arg<'_>, ty: &Type) -> Result<Box<dyn ToSql + Sync + Send>> {
    let out_of_range = || Error::backend(BACKEND, format!("{arg:?} does not fit {ty}"));
    Ok(match *arg {
        Arg::Text(v) => Box::new(v.to_string()),
        Arg::Bytes(v) => Box::new(v.to_vec()),
        Arg::Flag(v) => Box::new(v),
        Arg::Int(v) if *ty == Type::INT2 => Box::new(i16::try_from(v).map_err(|_| out_of_range())?),
        Arg::Int(v) if *ty == Type::INT4 => Box::new(i32::try_from(v).map_err(|_| out_of_range())?),
        Arg::Int(v) => Box::new(v),
        Arg::Null if *ty == Type::BYTEA => Box::new(None::<Vec<u8>>),
        Arg::Null if *ty == Type::TEXT => Box::new(None::<String>),
        Arg::Null => Box::new(None::<i64>),
    })
}

/// A row as the core reads it.
fn to_row(row: &tokio_postgres::Row) -> Result<SqlRow> {
    let cell = |i: usize, ty: &Type| -> std::result::Result<Cell, tokio_postgres::Error> {
        Ok(if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(i)?
                .map_or(Cell::Null, |v| Cell::Int(v.into()))
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?
                .map_or(Cell::Null, |v| Cell::Int(v.into()))
        } else if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?
                .map_or(Cell::Null, Cell::Int)
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)?
                .map_or(Cell::Null, Cell::Flag)
        } else if *ty == Type::BYTEA {
            row.try_get::<_, Option<Vec<u8>>>(i)?
                .map_or(Cell::Null, Cell::Bytes)
        } else if [Type::TEXT, Type::VARCHAR, Type::NAME, Type::BPCHAR].contains(ty) {
            row.try_get::<_, Option<String>>(i)?
                .map_or(Cell::Null, Cell::Text)
        } else {
            // `void` (close, refresh) and anything the core does not read.
            Cell::Null
        })
    };
    row.columns()
        .iter()
        .enumerate()
        .map(|(i, c)| cell(i, c.type_()).map_err(|e| Error::backend(BACKEND, e)))
        .collect::<Result<Vec<Cell>>>()
        .map(|cells| SqlRow::new(BACKEND, cells))
}

impl PostgresStore {
    /// Opens a store from a `postgres://` URL (as [`crate::open`] does), typed.
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

impl Postgres {
    async fn connect_raw(&self) -> Result<(Client, PgConnection)> {
        tokio::time::timeout(
            CONNECT_TIMEOUT + Duration::from_secs(1),
            // A clone of a connector; NoTls (without the `tls` feature) is Copy.
            #[allow(clippy::clone_on_copy)]
            self.inner.config.connect(self.inner.tls.clone()),
        )
        .await
        .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
        .map_err(pg_err)
    }

    /// The live connection, reconnecting (and preparing) if it was lost.
    async fn connected(&self) -> Result<Connected> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.client.is_closed() {
                return Ok(c.clone());
            }
        }
        let (client, connection) = self.connect_raw().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        });
        let s = &self.inner.schema;
        let mismatch = |v: &str| Error::SchemaMismatch {
            backend: BACKEND,
            url: self.inner.url.clone(),
            found: format!("schema {s} has tenure schema version {v}"),
            expected: format!("version {SCHEMA_VERSION}"),
        };
        super::sql::ensure_schema(
            &mut PgSchema {
                client: &client,
                schema: s,
            },
            SCHEMA_VERSION,
            UPGRADES_FROM,
            mismatch,
        )
        .await?;
        let prep = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await.map_err(pg_err) }
        };
        let prep_typed = |sql: String, types: &'static [Type]| {
            let client = &client;
            async move { client.prepare_typed(&sql, types).await.map_err(pg_err) }
        };
        let (fast_join, fast_leave) = fast_statements(s);
        let stmts = Statements {
            open: prep(format!(
                "SELECT {s}.open($1, $2, $3, $4)"
            ))
            .await?,
            keep_alive: prep(format!(
                "UPDATE {s}.sessions SET expires_ms = {s}.now_ms() + ttl_ms, renewals = renewals + 1 WHERE id = $1 AND expires_ms > 0"
            ))
            .await?,
            close: prep(format!("SELECT {s}.close($1)")).await?,
            join: prep(format!("SELECT * FROM {s}.join($1, $2, $3, $4, $5, $6, $7)")).await?,
            leave: prep(format!("SELECT * FROM {s}.leave($1, $2, $3)")).await?,
            // Typed here: `$3` is compared with a bigint, and the answer's
            // columns are what `to_row` reads.
            fast_join: prep_typed(
                fast_join,
                &[Type::TEXT, Type::TEXT, Type::INT2, Type::INT4, Type::INT4, Type::BYTEA],
            )
            .await?,
            fast_leave: prep_typed(fast_leave, &[Type::TEXT, Type::TEXT, Type::INT8])
                .await?,
            // A plain read, not a function: whether a queued entry still
            // waits, for a live session (the check behind a waiter's first
            // look skipped; otherwise the waiter looks, and learns why).
            still_queued: prep_typed(
                format!("SELECT 'ok'::text FROM {s}.entries e JOIN {s}.sessions s ON s.id = e.session
                          WHERE e.session = $1 AND e.name = $2 AND e.seq = $3 AND e.granted_ms IS NULL
                            AND s.expires_ms > 0"),
                &[Type::TEXT, Type::TEXT, Type::INT8],
            )
            .await?,
            look: prep(format!("SELECT * FROM {s}.look($1, $2, $3, $4)")).await?,
            set_value: prep(format!("SELECT {s}.set_value($1, $2, $3, $4)")).await?,
            version: prep(format!("SELECT coalesce((SELECT version FROM {s}.names WHERE name = $1), 0)")).await?,
            rows: prep(format!(
                "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value, e.granted_ms,
                        CASE WHEN s.expires_ms <= 0 THEN -1 ELSE greatest(s.expires_ms - {s}.now_ms(), 0) END, e.holds,
                        (SELECT version FROM {s}.names WHERE name = $1)
                   FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE e.name = $1 ORDER BY e.seq"
            ))
            .await?,
            refresh: prep(format!("SELECT {s}.refresh($1)")).await?,
            names: prep(format!(
                "SELECT DISTINCT e.name FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE s.expires_ms > 0 AND left(e.name, length($1)) = $1 ORDER BY 1"
            ))
            .await?,
            names_of: prep(format!("SELECT DISTINCT name FROM {s}.all_entries WHERE session = $1")).await?,
            names_of_tag: prep(format!(
                "SELECT DISTINCT e.name FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE s.tag = $1 AND s.expires_ms > 0"
            ))
            .await?,
            // A status first, as every routine answers.
            evict: prep(format!("SELECT 'ok', {s}.evict($1)")).await?,
            evict_session: prep(format!("SELECT 'ok', {s}.evict_session($1)")).await?,
            fence: prep(format!("SELECT * FROM {s}.fence($1, $2, $3)")).await?,
            cell_get: prep(format!("SELECT * FROM {s}.cell_get($1)")).await?,
            cell_put: prep(format!("SELECT * FROM {s}.cell_put($1, $2, $3, $4)")).await?,
            cell_delete: prep(format!("SELECT * FROM {s}.cell_delete($1, $2)")).await?,
            expire: prep(format!("SELECT 'ok', {s}.expire($1, $2)")).await?,
        };
        let connected = Connected {
            client: Arc::new(client),
            stmts: Arc::new(stmts),
        };
        *slot = Some(connected.clone());
        Ok(connected)
    }

    /// Runs one statement, retrying deadlocks; one round trip normally.
    async fn query(
        &self,
        pick: impl Fn(&Statements) -> Result<&Statement>,
        args: &[Arg<'_>],
    ) -> Result<Vec<tokio_postgres::Row>> {
        poll::retry_at_once(RETRIES, is_retryable, pg_err, || async {
            let c = self.connected().await?;
            let statement = pick(&c.stmts)?;
            let params = args
                .iter()
                .zip(statement.params())
                .map(|(arg, ty)| to_sql(arg, ty))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            Ok(c.client.query(statement, &refs).await)
        })
        .await
    }

    async fn texts(&self, pick: fn(&Statements) -> &Statement, arg: &str) -> Result<Vec<String>> {
        let rows = self.query(|s| Ok(pick(s)), &[Arg::Text(arg)]).await?;
        rows.iter()
            .map(|r| {
                r.try_get::<_, String>(0)
                    .map_err(|e| Error::backend(BACKEND, e))
            })
            .collect()
    }
}

#[async_trait]
impl SqlDriver for Postgres {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn open(&self, secret: &str, tag: &str, label: &str, ttl_ms: i64) -> Result<()> {
        let args = [
            Arg::Text(secret),
            Arg::Text(tag),
            Arg::Text(label),
            Arg::Int(ttl_ms),
        ];
        self.query(|s| Ok(&s.open), &args).await.map(|_| ())
    }

    async fn keep_alive(&self, secret: &str) -> Result<bool> {
        let c = self.connected().await?;
        let n = c
            .client
            .execute(&c.stmts.keep_alive, &[&secret])
            .await
            .map_err(pg_err)?;
        Ok(n > 0)
    }

    async fn call(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<SqlRow> {
        let rows = self.query(|s| s.routine(routine), args).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::backend(BACKEND, format!("{routine} returned no row")))?;
        to_row(row)
    }

    async fn rows(&self, name: &str) -> Result<(Vec<SqlRow>, i64)> {
        let rows = self.query(|s| Ok(&s.rows), &[Arg::Text(name)]).await?;
        let version = match rows.last() {
            Some(row) => row
                .try_get::<_, Option<i64>>(10)
                .map_err(|e| Error::backend(BACKEND, e))?,
            None => None,
        };
        let version = match version {
            Some(v) => v,
            None => self
                .query(|s| Ok(&s.version), &[Arg::Text(name)])
                .await?
                .first()
                .map(|r| {
                    r.try_get::<_, i64>(0)
                        .map_err(|e| Error::backend(BACKEND, e))
                })
                .transpose()?
                .unwrap_or(0),
        };
        let rows = rows.iter().map(to_row).collect::<Result<_>>()?;
        Ok((rows, version))
    }

    async fn names(&self, prefix: &str) -> Result<Vec<String>> {
        self.texts(|s| &s.names, prefix).await
    }

    async fn names_of(&self, secret: &str) -> Result<Vec<String>> {
        self.texts(|s| &s.names_of, secret).await
    }

    async fn names_of_tag(&self, tag: &str) -> Result<Vec<String>> {
        self.texts(|s| &s.names_of_tag, tag).await
    }

    /// Listens for this schema's notifications on a connection of its own,
    /// started on first use and restarted if it drops (tried at most once a
    /// second). When it drops, every waiter looks again.
    async fn listen(&self) -> bool {
        let mut listening = self.inner.listener.lock().await;
        if listening.as_ref().is_some_and(|c| !c.is_closed()) {
            return true;
        }
        if self.inner.listen_failed.failed_within(RECONNECT_AFTER) {
            return false;
        }
        let failed = || {
            self.inner.listen_failed.failed();
            false
        };
        let (client, mut connection) = match self.connect_raw().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "no LISTEN connection; waiters poll");
                return failed();
            }
        };
        let listeners = self.inner.listeners.clone();
        let wake = format!("{}_wake", self.inner.schema);
        let grant = format!("{}_grant", self.inner.schema);
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            // Payload: name TAB token.
            let key_of = |payload: &str| {
                payload.rsplit_once('\t').and_then(|(name, seq)| {
                    seq.parse::<u64>()
                        .ok()
                        .map(|seq| poll::grant_key(name, seq))
                })
            };
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) if n.channel() == wake => {
                        // Only a wake-up: the waiter looks before it takes the
                        // grant. A transaction may grant an entry and then
                        // end it (`evict` ends every holder its first settle
                        // finds, a waiter it just granted included), and the
                        // NOTIFY still goes out.
                        if let Some(key) = key_of(n.payload()) {
                            listeners.wake(&key);
                        }
                    }
                    Ok(AsyncMessage::Notification(n)) if n.channel() == grant => {
                        // A release's grant, sent by a transaction that ends
                        // nothing after it and delivered once it committed:
                        // the grant itself, if it carries the proof only
                        // the store could make (any role that can connect
                        // may NOTIFY on any channel). Payload: name TAB
                        // token TAB proof.
                        if let Some((rest, proof)) = n.payload().rsplit_once('\t') {
                            if let Some(key) = key_of(rest) {
                                listeners.announced(&key, proof);
                            }
                        }
                    }
                    Ok(AsyncMessage::Notification(n)) => {
                        listeners.wake(&poll::change_key(n.payload()))
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // No more notifications: close the connection first (so the
            // client reads closed and `listen` opens a new one), then every
            // waiter looks again, and polls until a new LISTEN connection is up.
            drop(messages);
            listeners.wake_all();
        });
        let s = &self.inner.schema;
        match client
            .batch_execute(&format!(
                "LISTEN {s}_grant; LISTEN {s}_wake; LISTEN {s}_change;"
            ))
            .await
        {
            // Kept here: the connection lives as long as its client.
            Ok(()) => {
                *listening = Some(client);
                // Whatever was notified while nobody listened.
                self.inner.listeners.wake_all();
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN failed; waiters poll");
                failed()
            }
        }
    }

    /// SHA-256 of the entry's session secret, a tab and its token, in hex,
    /// as `settle` computes it: a role that can NOTIFY but cannot read the
    /// sessions' secrets cannot make it, and a token is never reused, so a
    /// proof heard once proves nothing more.
    fn grant_proof(&self, secret: &str, seq: u64) -> Option<String> {
        use sha2::Digest;
        use std::fmt::Write;
        let digest = sha2::Sha256::digest(format!("{secret}\t{seq}").as_bytes());
        let mut hex = String::with_capacity(64);
        for byte in digest.iter() {
            let _ = write!(hex, "{byte:02x}");
        }
        Some(hex)
    }

    async fn fast(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<Option<SqlRow>> {
        let rows = match routine {
            // (The join's last argument, "only if granted", changes nothing
            // here: this grants or does nothing.)
            "join" => {
                self.query(|s| Ok(&s.fast_join), &args[..args.len().min(6)])
                    .await?
            }
            "leave" => self.query(|s| Ok(&s.fast_leave), args).await?,
            "still_queued" => self.query(|s| Ok(&s.still_queued), args).await?,
            _ => return Ok(None),
        };
        rows.first().map(to_row).transpose()
    }

    fn has_fast_paths(&self) -> bool {
        true
    }

    fn wakes_by_hand(&self) -> bool {
        false
    }

    fn poll_bounds(&self) -> (Duration, Duration) {
        (POLL_MIN, POLL_MAX)
    }
}

/// The schema in its own PostgreSQL schema, versioned in `SCHEMA.meta`,
/// created under a transaction-scoped advisory lock.
struct PgSchema<'a> {
    client: &'a Client,
    schema: &'a str,
}

#[async_trait]
impl SqlSchema for PgSchema<'_> {
    async fn stored_version(&mut self) -> Result<Option<String>> {
        let s = self.schema;
        let select = format!("SELECT value FROM {s}.meta WHERE key = 'schema'");
        // An error here is a schema or table not made yet.
        match self.client.query_opt(&select, &[]).await {
            Ok(Some(row)) => row
                .try_get::<_, String>(0)
                .map(Some)
                .map_err(|e| Error::backend(BACKEND, e)),
            _ => Ok(None),
        }
    }

    async fn lock(&mut self) -> Result<()> {
        let s = self.schema;
        self.client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock(hashtext('tenure schema {s}'));
                 CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL);"
            ))
            .await
            .map_err(pg_err)
    }

    async fn apply(&mut self, version: &str) -> Result<()> {
        let s = self.schema;
        let ddl = SCHEMA_SQL.replace("@s", s);
        self.client
            .batch_execute(&format!(
                "{ddl}
                 INSERT INTO {s}.meta (key, value) VALUES ('schema', '{version}')
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;"
            ))
            .await
            .map_err(pg_err)
    }

    async fn unlock(&mut self) -> Result<()> {
        // After a failed `apply` the transaction is aborted, and COMMIT
        // rolls it back.
        self.client.batch_execute("COMMIT").await.map_err(pg_err)
    }
}
