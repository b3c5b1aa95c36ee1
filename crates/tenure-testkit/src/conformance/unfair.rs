//! Conformance: the non-fair mutex.

use super::expiry::crashed_holder_passes_on;
use super::*;
use crate::counting::Counting;

/// The wake-up line of `name` (where its non-fair waiters wait).
fn line_of(name: &str) -> String {
    format!("{}{name}", tenure::queue::WAKE_LINE_PREFIX)
}

/// The non-fair mutex (`Mutex::fair(false)`): the fair lock's exclusion,
/// tokens and reentrancy, on the same lock as the fair one of its name; its
/// waiters hold no place in the name's queue (only in its wake-up line)
/// before they have waited the store's bound, and a release wakes them.
pub async fn check_unfair_mutex(t: &Target) {
    let name = unique("unfair");
    // A bound longer than the check: waiters stay in the line.
    let patient: Arc<dyn Store> =
        Counting::with_barging_bound(t.store.clone(), Duration::from_secs(120));
    let (a, b) = (session(&t.store).await, session(&patient).await);
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

    // A waiter holds no place in the queue, only in the wake-up line, and
    // the release grants it.
    let waiter = tokio::spawn({
        let mb = mb.clone();
        async move { mb.lock().await }
    });
    wait_queue_len(&t.store, &line_of(&name), 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queue = t.store.queue(&Name::new(&name).unwrap()).await.unwrap();
    let seqs: Vec<u64> = queue.entries.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        [g1.token()],
        "a non-fair waiter took a place: {queue:?}"
    );
    let line = t
        .store
        .queue(&Name::new(line_of(&name)).unwrap())
        .await
        .unwrap();
    assert_eq!(line.entries.len(), 1, "{line:?}");
    assert_eq!(line.entries[0].session_tag, b.tag(), "{line:?}");
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
    wait_queue_len(&t.store, &line_of(&name), 0).await;
    gb.release().await.unwrap();
    wait_queue_len(&t.store, &name, 0).await;
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Non-fair waiters wait in a line of arrival, and only the first watches
/// the name: with 32 of them (and a bound longer than the check), a second
/// of waiting costs a few store calls, each release and the grant that
/// follows cost a number of calls that does not grow with the waiters, and
/// with no newcomer they are granted in their order of arrival.
pub async fn check_unfair_waiters_wake_one_at_a_time(t: &Target) {
    const WAITERS: usize = 32;
    // Most calls one handoff may cost: the release, the first waiter's read
    // and try, its leaving the line, the next one's read and watch, and
    // room for one recheck.
    const PER_HANDOFF: u64 = 10;
    let name = unique("unfair-line");
    let counted = Counting::with_barging_bound(t.store.clone(), Duration::from_secs(120));
    let store: Arc<dyn Store> = counted.clone();
    let holder = session(&store).await;
    let mut guard = Some(Mutex::new(&holder, &name).unwrap().lock().await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for _ in 0..WAITERS {
        let s = session(&store).await;
        sessions.push(s.clone());
        let (tx, own) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let g = Mutex::new(&s, &own).unwrap().fair(false).lock().await;
            let _ = tx.send((s.tag().to_string(), g));
        });
        // One at a time, so that the line's order is known.
        wait_queue_len(&t.store, &line_of(&name), sessions.len()).await;
    }
    let line = t
        .store
        .queue(&Name::new(line_of(&name)).unwrap())
        .await
        .unwrap();
    let arrival: Vec<String> = line.entries.iter().map(|e| e.session_tag.clone()).collect();
    let tags: Vec<String> = sessions.iter().map(|s| s.tag().to_string()).collect();
    assert_eq!(arrival, tags, "the line is not in order of arrival");
    // Let the first reach its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = counted.calls();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = counted.calls() - before;
    // The first in line reads the name again after a second without a
    // change: a read and a watch, or two.
    assert!(
        idle <= 6,
        "{WAITERS} non-fair waiters cost {idle} calls in one second"
    );
    let mut most = 0;
    let mut total = 0;
    for (i, expected) in tags.iter().enumerate() {
        let before = counted.calls();
        let g = guard.take().unwrap();
        g.release().await.unwrap();
        let (tag, next) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a non-fair waiter was granted after the release")
            .unwrap();
        let next = next.expect("a non-fair waiter's lock");
        assert_eq!(&tag, expected, "grant {i} went out of the line's order");
        // The one granted leaves the line in the background: let its call
        // be counted in this handoff.
        wait_queue_len(&t.store, &line_of(&name), WAITERS - i - 1).await;
        let cost = counted.calls() - before;
        assert!(
            cost <= PER_HANDOFF,
            "handoff {i} cost {cost} calls (bound {PER_HANDOFF}) with {} waiting",
            WAITERS - i - 1
        );
        most = most.max(cost);
        total += cost;
        guard = Some(next);
    }
    guard.unwrap().release().await.unwrap();
    for s in sessions.into_iter().chain([holder]) {
        let _ = s.close().await;
    }
    eprintln!(
        "non-fair line: idle {idle} calls in 1 s, at most {most} per handoff, {:.1} on average",
        total as f64 / WAITERS as f64
    );
}

/// No non-fair waiter is passed over for longer than the store's bound:
/// four sessions take the name, hold it 5 ms and release it, again at once,
/// and a fifth, asking after them, is granted within the bound (and the
/// time a few grants and releases take) while they keep being granted.
/// Without the bound it would be passed over for as long as they go on:
/// each releaser's own try comes before the fifth can read the release.
pub async fn check_unfair_starvation_bound(t: &Target) {
    let name = unique("unfair-bound");
    let bound = t.store.capabilities().barging_bound;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let granted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut hammers = Vec::new();
    for _ in 0..4 {
        let s = session(&t.store).await;
        let (stop, granted, name) = (stop.clone(), granted.clone(), name.clone());
        hammers.push(tokio::spawn(async move {
            let m = Mutex::new(&s, &name).unwrap().fair(false);
            let until = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                let g = m.lock().await.unwrap();
                granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Held most of the time: the fifth's first try is refused.
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.release().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    // Let them contend first.
    while granted.load(std::sync::atomic::Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let victim = session(&t.store).await;
    let m = Mutex::new(&victim, &name).unwrap().fair(false);
    let before = granted.load(std::sync::atomic::Ordering::Relaxed);
    let asked = Instant::now();
    let g = tokio::time::timeout(Duration::from_secs(15), m.lock())
        .await
        .expect("a non-fair waiter was starved for 15 s")
        .unwrap();
    let waited = asked.elapsed();
    let passed = granted.load(std::sync::atomic::Ordering::Relaxed) - before;
    g.release().await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hammers {
        h.await.unwrap();
    }
    victim.close().await.unwrap();
    eprintln!(
        "non-fair bound {bound:?}: granted after {waited:?}, {passed} grants to others meanwhile"
    );
    // The bound, then the holders queued before it in the name's queue
    // (at most the four), each a grant and a release; two seconds for
    // a slow store on a loaded machine.
    let allowed = bound + Duration::from_secs(2);
    assert!(waited <= allowed, "waited {waited:?}, bound {bound:?}");
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
