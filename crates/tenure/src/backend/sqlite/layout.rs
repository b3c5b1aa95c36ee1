//! The file's tables, created on first use and versioned in
//! `tenure_meta`, and the two clocks the statements read.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

pub(super) const SCHEMA_VERSION: i64 = 1;

/// The schema marker once an upgrade to format 2 is finished
/// ([`crate::upgrade::finish`]): builds of 0.1.0 refuse a file above 1.
pub(super) const FINISHED_VERSION: i64 = 2;

/// What format 2 adds to format 1: the build that opened each session.
const SESSION_BUILDS: &str = "CREATE TABLE IF NOT EXISTS tenure_session_builds (
            session TEXT PRIMARY KEY REFERENCES tenure_sessions(id) ON DELETE CASCADE,
            build TEXT NOT NULL) WITHOUT ROWID;";

/// The store's clock for expiry: this machine's boot time in milliseconds
/// (`CLOCK_BOOTTIME`, shared by every process, never set by anyone), through
/// a function each connection registers.
pub(super) const NOW: &str = "tenure_now_ms()";

/// The wall clock, only for showing when an entry was granted.
pub(super) const WALL_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

pub(super) fn create_tables(
    conn: &mut Connection,
) -> rusqlite::Result<std::result::Result<(), String>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS tenure_meta (
            key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS tenure_sessions (
            id TEXT PRIMARY KEY,
            tag TEXT NOT NULL,
            label TEXT NOT NULL,
            ttl_ms INTEGER NOT NULL,
            expires_ms INTEGER NOT NULL);
         CREATE INDEX IF NOT EXISTS tenure_sessions_expiry ON tenure_sessions(expires_ms);
         CREATE TABLE IF NOT EXISTS tenure_names (
            name TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL,
            version INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS tenure_entries (
            name TEXT NOT NULL,
            seq INTEGER NOT NULL,
            session TEXT NOT NULL REFERENCES tenure_sessions(id) ON DELETE CASCADE,
            kind INTEGER NOT NULL,
            count INTEGER NOT NULL,
            lim INTEGER NOT NULL,
            holds INTEGER NOT NULL,
            value BLOB NOT NULL,
            granted_ms INTEGER,
            PRIMARY KEY (name, seq)) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS tenure_entries_session ON tenure_entries(session);
         CREATE TABLE IF NOT EXISTS tenure_registers (
            name TEXT PRIMARY KEY,
            kind INTEGER NOT NULL,
            version INTEGER NOT NULL,
            value BLOB,
            owner TEXT) WITHOUT ROWID;",
    )?;
    // Format 2, beside format 1 (which builds of 0.1.0 read and write, and
    // which stays as it is): the build each session was opened by. A
    // session's row goes with the session.
    tx.execute_batch(SESSION_BUILDS)?;
    let version: Option<i64> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match version {
        None => {
            tx.execute(
                "INSERT INTO tenure_meta (key, value) VALUES ('schema', ?1)",
                [SCHEMA_VERSION],
            )?;
        }
        Some(v) if v > FINISHED_VERSION => {
            return Ok(Err(format!("the file has tenure schema version {v}")));
        }
        Some(_) => {}
    }
    // Expiry times count from boot: sessions of an earlier boot are over.
    let boot = crate::clock::boot_id();
    let stored: Option<String> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'boot_id'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if stored.as_deref() != Some(boot.as_str()) {
        tx.execute(
            "UPDATE tenure_names SET version = version + 1
             WHERE name IN (SELECT name FROM tenure_entries)",
            [],
        )?;
        tx.execute("DELETE FROM tenure_sessions", [])?;
        tx.execute(
            "INSERT INTO tenure_meta (key, value) VALUES ('boot_id', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [&boot],
        )?;
    }
    tx.commit().map(Ok)
}
