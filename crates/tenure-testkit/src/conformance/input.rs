//! Conformance: what a caller may ask for — names (one lock per name,
//! compared byte for byte on every store) and TTLs — and the typed error for
//! what it may not.

use super::*;

/// Bad input gets a typed error, never a panic.
pub async fn check_bad_input(t: &Target) {
    let s = session(&t.store).await;
    for bad in ["", "a\0b", "line\nbreak"] {
        assert!(
            matches!(Mutex::new(&s, bad), Err(Error::InvalidName { .. })),
            "{bad:?}"
        );
        assert!(matches!(
            Election::new(&s, bad),
            Err(Error::InvalidName { .. })
        ));
    }
    let long = "n".repeat(tenure::store::MAX_NAME_LEN + 1);
    assert!(matches!(
        Mutex::new(&s, &long),
        Err(Error::InvalidName { .. })
    ));
    assert!(Mutex::new(&s, "n".repeat(tenure::store::MAX_NAME_LEN)).is_ok());
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(100 * 365 * 24 * 3600),
    ] {
        let r = Session::with_options(&t.store, SessionOptions::new().ttl(ttl)).await;
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "ttl {ttl:?}: {r:?}"
        );
    }
    let r = Session::with_options(
        &t.store,
        SessionOptions::new()
            .ttl(Duration::from_secs(3))
            .renew_every(Duration::from_secs(5)),
    )
    .await;
    assert!(matches!(r, Err(Error::InvalidArgument { .. })));
    // An injection-shaped name is only a name.
    let odd = unique("x'); DROP TABLE tenure_entries; --");
    let g = Mutex::new(&s, &odd).unwrap().lock().await.unwrap();
    assert_eq!(
        t.store.names(&odd).await.unwrap(),
        vec![Name::new(&odd).unwrap()]
    );
    g.release().await.unwrap();
}

/// A name is one lock on every store, compared byte for byte: names that
/// differ only in case, in a leading space, in a no-break space or in how
/// an accent is composed are different locks, each held at once; a name
/// that ends in a space (which MySQL's padding collation would take for
/// the name without it) is refused everywhere, with the reason.
pub async fn check_names_byte_for_byte(t: &Target) {
    let s = session(&t.store).await;
    let base = unique("pad");
    let variants = [
        base.clone(),
        base.to_uppercase(),
        format!(" {base}"),
        format!("{base}\u{a0}"),
        format!("{base}\u{e9}"),
        format!("{base}e\u{301}"),
    ];
    let mut held = Vec::new();
    for name in &variants {
        let g = Mutex::new(&s, name)
            .unwrap()
            .try_lock()
            .await
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        assert!(
            g.is_some(),
            "{name:?} was taken for another of {variants:?}"
        );
        held.push(g);
    }
    for name in &variants {
        let listed = t.store.names(name).await.unwrap();
        assert!(
            listed.contains(&Name::new(name).unwrap()),
            "{name:?} not listed: {listed:?}"
        );
    }
    let e = Mutex::new(&s, format!("{base} ")).unwrap_err();
    assert!(matches!(e, Error::InvalidName { .. }), "{e:?}");
    assert!(e.to_string().contains("must not end in a space"), "{e}");
    for g in held.into_iter().flatten() {
        g.release().await.unwrap();
    }
}
