//! The SQL core's own tests: tags and typed rows.

use super::{storable_tag, Cell, SqlRow};

#[test]
fn tags_no_store_could_hold_are_nobodys() {
    assert!(storable_tag("0123456789ab"));
    assert!(storable_tag("x'; DROP TABLE sessions; --"));
    assert!(storable_tag(""));
    assert!(!storable_tag(&"a".repeat(33)));
    assert!(!storable_tag("ab\0cd"));
}

#[test]
fn rows_read_with_typed_errors() {
    let row = SqlRow::new(
        "t",
        vec![
            Cell::Int(7),
            Cell::Flag(true),
            Cell::Null,
            Cell::Text("x".into()),
            Cell::Bytes(b"v".to_vec()),
        ],
    );
    assert_eq!(row.int(0).unwrap(), 7);
    assert!(row.flag(1).unwrap() && row.flag(0).unwrap());
    assert_eq!(row.opt_int(2).unwrap(), None);
    assert_eq!(row.text(3).unwrap(), "x");
    assert_eq!(row.bytes(4).unwrap(), b"v");
    assert_eq!(row.bytes(2).unwrap(), b"");
    assert!(row.int(3).is_err());
    assert!(row.int(9).is_err());
    assert!(row.count::<u32>(0).is_ok());
    assert!(SqlRow::new("t", vec![Cell::Int(-1)])
        .count::<u32>(0)
        .is_err());
    assert!(row
        .int(9)
        .unwrap_err()
        .to_string()
        .contains("t store error"));
}
