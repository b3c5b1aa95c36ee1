//! Reading the script's replies: its values as text and numbers, and the
//! tables of a queue, a watch and a cell write.

use std::time::{Duration, UNIX_EPOCH};

use redis::Value;

use super::BACKEND;
use crate::backend::codec;
use crate::backend::poll::Watch;
use crate::error::{Error, Result};
use crate::store::{CellWrite, Entry, Queue};

/// The fingerprint and TTL at `reply[at]` and `reply[at + 1]`, if any.
pub(super) fn watch_at(reply: &[Value], at: usize) -> Result<Option<Watch>> {
    let blockers = reply.get(at).map(text).transpose()?.unwrap_or_default();
    if blockers.is_empty() {
        return Ok(None);
    }
    let ttl = reply.get(at + 1).map(unsigned).transpose()?.unwrap_or(0);
    Ok(Some(Watch {
        blockers,
        ttl: Duration::from_millis(ttl),
    }))
}

pub(super) fn bad_reply(what: &str) -> Error {
    Error::backend(BACKEND, format!("unexpected reply from the script: {what}"))
}

pub(super) fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        Value::Okay => Ok("OK".into()),
        Value::Nil => Ok(String::new()),
        other => Err(bad_reply(&format!("{other:?}"))),
    }
}

pub(super) fn bytes(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::Nil => Ok(Vec::new()),
        other => text(other).map(String::into_bytes),
    }
}

pub(super) fn number(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => text(other)?
            .parse()
            .map_err(|_| bad_reply(&format!("{other:?} is not a number"))),
    }
}

pub(super) fn unsigned(v: &Value) -> Result<u64> {
    u64::try_from(number(v)?).map_err(|_| bad_reply("negative number"))
}

/// A queue's reply: its version, then ten fields per entry.
pub(super) fn queue(reply: &[Value]) -> Result<Queue> {
    let version = unsigned(reply.get(1).ok_or_else(|| bad_reply("short queue reply"))?)?;
    let mut entries = Vec::new();
    for f in reply[2..].chunks(10) {
        if f.len() < 10 {
            return Err(bad_reply("truncated queue entry"));
        }
        let granted_ms = text(&f[7])?;
        let left = number(&f[8])?;
        entries.push(Entry {
            seq: unsigned(&f[0])?,
            kind: codec::kind_from_letter(BACKEND, &text(&f[1])?, number(&f[2])?, number(&f[3])?)?,
            session_tag: text(&f[4])?,
            label: text(&f[5])?,
            value: bytes(&f[6])?,
            granted: !granted_ms.is_empty(),
            // Redis's clock is its wall clock: shown as-is.
            granted_at: granted_ms
                .parse::<u64>()
                .ok()
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            expires_in: Duration::from_millis(u64::try_from(left.max(0)).unwrap_or(0)),
            holds: u32::try_from(number(&f[9])?).map_err(|_| bad_reply("holds"))?,
        });
    }
    Ok(Queue { version, entries })
}

/// A cell write's reply: `ok` and the new version, or `mismatch` and the
/// current one (nil: no value).
pub(super) fn cell_write(reply: Vec<Value>) -> Result<CellWrite> {
    let version = match reply.get(1) {
        None | Some(Value::Nil) => None,
        Some(v) => Some(unsigned(v)?),
    };
    let status = reply.first().map(text).transpose()?;
    codec::cell_write(BACKEND, status.as_deref(), version)
}
