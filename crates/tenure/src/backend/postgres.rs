//! `postgres://user:password@host:port/db[?schema=NAME]`: one PL/pgSQL
//! function call per operation (one round trip, one transaction), expiry by
//! the database's clock, waiters woken by LISTEN/NOTIFY.
//!
//! The tables and functions live in their own schema (default `tenure`),
//! created on first use under an advisory lock, idempotently, and versioned
//! in `SCHEMA.meta`. Every statement is parameterized.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::StreamExt;
#[cfg(not(feature = "tls"))]
use tokio_postgres::NoTls;
use tokio_postgres::{AsyncMessage, Client, Statement};

use super::codec;
use super::poll::{self, Listeners, Look};
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, Entry, EntryKind, JoinMode, Joined, Name, OpenedSession, Queue, SessionKey,
    SessionSpec, Store, Wake,
};

const BACKEND: &str = "postgres";
const SCHEMA_SQL: &str = include_str!("postgres.sql");
const SCHEMA_VERSION: &str = "3";
/// Schema versions this build upgrades in place: the schema's DDL is
/// idempotent (tables `IF NOT EXISTS`, functions `CREATE OR REPLACE`), and
/// versions 1 and 2 differ only in their functions (2: fast paths; 3: the
/// fast join reads the clock after the name's lock, and `settle` re-checks
/// an expiry as it ends the session).
const UPGRADES_FROM: &[&str] = &["1", "2"];
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
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
        backend: BACKEND,
        fencing: true,
        durable: true,
        multi_process: true,
        fifo: true,
        shared: true,
        permits: true,
        wake: Wake::PubSub {
            fallback_poll: POLL_MAX,
        },
        clock: "the database's clock_timestamp()",
        min_ttl: Duration::from_millis(100),
        max_ttl: Duration::from_secs(7 * 24 * 3600),
        grant_times: true,
        round_trips: "acquire: 1 (a function call), release: 1, renew: 1",
    }
}

/// A store in one PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: tokio_postgres::Config,
    tls: Tls,
    schema: String,
    url: String,
    caps: Capabilities,
    conn: tokio::sync::Mutex<Option<Connected>>,
    listeners: Listeners,
    /// The LISTEN connection's client while it listens.
    listener: tokio::sync::Mutex<Option<Client>>,
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
    look: Statement,
    set_value: Statement,
    version: Statement,
    rows: Statement,
    refresh: Statement,
    names: Statement,
    evict: Statement,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.inner.url)
            .field("schema", &self.inner.schema)
            .finish()
    }
}

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

fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|e| Error::backend(BACKEND, e))
}

/// A column of one of our rows; a type other than the one expected (a
/// schema changed under us) is an error, not the panic of `Row::get`.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| Error::backend(BACKEND, e))
}

impl PostgresStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (config, schema, tls) = parse_url(&url)?;
        let tls = make_tls(&url, &tls)?;
        let store = PostgresStore {
            inner: Arc::new(Inner {
                config,
                tls,
                url: url.masked().to_string(),
                caps: capabilities(),
                conn: tokio::sync::Mutex::new(None),
                listeners: Listeners::default(),
                listener: tokio::sync::Mutex::new(None),
                schema,
            }),
        };
        store.connected().await?;
        // The LISTEN connection opens with the first wait, not now: while
        // this process listens, every NOTIFY in the database wakes its
        // backend and this process, which a process that only takes free
        // locks need not pay for.
        Ok(store)
    }

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
        self.create_schema(&client).await?;
        let s = &self.inner.schema;
        let prep = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await.map_err(pg_err) }
        };
        let stmts = Statements {
            open: prep(format!(
                "INSERT INTO {s}.sessions (id, tag, label, ttl_ms, expires_ms) VALUES ($1, $2, $3, $4, {s}.now_ms() + $4)"
            ))
            .await?,
            keep_alive: prep(format!(
                "UPDATE {s}.sessions SET expires_ms = {s}.now_ms() + ttl_ms WHERE id = $1 AND expires_ms > {s}.now_ms()"
            ))
            .await?,
            close: prep(format!("SELECT {s}.close($1)")).await?,
            join: prep(format!("SELECT * FROM {s}.join($1, $2, $3, $4, $5, $6, $7)")).await?,
            leave: prep(format!("SELECT * FROM {s}.leave($1, $2, $3)")).await?,
            look: prep(format!("SELECT * FROM {s}.look($1, $2, $3)")).await?,
            set_value: prep(format!("SELECT {s}.set_value($1, $2, $3, $4)")).await?,
            version: prep(format!("SELECT coalesce((SELECT version FROM {s}.names WHERE name = $1), 0)")).await?,
            rows: prep(format!(
                "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value, e.granted_ms,
                        s.expires_ms - {s}.now_ms(), e.holds,
                        (SELECT version FROM {s}.names WHERE name = $1)
                   FROM {s}.entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE e.name = $1 ORDER BY e.seq"
            ))
            .await?,
            refresh: prep(format!("SELECT {s}.refresh($1)")).await?,
            names: prep(format!(
                "SELECT DISTINCT e.name FROM {s}.entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE s.expires_ms > {s}.now_ms() AND left(e.name, length($1)) = $1 ORDER BY 1"
            ))
            .await?,
            evict: prep(format!("SELECT {s}.evict($1)")).await?,
        };
        let connected = Connected {
            client: Arc::new(client),
            stmts: Arc::new(stmts),
        };
        *slot = Some(connected.clone());
        Ok(connected)
    }

    /// Creates the schema once per database, or upgrades one of a version in
    /// [`UPGRADES_FROM`], under an advisory lock so that concurrent first
    /// users do not race. A newer schema is never rewritten.
    async fn create_schema(&self, client: &Client) -> Result<()> {
        let s = &self.inner.schema;
        let select = format!("SELECT value FROM {s}.meta WHERE key = 'schema'");
        if let Ok(Some(row)) = client.query_opt(&select, &[]).await {
            let v: String = col(&row, 0)?;
            if !UPGRADES_FROM.contains(&v.as_str()) {
                return self.check_version(&v);
            }
        }
        client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock(hashtext('tenure schema {s}'));
                 CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL);"
            ))
            .await
            .map_err(pg_err)?;
        // Read again under the lock: another user may have just done it.
        let found = client.query_opt(&select, &[]).await.map_err(pg_err)?;
        if let Some(v) = found.map(|row| col::<String>(&row, 0)).transpose()? {
            if !UPGRADES_FROM.contains(&v.as_str()) {
                client.batch_execute("COMMIT").await.map_err(pg_err)?;
                return self.check_version(&v);
            }
        }
        let ddl = SCHEMA_SQL.replace("@s", s);
        client
            .batch_execute(&format!(
                "{ddl}
                 INSERT INTO {s}.meta (key, value) VALUES ('schema', '{SCHEMA_VERSION}')
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
                 COMMIT;"
            ))
            .await
            .map_err(pg_err)
    }

    fn check_version(&self, v: &str) -> Result<()> {
        if v != SCHEMA_VERSION {
            return Err(Error::SchemaMismatch {
                backend: BACKEND,
                url: self.inner.url.clone(),
                found: format!("schema {} has tenure schema version {v}", self.inner.schema),
                expected: format!("version {SCHEMA_VERSION}"),
            });
        }
        Ok(())
    }

    /// Runs one statement, retrying deadlocks; one round trip normally.
    async fn query(
        &self,
        pick: fn(&Statements) -> &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let mut attempt = 0;
        loop {
            let c = self.connected().await?;
            match c.client.query(pick(&c.stmts), params).await {
                Ok(rows) => return Ok(rows),
                Err(e) if is_retryable(&e) && attempt < RETRIES => attempt += 1,
                Err(e) => return Err(pg_err(e)),
            }
        }
    }

    async fn execute(
        &self,
        pick: fn(&Statements) -> &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64> {
        let c = self.connected().await?;
        c.client
            .execute(pick(&c.stmts), params)
            .await
            .map_err(pg_err)
    }

    /// Listens for this schema's notifications on a connection of its own,
    /// started on first use and restarted if it drops.
    async fn ensure_listener(&self) {
        let mut listening = self.inner.listener.lock().await;
        if listening.as_ref().is_some_and(|c| !c.is_closed()) {
            return;
        }
        let (client, mut connection) = match self.connect_raw().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "no LISTEN connection; waiters poll");
                return;
            }
        };
        let listeners = self.inner.listeners.clone();
        let wake = format!("{}_wake", self.inner.schema);
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) if n.channel() == wake => {
                        // Payload: name TAB token.
                        let parsed = n.payload().rsplit_once('\t').and_then(|(name, seq)| {
                            seq.parse::<u64>()
                                .ok()
                                .map(|seq| poll::grant_key(name, seq))
                        });
                        if let Some(key) = parsed {
                            listeners.wake(&key);
                        }
                    }
                    Ok(AsyncMessage::Notification(n)) => {
                        listeners.wake(&poll::change_key(n.payload()))
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        let s = &self.inner.schema;
        match client
            .batch_execute(&format!("LISTEN {s}_wake; LISTEN {s}_change;"))
            .await
        {
            // Kept here: the connection lives as long as its client.
            Ok(()) => *listening = Some(client),
            Err(e) => tracing::debug!(error = %e, "LISTEN failed; waiters poll"),
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let secret = crate::store::random_hex(16)?;
        let tag = crate::store::random_hex(6)?;
        let ttl = i64::try_from(spec.ttl.as_millis()).unwrap_or(i64::MAX);
        self.execute(|s| &s.open, &[&secret, &tag, &spec.label, &ttl])
            .await?;
        Ok(OpenedSession {
            key: SessionKey::new(secret),
            tag,
        })
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let n = self
            .execute(|s| &s.keep_alive, &[&session.secret()])
            .await?;
        if n == 0 {
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        Ok(())
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.query(|s| &s.close, &[&session.secret()])
            .await
            .map(|_| ())
    }

    async fn join(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
    ) -> Result<Option<Joined>> {
        let (k, count, limit) = codec::kind_code(kind);
        let (count, limit) = (
            i32::try_from(count).unwrap_or(i32::MAX),
            i32::try_from(limit).unwrap_or(i32::MAX),
        );
        let if_granted = mode == JoinMode::IfGranted;
        let rows = self
            .query(
                |s| &s.join,
                &[
                    &session.secret(),
                    &name.as_str(),
                    &k,
                    &count,
                    &limit,
                    &value,
                    &if_granted,
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::backend(BACKEND, "join returned no row"))?;
        let status: String = col(row, 0)?;
        match status.as_str() {
            "ok" => Ok(Some(Joined {
                seq: to_u64(col(row, 1)?)?,
                granted: col(row, 2)?,
                holds: u32::try_from(col::<i32>(row, 3)?)
                    .map_err(|e| Error::backend(BACKEND, e))?,
                first: col(row, 4)?,
            })),
            "none" => Ok(None),
            s => Err(codec::status_error(BACKEND, s, None, name.as_str())),
        }
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        let rows = self
            .query(|s| &s.leave, &[&session.secret(), &name.as_str(), &seq])
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::backend(BACKEND, "leave returned no row"))?;
        let status: String = col(row, 0)?;
        if status != "ok" {
            return Err(codec::status_error(BACKEND, &status, None, name.as_str()));
        }
        u32::try_from(col::<i32>(row, 1)?).map_err(|e| Error::backend(BACKEND, e))
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.ensure_listener().await;
        let (listening, _) = self
            .inner
            .listeners
            .listen(poll::grant_key(name.as_str(), seq));
        let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        poll::until_granted(listening.notify(), POLL_MIN, POLL_MAX, || async {
            let rows = self
                .query(|s| &s.look, &[&session.secret(), &name.as_str(), &seq])
                .await?;
            let row = rows
                .first()
                .ok_or_else(|| Error::backend(BACKEND, "look returned no row"))?;
            let status: String = col(row, 0)?;
            match status.as_str() {
                "granted" => Ok(Look::Granted),
                "wait" => Ok(Look::Wait(poll::next_expiry(col(row, 1)?))),
                s => Err(codec::status_error(BACKEND, s, None, name.as_str())),
            }
        })
        .await
    }
    async fn set_value(
        &self,
        session: &SessionKey,
        name: &Name,
        seq: u64,
        value: &[u8],
    ) -> Result<()> {
        let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        let rows = self
            .query(
                |s| &s.set_value,
                &[&session.secret(), &name.as_str(), &seq, &value],
            )
            .await?;
        let status: String = rows
            .first()
            .ok_or_else(|| Error::backend(BACKEND, "set_value returned no row"))
            .and_then(|row| col(row, 0))?;
        if status == "ok" {
            Ok(())
        } else {
            Err(codec::status_error(BACKEND, &status, None, name.as_str()))
        }
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        loop {
            let rows = self.query(|s| &s.rows, &[&name.as_str()]).await?;
            let mut entries = Vec::with_capacity(rows.len());
            let mut stale = false;
            let mut version = None;
            for row in &rows {
                version = col::<Option<i64>>(row, 10)?;
                let left: i64 = col(row, 8)?;
                if left <= 0 {
                    stale = true;
                    continue;
                }
                let granted_ms: Option<i64> = col(row, 7)?;
                entries.push(Entry {
                    seq: to_u64(col(row, 0)?)?,
                    kind: codec::kind_from_code(
                        BACKEND,
                        col::<i16>(row, 1)?.into(),
                        col::<i32>(row, 2)?.into(),
                        col::<i32>(row, 3)?.into(),
                    )?,
                    session_tag: col(row, 4)?,
                    label: col(row, 5)?,
                    value: col(row, 6)?,
                    granted: granted_ms.is_some(),
                    granted_at: granted_ms
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                    expires_in: Duration::from_millis(to_u64(left)?),
                    holds: u32::try_from(col::<i32>(row, 9)?)
                        .map_err(|e| Error::backend(BACKEND, e))?,
                });
            }
            let unstamped = poll::has_unstamped_grant(&entries);
            if stale || unstamped {
                self.query(|s| &s.refresh, &[&name.as_str()]).await?;
                continue;
            }
            let version = match version {
                Some(v) => v,
                None => self
                    .query(|s| &s.version, &[&name.as_str()])
                    .await?
                    .first()
                    .map(|r| col::<i64>(r, 0))
                    .transpose()?
                    .unwrap_or(0),
            };
            return Ok(Queue {
                version: to_u64(version)?,
                entries,
            });
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.ensure_listener().await;
        let (listening, _) = self.inner.listeners.listen(poll::change_key(name.as_str()));
        poll::until_changed(self, name, version, listening.notify(), POLL_MIN, POLL_MAX).await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let rows = self.query(|s| &s.names, &[&prefix]).await?;
        rows.iter()
            .map(|r| Name::new(col::<String>(r, 0)?))
            .collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let rows = self.query(|s| &s.evict, &[&name.as_str()]).await?;
        let n: i32 = rows
            .first()
            .ok_or_else(|| Error::backend(BACKEND, "evict returned no row"))
            .and_then(|row| col(row, 0))?;
        usize::try_from(n).map_err(|e| Error::backend(BACKEND, e))
    }
}
