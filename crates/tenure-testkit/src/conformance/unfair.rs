//! Conformance: the non-fair mutex.

use super::locks::crashed_holder_passes_on;
use super::*;

/// The non-fair mutex (`Mutex::fair(false)`): the fair lock's exclusion,
/// tokens and reentrancy, on the same lock as the fair one of its name; its
/// waiters hold no place in the queue, and a release wakes them.
pub async fn check_unfair_mutex(t: &Target) {
    let name = unique("unfair");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let ma = Mutex::new(&a, &name).unwrap().fair(false);
    let mb = Mutex::new(&b, &name).unwrap().fair(false);
    assert!(!ma.is_fair() && Mutex::new(&a, &name).unwrap().is_fair());

    // Uncontended, and reentrant per session as the fair lock is.
    let g1 = ma.lock().await.expect("uncontended non-fair lock");
    let again = ma.lock().await.expect("reentered");
    assert_eq!((again.token(), again.hold_count()), (g1.token(), 2));
    again.release().await.unwrap();

    // Held: the other session's try and timed wait fail, fair or not.
    assert!(mb.try_lock().await.unwrap().is_none());
    match mb.lock_timeout(Duration::from_millis(300)).await {
        Err(Error::Timeout(d)) => assert_eq!(d, Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let fair_b = Mutex::new(&b, &name).unwrap();
    assert!(fair_b.try_lock().await.unwrap().is_none());

    // A waiter holds no place in the queue, and the release grants it.
    let waiter = tokio::spawn({
        let mb = mb.clone();
        async move { mb.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queue = t.store.queue(&Name::new(&name).unwrap()).await.unwrap();
    let seqs: Vec<u64> = queue.entries.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [g1.token()],
        "a non-fair waiter took a place: {queue:?}"
    );
    let first = g1.token();
    g1.release().await.unwrap();
    let gb = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the non-fair waiter was granted after the release")
        .unwrap()
        .unwrap();
    assert!(gb.token() > first, "{} after {first}", gb.token());

    // A fair waiter already queued is granted before a non-fair waiter
    // that waits at the same time (of a third session), which is granted
    // after it.
    let fair_a = tokio::spawn({
        let ma = Mutex::new(&a, &name).unwrap();
        async move { ma.lock().await }
    });
    wait_queue_len(&t.store, &name, 2).await;
    let c = session(&t.store).await;
    let unfair_c = tokio::spawn({
        let mc = Mutex::new(&c, &name).unwrap().fair(false);
        async move { mc.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held_by_b = gb.token();
    gb.release().await.unwrap();
    let ga = tokio::time::timeout(Duration::from_secs(10), fair_a)
        .await
        .expect("the queued fair waiter was granted")
        .unwrap()
        .unwrap();
    assert!(ga.token() > held_by_b);
    assert!(
        !unfair_c.is_finished(),
        "the non-fair waiter passed a queued fair one"
    );
    assert!(mb.try_lock().await.unwrap().is_none());
    let held_by_a = ga.token();
    ga.release().await.unwrap();
    let gc = tokio::time::timeout(Duration::from_secs(10), unfair_c)
        .await
        .expect("the non-fair waiter was granted after the fair one")
        .unwrap()
        .unwrap();
    assert!(gc.token() > held_by_a);
    gc.release().await.unwrap();
    c.close().await.unwrap();

    // A cancelled non-fair wait leaves nothing behind.
    let gb = mb.lock().await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(200), ma.lock()).await;
    assert!(cancelled.is_err(), "granted while held: {cancelled:?}");
    wait_queue_len(&t.store, &name, 1).await;
    gb.release().await.unwrap();
    wait_queue_len(&t.store, &name, 0).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A non-fair waiter is granted the lock of a holder that died without a
/// word, once the store ends its session; the holder is told first.
pub async fn check_unfair_crashed_holder_released(t: &Target) {
    crashed_holder_passes_on(t, false).await;
}

/// A holder that dies for good (the raw contract: it never renews, leaves
/// or closes, so nothing of it tells the store) loses the name to a waiting
/// non-fair mutex once its lease ends: on stores where only a watcher may
/// end a lease, the waiter's own try must watch it and end it, since
/// nobody else will.
pub async fn check_unfair_dead_holder_released(t: &Target) {
    let name = unique("unfair-dead");
    let ttl = short_ttl(t, Duration::from_millis(500));
    let opened = Instant::now();
    let joined = dying_join(&t.store, &name, ttl).await;
    assert!(joined.granted);
    let b = session(&t.store).await;
    let mb = Mutex::new(&b, &name).unwrap().fair(false);
    let g = tokio::time::timeout(Duration::from_secs(30), mb.lock())
        .await
        .expect("a non-fair waiter was never granted a dead holder's lock")
        .unwrap();
    let took = opened.elapsed();
    // The lease's end (rounded up to whole seconds on some stores), the waiter's recheck
    // (1 s) and, where a watcher must confirm it, a try's watch of a TTL.
    let bound = ttl * 2 + Duration::from_secs(1) + Duration::from_millis(1_500);
    eprintln!("non-fair waiter behind a dead holder: granted after {took:?}, bound {bound:?}");
    assert!(took <= bound, "granted after {took:?}, bound {bound:?}");
    assert!(g.token() > joined.seq);
    g.release().await.unwrap();
    b.close().await.unwrap();
}
