//! Where tenure's nodes are and what they hold: the paths of queues,
//! registers and sessions, the names of a queue's children, and the data
//! of entries, fences and cells. Every byte here is what the server stores.

use zookeeper_client as zk;

use super::{ZkStore, BACKEND};
use crate::backend::codec;
use crate::store::{EntryKind, Name};

impl ZkStore {
    pub(super) fn acls(&self) -> zk::Acls<'static> {
        // With digest credentials, nodes belong to that user.
        if self.inner.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    pub(super) fn name_path(&self, name: &Name) -> String {
        format!("{}/q/{}", self.inner.base, encode_name(name.as_str()))
    }

    /// The node of the fence or cell `name`.
    pub(super) fn register_path(&self, name: &Name) -> String {
        format!("{}/r/{}", self.inner.base, encode_name(name.as_str()))
    }

    /// The node that says the session `tag` is live: an ephemeral node of
    /// the session's own client, which `evict_session` deletes.
    pub(super) fn session_path(&self, tag: &str) -> String {
        format!("{}/s/{tag}", self.inner.base)
    }
}

/// A name as one path segment: bytes outside `[A-Za-z0-9_-]` as `%XX`.
pub(super) fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn decode_name(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A child's name before the sequence: `TAG_KIND_`, where KIND is `X`,
/// `S` or `P<count>of<limit>`.
pub(super) fn child_prefix(tag: &str, kind: EntryKind) -> String {
    let letter = codec::kind_letter(kind);
    match kind {
        EntryKind::Permits { count, limit } => format!("{tag}_{letter}{count}of{limit}_"),
        _ => format!("{tag}_{letter}_"),
    }
}

/// One child as its name tells: (tag, kind, sequence).
pub(super) fn parse_child(child: &str) -> Option<(&str, EntryKind, i64)> {
    let mut f = child.splitn(3, '_');
    let (tag, kind, seq) = (f.next()?, f.next()?, f.next()?);
    let (letter, permits) = kind.split_at(kind.len().min(1));
    let (count, limit) = match permits.split_once("of") {
        Some((count, limit)) => (count.parse().ok()?, limit.parse().ok()?),
        None if permits.is_empty() => (0, 0),
        None => return None,
    };
    let kind = codec::kind_from_letter(BACKEND, letter, count, limit).ok()?;
    Some((tag, kind, seq.parse().ok()?))
}

/// The class of a name, kept as its node's data: entries of one class may
/// share a name (a lock's exclusive and shared entries; a semaphore's of
/// one limit), entries of two may not (see [`crate::queue::check_compatible`]).
pub(super) fn class_of(kind: EntryKind) -> Vec<u8> {
    match kind {
        EntryKind::Exclusive | EntryKind::Shared => b"L".to_vec(),
        EntryKind::Permits { limit, .. } => format!("P{limit}").into_bytes(),
    }
}

/// An entry's data: `HOLDS\tLABEL\n` then the value.
pub(super) fn encode_data(holds: u32, label: &str, value: &[u8]) -> Vec<u8> {
    let mut out = format!("{holds}\t{label}\n").into_bytes();
    out.extend_from_slice(value);
    out
}

pub(super) fn decode_data(raw: &[u8]) -> (u32, String, Vec<u8>) {
    let nl = raw.iter().position(|b| *b == b'\n').unwrap_or(raw.len());
    let head = String::from_utf8_lossy(&raw[..nl]);
    let (holds, label) = head.split_once('\t').unwrap_or((&head, ""));
    (
        holds.parse().unwrap_or(1),
        label.to_string(),
        raw.get(nl + 1..).map(<[u8]>::to_vec).unwrap_or_default(),
    )
}

/// What a fence's or cell's node holds (its data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reg {
    /// A fence: the highest token admitted, and the value last written
    /// through it.
    Fence {
        highest: u64,
        value: Option<Vec<u8>>,
    },
    /// A cell: the tag of the session its value is bound to, and the value
    /// (`None`: deleted).
    Cell {
        owner: Option<String>,
        value: Option<Vec<u8>>,
    },
}

/// A fence's or cell's data: `KIND\tFIELD\tHAS\n` then the value, where
/// HAS is 1 when there is a value (which may not be empty, so 0 is none).
fn encode_register(kind: char, field: &str, value: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!("{kind}\t{field}\t{}\n", u8::from(value.is_some())).into_bytes();
    out.extend_from_slice(value.unwrap_or_default());
    out
}

pub(super) fn encode_fence(highest: u64, value: Option<&[u8]>) -> Vec<u8> {
    encode_register('F', &highest.to_string(), value)
}

pub(super) fn encode_cell(owner: Option<&str>, value: Option<&[u8]>) -> Vec<u8> {
    encode_register('C', owner.unwrap_or(""), value)
}

pub(super) fn decode_register(raw: &[u8]) -> Option<Reg> {
    let nl = raw.iter().position(|b| *b == b'\n')?;
    let (head, rest) = raw.split_at(nl);
    let body = rest.get(1..)?;
    let mut fields = std::str::from_utf8(head).ok()?.split('\t');
    let (kind, field, has) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let value = match has {
        "1" => Some(body.to_vec()),
        "0" if body.is_empty() => None,
        _ => return None,
    };
    match kind {
        "F" => Some(Reg::Fence {
            highest: field.parse().ok()?,
            value,
        }),
        "C" => Some(Reg::Cell {
            owner: (!field.is_empty()).then(|| field.to_string()),
            value,
        }),
        _ => None,
    }
}
