//! Conformance: leases that end without a release — holders crashed,
//! paused past their TTL or evicted, waiters whose sessions expire — and
//! the bounds within which the name passes on.

use super::*;
use tenure::{Cell, Expect};

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

/// A waiter further back becomes the next in line when the entry ahead of
/// it is granted; when that new holder then dies silently, the waiter
/// passes it by within the holder's TTL and one renew interval of its last
/// renewal (and, where a watcher confirms expiry, 1 % and 10 ms), as the
/// next in line from the start would — not a TTL later, at a look it makes
/// once per TTL of the entry ahead.
pub async fn check_made_next_by_a_grant_passes_a_dead_holder_in_bound(t: &Target) {
    // Long enough that a look a TTL late shows over the allowance.
    let ttl = short_ttl(t, Duration::from_millis(1500));
    let renew = ttl / 3;
    let allowance = Duration::from_millis(300);
    let name = unique("made-next");
    let a = session(&t.store).await;
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    // B: the raw contract, renewed by hand, queued behind A.
    let spec = SessionSpec {
        ttl,
        label: "dies once granted".into(),
    };
    let b = t.store.open_session(&spec).await.unwrap();
    let key = Name::new(&name).unwrap();
    let joined = t
        .store
        .join(&b.key, request(&key, EntryKind::Exclusive, b""))
        .await
        .unwrap()
        .unwrap();
    assert!(!joined.granted);
    // C: behind B, watching B's entry.
    let c = session(&t.store).await;
    let waiting = {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move { Mutex::new(&c, &name).unwrap().lock().await })
    };
    wait_queue_len(&t.store, &name, 3).await;
    tokio::time::sleep(ttl / 4).await;
    // B renews (C has not looked since), A releases: B holds, and renews
    // no more.
    t.store.keep_alive(&b.key).await.unwrap();
    let last_renewal = Instant::now();
    held.release().await.unwrap();
    let gc = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the lock passed on")
        .unwrap()
        .unwrap();
    let took = last_renewal.elapsed();
    let mut bound = ttl + renew;
    if t.store.capabilities().watched_expiry {
        bound += ttl / 100 + Duration::from_millis(10);
    }
    eprintln!("made next by a grant: the dead holder passed by {took:?} after its last renewal (bound {bound:?})");
    assert!(
        took <= bound + allowance,
        "the holder granted ahead of the waiter died {took:?} before the waiter was granted; the bound is {bound:?}"
    );
    assert!(gc.token() > joined.seq);
    gc.release().await.unwrap();
    a.close().await.unwrap();
    c.close().await.unwrap();
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
