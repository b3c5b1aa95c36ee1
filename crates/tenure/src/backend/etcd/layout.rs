//! Where things live in etcd's keyspace and how they are written: the two
//! layouts (`?layout=`), the keys of a session, of a name's queue and of
//! its hold counts, and an entry's value with its header, its nonce and its
//! granted mark.

use super::rpc::{Compare, CompareOp};
use super::{bad, EtcdStore, BACKEND};
use crate::backend::codec;
use crate::error::{Error, Result};
use crate::store::{EntryKind, Name, SessionKey};

/// Where a name's queue lives in etcd's keyspace (`?layout=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// tenure's own: `PREFIX/n/NAME\0q<lease>`, the entry's kind in its
    /// value; every kind of entry.
    Tenure,
    /// etcd's `concurrency` recipe (`etcdctl lock`/`elect`, Go's `Mutex` and
    /// `Election`): `NAME/<lease in hex>`, the value the user's own;
    /// exclusive entries only. A hold count and the join's nonce live in
    /// tenure's own `PREFIX/h/NAME\0<lease>`, which etcd's recipe never reads.
    Etcd,
}

/// A hold count with its layout's formatting: etcd's layout pads it to ten
/// digits, so that etcd's byte-wise compare (`< 0000000002`) tells one hold
/// from more, and the join's nonce follows it.
pub(super) fn aux_value(holds: u32, nonce: &str) -> Vec<u8> {
    format!("{holds:010}\t{nonce}").into_bytes()
}

pub(super) fn parse_aux(raw: &[u8]) -> Result<(u32, String)> {
    let text = std::str::from_utf8(raw).map_err(|_| bad("a hold count"))?;
    let (n, nonce) = text.split_once('\t').unwrap_or((text, ""));
    let n = n.parse::<u32>().map_err(|_| bad("a hold count"))?;
    Ok((n, nonce.to_string()))
}

/// A session key: 16 hex digits of the lease, then the secret.
pub(super) fn split_key(key: &SessionKey) -> Result<(i64, &str)> {
    let s = key.secret();
    let lease = s
        .get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|l| l as i64)
        .ok_or(Error::SessionLost(crate::error::LostReason::Expired))?;
    Ok((lease, &s[16..]))
}

/// An entry's value: `KIND\tCOUNT\tLIMIT\tNONCE\n` then the user's value.
/// The nonce names the join that put it, so a join tried again after a lost
/// answer knows its own entry.
pub(super) fn encode(kind: EntryKind, nonce: &str, value: &[u8]) -> Vec<u8> {
    let (_, count, limit) = codec::kind_code(kind);
    let letter = codec::kind_letter(kind);
    let mut out = format!("{letter}\t{count}\t{limit}\t{nonce}\n").into_bytes();
    out.extend_from_slice(value);
    out
}

pub(super) fn decode(raw: &[u8]) -> Result<(EntryKind, String, Vec<u8>)> {
    let nl = raw
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("an entry without a header"))?;
    let head = std::str::from_utf8(&raw[..nl]).map_err(bad)?;
    let mut f = head.split('\t');
    let (k, c, l, nonce) = (f.next(), f.next(), f.next(), f.next());
    let num = |v: Option<&str>| -> Result<i64> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("an entry header"))
    };
    let kind = codec::kind_from_letter(BACKEND, k.unwrap_or_default(), num(c)?, num(l)?)?;
    Ok((
        kind,
        nonce.unwrap_or_default().to_string(),
        raw[nl + 1..].to_vec(),
    ))
}

/// The header field an exclusive entry gains when its holder is granted
/// after waiting. Its deletion then tells the waiter just behind it, from
/// the watch event alone, that nothing is left ahead: nothing was ahead of
/// a granted exclusive entry, and entries only join at the back. So a
/// handoff costs no read of the queue, which etcd answers in `O(n)` (it
/// sorts a range by create revision by reading every key of it). Older
/// readers ignore the field.
const GRANTED_MARK: &str = "g";

/// Whether `raw` is an exclusive entry marked [`GRANTED_MARK`].
pub(super) fn marked_granted(raw: &[u8]) -> bool {
    let head = match raw.iter().position(|b| *b == b'\n') {
        Some(nl) => &raw[..nl],
        None => return false,
    };
    let mut fields = head.split(|b| *b == b'\t');
    fields.next() == Some(codec::kind_letter(EntryKind::Exclusive).as_bytes())
        && fields.nth(3) == Some(GRANTED_MARK.as_bytes())
}

/// `raw` with [`GRANTED_MARK`] added, if it has a header and no mark yet.
pub(super) fn with_granted_mark(raw: &[u8]) -> Option<Vec<u8>> {
    let nl = raw.iter().position(|b| *b == b'\n')?;
    if raw[..nl].iter().filter(|b| **b == b'\t').count() != 3 {
        return None;
    }
    let mut out = raw[..nl].to_vec();
    out.push(b'\t');
    out.extend_from_slice(GRANTED_MARK.as_bytes());
    out.extend_from_slice(&raw[nl..]);
    Some(out)
}

pub(super) fn lease_of(hex: &[u8]) -> Result<i64> {
    std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|l| l as i64)
        .ok_or_else(|| bad("a lease id in a key"))
}

impl EtcdStore {
    pub(super) fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}/{rest}", self.inner.prefix).into_bytes()
    }

    pub(super) fn secret_key(&self, lease: i64) -> Vec<u8> {
        self.key(&format!("sk/{lease:016x}"))
    }

    pub(super) fn info_key(&self, lease: i64) -> Vec<u8> {
        self.key(&format!("si/{lease:016x}"))
    }

    /// Format 2's key, beside format 1's: the build that opened the
    /// session, on its lease (builds of 0.1.0 neither read nor write it).
    pub(super) fn build_key(&self, lease: i64) -> Vec<u8> {
        self.key(&format!("sb/{lease:016x}"))
    }

    /// Every key of a name (its entries and, in tenure's layout, hold
    /// counts) starts with this.
    pub(super) fn name_prefix(&self, name: &Name) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => {
                let mut k = self.key(&format!("n/{name}"));
                k.push(0);
                k
            }
            Layout::Etcd => format!("{name}/").into_bytes(),
        }
    }

    /// tenure's layout: the lease of the newest exclusive entry, on that
    /// lease, deleted with that entry. So while it exists an entry does,
    /// and an exclusive try-lock is refused by one key's read (a range's
    /// costs etcd `O(n)`: it counts every key of a range, even with a limit).
    pub(super) fn busy_key(&self, name: &Name) -> Vec<u8> {
        let mut k = self.name_prefix(name);
        k.push(b'b');
        k
    }

    pub(super) fn queue_prefix(&self, name: &Name) -> Vec<u8> {
        let mut k = self.name_prefix(name);
        if self.inner.layout == Layout::Tenure {
            k.push(b'q');
        }
        k
    }

    pub(super) fn entry_key(&self, name: &Name, lease: i64) -> Vec<u8> {
        let mut k = self.queue_prefix(name);
        match self.inner.layout {
            Layout::Tenure => k.extend_from_slice(format!("{lease:016x}").as_bytes()),
            // As etcd's recipe names it (Go's `%x` of the lease).
            Layout::Etcd => k.extend_from_slice(format!("{lease:x}").as_bytes()),
        }
        k
    }

    pub(super) fn holds_key(&self, name: &Name, lease: i64) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => {
                let mut k = self.name_prefix(name);
                k.extend_from_slice(format!("h{lease:016x}").as_bytes());
                k
            }
            Layout::Etcd => {
                let mut k = self.aux_prefix(name);
                k.extend_from_slice(format!("{lease:016x}").as_bytes());
                k
            }
        }
    }

    /// etcd's layout: a name whose keys would mix with tenure's own (the
    /// prefix's) is refused: its queue would read sessions' secrets.
    pub(super) fn check_recipe_name(&self, name: &Name) -> Result<()> {
        if self.inner.layout != Layout::Etcd {
            return Ok(());
        }
        let (n, p) = (format!("{name}/"), format!("{}/", self.inner.prefix));
        if n.starts_with(&p) || p.starts_with(&n) {
            return Err(Error::InvalidName {
                name: name.to_string().escape_debug().collect(),
                reason: "with ?layout=etcd a name must not overlap the store's own ?prefix= (default `tenure`)",
            });
        }
        Ok(())
    }

    /// etcd's layout: where a name's hold counts and nonces live.
    pub(super) fn aux_prefix(&self, name: &Name) -> Vec<u8> {
        let mut k = self.key(&format!("h/{name}"));
        k.push(0);
        k
    }

    /// A hold count as this layout writes it.
    pub(super) fn holds_value(&self, holds: u32, nonce: &str) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => holds.to_string().into_bytes(),
            Layout::Etcd => aux_value(holds, nonce),
        }
    }

    /// An entry's value as this layout writes it.
    pub(super) fn encode_entry(&self, kind: EntryKind, nonce: &str, value: &[u8]) -> Vec<u8> {
        match self.inner.layout {
            Layout::Tenure => encode(kind, nonce, value),
            Layout::Etcd => value.to_vec(),
        }
    }

    /// An entry's kind, nonce and value (etcd's layout: always exclusive;
    /// the nonce is in the hold-count key).
    pub(super) fn decode_entry(&self, raw: &[u8]) -> Result<(EntryKind, String, Vec<u8>)> {
        match self.inner.layout {
            Layout::Tenure => decode(raw),
            Layout::Etcd => Ok((EntryKind::Exclusive, String::new(), raw.to_vec())),
        }
    }

    pub(super) fn seen_key(&self, name: &Name) -> Vec<u8> {
        self.key(&format!("c/{name}"))
    }

    pub(super) fn secret_matches(&self, lease: i64, secret: &str) -> Compare {
        Compare::value(self.secret_key(lease), CompareOp::Equal, secret)
    }
}
