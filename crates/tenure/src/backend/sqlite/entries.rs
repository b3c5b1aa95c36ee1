//! A session's entries: joining a queue (one transaction that settles the
//! name first), leaving it, and setting a granted entry's value.

use rusqlite::{params, Connection, OptionalExtension};

use super::calls::{db_err, to_u64, Tx};
use super::layout::{NOW, WALL_NOW};
use super::sessions::session_alive;
use super::settle::{settle, settle_walk, Walk};
use super::BACKEND;
use crate::backend::codec;
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{EntryKind, JoinMode, Joined, Name, SessionKey};

/// Joins `name`'s queue, or takes another hold of this session's entry
/// there; answers the entry (none for an "only if granted" join that was
/// not) and the seqs that settling granted ahead of it.
pub(super) fn join(
    conn: &mut Connection,
    key: &SessionKey,
    name: &Name,
    kind: EntryKind,
    value: &[u8],
    mode: JoinMode,
) -> Result<(Option<Joined>, Vec<u64>)> {
    let (kind_col, count_col, limit_col) = codec::kind_code(kind);
    let tx = Tx::immediate(conn)?;
    // Settling first drops entries of expired sessions ahead of us.
    let walk = settle_walk(&tx, name, false)?;
    let newly_ahead = walk.newly.clone();
    let own = own_entry(&tx, &walk, name, key)?;
    if let Some((own_seq, own_kind, granted_ms)) = own {
        queue::check_same_kind(name, own_kind, kind)?;
        let granted = granted_ms.is_some();
        if mode == JoinMode::IfGranted && !granted {
            tx.commit()?;
            return Ok((None, newly_ahead));
        }
        let holds: i64 = tx
            .prepare_cached(
                "UPDATE tenure_entries SET holds = holds + 1
                             WHERE name = ?1 AND seq = ?2 RETURNING holds",
            )
            .and_then(|mut s| s.query_row(params![name.as_str(), own_seq], |r| r.get(0)))
            .map_err(db_err)?;
        let seq = to_u64(own_seq)?;
        tx.commit()?;
        let holds = u32::try_from(holds).map_err(|e| Error::backend(BACKEND, e))?;
        return Ok((
            Some(Joined {
                seq,
                granted,
                holds,
                first: false,
            }),
            newly_ahead,
        ));
    }
    // Every entry passed this check against those before it, so
    // the head stands for them all.
    queue::check_compatible(name, kind, walk.granted.first().map(|r| r.kind))?;
    // Behind a waiting entry nothing is granted; otherwise the
    // walk saw every live entry, all granted.
    let granted = !walk.blocked && {
        let mut rule = queue::GrantWalk::new();
        walk.granted.iter().all(|r| rule.admit(r.kind)) && rule.admit(kind)
    };
    if mode == JoinMode::IfGranted && !granted {
        session_alive(&tx, key)?;
        tx.commit()?;
        return Ok((None, newly_ahead));
    }
    let seq: i64 = tx
        .prepare_cached(
            "INSERT INTO tenure_names (name, last_seq, version) VALUES (?1, 1, 1)
                         ON CONFLICT (name) DO UPDATE SET last_seq = last_seq + 1, version = version + 1
                         RETURNING last_seq",
        )
        .and_then(|mut s| s.query_row([name.as_str()], |r| r.get(0)))
        .map_err(db_err)?;
    // The session check rides on the insert: no live session, no row.
    let inserted = tx
        .prepare_cached(&format!(
            "INSERT INTO tenure_entries
                           (name, seq, session, kind, count, lim, holds, value, granted_ms)
                         SELECT ?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, CASE WHEN ?8 THEN {WALL_NOW} END
                         WHERE EXISTS (SELECT 1 FROM tenure_sessions
                                       WHERE id = ?3 AND expires_ms > {NOW})"
        ))
        .and_then(|mut s| {
            s.execute(params![
                name.as_str(),
                seq,
                key.secret(),
                kind_col,
                count_col,
                limit_col,
                value,
                granted
            ])
        })
        .map_err(db_err)?;
    if inserted == 0 {
        // Dropping the transaction rolls back the counter too.
        return Err(Error::SessionLost(crate::error::LostReason::Expired));
    }
    tx.commit()?;
    Ok((
        Some(Joined {
            seq: to_u64(seq)?,
            granted,
            holds: 1,
            // The counter row is never deleted, so 1 means no
            // entry ever came before.
            first: seq == 1,
        }),
        newly_ahead,
    ))
}

/// This session's entry in `name`'s queue (seq, kind, when granted), if it
/// has one.
fn own_entry(
    tx: &Tx<'_>,
    walk: &Walk,
    name: &Name,
    key: &SessionKey,
) -> Result<Option<(i64, EntryKind, Option<i64>)>> {
    // Our own entry: among the rows walked unless the walk
    // stopped short of the end.
    Ok(if walk.blocked {
        tx.prepare_cached(
            "SELECT seq, kind, count, lim, granted_ms FROM tenure_entries
                         WHERE name = ?1 AND session = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![name.as_str(), key.secret()], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                ))
            })
            .optional()
        })
        .map_err(db_err)?
        .map(|(seq, k, c, l, granted_ms)| {
            Ok::<_, Error>((seq, codec::kind_from_code(BACKEND, k, c, l)?, granted_ms))
        })
        .transpose()?
    } else {
        walk.granted
            .iter()
            .find(|r| r.session == key.secret())
            .map(|r| {
                Ok::<_, Error>((
                    i64::try_from(r.seq).map_err(|e| Error::backend(BACKEND, e))?,
                    r.kind,
                    r.granted_ms,
                ))
            })
            .transpose()?
    })
}

/// Lets go of one hold of the entry: the entry goes with the last one (and
/// the name is to settle). Answers the holds left.
pub(super) fn leave(
    tx: &Tx<'_>,
    key: &SessionKey,
    name: &Name,
    seq: u64,
) -> Result<(u32, Vec<Name>)> {
    // The usual case, the last hold, is one DELETE; else one UPDATE.
    let alive = format!(
        "name = ?1 AND seq = ?2 AND session = ?3 AND session IN
                   (SELECT id FROM tenure_sessions WHERE id = ?3 AND expires_ms > {NOW})"
    );
    let deleted = tx
        .prepare_cached(&format!(
            "DELETE FROM tenure_entries WHERE {alive} AND holds <= 1"
        ))
        .and_then(|mut s| s.execute(params![name.as_str(), seq as i64, key.secret()]))
        .map_err(db_err)?;
    if deleted == 0 {
        let holds: Option<i64> = tx
            .prepare_cached(&format!(
                "UPDATE tenure_entries SET holds = holds - 1 WHERE {alive} RETURNING holds"
            ))
            .and_then(|mut s| {
                s.query_row(params![name.as_str(), seq as i64, key.secret()], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(db_err)?;
        let Some(holds) = holds else {
            // Tell a lost session from an entry it never had.
            session_alive(tx, key)?;
            return Err(Error::NotHeld("this session has no such entry"));
        };
        let holds = u32::try_from(holds).map_err(|e| Error::backend(BACKEND, e))?;
        return Ok((holds, Vec::new()));
    }
    Ok((0, vec![name.clone()]))
}

/// Sets the value of this session's granted entry `seq` of `name`.
pub(super) fn set_value(
    tx: &Tx<'_>,
    key: &SessionKey,
    name: &Name,
    seq: u64,
    value: &[u8],
) -> Result<((), Vec<Name>)> {
    session_alive(tx, key)?;
    settle(tx, name, false)?;
    let n = tx
        .prepare_cached(
            "UPDATE tenure_entries SET value = ?4
                     WHERE name = ?1 AND seq = ?2 AND session = ?3 AND granted_ms IS NOT NULL",
        )
        .and_then(|mut s| s.execute(params![name.as_str(), seq as i64, key.secret(), value]))
        .map_err(db_err)?;
    if n == 0 {
        return Err(Error::NotHeld(
            "this session holds no granted entry with that token",
        ));
    }
    Ok(((), vec![name.clone()]))
}
