//! The driver of the SQL core: arguments and answers converted, one `CALL`
//! per routine (deadlocks retried), the one-statement paths, and the plain
//! reads of queues and names.

use std::time::Duration;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Row, Value};

use super::connect::{is_retryable, my_err};
use super::statements::NOW_MS;
use super::{Mysql, BACKEND, POLL_MAX, POLL_MIN, RETRIES};
use crate::backend::poll;
use crate::backend::sql::{answered, Arg, Cell, SqlDriver, SqlRow};
use crate::error::{Error, Result};

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

pub(super) fn to_row(row: Row) -> Result<SqlRow> {
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

impl Mysql {
    /// `call`'s answer, or the error that says it has not come within
    /// [`CALL_TIMEOUT`](crate::backend::sql::CALL_TIMEOUT). The connection
    /// it went on is dropped with the call: the pool reads the answer the
    /// statement still owes, or discards the connection, before it hands
    /// that connection out again.
    pub(super) async fn within<T>(&self, call: impl std::future::Future<Output = T>) -> Result<T> {
        answered(BACKEND, call).await
    }

    /// One statement's rows.
    async fn rows_of(&self, sql: String, args: &[Arg<'_>]) -> Result<Vec<SqlRow>> {
        let params: Vec<Value> = args.iter().map(to_value).collect();
        let mut conn = self.conn().await?;
        let rows: Vec<Row> = self.within(conn.exec(sql, params)).await?.map_err(my_err)?;
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

    async fn open(
        &self,
        secret: &str,
        tag: &str,
        label: &str,
        ttl_ms: i64,
        build: &str,
    ) -> Result<()> {
        let p = &self.inner.prefix;
        let (open, record) = (
            format!("CALL {p}open(?, ?, ?, ?)"),
            format!(
                "INSERT INTO {p}session_builds (session, build) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE build = VALUES(build)"
            ),
        );
        // One transaction: the session and its build's record, both or
        // neither (a transaction left unfinished is rolled back).
        poll::retry_at_once(RETRIES, is_retryable, my_err, || async {
            let mut conn = self.conn().await?;
            self.within(async {
                let mut tx = conn.start_transaction(mysql_async::TxOpts::default()).await?;
                tx.exec_drop(&open, (secret, tag, label, ttl_ms)).await?;
                tx.exec_drop(&record, (secret, build)).await?;
                tx.commit().await
            })
            .await
        })
        .await
    }

    fn format(&self) -> &'static str {
        super::FORMAT
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        self.within(conn.exec_drop(
            format!("UPDATE {p}meta SET v = ? WHERE k = 'schema' AND v = ?"),
            (super::FORMAT, super::schema::SCHEMA_VERSION),
        ))
        .await?
        .map_err(my_err)?;
        Ok(if conn.affected_rows() > 0 {
            vec![format!(
                "tables {p}*: marker {} -> {} (builds of 0.1.0 refuse them from their next start)",
                super::schema::SCHEMA_VERSION,
                super::FORMAT
            )]
        } else {
            Vec::new()
        })
    }

    async fn session_builds(&self) -> Result<Vec<(String, String, Option<String>)>> {
        let p = &self.inner.prefix;
        let rows = self
            .rows_of(
                format!(
                    "SELECT s.tag, s.label, b.build FROM {p}sessions s
                       LEFT JOIN {p}session_builds b ON b.session = s.id
                      WHERE s.expires_ms > 0 ORDER BY s.tag"
                ),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((r.text(0)?, r.text(1)?, r.opt_text(2)?)))
            .collect()
    }

    async fn keep_alive(&self, secret: &str) -> Result<bool> {
        let p = &self.inner.prefix;
        let mut conn = self.conn().await?;
        self.within(conn.exec_drop(
            format!("UPDATE {p}sessions SET expires_ms = {NOW_MS} + ttl_ms, renewals = renewals + 1 WHERE id = ? AND expires_ms > 0"),
            (secret,),
        ))
        .await?
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
            self.within(conn.exec_first::<Row, _, _>(&sql, params.clone()))
                .await
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
        match self.within(conn.exec_drop(sql, params)).await? {
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
