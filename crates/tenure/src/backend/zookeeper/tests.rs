//! Unit tests of what needs no server: URLs, names, queue order and the
//! registers' data.

use super::connect::{parse_url, Parsed};
use super::layout::{
    child_prefix, decode_data, decode_name, decode_register, encode_cell, encode_data,
    encode_fence, encode_name, parse_child, Reg,
};
use super::nodes::{cell_version, next_version};
use super::queue::{listing, queue_start};
use super::URL;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};
use crate::store::EntryKind;

fn parse(url: &str) -> Result<Parsed> {
    parse_url(&StoreUrl::parse(url, &URL)?)
}

/// A name's sequence counter wraps (signed 32 bits, never reset): the
/// queue keeps the order of creation across 2^31 and 2^32, and only
/// its first entry is granted.
#[test]
fn queue_order_survives_the_sequence_counters_wraps() {
    let prefix = child_prefix("abc", EntryKind::Exclusive);
    for created in [
        ["2147483646", "2147483647", "-2147483648", "-2147483647"],
        ["-000000002", "-000000001", "0000000000", "0000000001"],
        ["0000000005", "0000000006", "0000000007", "0000000008"],
    ] {
        let mut shuffled: Vec<String> = created.iter().map(|s| format!("{prefix}{s}")).collect();
        shuffled.swap(0, 3);
        shuffled.swap(1, 2);
        let list = listing(shuffled);
        let order: Vec<&str> = list.children.iter().map(|c| &c.0[prefix.len()..]).collect();
        assert_eq!(order, created);
        assert_eq!(list.granted, [true, false, false, false]);
    }
    assert_eq!(queue_start(&[]), 0);
    assert_eq!(queue_start(&[7]), 0);
}

#[test]
fn names_and_children() {
    for name in ["a", "x'); DROP --", "a/b", ".", "..", "é ü"] {
        let e = encode_name(name);
        assert!(!e.contains('/') && e != "." && e != "..", "{e}");
        assert_eq!(decode_name(&e).as_deref(), Some(name));
    }
    let kind = EntryKind::Permits { count: 2, limit: 5 };
    let child = format!("{}{}", child_prefix("abc", kind), "0000000007");
    assert_eq!(parse_child(&child), Some(("abc", kind, 7)));
    let (h, l, v) = decode_data(&encode_data(3, "host 1", b"v\nw"));
    assert_eq!((h, l.as_str(), v.as_slice()), (3, "host 1", &b"v\nw"[..]));
}

#[test]
fn registers() {
    let value = b"v\n\tw".to_vec();
    let fence = Reg::Fence {
        highest: (i64::MAX - 1) as u64,
        value: Some(value.clone()),
    };
    let data = encode_fence((i64::MAX - 1) as u64, Some(&value));
    assert_eq!(decode_register(&data), Some(fence));
    let none = Reg::Fence {
        highest: 0,
        value: None,
    };
    assert_eq!(decode_register(&encode_fence(0, None)), Some(none));
    let bound = Reg::Cell {
        owner: Some("abc".into()),
        value: Some(b"x".to_vec()),
    };
    let data = encode_cell(Some("abc"), Some(b"x"));
    assert_eq!(decode_register(&data), Some(bound));
    let tombstone = Reg::Cell {
        owner: None,
        value: None,
    };
    assert_eq!(decode_register(&encode_cell(None, None)), Some(tombstone));
    // Malformed data is none of them (the caller's typed error), never a panic.
    for bad in [
        &b""[..],
        b"\n",
        b"F\t1\t1",
        b"F\tx\t0\n",
        b"F\t-1\t0\n",
        b"F\t1\t0\nv",
        b"F\t1\t2\n",
        b"F\t1\t0\t\n",
        b"X\t1\t0\n",
        b"C\t\n",
        b"\xff\t1\t0\n",
    ] {
        assert_eq!(decode_register(bad), None, "{bad:?}");
    }
    assert_eq!(cell_version(7).ok(), Some(7));
    assert!(cell_version(0).is_err());
    assert!(cell_version(-1).is_err());
    assert!(next_version(i32::MAX).is_err());
}

#[test]
fn urls() {
    let p = parse("zk://u:p@a:1,b:2/app/locks").unwrap();
    assert_eq!(p.hosts, "a:1,b:2");
    assert_eq!(p.base, "/app/locks");
    assert_eq!(p.auth.as_deref(), Some(&b"u:p"[..]));
    assert_eq!(parse("zk://a:1").unwrap().base, "/tenure");
    for bad in ["zk://a", "zk://a:1/x/../y", "zk://a:1?x=1", "zk://a:1//x"] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    // TLS: zks:// with its CA; the CA only with zks://.
    let p = parse("zks://a:1/app?tls_ca=/ca.pem");
    match cfg!(feature = "tls") {
        true => assert_eq!(p.unwrap().tls_ca.as_deref(), Some("/ca.pem")),
        false => assert!(matches!(
            p,
            Err(Error::BackendDisabled { feature: "tls", .. })
        )),
    }
    assert!(matches!(
        parse("zk://a:1?tls_ca=/ca.pem"),
        Err(Error::InvalidUrl { .. })
    ));
    if cfg!(feature = "tls") {
        assert!(matches!(parse("zks://a:1"), Err(Error::InvalidUrl { .. })));
    }
}
