//! One queue from the nodes' queues: what shows on enough of them, and a
//! version that changes whenever the merged queue does.

use std::collections::HashMap;
use std::time::Duration;

use crate::store::{Entry, Queue};

/// One queue from the nodes' queues: an entry counts when it shows on at
/// least `threshold` of them, and is granted when as many granted it.
pub(super) fn merge(queues: Vec<Queue>, threshold: usize) -> Queue {
    struct Seen {
        entry: Entry,
        shows: usize,
        grants: usize,
        expiries: Vec<Duration>,
        values: Vec<Vec<u8>>,
    }
    let mut by_seq: HashMap<u64, Seen> = HashMap::new();
    for q in queues {
        for e in q.entries {
            let seen = by_seq.entry(e.seq).or_insert_with(|| Seen {
                entry: e.clone(),
                shows: 0,
                grants: 0,
                expiries: Vec::new(),
                values: Vec::new(),
            });
            seen.shows += 1;
            seen.grants += usize::from(e.granted);
            seen.expiries.push(e.expires_in);
            seen.entry.holds = seen.entry.holds.max(e.holds);
            if e.granted_at.is_some()
                && (seen.entry.granted_at.is_none() || e.granted_at < seen.entry.granted_at)
            {
                seen.entry.granted_at = e.granted_at;
            }
            seen.values.push(e.value);
        }
    }
    let mut entries: Vec<Entry> = by_seq
        .into_values()
        .filter(|s| s.shows >= threshold)
        .map(|mut s| {
            s.entry.granted = s.grants >= threshold;
            if !s.entry.granted {
                s.entry.granted_at = None;
            }
            // The entry lasts while `threshold` nodes still have it.
            s.expiries.sort_unstable_by(|a, b| b.cmp(a));
            s.entry.expires_in = s.expiries[threshold - 1];
            s.entry.value = most_common(s.values);
            s.entry
        })
        .collect();
    entries.sort_by_key(|e| e.seq);
    Queue {
        version: fingerprint(&entries),
        entries,
    }
}

pub(super) fn most_common(mut values: Vec<Vec<u8>>) -> Vec<u8> {
    values.sort();
    let mut best: (usize, usize) = (0, 0); // (count, index)
    let mut i = 0;
    while i < values.len() {
        let j = values[i..].iter().take_while(|v| **v == values[i]).count();
        if j > best.0 {
            best = (j, i);
        }
        i += j;
    }
    values.swap_remove(best.1)
}

/// A version for a merged queue: a hash of what observers can see, so it
/// changes whenever the queue does (the nodes' own versions differ).
fn fingerprint(entries: &[Entry]) -> u64 {
    let mut f = crate::backend::poll::Fingerprint::default();
    for e in entries {
        f.bytes(&e.seq.to_le_bytes());
        f.bytes(&[u8::from(e.granted)]);
        f.bytes(&e.holds.to_le_bytes());
        f.bytes(&(e.value.len() as u64).to_le_bytes());
        f.bytes(&e.value);
        f.bytes(e.session_tag.as_bytes());
    }
    f.0
}
