//! How stores write what the contract says, one way for every backend: an
//! entry's kind (a letter or a number, and a permit count and limit) and the
//! status words that server-side code answers with.

use crate::error::{Error, LostReason, Result};
use crate::store::{CellWrite, EntryKind};

/// The letters of the kinds, by [`kind_code`]'s number: exclusive, shared,
/// permits.
const LETTERS: [&str; 3] = ["X", "S", "P"];

/// An entry kind as (number, permit count, permit limit): 0 exclusive, 1
/// shared, 2 permits; count and limit are 0 unless permits.
pub(crate) fn kind_code(kind: EntryKind) -> (i16, i64, i64) {
    match kind {
        EntryKind::Exclusive => (0, 0, 0),
        EntryKind::Shared => (1, 0, 0),
        EntryKind::Permits { count, limit } => (2, count.into(), limit.into()),
    }
}

/// The kind's letter: `X`, `S` or `P`.
pub(crate) fn kind_letter(kind: EntryKind) -> &'static str {
    LETTERS[kind_code(kind).0 as usize]
}

/// The entry kind back from [`kind_code`]'s parts.
pub(crate) fn kind_from_code(
    backend: &'static str,
    code: i64,
    count: i64,
    limit: i64,
) -> Result<EntryKind> {
    let permits = |v: i64| u32::try_from(v).map_err(|e| Error::backend(backend, e));
    Ok(match code {
        0 => EntryKind::Exclusive,
        1 => EntryKind::Shared,
        2 => EntryKind::Permits {
            count: permits(count)?,
            limit: permits(limit)?,
        },
        other => {
            return Err(Error::backend(
                backend,
                format!("unknown entry kind {other}"),
            ))
        }
    })
}

/// The entry kind back from [`kind_letter`] and the permit parts.
pub(crate) fn kind_from_letter(
    backend: &'static str,
    letter: &str,
    count: i64,
    limit: i64,
) -> Result<EntryKind> {
    let code = LETTERS
        .iter()
        .position(|l| *l == letter)
        .ok_or_else(|| Error::backend(backend, format!("unknown entry kind {letter:?}")))?;
    kind_from_code(backend, code as i64, count, limit)
}

/// The error for a status word of server-side code (a Lua script, a SQL
/// function): `lost`, `notheld`, `conflict` with its reason (after a colon,
/// or given apart), anything else a backend error.
pub(crate) fn status_error(
    backend: &'static str,
    status: &str,
    detail: Option<String>,
    name: &str,
) -> Error {
    let (word, inline) = match status.split_once(':') {
        Some((word, reason)) => (word, Some(reason.to_string())),
        None => (status, None),
    };
    match word {
        "lost" => Error::SessionLost(LostReason::Expired),
        "forgot" => Error::SessionLost(LostReason::Forgotten),
        "notheld" => Error::NotHeld("this session holds no such entry"),
        "conflict" => Error::Conflict {
            name: name.to_string(),
            reason: inline.or(detail).unwrap_or_default(),
        },
        _ => Error::backend(backend, format!("unexpected status {status:?}")),
    }
}

/// A cell write's answer, as every store's routine gives it: `ok` and the
/// new version, or `mismatch` and the current one (none: no value).
pub(crate) fn cell_write(
    backend: &'static str,
    status: Option<&str>,
    version: Option<u64>,
) -> Result<CellWrite> {
    match (status, version) {
        (Some("ok"), Some(version)) => Ok(CellWrite::Done(version)),
        (Some("mismatch"), current) => Ok(CellWrite::Mismatch(current)),
        (status, _) => Err(Error::backend(
            backend,
            format!("a cell write answered {status:?} without a version"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip() {
        for kind in [
            EntryKind::Exclusive,
            EntryKind::Shared,
            EntryKind::Permits { count: 2, limit: 5 },
        ] {
            let (code, count, limit) = kind_code(kind);
            assert_eq!(
                kind_from_code("t", code.into(), count, limit).unwrap(),
                kind
            );
            assert_eq!(
                kind_from_letter("t", kind_letter(kind), count, limit).unwrap(),
                kind
            );
        }
        assert!(kind_from_code("t", 9, 0, 0).is_err());
        assert!(kind_from_letter("t", "Q", 0, 0).is_err());
        assert!(kind_from_code("t", 2, -1, 3).is_err());
    }

    #[test]
    fn status_words() {
        let name = "n";
        assert!(matches!(
            status_error("t", "lost", None, name),
            Error::SessionLost(_)
        ));
        assert!(matches!(
            status_error("t", "notheld", None, name),
            Error::NotHeld(_)
        ));
        let e = status_error("t", "conflict:limit 3 vs 4", None, name);
        assert!(e.to_string().contains("limit 3 vs 4"), "{e}");
        let e = status_error("t", "conflict", Some("kinds".into()), name);
        assert!(e.to_string().contains("kinds"), "{e}");
        assert!(matches!(
            status_error("t", "what", None, name),
            Error::Backend { .. }
        ));
    }
}
