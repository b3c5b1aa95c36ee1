//! Fencing inside your own database: the check that makes a fencing token
//! protect anything, run in *your* transaction on *your* connection, so the
//! check and your write commit together — or not at all.
//!
//! A lock's holder can lose its lease without knowing it in time (a GC
//! pause, a stopped VM, a slow network): by then another holder may have
//! been granted the lock, with a higher token. A resource that remembers the
//! highest token it has admitted and refuses lower ones keeps the late write
//! of the old holder out. Here the resource is a table of your database:
//! `tenure_fences (name, highest)`. [`postgres::admit`], [`mysql::admit`] and
//! [`sqlite::admit`] admit a token that is at least the highest seen (equal
//! is admitted: one holder writes many times) and record it, or fail with
//! [`Error::StaleToken`] carrying the highest; roll your transaction back
//! then. Because the row is locked until your transaction ends, two holders'
//! transactions are serialized on it, and a token is recorded only if your
//! write commits.
//!
//! Create the table once, outside your transactions (MySQL commits any open
//! transaction on DDL): `create_table`, or the `CREATE_TABLE` statement with
//! any other driver; `ADMIT` (and for MySQL `HIGHEST`) are the plain SQL.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> tenure::Result<()> {
//! # let token = 7;
//! let mut db = rusqlite::Connection::open("app.db").unwrap();
//! tenure::fencing::sqlite::create_table(&db)?;
//! let tx = db.transaction().unwrap();
//! let printer = tenure::Name::new("printer")?;
//! tenure::fencing::sqlite::admit(&tx, &printer, token)?; // Err(StaleToken): drop tx
//! tx.execute("INSERT INTO jobs (page) VALUES ('report')", []).unwrap();
//! tx.commit().unwrap();
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::Error;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::error::Result;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::store::Name;

/// A token as the databases store it (a signed 64-bit integer).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn as_i64(token: u64) -> Result<i64> {
    i64::try_from(token).map_err(|_| crate::Error::InvalidArgument {
        what: "fencing token",
        reason: format!("{token} is beyond what the database stores (2^63 - 1)"),
    })
}

/// The answer to an admission: admitted if the highest seen is the token.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn judged(fence: &Name, token: u64, highest: u64) -> Result<()> {
    if highest == token {
        Ok(())
    } else {
        Err(crate::Error::StaleToken {
            fence: fence.to_string(),
            token,
            highest,
        })
    }
}

/// PostgreSQL, through the tokio-postgres crate tenure uses (re-exported).
#[cfg(feature = "postgres")]
pub mod postgres {
    use super::*;
    pub use tokio_postgres;

    /// The fences table, in the connection's current schema.
    pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS tenure_fences (\
        name text PRIMARY KEY, highest bigint NOT NULL)";

    /// Admits `$2` for fence `$1` if it is at least the highest seen, and
    /// returns it; returns no row if it is lower (then read the highest).
    pub const ADMIT: &str = "INSERT INTO tenure_fences (name, highest) VALUES ($1, $2) \
        ON CONFLICT (name) DO UPDATE SET highest = excluded.highest \
        WHERE tenure_fences.highest <= excluded.highest RETURNING highest";

    const HIGHEST: &str = "SELECT highest FROM tenure_fences WHERE name = $1";

    fn db_err(e: tokio_postgres::Error) -> Error {
        Error::backend("postgres", e)
    }

    /// Creates the fences table if it is missing.
    pub async fn create_table(client: &tokio_postgres::Client) -> Result<()> {
        client.batch_execute(CREATE_TABLE).await.map_err(db_err)
    }

    /// Admits `token` for `fence` inside `tx`, or fails with
    /// [`Error::StaleToken`] (roll `tx` back then).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe on its own; dropping the transaction rolls it back.
    pub async fn admit(
        tx: &tokio_postgres::Transaction<'_>,
        fence: &Name,
        token: u64,
    ) -> Result<()> {
        let rows = tx
            .query(ADMIT, &[&fence.as_str(), &as_i64(token)?])
            .await
            .map_err(db_err)?;
        let highest: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(db_err)?,
            None => tx
                .query_one(HIGHEST, &[&fence.as_str()])
                .await
                .map_err(db_err)?
                .try_get(0)
                .map_err(db_err)?,
        };
        judged(fence, token, u64::try_from(highest).unwrap_or(0))
    }
}

/// MySQL and MariaDB, through the mysql_async crate tenure uses
/// (re-exported).
#[cfg(feature = "mysql")]
pub mod mysql {
    use super::*;
    pub use mysql_async;
    use mysql_async::prelude::Queryable;

    /// The fences table.
    pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS tenure_fences (\
        name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, \
        highest BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB";

    /// Raises fence `?` to `?` if that is higher (and locks its row).
    pub const ADMIT: &str = "INSERT INTO tenure_fences (name, highest) VALUES (?, ?) \
        ON DUPLICATE KEY UPDATE highest = GREATEST(highest, VALUES(highest))";

    /// The highest token of fence `?` after [`ADMIT`]: the token was
    /// admitted if and only if it equals it.
    pub const HIGHEST: &str = "SELECT highest FROM tenure_fences WHERE name = ?";

    fn db_err(e: mysql_async::Error) -> Error {
        Error::backend("mysql", e)
    }

    /// Creates the fences table if it is missing (not inside a transaction:
    /// MySQL commits one on DDL).
    pub async fn create_table(conn: &mut mysql_async::Conn) -> Result<()> {
        conn.query_drop(CREATE_TABLE).await.map_err(db_err)
    }

    /// Admits `token` for `fence` inside `tx`, or fails with
    /// [`Error::StaleToken`] (roll `tx` back then).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe on its own; dropping the transaction rolls it back.
    pub async fn admit(
        tx: &mut mysql_async::Transaction<'_>,
        fence: &Name,
        token: u64,
    ) -> Result<()> {
        tx.exec_drop(ADMIT, (fence.as_str(), token))
            .await
            .map_err(db_err)?;
        let highest: Option<u64> = tx
            .exec_first(HIGHEST, (fence.as_str(),))
            .await
            .map_err(db_err)?;
        judged(fence, token, highest.unwrap_or(0))
    }
}

/// SQLite, through the rusqlite crate tenure uses (re-exported).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    use super::*;
    pub use rusqlite;
    use rusqlite::OptionalExtension;

    /// The fences table.
    pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS tenure_fences (\
        name TEXT PRIMARY KEY, highest INTEGER NOT NULL) WITHOUT ROWID";

    /// Admits `?2` for fence `?1` if it is at least the highest seen, and
    /// returns it; returns no row if it is lower (then read the highest).
    pub const ADMIT: &str = "INSERT INTO tenure_fences (name, highest) VALUES (?1, ?2) \
        ON CONFLICT (name) DO UPDATE SET highest = excluded.highest \
        WHERE highest <= excluded.highest RETURNING highest";

    const HIGHEST: &str = "SELECT highest FROM tenure_fences WHERE name = ?1";

    fn db_err(e: rusqlite::Error) -> crate::Error {
        crate::Error::backend("sqlite", e)
    }

    /// Creates the fences table if it is missing.
    pub fn create_table(conn: &rusqlite::Connection) -> Result<()> {
        conn.execute_batch(CREATE_TABLE).map_err(db_err)
    }

    /// Admits `token` for `fence` inside `tx`, or fails with
    /// [`Error::StaleToken`] (drop `tx` then, which
    /// rolls it back).
    pub fn admit(tx: &rusqlite::Transaction<'_>, fence: &Name, token: u64) -> Result<()> {
        let admitted: Option<i64> = tx
            .query_row(
                ADMIT,
                rusqlite::params![fence.as_str(), as_i64(token)?],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)?;
        let highest = match admitted {
            Some(h) => h,
            None => tx
                .query_row(HIGHEST, [fence.as_str()], |r| r.get(0))
                .map_err(db_err)?,
        };
        judged(fence, token, u64::try_from(highest).unwrap_or(0))
    }
}
