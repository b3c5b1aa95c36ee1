//! Unit tests: the URL, a session ended by its tag, merging the nodes' queues.

use std::time::Duration;

use super::connect::parse_url;
use super::merge::{merge, most_common};
use super::quorum::ended_live_session;
use super::{Mask, URL};
use crate::backend::url::StoreUrl;
use crate::error::Result;
use crate::store::{Entry, EntryKind, Queue};

fn parse(url: &str) -> Result<(Vec<String>, Duration)> {
    parse_url(&StoreUrl::parse(url, &URL)?)
}

#[test]
fn urls() {
    let (urls, t) = parse("redlock://:pw@a:1,b:2,c:3/2?prefix=x&node_timeout=50ms").unwrap();
    assert_eq!(urls[1], "redis://:pw@b:2/2?prefix=x");
    assert_eq!(t, Duration::from_millis(50));
    for bad in [
        "redlock://a:1,b:2",
        "redlock://a:1,b:2,c:3,d:4",
        "redlock://a:1,a:1,b:2",
        "redlock://a,b:2,c:3",
        "redlock://a:1,b:2,c:3?node_timeout=forever",
        "redlock://a:1,b:2,c:3?nosuch=1",
        "redlock://a:1,b:2,c:3/x",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    let e = parse("redlock://:hunter2@a:1,b:2").unwrap_err();
    assert!(!e.to_string().contains("hunter2"));
}

#[test]
fn a_session_ended_by_tag_counts_on_a_majority() {
    let all: Mask = 0b111;
    // Ended on a majority: it was live.
    assert!(ended_live_session(3, 2, 0b011, all).unwrap());
    assert!(ended_live_session(3, 2, 0b011, 0b011).unwrap());
    // Nowhere, or only where a close was missed: not live.
    assert!(!ended_live_session(3, 2, 0, all).unwrap());
    assert!(!ended_live_session(3, 2, 0b001, all).unwrap());
    // One node ended it and the silent one may have had it too.
    assert!(ended_live_session(3, 2, 0b001, 0b011).is_err());
    assert!(ended_live_session(5, 3, 0b00011, 0b01111).is_err());
    assert!(!ended_live_session(5, 3, 0b00001, 0b01111).unwrap());
}

#[test]
fn merging() {
    let entry = |seq, granted| Entry {
        seq,
        kind: EntryKind::Exclusive,
        session_tag: "t".into(),
        label: "l".into(),
        value: vec![],
        granted,
        granted_at: None,
        expires_in: Duration::from_secs(1),
        holds: 1,
    };
    let q = |entries| Queue {
        version: 0,
        entries,
    };
    // seq 5 on all three, granted on two; seq 7 on one node only.
    let merged = merge(
        vec![
            q(vec![entry(5, true), entry(7, false)]),
            q(vec![entry(5, true)]),
            q(vec![entry(5, false)]),
        ],
        2,
    );
    assert_eq!(merged.entries.len(), 1);
    assert!(merged.entries[0].granted);
    assert_eq!(
        most_common(vec![b"a".to_vec(), b"b".to_vec(), b"b".to_vec()]),
        b"b"
    );
}
