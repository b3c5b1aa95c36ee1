//! The schema: tables and procedures under a prefix (`mysql.sql`),
//! versioned in `PREFIXmeta`, created or upgraded under `GET_LOCK`.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::Row;

use super::connect::my_err;
use super::driver::to_row;
use super::statements::with_prefix;
use crate::backend::sql::SqlSchema;
use crate::error::Result;

const SCHEMA_SQL: &str = include_str!("mysql.sql");
pub(super) const SCHEMA_VERSION: &str = "10";

/// What format 11 adds beside format 10, whose marker (`meta.schema` =
/// `10`) builds of 0.1.0 require and which stays as it is: the build that
/// opened each session, gone with the session.
const FORMAT_11_SQL: &str = "CREATE TABLE IF NOT EXISTS @psession_builds (
    session CHAR(32) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    build VARCHAR(64) NOT NULL,
    FOREIGN KEY (session) REFERENCES @psessions (id) ON DELETE CASCADE
) ENGINE=InnoDB";
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
pub(super) const UPGRADES_FROM: &[&str] = &["1", "2", "3", "4", "5", "6", "7", "8", "9"];

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

/// Tables and procedures under a prefix, versioned in `PREFIXmeta`, created
/// under `GET_LOCK`.
pub(super) struct MysqlSchema<'a> {
    pub(super) conn: mysql_async::Conn,
    pub(super) prefix: &'a str,
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

    async fn additions_present(&mut self) -> Result<bool> {
        let table = format!("{}session_builds", self.prefix);
        let row: Option<Row> = self
            .conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.TABLES
                  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (table,),
            )
            .await
            .map_err(my_err)?;
        match row {
            Some(row) => Ok(to_row(row)?.int(0)? > 0),
            None => Ok(false),
        }
    }

    async fn add_additions(&mut self) -> Result<()> {
        let ddl = with_prefix(FORMAT_11_SQL, self.prefix);
        self.conn.query_drop(ddl).await.map_err(my_err)
    }
}
