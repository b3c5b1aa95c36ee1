//! Conformance: faults of the store itself: servers killed and restarted, clusters losing members, clocks stepped; wake-ups and calls counted.

use super::*;

/// 64 waiters on one mutex. `work` is a count the backend keeps of its own
/// work for this store (wake-ups of waiters, or calls to the store): while
/// the waiters wait it grows by at most `idle_per_second`, and each release
/// and handoff to the next waiter adds at least one and at most
/// `per_handoff` — however many wait behind. A waiter that polled, or a
/// release that woke every waiter, shows up here as work that grows with
/// the queue.
pub async fn check_no_thundering_herd(
    store: &Arc<dyn Store>,
    work: impl Fn() -> u64,
    per_handoff: u64,
    idle_per_second: u64,
) {
    const WAITERS: usize = 64;
    let name = unique("herd");
    // Renewals come every 20 s: none during the check.
    let ttl = Duration::from_secs(60);
    let holder = Session::with_options(store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let mut guard = Some(Mutex::new(&holder, &name).unwrap().lock().await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for _ in 0..WAITERS {
        let s = Session::with_options(store, SessionOptions::new().ttl(ttl))
            .await
            .unwrap();
        sessions.push(s.clone());
        let (tx, name) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
            let _ = tx.send(g);
        });
    }
    wait_queue_len(store, &name, WAITERS + 1).await;
    // Let every waiter reach its watch (or its first sleep).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = work();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = work() - before;
    assert!(
        idle <= idle_per_second,
        "{WAITERS} waiters cost {idle} in one second of waiting (bound {idle_per_second})"
    );
    let mut last = 0;
    let mut most = 0;
    for i in 0..WAITERS {
        let before = work();
        let g = guard.take().unwrap();
        assert!(g.token() > last, "tokens not increasing");
        last = g.token();
        g.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the next waiter was granted")
            .unwrap();
        let cost = work() - before;
        assert!(
            (1..=per_handoff).contains(&cost),
            "handoff {i} cost {cost} (bound {per_handoff}) with {} waiting",
            WAITERS - i - 1
        );
        most = most.max(cost);
        guard = Some(next);
    }
    guard.unwrap().release().await.unwrap();
    for s in sessions.into_iter().chain([holder]) {
        let _ = s.close().await;
    }
    eprintln!("no herd: idle {idle} in 1 s, at most {most} per handoff");
}

/// A cluster loses its leader (`first`, then another member after the
/// first is back) while a lock is held and two sessions wait: the holder
/// keeps its lease, the lock is never held twice, the waiters are granted in
/// turn and tokens keep increasing.
pub async fn check_cluster_failover(cluster: &mut dyn crate::Cluster, first: usize) {
    let store = tenure::open(&cluster.url()).await.unwrap();
    let ttl = Duration::from_secs(4).max(store.capabilities().min_ttl);
    let options = || SessionOptions::new().ttl(ttl);
    let a = Session::with_options(&store, options()).await.unwrap();
    let name = unique("cluster");
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let holders = Arc::new(AtomicUsize::new(1));
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let s = Session::with_options(&store, options()).await.unwrap();
        let (task_name, holders) = (name.clone(), holders.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let g = Mutex::new(&s, &task_name).unwrap().lock().await.unwrap();
            assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            let token = g.token();
            let _ = rx.await;
            holders.fetch_sub(1, Ordering::SeqCst);
            // With a member just killed the cluster may still be electing
            // a leader for longer than a call is tried: a release may then
            // fail as unavailable, and the lease's end frees the lock
            // instead (the next waiter's 20 s allow for it). Any other
            // error fails the check.
            match g.release().await {
                Ok(()) => {}
                Err(e) if e.is_temporary() => eprintln!("release during the failover: {e}"),
                Err(e) => panic!("release: {e:?}"),
            }
            token
        });
        waiters.push((task, tx));
        wait_queue_len(&store, &name, waiters.len() + 1).await;
    }
    let mut last = held.token();
    cluster.kill_member(first);
    // Two TTLs with the leader gone: the holder keeps its lease.
    let kept = tokio::time::timeout(ttl * 2, held.lost()).await;
    assert!(
        kept.is_err(),
        "the holder lost its lease to a leader change"
    );
    holders.fetch_sub(1, Ordering::SeqCst);
    held.release().await.unwrap();
    cluster.restart_member(first);
    let other = (first + 1) % 3;
    for (i, (task, release)) in waiters.into_iter().enumerate() {
        if i == 1 {
            cluster.kill_member(other);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = release.send(());
        let token = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("a waiter was granted after the failover")
            .unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
    }
    cluster.restart_member(other);
}

/// Server killed while a lock is held: the holder's lost() fires within the
/// TTL; after a restart the same store object reconnects, locks are taken
/// again and tokens still increase.
pub async fn check_server_killed_and_restarted(server: &mut dyn crate::Server) {
    let store = tenure::open(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1).max(store.capabilities().min_ttl);
    let s = Session::with_options(&store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let guard = Mutex::new(&s, "fault").unwrap().lock().await.unwrap();
    let before = guard.token();
    let killed = Instant::now();
    server.kill();
    let lost = tokio::time::timeout(ttl + Duration::from_millis(500), guard.lost()).await;
    assert!(lost.is_ok(), "lost() did not fire within the TTL");
    assert!(
        killed.elapsed() <= ttl,
        "lost() fired after the TTL: {:?}",
        killed.elapsed()
    );
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    let s2 = loop {
        match Session::with_options(&store, SessionOptions::new().ttl(ttl)).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(e.is_temporary(), "{e}");
                assert!(Instant::now() < deadline, "no reconnect: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let g2 = Mutex::new(&s2, "fault").unwrap().lock().await.unwrap();
    assert!(
        g2.token() > before,
        "token went back after a restart: {} <= {before}",
        g2.token()
    );
    g2.release().await.unwrap();
}

/// A wrong password: a typed auth error that does not show the password.
pub async fn check_wrong_password(url_with_hunter2: &str) {
    let e = tenure::open(url_with_hunter2).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
}

/// An observer (`wait_changed`) of a quiet queue costs no calls in a second
/// (`work` counts the backend's calls), and sees a release at once.
pub async fn check_observers_do_not_poll(store: &Arc<dyn Store>, work: impl Fn() -> u64) {
    let name = unique("observed");
    let holder = session(store).await;
    let held = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let name = Name::new(&name).unwrap();
    let version = store.queue(&name).await.unwrap().version;
    let observer = {
        let (store, name) = (store.clone(), name.clone());
        tokio::spawn(async move { store.wait_changed(&name, version).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = work();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(work() - before, 0, "the observer polls");
    held.release().await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(2), observer)
        .await
        .expect("the observer saw the release")
        .unwrap()
        .unwrap();
    assert_ne!(changed, version);
    holder.close().await.unwrap();
}

/// The store's notification connection dropped (by `drop_notifications`,
/// which kills it on the server) while three waiters wait: every waiter looks
/// again and polls until a new connection is up, so none is stranded; each is
/// granted in turn after a release, and once notifications are back a waiter
/// costs no calls while it waits (`work` counts the backend's calls).
pub async fn check_waiters_outlive_dropped_notifications<F, Fut>(
    store: &Arc<dyn Store>,
    work: impl Fn() -> u64,
    drop_notifications: F,
) where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let name = unique("dropped-notifications");
    let holder = session(store).await;
    let mut guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..3 {
        let s = session(store).await;
        let (tx, name) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
            let _ = tx.send((g, s));
        });
    }
    wait_queue_len(store, &name, 4).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop_notifications().await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut sessions = vec![holder];
    for _ in 0..3 {
        guard.release().await.unwrap();
        let (next, s) = tokio::time::timeout(Duration::from_secs(3), rx.recv())
            .await
            .expect("the next waiter was granted after notifications dropped")
            .unwrap();
        guard = next;
        sessions.push(s);
    }
    // Notifications are back: a waiter queued now costs no calls while it waits.
    let s = session(store).await;
    let waiter = {
        let (s, name) = (s.clone(), name.clone());
        tokio::spawn(async move {
            let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
            g.release().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = work();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        work() - before,
        0,
        "the waiter polls: notifications are not back"
    );
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("granted through a notification")
        .unwrap();
    for s in sessions.into_iter().chain([s]) {
        let _ = s.close().await;
    }
}

/// The store's server clock steps (through `step`, in seconds: forward
/// past a holder's TTL while it holds and another waits, back after a
/// holder crashed): the live holder keeps its lease and nobody else is
/// granted meanwhile, and the crashed holder is released within its TTL
/// and one renew interval (+1 % and 10 ms) of its last renewal, whatever
/// the server's clock did. Returns how long that release took.
pub async fn check_server_clock_steps(store: &Arc<dyn Store>, step: impl Fn(i64)) -> Duration {
    let ttl = Duration::from_secs(2);
    let options = || SessionOptions::new().ttl(ttl);

    // Forward, by fifteen TTLs, while A holds and B waits.
    let name = unique("clock-forward");
    let a = Session::with_options(store, options()).await.unwrap();
    let held = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let b = Session::with_options(store, options()).await.unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { Mutex::new(&b, &name).unwrap().lock().await })
    };
    wait_queue_len(store, &name, 2).await;
    step(30);
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !waiter.is_finished(),
        "a waiter was granted while the holder renewed: the server's clock stepped forward"
    );
    assert!(!a.is_lost(), "the holder lost its lease to a clock step");
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was granted after the release")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    step(-30);
    a.close().await.unwrap();
    b.close().await.unwrap();

    // Back, by thirty TTLs, after A crashed holding: the raw contract, so
    // that no client of A's renews, releases or closes anything.
    let name = unique("clock-back");
    let crashed = Instant::now();
    let joined = dying_join(store, &name, ttl).await;
    assert!(joined.granted);
    let b = Session::with_options(store, options()).await.unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { Mutex::new(&b, &name).unwrap().lock().await })
    };
    wait_queue_len(store, &name, 2).await;
    step(-60);
    let bound = ttl + ttl / 100 + Duration::from_millis(10) + ttl / 3;
    let granted = tokio::time::timeout(bound + Duration::from_secs(10), waiter)
        .await
        .expect("the crashed holder was not released within 10 s of its bound")
        .unwrap()
        .unwrap();
    let took = crashed.elapsed();
    step(60);
    assert!(
        took <= bound + Duration::from_millis(500),
        "released {took:?} after the crash (bound {bound:?} and 500 ms)"
    );
    granted.release().await.unwrap();
    b.close().await.unwrap();
    eprintln!("clock steps: no second holder; a crashed holder released after {took:?}");
    took
}

/// A store with one-statement takes and releases (PostgreSQL, MySQL) tries
/// them only where they may apply, so two processes on one name pay no
/// second round trip for the statement each time. `a` and `b` are two
/// stores on the same database (two processes), `b_calls` counts `b`'s
/// calls; `name` must be new to them.
/// - `b`'s try-lock of a name `a` holds: the statement and the routine
///   (2 calls) the first time, the routine alone (1) right after;
/// - `b`'s take once `a` released, and its release: 1 call each;
/// - a holder granted from the queue is released by the routine alone (1).
pub async fn check_fast_paths_tried_where_they_may_apply(
    a: &Arc<dyn Store>,
    b: &Arc<dyn Store>,
    name: &str,
    b_calls: impl Fn() -> u64,
) {
    let long =
        |store| Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(60)));
    let (sa, sb) = (long(a).await.unwrap(), long(b).await.unwrap());
    let held = Mutex::new(&sa, name).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&sb, name).unwrap();
    let before = b_calls();
    assert!(mb.try_lock().await.unwrap().is_none());
    assert_eq!(
        b_calls() - before,
        2,
        "the first try of a held name: the statement, the routine"
    );
    let before = b_calls();
    assert!(mb.try_lock().await.unwrap().is_none());
    assert_eq!(
        b_calls() - before,
        1,
        "the next try goes to the routine at once"
    );
    held.release().await.unwrap();
    let before = b_calls();
    let g = mb.lock().await.unwrap();
    assert_eq!(
        b_calls() - before,
        1,
        "a take right after a miss goes to the routine"
    );
    let before = b_calls();
    g.release().await.unwrap();
    assert_eq!(
        b_calls() - before,
        1,
        "a hold the routine granted is released by the routine"
    );

    // A grant from the queue: `b` waits behind `a`.
    let held = Mutex::new(&sa, name).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn(async move { mb.lock().await });
    wait_queue_len(a, name, 2).await;
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    let before = b_calls();
    g.release().await.unwrap();
    assert_eq!(
        b_calls() - before,
        1,
        "a hold granted from the queue is released by the routine"
    );
    let _ = tokio::join!(sa.close(), sb.close());
}

/// Three sessions of `store` with a TTL of a minute, opened on the store
/// itself: no renewals while calls are counted.
async fn long_sessions(store: &Arc<dyn Store>) -> [OpenedSession; 3] {
    let spec = SessionSpec {
        ttl: Duration::from_secs(60),
        label: "test".into(),
    };
    let mut opened = Vec::new();
    for _ in 0..3 {
        opened.push(store.open_session(&spec).await.unwrap());
    }
    opened.try_into().unwrap_or_else(|_| unreachable!())
}

/// A waiting exclusive join, answered.
async fn join_exclusive(store: &Arc<dyn Store>, key: &SessionKey, name: &Name) -> Joined {
    store
        .join(key, request(name, EntryKind::Exclusive, b""))
        .await
        .unwrap()
        .unwrap()
}

/// A store whose waiters poll when nothing is pushed (MySQL): only the first
/// waiter of a name in a process polls, and when it is granted it hands
/// polling on to the next, which polls from then on, first after the
/// shortest interval (5 ms), instead of looking at once: nothing changed
/// for it. A holder and two waiters of this process, the second behind the
/// first (so not polling): from the holder's release, which grants the
/// first, until a millisecond after the first has its grant, the store
/// makes one call, the release; with a look at the hand-over, two. A poll
/// of the first waiter can fall in between by chance (or a slow spell of
/// the machine can delay the test past the second's first poll), so up to
/// ten rounds are tried, and one must show it. `calls` counts `store`'s
/// calls; `name` must be new to it.
pub async fn check_polling_handed_on_without_a_look(
    store: &Arc<dyn Store>,
    name: &str,
    calls: impl Fn() -> u64,
) {
    let n = Name::new(name).unwrap();
    let [h, w1, w2] = long_sessions(store).await;
    let wait = |key: &SessionKey, seq: u64| {
        let (store, key, n) = (store.clone(), key.clone(), n.clone());
        tokio::spawn(async move { store.await_grant(&key, &n, seq).await })
    };
    let mut costs = Vec::new();
    for _ in 0..10 {
        let held = join_exclusive(store, &h.key, &n).await;
        let (first, second) = (
            join_exclusive(store, &w1.key, &n).await,
            join_exclusive(store, &w2.key, &n).await,
        );
        assert!(held.granted && !first.granted && !second.granted);
        let first_waits = wait(&w1.key, first.seq);
        // Long enough for the first waiter's polls to back off to their
        // longest interval.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let second_waits = wait(&w2.key, second.seq);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = calls();
        let start = Instant::now();
        store.leave(&h.key, &n, held.seq).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), first_waits)
            .await
            .expect("the first waiter was never granted")
            .unwrap()
            .unwrap();
        // The hand-over came as the first waiter returned: a look there
        // would have been made by now, a poll would not.
        tokio::time::sleep(Duration::from_millis(1)).await;
        costs.push((calls() - before, start.elapsed()));
        store.leave(&w1.key, &n, first.seq).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), second_waits)
            .await
            .expect("the second waiter was never granted")
            .unwrap()
            .unwrap();
        store.leave(&w2.key, &n, second.seq).await.unwrap();
        if costs.last().is_some_and(|(c, _)| *c == 1) {
            break;
        }
    }
    assert!(
        costs.iter().all(|(c, _)| *c >= 1) && costs.iter().any(|(c, _)| *c == 1),
        "calls from the release to a millisecond after the first waiter's grant, per round: {costs:?}"
    );
    eprintln!("polling handed on: calls, and time since the release, per round: {costs:?}");
    for s in [h, w1, w2] {
        store.close_session(&s.key).await.unwrap();
    }
}

/// A store whose queued join says what its waiter's first look would, and
/// whose releases announce their grants in this process (MySQL): a waiter
/// does not look when it starts waiting, and a grant announced before its
/// waiter waits is kept for it. `calls` counts `store`'s calls; `name` must
/// be new to it.
/// - the next in line starts waiting and makes no call before its first
///   poll (5 ms), three times out of three (a look at once would be one
///   call within a millisecond or so);
/// - a holder and two waiters of this process, the releases made before
///   the waiters wait: the waits cost nothing, the chain one call per
///   release.
pub async fn check_queued_join_answers_the_first_look(
    store: &Arc<dyn Store>,
    name: &str,
    calls: impl Fn() -> u64,
) {
    let n = Name::new(name).unwrap();
    let [h, w1, w2] = long_sessions(store).await;
    for round in 0..3 {
        let held = join_exclusive(store, &h.key, &n).await;
        assert!(held.granted);
        let queued = join_exclusive(store, &w1.key, &n).await;
        assert!(!queued.granted);
        let before = calls();
        let start = Instant::now();
        let (s, key, n1) = (store.clone(), w1.key.clone(), n.clone());
        let waiter = tokio::spawn(async move { s.await_grant(&key, &n1, queued.seq).await });
        while calls() == before {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiter never polled"
            );
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        let first_call = start.elapsed();
        assert!(
            first_call >= Duration::from_millis(5),
            "round {round}: the waiter called the store {first_call:?} after it started waiting"
        );
        store.leave(&h.key, &n, held.seq).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was never granted")
            .unwrap()
            .unwrap();
        store.leave(&w1.key, &n, queued.seq).await.unwrap();
    }

    let held = join_exclusive(store, &h.key, &n).await;
    let (first, second) = (
        join_exclusive(store, &w1.key, &n).await,
        join_exclusive(store, &w2.key, &n).await,
    );
    assert!(!first.granted && !second.granted);
    let before = calls();
    store.leave(&h.key, &n, held.seq).await.unwrap();
    store.await_grant(&w1.key, &n, first.seq).await.unwrap();
    store.leave(&w1.key, &n, first.seq).await.unwrap();
    store.await_grant(&w2.key, &n, second.seq).await.unwrap();
    assert_eq!(
        calls() - before,
        2,
        "two releases, each announcing its grant before the waiter waited"
    );
    store.leave(&w2.key, &n, second.seq).await.unwrap();
    for s in [h, w1, w2] {
        store.close_session(&s.key).await.unwrap();
    }
}

/// A store that keeps a lone holder in the name's row (PostgreSQL, MySQL):
/// taking a free name and releasing it are one call each, and `layout`
/// (the row holder's token, and how many entries the name has in the
/// queue's table) shows the holder in the row; a second comer moves it into
/// the queue, the handoff works as ever, and once the queue is empty again
/// the next take is in the row again. `name` must be new to the store.
pub async fn check_lone_holder_layout<F, Fut>(
    store: &Arc<dyn Store>,
    name: &str,
    work: impl Fn() -> u64,
    layout: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (Option<i64>, i64)>,
{
    // Renewals come every 20 s: none while calls are counted.
    let long = || Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(60)));
    let (s1, s2) = (long().await.unwrap(), long().await.unwrap());
    // The first take of a new name makes its row.
    let g = Mutex::new(&s1, name).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    let before = work();
    let g1 = Mutex::new(&s1, name).unwrap().lock().await.unwrap();
    assert_eq!(work() - before, 1, "a free name is taken in one call");
    assert_eq!(layout().await, (Some(g1.token() as i64), 0));
    let before = work();
    g1.release().await.unwrap();
    assert_eq!(work() - before, 1, "a lone holder is released in one call");
    assert_eq!(layout().await, (None, 0));

    let g1 = Mutex::new(&s1, name).unwrap().lock().await.unwrap();
    let m2 = Mutex::new(&s2, name).unwrap();
    let waiter = tokio::spawn(async move { m2.lock().await.map(|g| g.token()) });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while layout().await != (None, 2) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the holder never moved into the queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = g1.token();
    drop(g1);
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    assert!(second > first);
    // The waiter's guard went with its task: the queue empties, and the
    // name is free for a take in its row again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while layout().await != (None, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue never emptied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g = Mutex::new(&s1, name).unwrap().lock().await.unwrap();
    assert_eq!(layout().await, (Some(g.token() as i64), 0));
    g.release().await.unwrap();
    let _ = tokio::join!(s1.close(), s2.close());
}

/// A wake-up forged on a waiter's own channel while the lock is held
/// (`forge(name, seq)` sends it, as another client of the server could)
/// grants nothing: the waiter may look, but is granted only after the
/// holder releases, with the token it queued with. For stores that take an
/// announced grant without a look: only the announcement may do that.
pub async fn check_a_forged_wakeup_grants_nothing<F, Fut>(store: &Arc<dyn Store>, forge: F)
where
    F: FnOnce(String, u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let name = unique("forged");
    let holder = Session::new(store).await.unwrap();
    let held = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let waiter = Session::new(store).await.unwrap();
    let mutex = Mutex::new(&waiter, &name).unwrap();
    let granted = Arc::new(tokio::sync::Notify::new());
    let task = {
        let granted = granted.clone();
        tokio::spawn(async move {
            let guard = mutex.lock().await.unwrap();
            granted.notify_one();
            guard
        })
    };
    let queue_name = Name::new(&name).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let seq = loop {
        let queue = store.queue(&queue_name).await.unwrap();
        if let Some(entry) = queue.entries.get(1) {
            break entry.seq;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Let the waiter reach its sleep, then forge its wake-up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    forge(name.clone(), seq).await;
    let early = tokio::time::timeout(Duration::from_millis(500), granted.notified()).await;
    assert!(
        early.is_err(),
        "a forged wake-up granted the lock while it was held"
    );
    let queue = store.queue(&queue_name).await.unwrap();
    assert!(queue.entries[0].granted && !queue.entries[1].granted);
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the waiter was granted after the release")
        .unwrap();
    assert_eq!(guard.token(), seq);
    guard.release().await.unwrap();
    let _ = tokio::join!(holder.close(), waiter.close());
}

/// Five handoffs, each to a waiter of this process that has reached its
/// sleep: the least of them costs one call of `work` (a count of calls to
/// the store), the release, so the waiter took its grant from the release
/// without a look of its own. (The least, as a store without notifications
/// has the next in line poll, every 100 ms by then, which may fall in a
/// handoff.)
pub async fn check_a_handoff_here_costs_the_release_alone(
    store: &Arc<dyn Store>,
    work: impl Fn() -> u64,
) {
    let name = unique("handover");
    // Renewals come every 20 s: none while calls are counted.
    let long = || Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(60)));
    let sessions = [long().await.unwrap(), long().await.unwrap()];
    let mut guard = Mutex::new(&sessions[0], &name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mut least = u64::MAX;
    for i in 1..=5 {
        // The other session each time: the holder's own would re-enter.
        let mutex = Mutex::new(&sessions[i % 2], &name).unwrap();
        let waiter = tokio::spawn(async move { mutex.lock().await.unwrap() });
        wait_queue_len(store, &name, 2).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (before, token) = (work(), guard.token());
        guard.release().await.unwrap();
        guard = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was granted")
            .unwrap();
        assert!(guard.token() > token);
        least = least.min(work() - before);
    }
    guard.release().await.unwrap();
    let [a, b] = sessions;
    let _ = tokio::join!(a.close(), b.close());
    assert_eq!(
        least, 1,
        "every handoff cost more than the release: the waiter looked"
    );
}
