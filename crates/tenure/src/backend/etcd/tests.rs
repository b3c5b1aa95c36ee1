//! Unit tests: URLs, the layouts' encodings, the granted mark, fence marks.

use super::connect::{parse_url, Parsed};
use super::layout::{
    aux_value, decode, encode, marked_granted, parse_aux, with_granted_mark, Layout,
};
use super::registers::{
    fence_ceiling, fence_mark, register_kind_of, revision_arg, Register, CELL_MARK, FENCE_MARK,
    TOKEN_DIGITS,
};
use super::{rpc, URL};
use crate::backend::url::StoreUrl;
use crate::error::Result;
use crate::store::EntryKind;

fn parse(url: &str) -> Result<Parsed> {
    parse_url(&StoreUrl::parse(url, &URL)?)
}

#[test]
fn urls() {
    let p = parse("etcd://u:p%40ss@a:1,b:2?prefix=x").unwrap();
    assert_eq!(p.endpoints, ["http://a:1", "http://b:2"]);
    assert_eq!(p.user, Some(("u".into(), "p@ss".into())));
    assert_eq!(p.prefix, "x");
    for bad in ["etcd://a", "etcd://a:x", "etcd://a:1?nosuch=1", "etcd://:1"] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    let Err(e) = parse("etcd://u:hunter2@a") else {
        panic!("a URL without a port was taken");
    };
    assert!(!e.to_string().contains("hunter2"));
    assert_eq!(parse("etcds://a:1").is_ok(), cfg!(feature = "tls"));
    assert!(parse("etcd://a:1?tls_ca=/x").is_err());
    assert_eq!(parse("etcd://a:1").unwrap().layout, Layout::Tenure);
    assert_eq!(
        parse("etcd://a:1?layout=etcd").unwrap().layout,
        Layout::Etcd
    );
    assert!(parse("etcd://a:1?layout=zk").is_err());
}

#[test]
fn hold_counts_order_as_numbers_in_etcds_layout() {
    // leave's one-hold compare: value < aux_value(2, "").
    let two = aux_value(2, "");
    assert!(aux_value(1, "nonce") < two);
    for n in [2, 10, 11, 123_456] {
        assert!(aux_value(n, "n") >= two, "{n}");
    }
    assert_eq!(
        parse_aux(&aux_value(12, "ab")).unwrap(),
        (12, "ab".to_string())
    );
    assert!(parse_aux(b"x\ty").is_err());
}

#[test]
fn a_granted_mark_is_read_only_on_exclusive_entries_and_ignored_by_decode() {
    let plain = encode(EntryKind::Exclusive, "n1", b"v\tw\nx");
    assert!(!marked_granted(&plain));
    let marked = with_granted_mark(&plain).expect("a header");
    assert!(marked_granted(&marked));
    assert!(with_granted_mark(&marked).is_none(), "marked once");
    let (kind, nonce, value) = decode(&marked).expect("decodes");
    assert_eq!(
        (kind, nonce.as_str(), value.as_slice()),
        (EntryKind::Exclusive, "n1", &b"v\tw\nx"[..])
    );
    let shared = with_granted_mark(&encode(EntryKind::Shared, "n2", b"")).expect("a header");
    assert!(
        !marked_granted(&shared),
        "only an exclusive entry's mark counts"
    );
    assert!(!marked_granted(b"no header"));
    assert!(with_granted_mark(b"no header").is_none());
}

#[test]
fn entries_round_trip() {
    let kind = EntryKind::Permits { count: 2, limit: 5 };
    let raw = encode(kind, "n1", b"a\nb\tc");
    assert_eq!(
        decode(&raw).unwrap(),
        (kind, "n1".to_string(), b"a\nb\tc".to_vec())
    );
    assert_eq!(rpc::prefix_end(b"ab"), b"ac");
    assert_eq!(rpc::prefix_end(b"a\xff"), b"b");
}

/// etcd compares values as bytes: a fence's mark must order tokens as
/// numbers, and the admit compares (`f` < mark < ceiling) must hold
/// exactly for a highest at most the token.
#[test]
fn fence_marks_order_as_numbers() {
    let tokens = [0, 1, 9, 10, 99, 100, 1 << 40, i64::MAX as u64, u64::MAX];
    for &a in &tokens {
        let mark = fence_mark(a);
        assert_eq!(mark.len(), 1 + TOKEN_DIGITS);
        assert!(mark.as_slice() > [FENCE_MARK].as_slice());
        assert!(CELL_MARK < [FENCE_MARK].as_slice());
        assert_eq!(register_kind_of(&mark).unwrap(), Register::Fence(a));
        for &b in &tokens {
            assert_eq!(mark.cmp(&fence_mark(b)), a.cmp(&b), "{a} vs {b}");
            assert_eq!(mark < fence_ceiling(b), a <= b, "{a} admitted by {b}");
        }
    }
    assert_eq!(register_kind_of(CELL_MARK).unwrap(), Register::Cell);
    for bad in [
        &b"f12"[..],
        b"f0000000000000000000x",
        b"f99999999999999999999",
        b"x",
        b"",
    ] {
        assert!(register_kind_of(bad).is_err(), "{bad:?}");
    }
    assert_eq!(revision_arg(0), i64::MAX);
    assert_eq!(revision_arg(u64::MAX), i64::MAX);
    assert_eq!(revision_arg(7), 7);
}
