//! `mysql://user:password@host:port/db[?prefix=NAME_]` (also `mariadb://`):
//! one stored-procedure CALL per operation (one round trip, one
//! transaction), expiry by the server's clock (`SYSDATE(3)`). Nothing can
//! notify a waiter, so waiters poll with a backoff (never past the next
//! expiry ahead of them); in this process a release wakes its next waiter
//! directly.
//!
//! Tables and procedures carry a prefix (default `tenure_`), are created on
//! first use under `GET_LOCK`, idempotently, and versioned in `PREFIXmeta`.
//! Fencing counters are plain columns, not `AUTO_INCREMENT` (which InnoDB may
//! reuse after a restart), so tokens never go back.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Row, Value};

use super::codec;
use super::poll::{self, Listeners, Look};
use super::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, Entry, EntryKind, JoinMode, Joined, Name, OpenedSession, Queue, SessionKey,
    SessionSpec, Store, Wake,
};

const BACKEND: &str = "mysql";
const SCHEMA_SQL: &str = include_str!("mysql.sql");
const SCHEMA_VERSION: &str = "2";
/// Schema versions this build upgrades in place (the tables are the same;
/// the procedures are replaced). The upgrade is one-way: a build of an older
/// version then refuses the tables.
const UPGRADES_FROM: &[&str] = &["1"];
const NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)";
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const RETRIES: usize = 5;

/// How this backend reads its URL (the one parser: [`super::url`]).
// Besides our own options, the driver's own that we pass on.
pub(crate) const URL: UrlRules = UrlRules::servers(&[
    "prefix",
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
        backend: BACKEND,
        fencing: true,
        durable: true,
        multi_process: true,
        fifo: true,
        shared: true,
        permits: true,
        wake: Wake::LocalOrPoll {
            min: POLL_MIN,
            max: POLL_MAX,
        },
        clock: "the server's SYSDATE(3)",
        min_ttl: Duration::from_millis(100),
        max_ttl: Duration::from_secs(7 * 24 * 3600),
        grant_times: true,
        round_trips: "acquire: 1 (a CALL), release: 1, renew: 1",
    }
}

/// A store in one MySQL or MariaDB database.
#[derive(Clone)]
pub struct MysqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    prefix: String,
    url: String,
    caps: Capabilities,
    /// This process's waiters and observers, woken by changes made here.
    listeners: Listeners,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("url", &self.inner.url)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

fn my_err(e: mysql_async::Error) -> Error {
    match &e {
        mysql_async::Error::Server(s) if s.code == 1045 || s.code == 1044 => Error::Auth {
            backend: BACKEND,
            reason: s.message.clone(),
        },
        mysql_async::Error::Server(s) if matches!(s.code, 1205 | 1213 | 1040 | 1053) => {
            Error::unavailable(BACKEND, e)
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
        url.driver_query(&["prefix"])
    );
    let opts = mysql_async::Opts::from_url(&cleaned).map_err(|e| url.invalid(e.to_string()))?;
    if opts.db_name().is_none() {
        return Err(url.invalid("no database: use mysql://user:password@host:port/DATABASE"));
    }
    Ok((opts, prefix.to_string()))
}

/// Reads column `i` of a row, with a typed error instead of a panic.
fn col<T: mysql_async::prelude::FromValue>(row: &Row, i: usize) -> Result<T> {
    let value: Value = row
        .as_ref(i)
        .cloned()
        .ok_or_else(|| Error::backend(BACKEND, format!("reply has no column {i}")))?;
    mysql_async::from_value_opt(value)
        .map_err(|e| Error::backend(BACKEND, format!("column {i}: {e}")))
}

fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|e| Error::backend(BACKEND, e))
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
    row.map(|row| col::<String>(&row, 0)).transpose()
}

impl MysqlStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (opts, prefix) = parse_url(&url)?;
        let store = MysqlStore {
            inner: Arc::new(Inner {
                pool: Pool::new(opts),
                prefix,
                url: url.masked().to_string(),
                caps: capabilities(),
                listeners: Listeners::default(),
            }),
        };
        store.create_schema().await?;
        Ok(store)
    }

    async fn conn(&self) -> Result<mysql_async::Conn> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.inner.pool.get_conn())
            .await
            .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
            .map_err(my_err)
    }

    /// Creates the tables and procedures once per prefix, or upgrades those
    /// of a version in [`UPGRADES_FROM`], under a named lock so that
    /// concurrent first users do not race. A newer schema is never rewritten.
    async fn create_schema(&self) -> Result<()> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        if let Some(v) = stored_version(&mut conn, p).await? {
            if !UPGRADES_FROM.contains(&v.as_str()) {
                return self.check_version(&v);
            }
        }
        // A row, not a typed value: mysql_async panics on a value it cannot
        // convert (GET_LOCK answers NULL on an error).
        let _: Option<Row> = conn
            .exec_first("SELECT GET_LOCK(?, 30)", (format!("tenure schema {p}"),))
            .await
            .map_err(my_err)?;
        let result = async {
            // Read again under the lock: another user may have just done it.
            if let Some(v) = stored_version(&mut conn, p).await? {
                if !UPGRADES_FROM.contains(&v.as_str()) {
                    return Ok(());
                }
            }
            for statement in SCHEMA_SQL.split("\n;;\n") {
                let sql = statement.replace("@pnow_ms()", NOW_MS).replace("@p", p);
                let sql = sql.trim();
                if sql
                    .lines()
                    .all(|l| l.trim().is_empty() || l.trim_start().starts_with("--"))
                {
                    continue;
                }
                conn.query_drop(sql).await.map_err(my_err)?;
            }
            conn.exec_drop(
                format!(
                    "INSERT INTO {p}meta (k, v) VALUES ('schema', ?) ON DUPLICATE KEY UPDATE v = VALUES(v)"
                ),
                (SCHEMA_VERSION,),
            )
            .await
            .map_err(my_err)
        }
        .await;
        let _ = conn
            .exec_drop("DO RELEASE_LOCK(?)", (format!("tenure schema {p}"),))
            .await;
        result?;
        let v = stored_version(&mut conn, p).await?;
        self.check_version(v.as_deref().unwrap_or(""))
    }

    fn check_version(&self, v: &str) -> Result<()> {
        if v != SCHEMA_VERSION {
            return Err(Error::SchemaMismatch {
                backend: BACKEND,
                url: self.inner.url.clone(),
                found: format!("tables {}* have schema version {v:?}", self.inner.prefix),
                expected: format!("version {SCHEMA_VERSION}"),
            });
        }
        Ok(())
    }

    /// One CALL (one round trip): its first row. Deadlocks are retried.
    async fn call(&self, procedure: &str, params: Vec<Value>) -> Result<Row> {
        let placeholders = vec!["?"; params.len()].join(", ");
        let sql = format!("CALL {}{procedure}({placeholders})", self.inner.prefix);
        let mut attempt = 0;
        loop {
            let mut conn = self.conn().await?;
            match conn.exec_first::<Row, _, _>(&sql, params.clone()).await {
                Ok(Some(row)) => return Ok(row),
                Ok(None) => {
                    return Err(Error::backend(
                        BACKEND,
                        format!("{procedure} returned no row"),
                    ))
                }
                Err(e) if is_retryable(&e) && attempt < RETRIES => attempt += 1,
                Err(e) => return Err(my_err(e)),
            }
        }
    }

    /// Wakes this process's observers of `name`.
    fn changed(&self, name: &Name) {
        self.inner.listeners.wake(&poll::change_key(name.as_str()));
    }

    /// Wakes the first local waiter of `name` in queue order after a change
    /// made here: in FIFO order it is the one a release may have granted.
    /// Waiters behind it (several readers or permits granted at once) find out
    /// by polling; a herd of lookups would cost more than it saves.
    fn wake_next(&self, name: &Name) {
        self.inner
            .listeners
            .wake_first(&poll::grant_prefix(name.as_str()));
        self.changed(name);
    }
}

#[async_trait]
impl Store for MysqlStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let secret = crate::store::random_hex(16)?;
        let tag = crate::store::random_hex(6)?;
        let ttl = i64::try_from(spec.ttl.as_millis()).unwrap_or(i64::MAX);
        let label: String = spec.label.chars().take(255).collect();
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("INSERT INTO {p}sessions (id, tag, label, ttl_ms, expires_ms) VALUES (?, ?, ?, ?, {NOW_MS} + ?)"),
            (&secret, &tag, label, ttl, ttl),
        )
        .await
        .map_err(my_err)?;
        Ok(OpenedSession {
            key: SessionKey::new(secret),
            tag,
        })
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        conn.exec_drop(
            format!("UPDATE {p}sessions SET expires_ms = {NOW_MS} + ttl_ms WHERE id = ? AND expires_ms > {NOW_MS}"),
            (session.secret(),),
        )
        .await
        .map_err(my_err)?;
        if conn.affected_rows() == 0 {
            return Err(Error::SessionLost(crate::error::LostReason::Expired));
        }
        Ok(())
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let p = &self.inner.prefix;
        let names: Vec<String> = {
            let mut conn = self.conn().await?;
            let rows: Vec<Row> = conn
                .exec(
                    format!("SELECT DISTINCT name FROM {p}entries WHERE session = ?"),
                    (session.secret(),),
                )
                .await
                .map_err(my_err)?;
            rows.iter().map(|row| col(row, 0)).collect::<Result<_>>()?
        };
        self.call("close", vec![session.secret().into()]).await?;
        for name in names {
            if let Ok(name) = Name::new(name) {
                self.wake_next(&name);
            }
        }
        Ok(())
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
        let row = self
            .call(
                "join",
                vec![
                    session.secret().into(),
                    name.as_str().into(),
                    k.into(),
                    count.into(),
                    limit.into(),
                    value.to_vec().into(),
                    (mode == JoinMode::IfGranted).into(),
                ],
            )
            .await?;
        let status: String = col(&row, 0)?;
        match status.as_str() {
            "ok" => {
                let joined = Joined {
                    seq: to_u64(col(&row, 1)?)?,
                    granted: col::<i64>(&row, 2)? != 0,
                    holds: u32::try_from(col::<i64>(&row, 3)?)
                        .map_err(|e| Error::backend(BACKEND, e))?,
                    first: col::<i64>(&row, 4)? != 0,
                };
                self.changed(name);
                Ok(Some(joined))
            }
            "none" => Ok(None),
            s => Err(codec::status_error(BACKEND, s, None, name.as_str())),
        }
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let seq_i = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        let row = self
            .call(
                "leave",
                vec![session.secret().into(), name.as_str().into(), seq_i.into()],
            )
            .await?;
        let status: String = col(&row, 0)?;
        if status != "ok" {
            return Err(codec::status_error(BACKEND, &status, None, name.as_str()));
        }
        let holds = u32::try_from(col::<i64>(&row, 1)?).map_err(|e| Error::backend(BACKEND, e))?;
        if holds == 0 {
            // Whoever is next may be waiting in this process.
            self.wake_next(name);
        }
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let (listening, _) = self
            .inner
            .listeners
            .listen(poll::grant_key(name.as_str(), seq));
        let seq_i = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        poll::until_granted(listening.notify(), POLL_MIN, POLL_MAX, || async {
            let row = self
                .call(
                    "look",
                    vec![session.secret().into(), name.as_str().into(), seq_i.into()],
                )
                .await?;
            let status: String = col(&row, 0)?;
            match status.as_str() {
                "granted" => Ok(Look::Granted),
                "wait" => Ok(Look::Wait(poll::next_expiry(col(&row, 1)?))),
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
        let row = self
            .call(
                "set_value",
                vec![
                    session.secret().into(),
                    name.as_str().into(),
                    seq.into(),
                    value.to_vec().into(),
                ],
            )
            .await?;
        let status: String = col(&row, 0)?;
        if status != "ok" {
            return Err(codec::status_error(BACKEND, &status, None, name.as_str()));
        }
        self.changed(name);
        Ok(())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let p = self.inner.prefix.clone();
        loop {
            let (rows, version) = {
                let mut conn = self.conn().await?;
                let rows: Vec<Row> = conn
                    .exec(
                        format!(
                            "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value, e.granted_ms,
                                    s.expires_ms - {NOW_MS}, e.holds
                               FROM {p}entries e JOIN {p}sessions s ON s.id = e.session
                              WHERE e.name = ? ORDER BY e.seq"
                        ),
                        (name.as_str(),),
                    )
                    .await
                    .map_err(my_err)?;
                let version: Option<Row> = conn
                    .exec_first(
                        format!("SELECT version FROM {p}names WHERE name = ?"),
                        (name.as_str(),),
                    )
                    .await
                    .map_err(my_err)?;
                let version = version.map(|row| col::<i64>(&row, 0)).transpose()?;
                (rows, version.unwrap_or(0))
            };
            let mut entries = Vec::with_capacity(rows.len());
            let mut stale = false;
            for row in &rows {
                let left: i64 = col(row, 8)?;
                if left <= 0 {
                    stale = true;
                    continue;
                }
                let granted_ms: Option<i64> = col(row, 7)?;
                entries.push(Entry {
                    seq: to_u64(col(row, 0)?)?,
                    kind: codec::kind_from_code(BACKEND, col(row, 1)?, col(row, 2)?, col(row, 3)?)?,
                    session_tag: col(row, 4)?,
                    label: col(row, 5)?,
                    value: col(row, 6)?,
                    granted: granted_ms.is_some(),
                    granted_at: granted_ms
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                    expires_in: Duration::from_millis(to_u64(left)?),
                    holds: u32::try_from(col::<i64>(row, 9)?)
                        .map_err(|e| Error::backend(BACKEND, e))?,
                });
            }
            let unstamped = poll::has_unstamped_grant(&entries);
            if stale || unstamped {
                self.call("refresh", vec![name.as_str().into()]).await?;
                self.wake_next(name);
                continue;
            }
            return Ok(Queue {
                version: to_u64(version)?,
                entries,
            });
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let (listening, _) = self.inner.listeners.listen(poll::change_key(name.as_str()));
        poll::until_changed(self, name, version, listening.notify(), POLL_MIN, POLL_MAX).await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        let names: Vec<Row> = conn
            .exec(
                format!(
                    "SELECT DISTINCT e.name FROM {p}entries e JOIN {p}sessions s ON s.id = e.session
                      WHERE s.expires_ms > {NOW_MS} AND LEFT(e.name, CHAR_LENGTH(?)) = ? ORDER BY e.name"
                ),
                (prefix, prefix),
            )
            .await
            .map_err(my_err)?;
        names
            .iter()
            .map(|row| Name::new(col::<String>(row, 0)?))
            .collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let row = self.call("evict", vec![name.as_str().into()]).await?;
        let n: i64 = col(&row, 1)?;
        self.wake_next(name);
        usize::try_from(n).map_err(|e| Error::backend(BACKEND, e))
    }
}
