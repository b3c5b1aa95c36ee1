//! Conformance: mutual exclusion, fairness, reentrancy, cancellation, fencing, read-write locks.

use super::*;

/// N sessions × M rounds on one name: never two holders at once, and tokens
/// strictly increase in grant order.
pub async fn check_exclusion(t: &Target) {
    const TASKS: usize = 6;
    const ROUNDS: usize = 8;
    let name = unique("exclusion");
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = t.store.clone();
        let (name, inside, max_inside, tokens) = (
            name.clone(),
            inside.clone(),
            max_inside.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let s = session(&store).await;
            let m = Mutex::new(&s, &name).unwrap();
            for _ in 0..ROUNDS {
                let g = m.lock().await.expect("lock");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                tokens.lock().unwrap().push(g.token());
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
            s.close().await.unwrap();
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("exclusion run finished in time")
            .unwrap();
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), TASKS * ROUNDS);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}

/// Many sessions try a fresh name at the same moment: exactly one wins.
pub async fn check_concurrent_first_use(t: &Target) {
    const TASKS: usize = 8;
    for _ in 0..4 {
        let name = unique("first-use");
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (store, name, barrier) = (t.store.clone(), name.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let s = session(&store).await;
                let m = Mutex::new(&s, &name).unwrap();
                barrier.wait().await;
                let won = m.try_lock().await.unwrap();
                // Hold until everyone has tried.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let won = won.is_some();
                s.close().await.unwrap();
                won
            }));
        }
        let mut winners = 0;
        for task in tasks {
            winners += usize::from(task.await.unwrap());
        }
        assert_eq!(winners, 1, "{winners} sessions won {name} at once");
    }
}

pub async fn check_try_lock_while_held(t: &Target) {
    let name = unique("try");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&b, &name).unwrap();
    assert!(
        mb.try_lock().await.unwrap().is_none(),
        "try_lock succeeded on a held lock"
    );
    wait_queue_len(&t.store, &name, 1).await; // a failed try_lock leaves nothing behind
    let first = held.token();
    held.release().await.unwrap();
    let g = mb.try_lock().await.unwrap().expect("free lock not taken");
    assert!(g.token() > first);
    g.release().await.unwrap();
}

/// A try with the `likely_free` hint (what a non-fair lock sends) gets the
/// same answers as one without: refused on a held name, and nothing left
/// behind (a store that skips its read-first for the hint must undo its
/// write); granted, with a higher token, once the name is free.
pub async fn check_hinted_try(t: &Target) {
    let name = Name::new(unique("hinted")).unwrap();
    let (a, b) = (raw_session(&t.store).await, raw_session(&t.store).await);
    let held = t
        .store
        .join(&a.key, request(&name, EntryKind::Exclusive, b"a"))
        .await
        .unwrap()
        .unwrap();
    assert!(held.granted);
    let hinted = |value: &'static [u8]| JoinRequest {
        likely_free: true,
        mode: JoinMode::IfGranted,
        ..request(&name, EntryKind::Exclusive, value)
    };
    let refused = t.store.join(&b.key, hinted(b"b")).await.unwrap();
    assert_eq!(refused, None, "a hinted try was granted on a held name");
    wait_queue_len(&t.store, name.as_str(), 1).await;
    let queue = t.store.queue(&name).await.unwrap();
    assert_eq!(
        queue.entries[0].seq, held.seq,
        "the holder's entry is not the only one"
    );
    t.store.leave(&a.key, &name, held.seq).await.unwrap();
    let granted = t
        .store
        .join(&b.key, hinted(b"b"))
        .await
        .unwrap()
        .expect("a hinted try on a free name was refused");
    assert!(granted.granted && granted.seq > held.seq);
    t.store.leave(&b.key, &name, granted.seq).await.unwrap();
    wait_queue_len(&t.store, name.as_str(), 0).await;
}

pub async fn check_timeout(t: &Target) {
    let name = unique("timeout");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&b, &name).unwrap();
    let start = Instant::now();
    match mb.lock_timeout(Duration::from_millis(200)).await {
        Err(Error::Timeout(d)) => assert_eq!(d, Duration::from_millis(200)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // The timed-out waiter left the queue: only the holder remains.
    wait_queue_len(&t.store, &name, 1).await;
    held.release().await.unwrap();
    assert!(mb.try_lock().await.unwrap().is_some());
}

/// Waiters are granted in arrival order.
pub async fn check_fifo(t: &Target) {
    const WAITERS: usize = 5;
    let name = unique("fifo");
    let a = session(&t.store).await;
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let s = session(&t.store).await;
        let m = Mutex::new(&s, &name).unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = m.lock().await.expect("lock");
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
            drop(s);
        }));
        wait_queue_len(&t.store, &name, i + 2).await;
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
}

/// Two tasks of one session waiting on the same name share one entry; the
/// grant must wake both.
pub async fn check_reentrant_waiters(t: &Target) {
    let name = unique("reentrant-waiters");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&b, &name).unwrap();
    let (m1, m2) = (mb.clone(), mb.clone());
    let w1 = tokio::spawn(async move { m1.lock().await });
    let w2 = tokio::spawn(async move { m2.lock().await });
    wait_queue_len(&t.store, &name, 2).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.release().await.unwrap();
    let g1 = tokio::time::timeout(Duration::from_secs(5), w1)
        .await
        .expect("first waiter woken")
        .unwrap()
        .unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(5), w2)
        .await
        .expect("second waiter woken")
        .unwrap()
        .unwrap();
    assert_eq!(g1.token(), g2.token());
    g1.release().await.unwrap();
    g2.release().await.unwrap();
    wait_queue_len(&t.store, &name, 0).await;
}

pub async fn check_reentrancy(t: &Target) {
    let name = unique("reentrant");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let ma = Mutex::new(&a, &name).unwrap();
    let first = ma.lock().await.unwrap();
    let second = ma.lock().await.unwrap();
    assert_eq!(first.token(), second.token());
    assert_eq!((first.hold_count(), second.hold_count()), (1, 2));
    let mb = Mutex::new(&b, &name).unwrap();
    second.release().await.unwrap();
    assert!(
        mb.try_lock().await.unwrap().is_none(),
        "released after one of two holds"
    );
    first.release().await.unwrap();
    assert!(mb.try_lock().await.unwrap().is_some());
}

/// A non-reentrant mutex (Curator's semaphore mutex): a second `lock`
/// through the same session times out while the first hold lasts, and is
/// granted once it is released, with a new token; `try_lock` is refused
/// meanwhile; another session is excluded throughout.
pub async fn check_non_reentrant_mutex(t: &Target) {
    let name = unique("non-reentrant");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let ma = Mutex::new(&a, &name).unwrap().reentrant(false);
    assert!(!ma.is_reentrant());
    let first = ma.lock().await.unwrap();
    assert_eq!(first.hold_count(), 1);
    assert!(
        ma.try_lock().await.unwrap().is_none(),
        "try_lock re-entered"
    );
    let other_handle = Mutex::new(&a.clone(), &name).unwrap().reentrant(false);
    assert!(matches!(
        other_handle.lock_timeout(Duration::from_millis(300)).await,
        Err(Error::Timeout(_))
    ));
    // A second lock waits for the first hold, in another task.
    let waiting = tokio::spawn({
        let ma = ma.clone();
        async move { ma.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the second lock re-entered");
    let mb = Mutex::new(&b, &name).unwrap();
    assert!(mb.try_lock().await.unwrap().is_none());
    let token = first.token();
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted after the first hold's release")
        .unwrap()
        .unwrap();
    assert!(second.token() > token, "{} after {token}", second.token());
    assert_eq!(second.hold_count(), 1);
    assert!(mb.try_lock().await.unwrap().is_none());
    second.release().await.unwrap();
    let third = mb.try_lock().await.unwrap().expect("free after both holds");
    third.release().await.unwrap();
}

/// Without the session's secret nothing can be released, renewed or
/// proclaimed; reading a queue never reveals the secret.
pub async fn check_non_holder_cannot_act(t: &Target) {
    let name = Name::new(unique("owner")).unwrap();
    let (a, b) = (raw_session(&t.store).await, raw_session(&t.store).await);
    let ja = t
        .store
        .join(&a.key, request(&name, EntryKind::Exclusive, b"a"))
        .await
        .unwrap()
        .unwrap();
    assert!(ja.granted);
    let jb = t
        .store
        .join(&b.key, request(&name, EntryKind::Exclusive, b"b"))
        .await
        .unwrap()
        .unwrap();
    assert!(!jb.granted);
    // b cannot release, or proclaim over, a's entry.
    assert!(matches!(
        t.store.leave(&b.key, &name, ja.seq).await,
        Err(Error::NotHeld(_))
    ));
    assert!(matches!(
        t.store.set_value(&b.key, &name, ja.seq, b"x").await,
        Err(Error::NotHeld(_))
    ));
    // A waiting candidate cannot proclaim.
    assert!(matches!(
        t.store.set_value(&b.key, &name, jb.seq, b"x").await,
        Err(Error::NotHeld(_))
    ));
    // A made-up key is no session.
    let forged = SessionKey::new("0000000000000000");
    assert!(matches!(
        t.store.keep_alive(&forged).await,
        Err(Error::SessionLost(_))
    ));
    assert!(matches!(
        t.store.leave(&forged, &name, ja.seq).await,
        Err(Error::SessionLost(_))
    ));
    // Public reads carry tags, not secrets.
    let q = t.store.queue(&name).await.unwrap();
    assert_eq!(q.entries.len(), 2);
    for e in &q.entries {
        assert_ne!(e.session_tag, a.key.secret());
        assert_ne!(e.session_tag, b.key.secret());
    }
    assert_eq!(q.entries[0].value, b"a");
    assert!(!format!("{:?}", a.key).contains(a.key.secret()));
    t.store.close_session(&a.key).await.unwrap();
    t.store.close_session(&b.key).await.unwrap();
}

pub async fn check_close_releases_everything(t: &Target) {
    let names: Vec<String> = (0..3).map(|i| unique(&format!("close{i}"))).collect();
    let a = session(&t.store).await;
    let mut guards = Vec::new();
    for n in &names {
        guards.push(Mutex::new(&a, n).unwrap().lock().await.unwrap());
    }
    let election = unique("close-election");
    let term = Election::new(&a, &election)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    a.close().await.unwrap();
    assert!(a.is_lost());
    let b = session(&t.store).await;
    for n in &names {
        assert!(
            Mutex::new(&b, n)
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_some(),
            "{n} still held"
        );
    }
    assert!(Election::new(&b, &election)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .is_none());
    // A guard of a closed session reports the loss on release.
    assert!(matches!(
        guards.pop().unwrap().release().await,
        Err(Error::SessionLost(_))
    ));
    drop(term);
}

/// A waiter's wait starts after its join (it listens only then): a grant
/// made in between is not missed, and a wait that starts while the holder
/// still holds is not granted by it.
pub async fn check_grant_before_the_wait(t: &Target) {
    let spec = SessionSpec {
        ttl: Duration::from_secs(30),
        label: "test".into(),
    };
    let (a, b) = (
        t.store.open_session(&spec).await.unwrap(),
        t.store.open_session(&spec).await.unwrap(),
    );
    let n = Name::new(unique("between")).unwrap();
    let held = t
        .store
        .join(&a.key, request(&n, EntryKind::Exclusive, b""))
        .await;
    let held = held.unwrap().unwrap();
    assert!(held.granted);
    // Granted between the join and the wait.
    let w = t
        .store
        .join(&b.key, request(&n, EntryKind::Exclusive, b""))
        .await;
    let w = w.unwrap().unwrap();
    assert!(!w.granted);
    assert_eq!(t.store.leave(&a.key, &n, held.seq).await.unwrap(), 0);
    tokio::time::timeout(
        Duration::from_secs(5),
        t.store.await_grant(&b.key, &n, w.seq),
    )
    .await
    .expect("a grant made before the wait began was missed")
    .unwrap();
    // Held while the wait begins: not granted until the release.
    let w2 = t
        .store
        .join(&a.key, request(&n, EntryKind::Exclusive, b""))
        .await;
    let w2 = w2.unwrap().unwrap();
    assert!(!w2.granted);
    let wait = t.store.await_grant(&a.key, &n, w2.seq);
    tokio::pin!(wait);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut wait)
            .await
            .is_err(),
        "granted while another held"
    );
    t.store.leave(&b.key, &n, w.seq).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the release did not grant the waiter")
        .unwrap();
    t.store.leave(&a.key, &n, w2.seq).await.unwrap();
    t.store.close_session(&a.key).await.unwrap();
    t.store.close_session(&b.key).await.unwrap();
}

/// A lock() future dropped while waiting leaves nothing behind.
pub async fn check_cancelled_wait_leaves_queue(t: &Target) {
    let name = unique("cancel");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&b, &name).unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(100), mb.lock()).await;
    wait_queue_len(&t.store, &name, 1).await;
    held.release().await.unwrap();
    wait_queue_len(&t.store, &name, 0).await;
}

/// A session that asks for a name again right after giving up a wait, or
/// right after dropping its guard (both left in the background), gets the
/// answer it would have got without the earlier ask: a timeout while the
/// name is held, the lock once it is free, and no entry left behind; fair
/// and non-fair alike.
pub async fn check_ask_again_at_once(t: &Target) {
    for fair in [true, false] {
        let name = unique(if fair { "again" } else { "again-unfair" });
        let (a, b) = (session(&t.store).await, session(&t.store).await);
        let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
        let mb = Mutex::new(&b, &name).unwrap().fair(fair);
        for round in 0..4 {
            // Given up after a while, then at once again: still held by a.
            let _ = tokio::time::timeout(Duration::from_millis(30 + 20 * round), mb.lock()).await;
            match mb.lock_timeout(Duration::from_millis(150)).await {
                Err(Error::Timeout(_)) => {}
                other => panic!("fair={fair}, round {round}: asked again at once: {other:?}"),
            }
        }
        held.release().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), mb.lock())
            .await
            .expect("the name was released, yet the waiter was not granted")
            .unwrap();
        for round in 0..4 {
            // Dropped (left in the background), then taken again at once.
            drop(guard_of(&mb, round).await);
        }
        // The last guard dropped, and the lock taken again at once.
        drop(guard);
        let again = tokio::time::timeout(Duration::from_secs(10), mb.lock())
            .await
            .expect("the lock was not granted after its guards were dropped")
            .unwrap();
        again.release().await.unwrap();
        wait_queue_len(&t.store, &name, 0).await;
        b.close().await.unwrap();
        a.close().await.unwrap();
    }
}

/// A guard of `mutex` taken at once (reentrant: the session holds it).
async fn guard_of(mutex: &Mutex, round: u64) -> MutexGuard {
    match tokio::time::timeout(Duration::from_secs(10), mutex.lock()).await {
        Ok(Ok(guard)) => guard,
        other => panic!("round {round}: taken again after a drop: {other:?}"),
    }
}

pub async fn check_fencing_monotonic(t: &Target) {
    let name = unique("fence");
    let mut last = 0;
    for _ in 0..10 {
        let s = session(&t.store).await;
        let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
        assert!(g.token() > last);
        last = g.token();
        g.release().await.unwrap();
        s.close().await.unwrap();
    }
    if t.store.capabilities().durable {
        let reopened = tenure::open(&t.url).await.unwrap();
        let s = session(&reopened).await;
        let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
        assert!(
            g.token() > last,
            "token went back after reopening: {} <= {last}",
            g.token()
        );
        g.release().await.unwrap();
    }
}
pub async fn check_rwlock(t: &Target) {
    use tenure::RwLock;
    let name = unique("rw");
    if !t.store.capabilities().shared {
        // A backend without shared entries says so, typed, for readers;
        // a writer is an exclusive entry and still works.
        let s = session(&t.store).await;
        let r = RwLock::new(&s, &name).unwrap().try_read().await;
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
        let w = RwLock::new(&s, &name).unwrap().try_write().await;
        assert!(matches!(w, Ok(Some(_))), "{w:?}");
        return;
    }
    let (a, b, c, d) = (
        session(&t.store).await,
        session(&t.store).await,
        session(&t.store).await,
        session(&t.store).await,
    );
    let ra = RwLock::new(&a, &name).unwrap().read().await.unwrap();
    let rb = RwLock::new(&b, &name).unwrap().read().await.unwrap();
    assert!(RwLock::new(&c, &name)
        .unwrap()
        .try_write()
        .await
        .unwrap()
        .is_none());
    // A waiting writer holds back later readers: writers are not starved.
    let wc = RwLock::new(&c, &name).unwrap();
    let writer = tokio::spawn(async move { wc.write().await });
    wait_queue_len(&t.store, &name, 3).await;
    assert!(RwLock::new(&d, &name)
        .unwrap()
        .try_read()
        .await
        .unwrap()
        .is_none());
    let late_reader = RwLock::new(&d, &name).unwrap();
    assert!(matches!(
        late_reader.read_timeout(Duration::from_millis(50)).await,
        Err(Error::Timeout(_))
    ));
    // An upgrade is a conflict, not a deadlock.
    assert!(matches!(
        RwLock::new(&a, &name).unwrap().try_write().await,
        Err(Error::Conflict { .. })
    ));
    let max_reader = ra.token().max(rb.token());
    ra.release().await.unwrap();
    rb.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(w.token() > max_reader);
    assert_eq!(w.kind(), EntryKind::Exclusive);
    let writer_token = w.token();
    w.release().await.unwrap();
    let r = late_reader.read().await.unwrap();
    assert!(r.token() > writer_token);
    assert_eq!(r.kind(), EntryKind::Shared);
}
