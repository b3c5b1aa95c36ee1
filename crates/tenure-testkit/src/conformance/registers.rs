//! Conformance: fences (a token check kept by the store) and cells (values
//! with versions, written by compare-and-set).

use super::*;

use tenure::store::{Expect, MAX_VALUE_LEN};
use tenure::{Cell, Fence};

/// A cell on a backend that says it has none answers `Unsupported`, and
/// changes nothing; returns whether the backend has cells.
async fn has_cells(t: &Target, name: &str) -> bool {
    if t.store.capabilities().cells {
        return true;
    }
    let cell = Cell::new(&t.store, name).unwrap();
    let e = err(cell.get().await, "cell.get()");
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    let e = err(
        cell.put(b"x", Expect::Absent).await,
        "cell.put(b\"x\", Expect::Absent)",
    );
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    eprintln!(
        "{}: cells are not supported (capabilities say so)",
        t.store.capabilities().backend
    );
    false
}

/// The error of a call that must fail; a success is reported without its
/// value (which may be 64 KiB).
fn err<T>(result: tenure::Result<T>, what: &str) -> Error {
    match result {
        Ok(_) => panic!("{what} succeeded; it must fail"),
        Err(e) => e,
    }
}

fn stale(e: &Error) -> Option<(u64, u64)> {
    match e {
        Error::StaleToken { token, highest, .. } => Some((*token, *highest)),
        _ => None,
    }
}

fn mismatch(e: &Error) -> Option<(Option<u64>, Option<u64>)> {
    match e {
        Error::VersionMismatch {
            expected, current, ..
        } => Some((*expected, *current)),
        _ => None,
    }
}

/// A fence admits a token at least the highest, refuses a lower one with
/// the highest, and refuses bad tokens and a cell's name without changing
/// anything.
pub async fn check_fence(t: &Target) {
    let name = unique("fence");
    let fence = Fence::new(&t.store, &name).unwrap();
    let fresh = fence.read().await.unwrap();
    assert_eq!((fresh.highest, fresh.value.clone()), (0, None), "{fresh:?}");
    assert_eq!(fence.admit(5).await.unwrap(), 5);
    assert_eq!(
        fence.admit(5).await.unwrap(),
        5,
        "an equal token is admitted"
    );
    let e = err(fence.admit(4).await, "fence.admit(4)");
    assert_eq!(stale(&e), Some((4, 5)), "{e:?}");
    assert_eq!(fence.read().await.unwrap().highest, 5);
    assert_eq!(fence.admit(9).await.unwrap(), 9);
    // Tokens beyond 2^53 (a double's exact range) and up to the largest a
    // store hands out.
    let big = (i64::MAX - 1) as u64;
    assert_eq!(fence.admit(big - 1).await.unwrap(), big - 1);
    assert_eq!(fence.admit(big).await.unwrap(), big);
    let e = err(fence.admit(big - 1).await, "fence.admit(big - 1)");
    assert_eq!(stale(&e), Some((big - 1, big)), "{e:?}");
    let e = err(fence.admit(1 << 40).await, "fence.admit(1 << 40)");
    assert_eq!(stale(&e), Some((1 << 40, big)), "{e:?}");
    // Bad tokens: a clear error, and nothing changes.
    for e in [
        err(fence.admit(0).await, "fence.admit(0)"),
        err(fence.admit(u64::MAX).await, "fence.admit(u64::MAX)"),
    ] {
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "bad input gave {e:?}"
        );
    }
    assert_eq!(fence.read().await.unwrap().highest, big);

    // A fence's name used as a cell, and a cell's as a fence.
    if t.store.capabilities().cells {
        // Refused cell writes on a name never used leave nothing behind: a
        // fence can still take the name.
        let fresh = unique("fence-fresh");
        let cell = Cell::new(&t.store, &fresh).unwrap();
        let e = err(
            cell.put(b"x", Expect::Version(5)).await,
            "put on a fresh name",
        );
        assert_eq!(mismatch(&e), Some((Some(5), None)), "{e:?}");
        let e = err(cell.delete(5).await, "delete on a fresh name");
        assert_eq!(mismatch(&e), Some((Some(5), None)), "{e:?}");
        assert_eq!(
            Fence::new(&t.store, &fresh)
                .unwrap()
                .admit(7)
                .await
                .unwrap(),
            7,
            "a refused cell write made the name a cell"
        );

        let cell = Cell::new(&t.store, &name).unwrap();
        let e = err(cell.get().await, "cell.get()");
        assert!(matches!(e, Error::Conflict { .. }), "{e:?}");
        let e = err(
            cell.put(b"x", Expect::Absent).await,
            "cell.put(b\"x\", Expect::Absent)",
        );
        assert!(matches!(e, Error::Conflict { .. }), "{e:?}");
        assert_eq!(fence.read().await.unwrap().highest, big);

        let cell_name = unique("fence-cell");
        let cell = Cell::new(&t.store, &cell_name).unwrap();
        let v = cell.put(b"mine", Expect::Absent).await.unwrap();
        let not_a_fence = Fence::new(&t.store, &cell_name).unwrap();
        for e in [
            err(not_a_fence.admit(3).await, "not_a_fence.admit(3)"),
            err(not_a_fence.read().await, "not_a_fence.read()"),
        ] {
            assert!(matches!(e, Error::Conflict { .. }), "{e:?}");
        }
        let kept = cell.get().await.unwrap().unwrap();
        assert_eq!((kept.value.as_slice(), kept.version), (&b"mine"[..], v));
    }
}

/// A value written through a fence: only with an admitted token, kept
/// when a later token is admitted without one, whole up to the largest
/// size; bad values change nothing.
pub async fn check_fence_values(t: &Target) {
    let fence = Fence::new(&t.store, unique("fence-value")).unwrap();
    if !t.store.capabilities().fence_values {
        let e = err(fence.write(3, b"x").await, "fence.write(3)");
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        assert_eq!(
            fence.read().await.unwrap().highest,
            0,
            "an unsupported write admitted"
        );
        eprintln!(
            "{}: fenced values are not supported (capabilities say so)",
            t.store.capabilities().backend
        );
        return;
    }
    fence.write(5, b"first").await.unwrap();
    fence.write(5, b"again").await.unwrap();
    fence.write(9, b"second").await.unwrap();
    let e = err(fence.write(8, b"late").await, "fence.write(8)");
    assert_eq!(stale(&e), Some((8, 9)), "{e:?}");
    let now = fence.read().await.unwrap();
    assert_eq!(
        (now.highest, now.value.as_deref()),
        (9, Some(&b"second"[..])),
        "a refused write changed the fence"
    );
    // Admitting without a value keeps the value.
    assert_eq!(fence.admit(10).await.unwrap(), 10);
    assert_eq!(
        fence.read().await.unwrap().value.as_deref(),
        Some(&b"second"[..])
    );
    for e in [
        err(fence.write(11, b"").await, "fence.write(11, empty)"),
        err(
            fence.write(11, &vec![7u8; MAX_VALUE_LEN + 1]).await,
            "fence.write(11, too long)",
        ),
    ] {
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "bad input gave {e:?}"
        );
    }
    let after = fence.read().await.unwrap();
    assert_eq!(
        (after.highest, after.value.as_deref()),
        (10, Some(&b"second"[..])),
        "a bad value changed the fence"
    );
    let largest = vec![0xa5u8; MAX_VALUE_LEN];
    fence.write(10, &largest).await.unwrap();
    assert!(
        fence.read().await.unwrap().value == Some(largest),
        "the largest value did not come back whole"
    );
}

/// 16 tasks admit interleaved tokens (drawn from one counter as they go):
/// the admitted tokens never go down in real-time order, a refusal names a
/// token that was admitted (over independent nodes: presented), and the fence ends at
/// the highest admitted.
pub async fn check_fence_interleaved(t: &Target) {
    const TASKS: u64 = 16;
    const EACH: usize = 30;
    let name = unique("fence-race");
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let origin = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let fence = Fence::new(&t.store, &name).unwrap();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..EACH {
                let token = counter.fetch_add(1, Ordering::SeqCst);
                let start = origin.elapsed();
                let answer = fence.admit(token).await;
                let end = origin.elapsed();
                let outcome = match answer {
                    Ok(highest) => {
                        assert_eq!(highest, token);
                        None
                    }
                    Err(e) => {
                        let (_, highest) = stale(&e).unwrap_or_else(|| panic!("admit: {e:?}"));
                        assert!(highest > token, "refused {token} with highest {highest}");
                        Some(highest)
                    }
                };
                seen.push((start, end, token, outcome));
            }
            seen
        }));
    }
    let mut calls = Vec::new();
    for task in tasks {
        calls.extend(
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("admits took over 60 s")
                .unwrap(),
        );
    }
    let admitted: std::collections::HashSet<u64> = calls
        .iter()
        .filter(|c| c.3.is_none())
        .map(|c| c.2)
        .collect();
    assert!(!admitted.is_empty());
    // Where nodes admit each on their own (a store of independent nodes,
    // which for the same reason keeps no values through a fence), a token that reached a
    // minority before a higher one refused it stays there, and a later
    // refusal may name it: it was presented, and it is above the refused
    // one. Elsewhere an admission is one atomic step.
    let atomic = t.store.capabilities().fence_values;
    let presented: std::collections::HashSet<u64> = calls.iter().map(|c| c.2).collect();
    for &(_, a_end, a_token, a_refused) in &calls {
        if let Some(highest) = a_refused {
            if atomic {
                assert!(
                    admitted.contains(&highest),
                    "a refusal named {highest}, which no call had admitted"
                );
            } else {
                assert!(
                    presented.contains(&highest),
                    "a refusal named {highest}, which no call had presented"
                );
            }
        }
        // Whatever a finished call saw as the highest, a later admission
        // is at least that.
        let floor = a_refused.unwrap_or(a_token);
        for &(b_start, _, b_token, b_refused) in &calls {
            if a_end < b_start && b_refused.is_none() {
                assert!(
                    b_token >= floor,
                    "token {b_token} admitted after the fence had seen {floor}"
                );
            }
        }
    }
    let highest = Fence::new(&t.store, &name)
        .unwrap()
        .read()
        .await
        .unwrap()
        .highest;
    let top = admitted.iter().max().copied().unwrap_or(0);
    if atomic {
        assert_eq!(highest, top);
    } else {
        assert!(
            highest >= top && presented.contains(&highest),
            "the fence ends at {highest}, admitted up to {top}"
        );
    }
}

/// Versions: absent and present cases, a mismatch carries the current
/// version, a deleted cell's versions are not reused, bad input changes
/// nothing.
pub async fn check_cell(t: &Target) {
    let name = unique("cell");
    if !has_cells(t, &name).await {
        return;
    }
    let cell = Cell::new(&t.store, &name).unwrap();
    assert_eq!(cell.get().await.unwrap(), None);
    let e = err(cell.delete(1).await, "cell.delete(1)");
    assert_eq!(mismatch(&e), Some((Some(1), None)), "{e:?}");
    let e = err(
        cell.put(b"x", Expect::Version(1)).await,
        "cell.put(b\"x\", Expect::Version(1))",
    );
    assert_eq!(mismatch(&e), Some((Some(1), None)), "{e:?}");

    let v1 = cell.put(b"one", Expect::Absent).await.unwrap();
    assert!(v1 >= 1);
    let e = err(
        cell.put(b"again", Expect::Absent).await,
        "cell.put(b\"again\", Expect::Absent)",
    );
    assert_eq!(mismatch(&e), Some((None, Some(v1))), "{e:?}");
    let v2 = cell.put(b"two", Expect::Version(v1)).await.unwrap();
    assert!(v2 > v1, "{v2} after {v1}");
    let e = err(
        cell.put(b"late", Expect::Version(v1)).await,
        "cell.put(b\"late\", Expect::Version(v1))",
    );
    assert_eq!(mismatch(&e), Some((Some(v1), Some(v2))), "{e:?}");
    let got = cell.get().await.unwrap().unwrap();
    assert_eq!((got.value.as_slice(), got.version), (&b"two"[..], v2));

    // Bad input: typed errors, nothing written.
    for e in [
        err(
            cell.put(b"", Expect::Version(v2)).await,
            "cell.put(b\"\", Expect::Version(v2))",
        ),
        err(
            cell.put(&vec![1u8; MAX_VALUE_LEN + 1], Expect::Version(v2))
                .await,
            "cell.put(&vec![1u8; MAX_VALUE_LEN + 1], Expect::Version(v2))",
        ),
        err(
            cell.put(b"x", Expect::Version(0)).await,
            "cell.put(b\"x\", Expect::Version(0))",
        ),
        err(cell.delete(0).await, "cell.delete(0)"),
    ] {
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "bad input gave {e:?}"
        );
    }
    assert_eq!(cell.get().await.unwrap().map(|c| c.version), Some(v2));
    let largest = vec![0x5au8; MAX_VALUE_LEN];
    let v3 = cell.put(&largest, Expect::Version(v2)).await.unwrap();
    assert!(
        cell.get().await.unwrap().map(|c| c.value) == Some(largest),
        "the largest value did not come back whole"
    );

    let e = err(cell.delete(v2).await, "cell.delete(v2)");
    assert_eq!(mismatch(&e), Some((Some(v2), Some(v3))), "{e:?}");
    cell.delete(v3).await.unwrap();
    assert_eq!(cell.get().await.unwrap(), None);
    let e = err(
        cell.put(b"x", Expect::Version(v3)).await,
        "cell.put(b\"x\", Expect::Version(v3))",
    );
    assert_eq!(mismatch(&e), Some((Some(v3), None)), "{e:?}");
    let v4 = cell.put(b"reborn", Expect::Absent).await.unwrap();
    assert!(
        v4 > v3,
        "a deleted cell's version came back: {v4} after {v3}"
    );
    // Another handle on the same name sees the same cell.
    let other = Cell::new(&t.store, &name).unwrap();
    assert_eq!(other.get().await.unwrap().map(|c| c.version), Some(v4));
}

/// A cell bound to a session loses its value when the session is closed or
/// expires; a lost session cannot write one; versions go on growing.
pub async fn check_cell_bound_to_session(t: &Target) {
    let name = unique("cell-bound");
    if !has_cells(t, &name).await {
        return;
    }
    let owner = session(&t.store).await;
    let bound = Cell::bound_to(&owner, &name).unwrap();
    let v1 = bound.put(b"while I live", Expect::Absent).await.unwrap();
    let v2 = bound.put(b"still", Expect::Version(v1)).await.unwrap();
    let plain = Cell::new(&t.store, &name).unwrap();
    assert_eq!(plain.get().await.unwrap().map(|c| c.version), Some(v2));
    owner.close().await.unwrap();
    assert_eq!(plain.get().await.unwrap(), None, "closed session's cell");
    let e = err(
        bound.put(b"after", Expect::Absent).await,
        "bound.put(b\"after\", Expect::Absent)",
    );
    assert!(matches!(e, Error::SessionLost(_)), "{e:?}");
    let v3 = plain.put(b"anyone's", Expect::Absent).await.unwrap();
    assert!(v3 > v2, "{v3} after {v2}");

    // Expiry: a session that stops renewing.
    let ttl = short_ttl(t, Duration::from_millis(500));
    let crashed = crashing_session(&t.store, ttl).await;
    let name = unique("cell-expiring");
    let bound = Cell::bound_to(&crashed, &name).unwrap();
    let v = bound.put(b"short-lived", Expect::Absent).await.unwrap();
    let plain = Cell::new(&t.store, &name).unwrap();
    assert_eq!(plain.get().await.unwrap().map(|c| c.version), Some(v));
    let deadline = Instant::now() + ttl + Duration::from_secs(10);
    while plain.get().await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "a bound cell outlived its expired session by 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = plain.put(b"next", Expect::Absent).await.unwrap();
    assert!(after > v, "{after} after {v}");
}

/// 16 tasks × 100 read-modify-write increments through one cell, retried on
/// a version mismatch (with a short random backoff), end at exactly 1,600.
pub async fn check_cell_increments(t: &Target) {
    const TASKS: u64 = 16;
    const EACH: u64 = 100;
    let name = unique("cell-counter");
    if !has_cells(t, &name).await {
        return;
    }
    let conflicts = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let cell = Cell::new(&t.store, &name).unwrap();
        let conflicts = conflicts.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (i + 1);
            for _ in 0..EACH {
                let mut backoff = 1u64;
                loop {
                    let current = cell.get().await.expect("get");
                    let (count, expect) = match &current {
                        None => (0u64, Expect::Absent),
                        Some(c) => (
                            std::str::from_utf8(&c.value).unwrap().parse().unwrap(),
                            Expect::Version(c.version),
                        ),
                    };
                    match cell.put((count + 1).to_string().as_bytes(), expect).await {
                        Ok(_) => break,
                        Err(Error::VersionMismatch { .. }) => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let wait = rng % (backoff * 1000);
                            backoff = (backoff * 2).min(16);
                            tokio::time::sleep(Duration::from_micros(wait)).await;
                        }
                        Err(e) => panic!("put: {e:?}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(180), task)
            .await
            .expect("1,600 increments took over 180 s")
            .unwrap();
    }
    let end = Cell::new(&t.store, &name)
        .unwrap()
        .get()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        std::str::from_utf8(&end.value).unwrap(),
        (TASKS * EACH).to_string(),
        "lost updates ({} conflicts retried)",
        conflicts.load(Ordering::Relaxed)
    );
}
