//! Sessions: opening one (collecting a few expired ones on the way),
//! renewing, closing, ending expired ones for good, evicting holders, and
//! the names a session has entries in.

use rusqlite::{params, Connection, OptionalExtension};

use super::calls::{db_err, Tx};
use super::layout::NOW;
use super::settle::settle;
use crate::error::{Error, Result};
use crate::store::{Build, Name, SessionBuild, SessionKey};

/// Records a new session, with its expiry by the store's clock; answers
/// the names to settle.
pub(super) fn open(
    tx: &Tx<'_>,
    k: &str,
    t: &str,
    label: &str,
    ttl_ms: i64,
) -> Result<((), Vec<Name>)> {
    let dead = tx
        .prepare_cached(&format!(
            "SELECT id FROM tenure_sessions WHERE expires_ms <= {NOW}
                     ORDER BY expires_ms LIMIT 16"
        ))
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<String>>>()
        })
        .map_err(db_err)?;
    let mut names = Vec::new();
    for session in &dead {
        names.extend(session_names(tx, session)?);
    }
    end_sessions(tx, &dead)?;
    tx.prepare_cached(&format!(
        "INSERT INTO tenure_sessions (id, tag, label, ttl_ms, expires_ms)
                 VALUES (?1, ?2, ?3, ?4, {NOW} + ?4)"
    ))
    .and_then(|mut s| s.execute(params![k, t, label, ttl_ms]))
    .map_err(db_err)?;
    tx.prepare_cached("INSERT INTO tenure_session_builds (session, build) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![k, Build::this(super::FORMAT).encode()]))
        .map_err(db_err)?;
    Ok(((), names))
}

/// Every session the file holds (ended ones are deleted), with the build
/// that opened it, if it recorded one.
pub(super) fn builds(conn: &Connection) -> Result<Vec<SessionBuild>> {
    conn.prepare_cached(
        "SELECT s.tag, s.label, b.build FROM tenure_sessions s
           LEFT JOIN tenure_session_builds b ON b.session = s.id ORDER BY s.tag",
    )
    .and_then(|mut s| {
        s.query_map([], |r| {
            let build: Option<String> = r.get(2)?;
            Ok(SessionBuild::new(
                r.get(0)?,
                r.get(1)?,
                build.as_deref().and_then(Build::decode),
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(db_err)
}

/// Extends a live session by its TTL.
pub(super) fn renew(conn: &Connection, key: &SessionKey) -> Result<()> {
    let n = conn
        .prepare_cached(&format!(
            "UPDATE tenure_sessions SET expires_ms = {NOW} + ttl_ms
                     WHERE id = ?1 AND expires_ms > {NOW}"
        ))
        .and_then(|mut s| s.execute([key.secret()]))
        .map_err(db_err)?;
    if n == 0 {
        Err(Error::SessionLost(crate::error::LostReason::Expired))
    } else {
        Ok(())
    }
}

/// Ends the session; answers the names it had entries in, to settle.
pub(super) fn close(tx: &Tx<'_>, key: &SessionKey) -> Result<((), Vec<Name>)> {
    let names = session_names(tx, key.secret())?;
    tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
        .and_then(|mut s| s.execute([key.secret()]))
        .map_err(db_err)?;
    Ok(((), names))
}

/// Ends expired sessions for good (a session row that is gone cannot be
/// renewed, so even a wall clock that jumps back cannot revive a lease that
/// is being passed on), bumping the versions of every name they were in.
pub(super) fn end_sessions(tx: &Tx<'_>, sessions: &[String]) -> Result<usize> {
    let mut ended = 0;
    for session in sessions {
        tx.prepare_cached(
            "UPDATE tenure_names SET version = version + 1 WHERE name IN
               (SELECT name FROM tenure_entries WHERE session = ?1)",
        )
        .and_then(|mut s| s.execute([session]))
        .map_err(db_err)?;
        ended += tx
            .prepare_cached(&format!(
                "DELETE FROM tenure_sessions WHERE id = ?1 AND expires_ms <= {NOW}"
            ))
            .and_then(|mut s| s.execute([session]))
            .map_err(db_err)?;
    }
    Ok(ended)
}

pub(super) fn session_alive(conn: &Connection, key: &SessionKey) -> Result<()> {
    let alive: bool = conn
        .prepare_cached(&format!(
            "SELECT EXISTS(SELECT 1 FROM tenure_sessions WHERE id = ?1 AND expires_ms > {NOW})"
        ))
        .and_then(|mut s| s.query_row([key.secret()], |r| r.get(0)))
        .map_err(db_err)?;
    if alive {
        Ok(())
    } else {
        Err(Error::SessionLost(crate::error::LostReason::Expired))
    }
}

/// The names a session has entries in.
pub(super) fn session_names(conn: &Connection, key: &str) -> Result<Vec<Name>> {
    let mut stmt = conn
        .prepare_cached("SELECT DISTINCT name FROM tenure_entries WHERE session = ?1")
        .map_err(db_err)?;
    let names = stmt
        .query_map([key], |r| r.get::<_, String>(0))
        .map_err(db_err)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(db_err)?;
    names.into_iter().map(|n| Name::stored(&n)).collect()
}

/// Ends the sessions that hold `name`; answers how many, and the names
/// their entries were in, to settle.
pub(super) fn evict_holders(tx: &Tx<'_>, name: &Name) -> Result<(usize, Vec<Name>)> {
    settle(tx, name, false)?;
    let mut stmt = tx
        .prepare_cached(
            "SELECT DISTINCT session FROM tenure_entries
                     WHERE name = ?1 AND granted_ms IS NOT NULL",
        )
        .map_err(db_err)?;
    let holders = stmt
        .query_map([name.as_str()], |r| r.get::<_, String>(0))
        .map_err(db_err)?
        .collect::<rusqlite::Result<Vec<String>>>()
        .map_err(db_err)?;
    let mut names = vec![name.clone()];
    for holder in &holders {
        for n in session_names(tx, holder)? {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
            .and_then(|mut s| s.execute([holder]))
            .map_err(db_err)?;
    }
    Ok((holders.len(), names))
}

/// Ends the live session with the public tag `tag`, if there is one.
pub(super) fn evict_tag(tx: &Tx<'_>, tag: &str) -> Result<(bool, Vec<Name>)> {
    // Live by the store's clock: one that expired is over already.
    let session: Option<String> = tx
        .prepare_cached(&format!(
            "SELECT id FROM tenure_sessions WHERE tag = ?1 AND expires_ms > {NOW} LIMIT 1"
        ))
        .and_then(|mut s| s.query_row([&tag], |r| r.get(0)).optional())
        .map_err(db_err)?;
    let Some(session) = session else {
        return Ok((false, Vec::new()));
    };
    // As evict ends a holder: the row goes, its entries with it, and
    // `write` settles (and wakes) every name they were in.
    let names = session_names(tx, &session)?;
    tx.prepare_cached("DELETE FROM tenure_sessions WHERE id = ?1")
        .and_then(|mut s| s.execute([&session]))
        .map_err(db_err)?;
    Ok((true, names))
}
