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

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Row, Value};

use super::poll::{self, Listeners};
use super::sql::{Arg, Cell, SqlDriver, SqlRow, SqlSchema, SqlStore};
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{Capabilities, Wake};

const BACKEND: &str = "mysql";
const SCHEMA_SQL: &str = include_str!("mysql.sql");
const SCHEMA_VERSION: &str = "10";
/// Schema versions this build upgrades in place (the procedures are
/// replaced; version 4 adds the fences' and cells' table, 5 a renewal
/// counter, and ends a session only when a watcher confirms it, never by
/// the server's clock; 6 adds `evict_session`, ending one session by its
/// tag; 7 runs fewer statements per join and release; 8 keeps a lone
/// holder in its name's row; 9 answers a release with the entries it
/// granted, and a waiter's usual look takes no lock; 10 answers a queued
/// join with what the waiter's first look would). The upgrade is
/// one-way: a build of an older version then refuses
/// the tables.
const UPGRADES_FROM: &[&str] = &["1", "2", "3", "4", "5", "6", "7", "8", "9"];
const NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)";
/// Takes a name nobody holds or waits for (`queued` false) for a live
/// session: the lone holder goes into the name's row, with the next token.
/// One plain statement instead of `join`'s `CALL`, which costs MariaDB a
/// dozen statements; it changes no row when that case does not apply (a
/// name never used, held, queued on, or a session ended), and the `CALL`
/// decides. The token comes back in the answer's last-insert id
/// (`LAST_INSERT_ID(expr)`), so no second read is needed; `h_seq` takes it
/// from there: the server evaluates the SET list left to right, and
/// `LAST_INSERT_ID()` reads the value just set whether a later assignment
/// sees the row's new values or its old ones (MariaDB's
/// `SIMULTANEOUS_ASSIGNMENT`). The session's row is read with a shared
/// lock (at any isolation level: the clause is explicit), held until the
/// statement commits: an ending of the session (a close, an eviction, a
/// confirmed expiry, a collection: all write that row) waits for this
/// grant, or commits first and is read here. A grant to a session ended
/// while this waited for the name's row cannot happen. (An ending that
/// listed the session's names before this committed misses the new row
/// holder, which is then dead: the next join of the name drops it, as it
/// drops any holder of an ended session.) MariaDB takes that lock while
/// it plans the statement, before the name's row: the reverse of the
/// procedures' order, so a procedure that ends the session, or a renewal
/// queued behind a join, can deadlock with this; the server rolls one
/// back at once, a `CALL` is retried, this falls back to the `CALL`, a
/// renewal is retried by the session. The name's row is read at its
/// newest version once locked, as every `UPDATE` reads, so two of these
/// never both take a name. It commits on its own (autocommit): every
/// procedure ends the transaction it starts, so a pooled connection never
/// has one open (see `parse_url`). Parameters: secret, kind, count, limit,
/// value, name, secret.
const FAST_JOIN: &str = "UPDATE @pnames
    SET last_seq = LAST_INSERT_ID(last_seq + 1), h_seq = LAST_INSERT_ID(), version = version + 1,
        h_session = ?, h_kind = ?, h_count = ?, h_lim = ?, h_value = ?, h_granted_ms = @pnow_ms()
  WHERE name = ? AND h_session IS NULL AND NOT queued
    AND (SELECT s.expires_ms FROM @psessions s WHERE s.id = ? LOCK IN SHARE MODE) > 0";
/// Releases the row holder of a live session, one plain statement; no row
/// changed when that is not the case (an entry in `entries`, a session
/// ended or gone), and `leave`'s `CALL` decides, so that an ended
/// session's release reads "lost". Parameters: name, seq, secret, secret.
const FAST_LEAVE: &str = "UPDATE @pnames
    SET h_seq = NULL, h_session = NULL, h_value = NULL, version = version + 1
  WHERE name = ? AND h_seq = ? AND h_session = ?
    AND (SELECT s.expires_ms FROM @psessions s WHERE s.id = ? LOCK IN SHARE MODE) > 0";
/// The take of a free name and the release of a lone holder, with the
/// prefix `prefix` and the clock filled in, as the driver prepares them;
/// public only for the bench's shapes (`bench/benches/shapes.rs`), which
/// run them raw and strip them down. Not an API.
#[doc(hidden)]
pub fn fast_statements(prefix: &str) -> (String, String) {
    (
        with_prefix(FAST_JOIN, prefix),
        with_prefix(FAST_LEAVE, prefix),
    )
}
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const RETRIES: usize = 5;

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
    /// [`FAST_JOIN`] and [`FAST_LEAVE`] under this prefix.
    fast_join: String,
    fast_leave: String,
}

store_debug!(Mysql: url, prefix);

fn my_err(e: mysql_async::Error) -> Error {
    match &e {
        mysql_async::Error::Server(s) if s.code == 1045 || s.code == 1044 => Error::Auth {
            backend: BACKEND,
            reason: s.message.clone(),
        },
        mysql_async::Error::Server(s) if matches!(s.code, 1205 | 1213 | 1040 | 1053) => {
            Error::unavailable(BACKEND, e)
        }
        // A certificate that is not trusted, or names another host: trying
        // again does not help.
        #[cfg(feature = "tls")]
        mysql_async::Error::Io(mysql_async::IoError::Tls(t)) => {
            Error::backend(BACKEND, format!("TLS: {t}"))
        }
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Error::unavailable(BACKEND, e),
        _ => Error::backend(BACKEND, e),
    }
}

fn is_retryable(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == 1213 || s.code == 1205)
}

fn parse_url(url: &StoreUrl) -> Result<(mysql_async::Opts, String)> {
    let prefix = match url.option("prefix") {
        None => "tenure_",
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 32
                && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(url.invalid(format!(
                    "prefix must be 1-32 of A-Z, a-z, 0-9 and _, not {v:?}"
                )));
            }
            v
        }
    };
    // mysql_async knows only mysql://, also for MariaDB.
    let cleaned = format!(
        "mysql://{}{}{}{}",
        url.userinfo_as_written(),
        url.authority(),
        url.path(),
        url.driver_query(&["prefix", "ssl-mode", "ssl-ca"])
    );
    let opts = mysql_async::Opts::from_url(&cleaned).map_err(|e| url.invalid(e.to_string()))?;
    // No reset when a connection goes back to the pool: a reset is one more
    // round trip and drops the connection's prepared statements, so every
    // CALL was prepared again; with it a lock + release cost MariaDB 2.4
    // times the CPU (1.77 against 0.71 ms, one bench run). What a
    // connection keeps between calls is harmless: every path of every
    // procedure ends the transaction it starts with COMMIT or ROLLBACK
    // (which the one-statement take and release rely on to commit)
    // (the driver cannot see one opened inside a procedure, so that rule
    // is what keeps a pooled connection clean; a call cut off midway
    // drops its connection), and `group_concat_max_len`, raised by the
    // procedures that list a queue, stays raised. The schema's connection,
    // which takes a named lock, is reset on its own.
    let pool = opts.pool_opts().clone().with_reset_connection(false);
    let opts: mysql_async::Opts = mysql_async::OptsBuilder::from_opts(opts)
        .ssl_opts(ssl_opts(url)?)
        .pool_opts(pool)
        .into();
    if opts.db_name().is_none() {
        return Err(url.invalid("no database: use mysql://user:password@host:port/DATABASE"));
    }
    Ok((opts, prefix.to_string()))
}

/// TLS as the MySQL client's own options say (`ssl-mode`, `ssl-ca`):
/// DISABLED (the default), REQUIRED (encrypted, the certificate not
/// checked), VERIFY_CA (signed by `ssl-ca` or a system root), or
/// VERIFY_IDENTITY (that, and for this host). PREFERRED, which falls back to
/// plain text without a word, is refused.
fn ssl_opts(url: &StoreUrl) -> Result<Option<mysql_async::SslOpts>> {
    let mode = url
        .option("ssl-mode")
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| "DISABLED".into());
    let ca = url.option("ssl-ca");
    if let Some(ca) = ca {
        if std::fs::metadata(ca).is_err() {
            return Err(url.invalid(format!("ssl-ca={ca:?} is not a readable file")));
        }
    }
    let checked = |verify_host: bool| -> Result<Option<mysql_async::SslOpts>> {
        if !cfg!(feature = "tls") {
            return Err(Error::BackendDisabled {
                backend: "mysql over TLS",
                feature: "tls",
            });
        }
        let mut ssl = mysql_async::SslOpts::default();
        if let Some(ca) = ca {
            ssl = ssl.with_root_certs(vec![std::path::PathBuf::from(ca).into()]);
        }
        Ok(Some(ssl.with_danger_skip_domain_validation(!verify_host)))
    };
    match mode.as_str() {
        "DISABLED" => Ok(None),
        "REQUIRED" => checked(false).map(|ssl| {
            ssl.map(|s| s.with_danger_accept_invalid_certs(true))
        }),
        "VERIFY_CA" => checked(false),
        "VERIFY_IDENTITY" => checked(true),
        "PREFERRED" => Err(url.invalid(
            "ssl-mode=PREFERRED falls back to plain text silently: choose REQUIRED, VERIFY_CA, VERIFY_IDENTITY or DISABLED",
        )),
        other => Err(url.invalid(format!(
            "ssl-mode={other:?}: one of DISABLED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
        ))),
    }
}

/// A value as the core reads it.
fn to_cell(value: Value) -> Result<Cell> {
    Ok(match value {
        Value::NULL => Cell::Null,
        Value::Int(v) => Cell::Int(v),
        Value::UInt(v) => Cell::Int(i64::try_from(v).map_err(|e| Error::backend(BACKEND, e))?),
        Value::Bytes(v) => Cell::Bytes(v),
        other => {
            return Err(Error::backend(
                BACKEND,
                format!("unexpected value {other:?}"),
            ))
        }
    })
}

fn to_row(row: Row) -> Result<SqlRow> {
    // `Row::unwrap` hands over the values; it panics only for a column
    // taken out before (`Row::take`), which nothing here does.
    row.unwrap()
        .into_iter()
        .map(to_cell)
        .collect::<Result<_>>()
        .map(|cells| SqlRow::new(BACKEND, cells))
}

fn to_value(arg: &Arg<'_>) -> Value {
    match *arg {
        Arg::Text(v) => v.into(),
        Arg::Int(v) => v.into(),
        Arg::Bytes(v) => v.to_vec().into(),
        Arg::Flag(v) => v.into(),
        Arg::Null => Value::NULL,
    }
}

/// A statement of this file's with its prefix and clock filled in.
fn with_prefix(sql: &str, prefix: &str) -> String {
    sql.replace("@pnow_ms()", NOW_MS).replace("@p", prefix)
}

/// The schema version recorded under prefix `p`; `None` before the first
/// user created the tables.
async fn stored_version(conn: &mut mysql_async::Conn, p: &str) -> Result<Option<String>> {
    // A row, not a typed value: mysql_async panics on a value it cannot
    // convert. An error here is a missing table.
    let row: Option<Row> = conn
        .query_first(format!("SELECT v FROM {p}meta WHERE k = 'schema'"))
        .await
        .unwrap_or(None);
    match row {
        Some(row) => to_row(row)?.text(0).map(Some),
        None => Ok(None),
    }
}

impl MysqlStore {
    /// Opens a store from a `mysql://` URL (as [`crate::open`] does), typed.
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
        super::sql::ensure_schema(&mut schema, SCHEMA_VERSION, UPGRADES_FROM, mismatch).await?;
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

impl Mysql {
    async fn conn(&self) -> Result<mysql_async::Conn> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.inner.pool.get_conn())
            .await
            .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
            .map_err(my_err)
    }

    /// One statement's rows.
    async fn rows_of(&self, sql: String, args: &[Arg<'_>]) -> Result<Vec<SqlRow>> {
        let params: Vec<Value> = args.iter().map(to_value).collect();
        let mut conn = self.conn().await?;
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(my_err)?;
        rows.into_iter().map(to_row).collect()
    }

    async fn texts(&self, sql: String, args: &[Arg<'_>]) -> Result<Vec<String>> {
        self.rows_of(sql, args)
            .await?
            .iter()
            .map(|row| row.text(0))
            .collect()
    }
}

#[async_trait]
impl SqlDriver for Mysql {
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
        self.call("open", &args).await.map(|_| ())
    }

    async fn keep_alive(&self, secret: &str) -> Result<bool> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("UPDATE {p}sessions SET expires_ms = {NOW_MS} + ttl_ms, renewals = renewals + 1 WHERE id = ? AND expires_ms > 0"),
            (secret,),
        )
        .await
        .map_err(my_err)?;
        Ok(conn.affected_rows() > 0)
    }

    /// One CALL (one round trip): its first row. Deadlocks are retried.
    async fn call(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<SqlRow> {
        let placeholders = vec!["?"; args.len()].join(", ");
        let sql = format!("CALL {}{routine}({placeholders})", self.inner.prefix);
        let params: Vec<Value> = args.iter().map(to_value).collect();
        let row = poll::retry_at_once(RETRIES, is_retryable, my_err, || async {
            let mut conn = self.conn().await?;
            Ok(conn.exec_first::<Row, _, _>(&sql, params.clone()).await)
        })
        .await?;
        let row =
            row.ok_or_else(|| Error::backend(BACKEND, format!("{routine} returned no row")))?;
        to_row(row)
    }

    async fn fast(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<Option<SqlRow>> {
        // The core's order: secret, name, then join's kind, count, limit,
        // value (its "only if granted" changes nothing here: this grants or
        // does nothing), or leave's seq.
        let (sql, params) = match (routine, args) {
            ("join", [secret, name, kind, count, limit, value, ..]) => (
                &self.inner.fast_join,
                [secret, kind, count, limit, value, name, secret]
                    .map(to_value)
                    .to_vec(),
            ),
            ("leave", [secret, name, seq]) => (
                &self.inner.fast_leave,
                [name, seq, secret, secret].map(to_value).to_vec(),
            ),
            _ => return Ok(None),
        };
        let mut conn = self.conn().await?;
        match conn.exec_drop(sql, params).await {
            Ok(()) => {}
            // A deadlock or a lock wait that timed out: the CALL decides
            // (and retries).
            Err(e) if is_retryable(&e) => return Ok(None),
            Err(e) => return Err(my_err(e)),
        }
        if conn.affected_rows() != 1 {
            return Ok(None);
        }
        let cells = if routine == "join" {
            // One row changed, so `LAST_INSERT_ID(expr)` ran, and the
            // answer carries its value (the driver reports only 0 as none,
            // and a token is at least 1).
            let seq = conn
                .last_insert_id()
                .and_then(|seq| i64::try_from(seq).ok())
                .ok_or_else(|| Error::backend(BACKEND, "a take's answer without its token"))?;
            // As `join` answers: status, seq, granted, holds, first.
            vec![
                Cell::Text("ok".into()),
                Cell::Int(seq),
                Cell::Flag(true),
                Cell::Int(1),
                Cell::Flag(seq == 1),
            ]
        } else {
            // As `leave` answers a lone holder's release: nothing granted.
            vec![Cell::Text("ok".into()), Cell::Int(0)]
        };
        Ok(Some(SqlRow::new(BACKEND, cells)))
    }

    fn has_fast_paths(&self) -> bool {
        true
    }

    async fn rows(&self, name: &str) -> Result<(Vec<SqlRow>, i64)> {
        let p = &self.inner.prefix;
        let rows = self
            .rows_of(
                format!(
                    "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value, e.granted_ms,
                            IF(s.expires_ms <= 0, -1, GREATEST(s.expires_ms - {NOW_MS}, 0)), e.holds
                       FROM {p}entries e JOIN {p}sessions s ON s.id = e.session
                      WHERE e.name = ?
                     UNION ALL
                     SELECT n.h_seq, n.h_kind, n.h_count, n.h_lim, s.tag, s.label, n.h_value, n.h_granted_ms,
                            IF(s.expires_ms <= 0, -1, GREATEST(s.expires_ms - {NOW_MS}, 0)), 1
                       FROM {p}names n JOIN {p}sessions s ON s.id = n.h_session
                      WHERE n.name = ?
                      ORDER BY 1"
                ),
                &[Arg::Text(name), Arg::Text(name)],
            )
            .await?;
        let version = self
            .rows_of(
                format!("SELECT version FROM {p}names WHERE name = ?"),
                &[Arg::Text(name)],
            )
            .await?
            .first()
            .map(|row| row.int(0))
            .transpose()?
            .unwrap_or(0);
        Ok((rows, version))
    }

    async fn names(&self, prefix: &str) -> Result<Vec<String>> {
        let p = &self.inner.prefix;
        self.texts(
            format!(
                "SELECT e.name FROM {p}entries e JOIN {p}sessions s ON s.id = e.session
                  WHERE s.expires_ms > 0 AND LEFT(e.name, CHAR_LENGTH(?)) = ?
                 UNION
                 SELECT n.name FROM {p}names n JOIN {p}sessions s ON s.id = n.h_session
                  WHERE s.expires_ms > 0 AND LEFT(n.name, CHAR_LENGTH(?)) = ? ORDER BY 1"
            ),
            &[
                Arg::Text(prefix),
                Arg::Text(prefix),
                Arg::Text(prefix),
                Arg::Text(prefix),
            ],
        )
        .await
    }

    async fn names_of(&self, secret: &str) -> Result<Vec<String>> {
        let p = &self.inner.prefix;
        self.texts(
            format!(
                "SELECT name FROM {p}entries WHERE session = ?
                 UNION SELECT name FROM {p}names WHERE h_session = ?"
            ),
            &[Arg::Text(secret), Arg::Text(secret)],
        )
        .await
    }

    async fn names_of_tag(&self, tag: &str) -> Result<Vec<String>> {
        let p = &self.inner.prefix;
        // Compared as bytes, as `evict_session` compares them.
        self.texts(
            format!(
                "SELECT e.name FROM {p}entries e JOIN {p}sessions s ON s.id = e.session
                  WHERE CAST(s.tag AS BINARY) = CAST(? AS BINARY) AND s.expires_ms > 0
                 UNION
                 SELECT n.name FROM {p}names n JOIN {p}sessions s ON s.id = n.h_session
                  WHERE CAST(s.tag AS BINARY) = CAST(? AS BINARY) AND s.expires_ms > 0"
            ),
            &[Arg::Text(tag), Arg::Text(tag)],
        )
        .await
    }

    fn wakes_by_hand(&self) -> bool {
        true
    }

    fn poll_bounds(&self) -> (Duration, Duration) {
        (POLL_MIN, POLL_MAX)
    }
}

/// Tables and procedures under a prefix, versioned in `PREFIXmeta`, created
/// under `GET_LOCK`.
struct MysqlSchema<'a> {
    conn: mysql_async::Conn,
    prefix: &'a str,
}

impl MysqlSchema<'_> {
    fn lock_name(&self) -> String {
        format!("tenure schema {}", self.prefix)
    }
}

#[async_trait]
impl SqlSchema for MysqlSchema<'_> {
    async fn stored_version(&mut self) -> Result<Option<String>> {
        stored_version(&mut self.conn, self.prefix).await
    }

    async fn lock(&mut self) -> Result<()> {
        // A row, not a typed value: mysql_async panics on a value it cannot
        // convert (GET_LOCK answers NULL on an error).
        let name = self.lock_name();
        let _: Option<Row> = self
            .conn
            .exec_first("SELECT GET_LOCK(?, 30)", (name,))
            .await
            .map_err(my_err)?;
        Ok(())
    }

    async fn apply(&mut self, version: &str) -> Result<()> {
        let p = self.prefix;
        for statement in SCHEMA_SQL.split("\n;;\n") {
            let sql = with_prefix(statement, p);
            let sql = sql.trim();
            if sql
                .lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with("--"))
            {
                continue;
            }
            self.conn.query_drop(sql).await.map_err(my_err)?;
        }
        self.conn
            .exec_drop(
                format!(
                    "INSERT INTO {p}meta (k, v) VALUES ('schema', ?) ON DUPLICATE KEY UPDATE v = VALUES(v)"
                ),
                (version,),
            )
            .await
            .map_err(my_err)
    }

    async fn unlock(&mut self) -> Result<()> {
        let name = self.lock_name();
        let _ = self.conn.exec_drop("DO RELEASE_LOCK(?)", (name,)).await;
        Ok(())
    }
}
