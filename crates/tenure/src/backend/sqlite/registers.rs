//! Fences and cells, in `tenure_registers`: a fence admits tokens no lower
//! than the highest it saw; a cell is a versioned value, bound to an owner
//! session or not.

use rusqlite::{params, Connection, OptionalExtension};

use super::calls::{db_err, to_u64, Tx};
use super::layout::NOW;
use super::sessions::session_alive;
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{kind_conflict, CellWrite, Expect, FenceState, Name, SessionKey, Versioned};

/// A fence's or a cell's row in `tenure_registers`. A fence keeps its
/// highest token in `version`; a cell keeps its version there even when it
/// has no value (deleted, or its owner session ended), so versions are never
/// reused for a name.
pub(super) struct Register {
    is_cell: bool,
    version: i64,
    value: Option<Vec<u8>>,
    /// A cell's owner session is alive, or it has none.
    live: bool,
}

const FENCE: i64 = 0;
const CELL: i64 = 1;

impl Register {
    fn read(conn: &Connection, name: &str) -> Result<Option<Register>> {
        conn.prepare_cached(&format!(
            "SELECT kind, version, value, owner IS NULL OR EXISTS(SELECT 1 FROM tenure_sessions s
                 WHERE s.id = owner AND s.expires_ms > {NOW})
             FROM tenure_registers WHERE name = ?1"
        ))
        .and_then(|mut s| {
            s.query_row([name], |r| {
                Ok(Register {
                    is_cell: r.get::<_, i64>(0)? == CELL,
                    version: r.get(1)?,
                    value: r.get(2)?,
                    live: r.get(3)?,
                })
            })
            .optional()
        })
        .map_err(db_err)
    }

    /// The cell's stored version and live value; a fence is a conflict.
    pub(super) fn cell(conn: &Connection, name: &Name) -> Result<(i64, Option<Versioned>)> {
        match Register::read(conn, name.as_str())? {
            None => Ok((0, None)),
            Some(r) if !r.is_cell => Err(kind_conflict(name, "a fence", "a cell")),
            Some(r) => {
                let value = match r.value.filter(|_| r.live) {
                    Some(value) => Some(Versioned {
                        value,
                        version: to_u64(r.version)?,
                    }),
                    None => None,
                };
                Ok((r.version, value))
            }
        }
    }
}

pub(super) fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidArgument {
        what: "number",
        reason: format!("{v} is larger than SQLite's integers"),
    })
}

/// Reads the fence, and with a `token` admits it if it is no lower than
/// the highest the fence saw (storing `value`, if any, with it).
pub(super) fn fence(
    conn: &mut Connection,
    name: &Name,
    token: Option<i64>,
    value: &Option<Vec<u8>>,
) -> Result<FenceState> {
    let tx = Tx::immediate(conn)?;
    let (highest, stored) = match Register::read(&tx, name.as_str())? {
        Some(r) if r.is_cell => return Err(kind_conflict(name, "a cell", "a fence")),
        Some(r) => (r.version, r.value),
        None => (0, None),
    };
    let answer = match token {
        Some(token) if token >= highest => {
            tx.prepare_cached(
                "INSERT INTO tenure_registers (name, kind, version, value) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (name) DO UPDATE
                           SET version = excluded.version, value = coalesce(excluded.value, value)",
            )
            .and_then(|mut s| s.execute(params![name.as_str(), FENCE, token, value]))
            .map_err(db_err)?;
            FenceState {
                admitted: true,
                highest: to_u64(token)?,
                value: value.clone().or(stored),
            }
        }
        _ => FenceState {
            admitted: token.is_none(),
            highest: to_u64(highest)?,
            value: stored,
        },
    };
    tx.commit()?;
    Ok(answer)
}

/// Writes the cell if its current version is as `expect`ed.
pub(super) fn cell_put(
    conn: &mut Connection,
    name: &Name,
    value: &[u8],
    expect: Expect,
    owner: &Option<SessionKey>,
) -> Result<CellWrite> {
    let tx = Tx::immediate(conn)?;
    let (stored, current) = Register::cell(&tx, name)?;
    if let Some(owner) = &owner {
        session_alive(&tx, owner)?;
    }
    let current = current.map(|c| c.version);
    if !queue::cell_expected(current, expect) {
        return Ok(CellWrite::Mismatch(current));
    }
    let version = stored + 1;
    tx.prepare_cached(
        "INSERT INTO tenure_registers (name, kind, version, value, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (name) DO UPDATE
                   SET version = excluded.version, value = excluded.value, owner = excluded.owner",
    )
    .and_then(|mut s| {
        s.execute(params![
            name.as_str(),
            CELL,
            version,
            value,
            owner.as_ref().map(SessionKey::secret)
        ])
    })
    .map_err(db_err)?;
    tx.commit()?;
    Ok(CellWrite::Done(to_u64(version)?))
}

/// Deletes the cell's value if its version is `version`.
pub(super) fn cell_delete(conn: &mut Connection, name: &Name, version: u64) -> Result<CellWrite> {
    let tx = Tx::immediate(conn)?;
    let (stored, current) = Register::cell(&tx, name)?;
    let current = current.map(|c| c.version);
    if current != Some(version) {
        return Ok(CellWrite::Mismatch(current));
    }
    tx.prepare_cached("UPDATE tenure_registers SET value = NULL, owner = NULL WHERE name = ?1")
        .and_then(|mut s| s.execute([name.as_str()]))
        .map_err(db_err)?;
    tx.commit()?;
    Ok(CellWrite::Done(to_u64(stored)?))
}
