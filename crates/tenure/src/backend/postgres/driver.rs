//! The driver of the SQL core: arguments and answers converted, statements
//! run (deadlocks and serialization failures retried), the one-statement
//! paths.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Statement;

use super::connect::{is_retryable, pg_err, Connected};
use super::listen::grant_proof;
use super::statements::Statements;
use super::{Postgres, BACKEND, POLL_MAX, POLL_MIN, RETRIES};
use crate::backend::poll;
use crate::backend::sql::{answered, Arg, Cell, SqlDriver, SqlRow};
use crate::error::{Error, Result};

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

impl Postgres {
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
            self.answered(&c, c.client.query(statement, &refs)).await
        })
        .await
    }

    /// `call`'s answer on the connection `c`, or, when it has not come
    /// within [`CALL_TIMEOUT`](crate::backend::sql::CALL_TIMEOUT), the
    /// error that says so; the connection is then given up (the next call
    /// opens another), since the answers it owes would come late, if ever.
    pub(super) async fn answered<T>(
        &self,
        c: &Connected,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        let answer = answered(BACKEND, call).await;
        if answer.is_err() {
            // Marked, not taken out of its slot: that would wait for a
            // call that is connecting meanwhile.
            c.given_up
                .store(true, std::sync::atomic::Ordering::Release);
        }
        answer
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

    async fn open(
        &self,
        secret: &str,
        tag: &str,
        label: &str,
        ttl_ms: i64,
        build: &str,
    ) -> Result<()> {
        let args = [
            Arg::Text(secret),
            Arg::Text(tag),
            Arg::Text(label),
            Arg::Int(ttl_ms),
            Arg::Text(build),
        ];
        self.query(|s| Ok(&s.open), &args).await.map(|_| ())
    }

    async fn keep_alive(&self, secret: &str) -> Result<bool> {
        let c = self.connected().await?;
        let n = self
            .answered(&c, c.client.execute(&c.stmts.keep_alive, &[&secret]))
            .await?
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

    fn format(&self) -> &'static str {
        super::FORMAT
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        let c = self.connected().await?;
        let s = &self.inner.schema;
        let update = format!("UPDATE {s}.meta SET value = $1 WHERE key = 'schema' AND value = $2");
        let changed = self
            .answered(
                &c,
                c.client
                    .execute(&update, &[&super::FORMAT, &super::schema::SCHEMA_VERSION]),
            )
            .await?
            .map_err(pg_err)?;
        Ok(if changed > 0 {
            vec![format!(
                "schema {s}: marker {} -> {} (builds of 0.1.0 refuse it from their next connection)",
                super::schema::SCHEMA_VERSION,
                super::FORMAT
            )]
        } else {
            Vec::new()
        })
    }

    async fn session_builds(&self) -> Result<Vec<(String, String, Option<String>)>> {
        let rows = self.query(|s| Ok(&s.session_builds), &[]).await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| Error::backend(BACKEND, e))
    }

    async fn listen(&self) -> bool {
        self.listen_for_notifications().await
    }

    fn grant_proof(&self, secret: &str, seq: u64) -> Option<String> {
        grant_proof(secret, seq)
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
