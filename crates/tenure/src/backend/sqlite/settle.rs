//! Settling a name: the walk from its queue's head that ends the expired
//! sessions it meets, stamps what the rules now grant, and bumps the
//! name's version when anything changed.

use rusqlite::params;

use super::calls::{db_err, kind_at, to_u64, Tx};
use super::layout::{NOW, WALL_NOW};
use super::sessions::end_sessions;
use crate::error::Result;
use crate::queue;
use crate::store::{EntryKind, Name};

/// A row of a queue as read inside the store.
pub(super) struct Row {
    pub(super) seq: u64,
    pub(super) kind: EntryKind,
    pub(super) session: String,
    pub(super) granted_ms: Option<i64>,
    live: bool,
}

/// Drops the name's entries of expired sessions, stamps newly granted entries
/// and, if anything changed (or `changed`), bumps the name's version.
/// Returns the seqs granted by this call.
pub(super) fn settle(tx: &Tx<'_>, name: &Name, changed: bool) -> Result<Vec<u64>> {
    settle_walk(tx, name, changed).map(|walk| walk.newly)
}

/// What settling saw, walking the queue from its head.
pub(super) struct Walk {
    /// The live entries the rules grant, in order: a prefix of the queue.
    pub(super) granted: Vec<Row>,
    /// Whether a live entry waits behind them (the walk stopped there).
    pub(super) blocked: bool,
    /// The entries this walk stamped granted.
    pub(super) newly: Vec<u64>,
}

/// Walks `name`'s queue from the head: ends the expired sessions it meets,
/// stamps what the rules now grant, and stops at the first live entry that
/// waits, so it reads the granted entries and one more however long the
/// queue. Bumps the version if anything changed (or `changed`).
pub(super) fn settle_walk(tx: &Tx<'_>, name: &Name, changed: bool) -> Result<Walk> {
    let mut granted = Vec::new();
    let mut blocked = false;
    let mut dead = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT e.seq, e.kind, e.count, e.lim, e.session, e.granted_ms, s.expires_ms > {NOW}
                 FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                 WHERE e.name = ?1 ORDER BY e.seq"
            ))
            .map_err(db_err)?;
        let mut rows = stmt.query([name.as_str()]).map_err(db_err)?;
        let mut rule = queue::GrantWalk::new();
        while let Some(r) = rows.next().map_err(db_err)? {
            let row = Row {
                seq: to_u64(r.get(0).map_err(db_err)?)?,
                kind: kind_at(r, 1)?,
                session: r.get(4).map_err(db_err)?,
                granted_ms: r.get(5).map_err(db_err)?,
                live: r.get(6).map_err(db_err)?,
            };
            if !row.live {
                dead.push(row.session);
            } else if rule.admit(row.kind) {
                granted.push(row);
            } else {
                blocked = true;
                break;
            }
        }
    }
    let purged = end_sessions(tx, &dead)?;
    let mut newly = Vec::new();
    for row in granted.iter_mut().filter(|r| r.granted_ms.is_none()) {
        tx.prepare_cached(&format!(
            "UPDATE tenure_entries SET granted_ms = {WALL_NOW} WHERE name = ?1 AND seq = ?2"
        ))
        .and_then(|mut s| s.execute(params![name.as_str(), row.seq as i64]))
        .map_err(db_err)?;
        newly.push(row.seq);
        row.granted_ms = Some(0);
    }
    if changed || purged > 0 || !newly.is_empty() {
        tx.prepare_cached("UPDATE tenure_names SET version = version + 1 WHERE name = ?1")
            .and_then(|mut s| s.execute([name.as_str()]))
            .map_err(db_err)?;
    }
    Ok(Walk {
        granted,
        blocked,
        newly,
    })
}
