//! The schema: tables and functions in their own PostgreSQL schema
//! (`postgres.sql`), versioned in `SCHEMA.meta`, created or upgraded under
//! an advisory lock.

use async_trait::async_trait;
use tokio_postgres::Client;

use super::connect::pg_err;
use super::BACKEND;
use crate::backend::sql::SqlSchema;
use crate::error::{Error, Result};

const SCHEMA_SQL: &str = include_str!("postgres.sql");
pub(super) const SCHEMA_VERSION: &str = "10";

/// What format 11 adds beside format 10, whose marker (`meta.schema` =
/// `10`) builds of 0.1.0 require and which stays as it is: the build that
/// opened each session, gone with the session.
const FORMAT_11_SQL: &str = "CREATE TABLE IF NOT EXISTS @s.session_builds (
    session text PRIMARY KEY REFERENCES @s.sessions (id) ON DELETE CASCADE,
    build text NOT NULL);";
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
pub(super) const UPGRADES_FROM: &[&str] = &["1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The schema in its own PostgreSQL schema, versioned in `SCHEMA.meta`,
/// created under a transaction-scoped advisory lock.
pub(super) struct PgSchema<'a> {
    pub(super) client: &'a Client,
    pub(super) schema: &'a str,
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

    async fn additions_present(&mut self) -> Result<bool> {
        let s = self.schema;
        let row = self
            .client
            .query_one(
                &format!("SELECT to_regclass('{s}.session_builds') IS NOT NULL"),
                &[],
            )
            .await
            .map_err(pg_err)?;
        row.try_get(0).map_err(|e| Error::backend(BACKEND, e))
    }

    async fn add_additions(&mut self) -> Result<()> {
        let ddl = FORMAT_11_SQL.replace("@s", self.schema);
        self.client.batch_execute(&ddl).await.map_err(pg_err)
    }
}
