//! Conformance: mutual exclusion, fairness, reentrancy, expiry, fencing, read-write locks.

use super::*;
use tenure::{Cell, Expect};

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

/// A forced release (`evict`) ends the holder's session: the holder is told
/// within one renew interval that it was evicted (not that its lease ran
/// out), and the waiter behind it is granted with a higher token.
pub async fn check_evicted_holder_is_told(t: &Target) {
    let ttl = short_ttl(t, Duration::from_secs(3));
    let options = || SessionOptions::new().ttl(ttl);
    let a = Session::with_options(&t.store, options()).await.unwrap();
    let b = Session::with_options(&t.store, options()).await.unwrap();
    let name = unique("evict");
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { Mutex::new(&b, &name).unwrap().lock().await })
    };
    wait_queue_len(&t.store, &name, 2).await;
    let evicted = t.store.evict(&Name::new(&name).unwrap()).await.unwrap();
    assert_eq!(evicted, 1, "evict ended {evicted} sessions");
    let reason = tokio::time::timeout(a.renew_interval() + Duration::from_secs(2), held.lost())
        .await
        .expect("the evicted holder was told within a renew interval");
    assert_eq!(reason, tenure::LostReason::Evicted, "told {reason}");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was granted after the eviction")
        .unwrap()
        .unwrap();
    assert!(next.token() > held.token(), "token went back");
    next.release().await.unwrap();
}

/// Ending one session by its public tag (`evict_session`) takes all its
/// entries at once — held and waiting, on every name, and its bound cells —
/// tells its owner it was evicted, and leaves every other session alone.
pub async fn check_evicted_session_is_told(t: &Target) {
    let ttl = short_ttl(t, Duration::from_secs(3));
    let options = || SessionOptions::new().ttl(ttl);
    let a = Session::with_options(&t.store, options()).await.unwrap();
    let b = Session::with_options(&t.store, options()).await.unwrap();
    let (first, second, theirs) = (
        unique("evict-session-1"),
        unique("evict-session-2"),
        unique("evict-session-b"),
    );
    let held = Mutex::new(&a, &first).unwrap().lock().await.unwrap();
    let b_holds = Mutex::new(&b, &theirs).unwrap().lock().await.unwrap();
    let b_first = Mutex::new(&b, &second).unwrap().lock().await.unwrap();
    // `a` also waits behind `b`, and `b` waits behind `a`.
    let a_waits = {
        let (a, second) = (a.clone(), second.clone());
        tokio::spawn(async move { Mutex::new(&a, &second).unwrap().lock().await })
    };
    let b_waits = {
        let (b, first) = (b.clone(), first.clone());
        tokio::spawn(async move { Mutex::new(&b, &first).unwrap().lock().await })
    };
    wait_queue_len(&t.store, &first, 2).await;
    wait_queue_len(&t.store, &second, 2).await;
    let cell_name = unique("evict-session-cell");
    let bound = t
        .store
        .capabilities()
        .cells
        .then(|| Cell::bound_to(&a, &cell_name).unwrap());
    if let Some(cell) = &bound {
        cell.put(b"a's", Expect::Absent).await.unwrap();
    }

    assert!(
        t.store.evict_session(a.tag()).await.unwrap(),
        "a live session's tag was not found"
    );
    let reason = tokio::time::timeout(a.renew_interval() + Duration::from_secs(2), held.lost())
        .await
        .expect("the evicted session was told within a renew interval");
    assert_eq!(reason, tenure::LostReason::Evicted, "told {reason}");
    let waited = tokio::time::timeout(Duration::from_secs(10), a_waits)
        .await
        .expect("the evicted session's wait ended")
        .unwrap();
    assert!(
        waited.is_err(),
        "the evicted session was granted: {waited:?}"
    );
    // Its entries are gone from both queues; `b` holds `first` now.
    let next = tokio::time::timeout(Duration::from_secs(10), b_waits)
        .await
        .expect("the waiter behind the evicted session was granted")
        .unwrap()
        .unwrap();
    assert!(next.token() > held.token(), "token went back");
    for name in [&first, &second, &theirs] {
        let q = t.store.queue(&Name::new(name).unwrap()).await.unwrap();
        assert!(
            q.entries.iter().all(|e| e.session_tag == b.tag()),
            "{name} still has the evicted session's entry: {q:?}"
        );
        assert_eq!(q.entries.len(), 1, "{name}: {q:?}");
    }
    if bound.is_some() {
        let plain = Cell::new(&t.store, &cell_name).unwrap();
        assert_eq!(
            plain.get().await.unwrap(),
            None,
            "the evicted session's cell"
        );
    }
    // The other session lives on; an unknown or ended tag changes nothing.
    assert!(!b.is_lost());
    assert!(!t.store.evict_session(a.tag()).await.unwrap());
    assert!(!t.store.evict_session("no-such-tag").await.unwrap());
    assert!(!b.is_lost());
    for guard in [next, b_first, b_holds] {
        guard.release().await.unwrap();
    }
    b.close().await.unwrap();
}

/// Every process of a queue crashed: a holder and two waiters that joined
/// and died (the raw contract: never renewed, never left, never closed).
/// With nobody left to watch them, a try-lock alone must clear the name
/// within a few TTLs, not find it held for ever; a blocking lock must too.
pub async fn check_crashed_queue_cleared_by_try(t: &Target) {
    let ttl = short_ttl(t, Duration::from_millis(500));
    let name = unique("crashed-queue");
    let n = Name::new(&name).unwrap();
    let mut last = 0;
    for i in 0..3 {
        let joined = dying_join(&t.store, &name, ttl).await;
        assert_eq!(joined.granted, i == 0, "{joined:?}");
        last = joined.seq;
    }
    let s = session(&t.store).await;
    let m = Mutex::new(&s, &name).unwrap();
    let deadline = Instant::now() + ttl * 6 + Duration::from_secs(10);
    let guard = loop {
        if let Some(g) = m.try_lock().await.unwrap() {
            break g;
        }
        assert!(
            Instant::now() < deadline,
            "a queue of crashed sessions still blocks a try-lock: {:?}",
            t.store.queue(&n).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(guard.token() > last, "token went back");
    guard.release().await.unwrap();
    // A blocking lock behind a crashed holder and five crashed waiters is
    // granted within a few TTLs, not one TTL per crashed entry: a waiter
    // whose entry ahead lapsed watches the whole lapsed run ahead at once.
    let name = unique("crashed-queue-lock");
    for _ in 0..6 {
        dying_join(&t.store, &name, ttl).await;
    }
    let started = Instant::now();
    let g = tokio::time::timeout(
        ttl * 6 + Duration::from_secs(10),
        Mutex::new(&s, &name).unwrap().lock(),
    )
    .await
    .expect("a lock behind crashed sessions was granted in time")
    .unwrap();
    let took = started.elapsed();
    eprintln!("behind six crashed entries: granted after {took:?}");
    assert!(
        took < ttl * 2 + Duration::from_secs(1),
        "behind six crashed entries for {took:?} (TTL {ttl:?})"
    );
    g.release().await.unwrap();
    s.close().await.unwrap();
}

/// A holder that stops renewing learns of the loss before its local
/// deadline, and the lock passes on within TTL + one renew interval — never
/// before the old holder was told.
pub async fn check_crashed_holder_released(t: &Target) {
    crashed_holder_passes_on(t, true).await;
}

/// A holder that stops renewing loses the lock to a waiter of a `fair`
/// (or non-fair) mutex, which is granted within its bound and never before
/// the holder was told; the lost session stays lost.
pub(crate) async fn crashed_holder_passes_on(t: &Target, fair: bool) {
    let ttl = short_ttl(t, Duration::from_millis(600));
    let name = unique(if fair { "crash" } else { "unfair-crash" });
    let opened = Instant::now();
    let a = crashing_session(&t.store, ttl).await;
    let g = Mutex::new(&a, &name)
        .unwrap()
        .fair(fair)
        .lock()
        .await
        .unwrap();
    let b = session(&t.store).await;
    let mb = Mutex::new(&b, &name).unwrap().fair(fair);
    let lost = tokio::spawn({
        let lost = g.lost();
        async move {
            let reason = lost.await;
            (reason, Instant::now())
        }
    });
    let gb = tokio::time::timeout(Duration::from_secs(20), mb.lock())
        .await
        .expect("lock passed on")
        .unwrap();
    let granted_at = Instant::now();
    // Told means `lost()` resolves at once: the session reads itself lost
    // at the moment of the grant. (The task that records when `lost()`
    // woke may itself be scheduled late on a loaded machine.)
    let told_at_grant = a.is_lost();
    let (reason, lost_at) = lost.await.unwrap();
    assert_eq!(reason, tenure::LostReason::Unconfirmed);
    assert!(
        told_at_grant || lost_at <= granted_at,
        "new holder granted before the old one was told"
    );
    // Reported means the session reads itself lost from its local deadline
    // on (`lost_reason` goes by the clock alone), whenever the recorder woke.
    assert!(
        lost_at <= opened + ttl || a.deadline() <= opened + ttl,
        "loss reported after the TTL"
    );
    let renew = a.renew_interval();
    let slack = Duration::from_millis(300);
    // A non-fair waiter asks again at the latest a second after its last
    // try; where only a watching client may call a lease expired, that try
    // then watches the lapsed holder for a TTL before it takes the lock.
    let bound = match fair {
        true => ttl + renew + slack,
        false => ttl * 2 + renew + Duration::from_secs(1) + slack * 2,
    };
    assert!(
        granted_at <= opened + bound,
        "released after {:?}, bound {bound:?}",
        granted_at - opened
    );
    assert!(gb.token() > g.token());
    // No silent re-acquire: the lost session stays lost.
    assert!(matches!(
        Mutex::new(&a, &name).unwrap().try_lock().await,
        Err(Error::SessionLost(_))
    ));
    assert!(matches!(a.renew().await, Err(Error::SessionLost(_))));
    gb.release().await.unwrap();
    b.close().await.unwrap();
}

/// A holder that dies silently (its session never renews nor closes: a
/// process killed) is released to a waiter within the bound the store
/// states, whenever the waiter came — as the holder died, while its lease
/// still ran by the store's clock, or after it lapsed: by the holder's TTL
/// and one renew interval where the store's clock judges expiry; where a
/// watching client does (`Capabilities::watched_expiry`), also no later
/// than a TTL (+1 % and 10 ms) and one renew interval after the waiter
/// came, since it must see the holder unrenewed for a TTL itself.
pub async fn check_crashed_holder_released_to_a_late_waiter(t: &Target) {
    let ttl = short_ttl(t, Duration::from_millis(600));
    let renew = ttl / 3;
    let watched = t.store.capabilities().watched_expiry;
    // Scheduling on a loaded machine, as the sibling checks allow.
    let allowance = Duration::from_millis(300);
    for comes_after in [Duration::ZERO, ttl / 2, ttl * 3 / 2] {
        let name = unique("late-waiter");
        let opened = Instant::now();
        let dead = dying_join(&t.store, &name, ttl).await;
        assert!(dead.granted);
        tokio::time::sleep_until(opened + comes_after).await;
        let b = session(&t.store).await;
        let came = Instant::now();
        let gb = tokio::time::timeout(
            Duration::from_secs(20),
            Mutex::new(&b, &name).unwrap().lock(),
        )
        .await
        .expect("the lock passed on")
        .unwrap();
        let granted = Instant::now();
        // (One that comes after the lease lapsed is granted as it comes.)
        let mut bound = (opened + ttl + renew).max(came);
        if watched {
            bound = bound.max(came + ttl + ttl / 100 + Duration::from_millis(10) + renew);
        }
        eprintln!(
            "came {:?} after the holder died, granted {:?} after, bound {:?}",
            came - opened,
            granted - opened,
            bound - opened
        );
        assert!(
            granted <= bound + allowance,
            "came {:?} after the holder died, granted {:?} after it; the bound is {:?}",
            came - opened,
            granted - opened,
            bound - opened
        );
        assert!(gb.token() > dead.seq);
        gb.release().await.unwrap();
        b.close().await.unwrap();
    }
}

/// A waiter whose own session expires stops waiting and says so.
pub async fn check_waiter_session_expiry(t: &Target) {
    let name = unique("waiter-expiry");
    let a = session(&t.store).await;
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let ttl = short_ttl(t, Duration::from_millis(500));
    let b = crashing_session(&t.store, ttl).await;
    let result = tokio::time::timeout(
        Duration::from_secs(5) + ttl,
        Mutex::new(&b, &name).unwrap().lock(),
    )
    .await
    .expect("waiter returned");
    assert!(matches!(result, Err(Error::SessionLost(_))), "{result:?}");
    // Its entry is gone from the queue (after the store's expiry).
    wait_queue_len(&t.store, &name, 1).await;
    held.release().await.unwrap();
}

/// A waiter that dies behind another waiter (nobody behind it looks, and
/// a walk from the head stops at the live waiter): a read of the whole
/// queue answers at once, and leaves it out once its session expired (or,
/// where only a watcher ends a lease, shows it with no time left).
pub async fn check_dead_waiter_behind_a_waiter(t: &Target) {
    let name = unique("dead-behind");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { Mutex::new(&b, &name).unwrap().lock().await })
    };
    wait_queue_len(&t.store, &name, 2).await;
    // A client that joins and then dies: it never renews, never leaves and
    // never closes (the raw contract, no Session to clean up after it).
    let ttl = short_ttl(t, Duration::from_millis(500));
    let joined = dying_join(&t.store, &name, ttl).await;
    assert!(!joined.granted);
    wait_queue_len(&t.store, &name, 3).await;
    // Past the store's expiry (a store whose leases count whole seconds
    // rounds up).
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let started = Instant::now();
    // Where only a watcher may end a lease (nobody watches this one: no
    // entry is behind it), it stays, shown with no time left; elsewhere it
    // is left out.
    let watched = t.store.capabilities().watched_expiry;
    let q = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let q = t.store.queue(&Name::new(&name).unwrap()).await.unwrap();
            let done = if watched {
                q.entries.len() == 3 && q.entries[2].expires_in.is_zero()
            } else {
                q.entries.len() == 2
            };
            if done {
                return q;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("queue() answered, the dead waiter left out or shown lapsed");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(q.entries[0].granted && !q.entries[1].granted, "{q:?}");
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the live waiter was granted")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
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

/// The fencing scenario's first half: holder A takes `name` and stops
/// renewing (a process paused past its TTL); once its lease has run out, B
/// is granted the lock. Returns A's token and B's guard (B's token is higher).
pub async fn holder_paused_past_its_ttl(store: &Arc<dyn Store>, name: &str) -> (u64, MutexGuard) {
    let ttl = Duration::from_millis(300).max(store.capabilities().min_ttl);
    let a = crashing_session(store, ttl).await;
    let token_a = Mutex::new(&a, name).unwrap().lock().await.unwrap().token();
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let b = session(store).await;
    let granted =
        tokio::time::timeout(Duration::from_secs(5), Mutex::new(&b, name).unwrap().lock())
            .await
            .expect("B granted after A's lease ran out")
            .unwrap();
    assert!(granted.token() > token_a);
    (token_a, granted)
}

/// Two readers hold a name, one crashes, the other keeps renewing; a writer
/// waits. The crashed reader's lease ends within its TTL and one renew
/// interval, although its co-holder renews meanwhile: when the live reader
/// releases, the writer is granted at once, not a TTL later.
pub async fn check_crashed_co_holder_released(t: &Target) {
    if !t.store.capabilities().shared {
        return;
    }
    let name = unique("co-holder");
    let ttl = short_ttl(t, Duration::from_secs(1));
    let live = Session::with_options(&t.store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let read = tenure::RwLock::new(&live, &name)
        .unwrap()
        .read()
        .await
        .unwrap();
    // The crashed reader: the raw contract, so nothing of its renews,
    // releases or closes.
    let spec = SessionSpec {
        ttl,
        label: "crashes".into(),
    };
    let dead = t.store.open_session(&spec).await.unwrap();
    let joined = t
        .store
        .join(
            &dead.key,
            request(&Name::new(&name).unwrap(), EntryKind::Shared, b""),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(joined.granted);
    let writer = session(&t.store).await;
    let waiting = {
        let (writer, name) = (writer.clone(), name.clone());
        tokio::spawn(async move { tenure::RwLock::new(&writer, &name).unwrap().write().await })
    };
    wait_queue_len(&t.store, &name, 3).await;
    // Three TTLs: the live reader renews all along.
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !waiting.is_finished(),
        "the writer was granted beside a live reader"
    );
    read.release().await.unwrap();
    let released = Instant::now();
    let w = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer was granted")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_millis(700),
        "the writer waited {took:?} after the live reader left: the crashed one was still there"
    );
    w.release().await.unwrap();
    writer.close().await.unwrap();
    live.close().await.unwrap();
}
