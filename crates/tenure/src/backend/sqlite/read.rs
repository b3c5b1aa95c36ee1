//! Reading a queue (and ending the expired sessions a read finds in it),
//! and listing names.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::OptionalExtension;

use super::calls::{db_err, kind_at, to_u64, Tx};
use super::layout::NOW;
use super::sessions::end_sessions;
use super::BACKEND;
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{Entry, EntryKind, Name, Queue};

fn ms_to_time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `name`'s queue, and whether it needs settling first: an expired entry,
/// or one the rules grant that is not stamped.
pub(super) fn queue_rows(conn: &rusqlite::Connection, n: &Name) -> Result<(Queue, bool)> {
    let version: i64 = conn
        .prepare_cached("SELECT version FROM tenure_names WHERE name = ?1")
        .and_then(|mut s| s.query_row([n.as_str()], |r| r.get(0)).optional())
        .map_err(db_err)?
        .unwrap_or(0);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value,
                                    e.granted_ms, s.expires_ms - {NOW}, e.holds
                             FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                             WHERE e.name = ?1 ORDER BY e.seq"
        ))
        .map_err(db_err)?;
    let mut rows = stmt.query([n.as_str()]).map_err(db_err)?;
    let mut entries = Vec::new();
    let mut stale = false;
    while let Some(r) = rows.next().map_err(db_err)? {
        let left: i64 = r.get(8).map_err(db_err)?;
        if left <= 0 {
            stale = true;
            continue;
        }
        let granted_ms: Option<i64> = r.get(7).map_err(db_err)?;
        entries.push(Entry {
            seq: to_u64(r.get(0).map_err(db_err)?)?,
            kind: kind_at(r, 1)?,
            session_tag: r.get(4).map_err(db_err)?,
            label: r.get(5).map_err(db_err)?,
            value: r.get(6).map_err(db_err)?,
            granted: granted_ms.is_some(),
            granted_at: granted_ms.map(ms_to_time),
            expires_in: Duration::from_millis(to_u64(left)?),
            holds: u32::try_from(r.get::<_, i64>(9).map_err(db_err)?)
                .map_err(|e| Error::backend(BACKEND, e))?,
        });
    }
    let kinds: Vec<EntryKind> = entries.iter().map(|e| e.kind).collect();
    let needs_stamp = queue::grants(&kinds)
        .iter()
        .zip(&entries)
        .any(|(g, e)| *g && !e.granted);
    Ok((
        Queue {
            version: to_u64(version)?,
            entries,
        },
        stale || needs_stamp,
    ))
}

/// Ends every expired session with an entry in `name`'s queue.
pub(super) fn end_expired(tx: &Tx<'_>, name: &Name) -> Result<((), Vec<Name>)> {
    let dead = tx
        .prepare_cached(&format!(
            "SELECT DISTINCT e.session FROM tenure_entries e
                         JOIN tenure_sessions s ON s.id = e.session
                         WHERE e.name = ?1 AND s.expires_ms <= {NOW}"
        ))
        .and_then(|mut s| {
            s.query_map([name.as_str()], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
        })
        .map_err(db_err)?;
    end_sessions(tx, &dead)?;
    Ok(((), vec![name.clone()]))
}

/// The names with live entries that start with `prefix`, sorted.
pub(super) fn names(conn: &rusqlite::Connection, prefix: &str) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT DISTINCT e.name FROM tenure_entries e
                         JOIN tenure_sessions s ON s.id = e.session
                         WHERE s.expires_ms > {NOW} AND substr(e.name, 1, length(?1)) = ?1
                         ORDER BY e.name"
        ))
        .map_err(db_err)?;
    let names = stmt
        .query_map([&prefix], |r| r.get::<_, String>(0))
        .map_err(db_err)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(db_err)?;
    Ok(names)
}
