//! The conformance suite: the specification every backend meets.
//!
//! Plain async check functions over a store URL. A backend's test file calls
//! `conformance_tests!(|| async { url })` and gets one test per check.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{
    Election, Elector, EntryKind, Error, JoinMode, Mutex, Name, Session, SessionKey,
    SessionOptions, SessionSpec, Store,
};
use tokio::time::Instant;

/// A store under test and how to open it again.
pub struct Target {
    pub url: String,
    pub store: Arc<dyn Store>,
}

impl Target {
    pub async fn new(url: String) -> Target {
        let store = tenure::open(&url).await.expect("open store");
        Target { url, store }
    }

    /// For backends that may be skipped (a server that is not installed).
    pub async fn some(url: String) -> Option<Target> {
        Some(Self::new(url).await)
    }
}

/// A fresh name per check so checks sharing a store do not meet.
pub fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn session(store: &Arc<dyn Store>) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(10)))
        .await
        .expect("open session")
}

/// A session that never renews: it stands for a crashed or paused client.
async fn crashing_session(store: &Arc<dyn Store>, ttl: Duration) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(ttl).auto_renew(false))
        .await
        .expect("open session")
}

/// `wanted`, or the backend's shortest TTL if that is longer (etcd leases
/// count whole seconds, ZooKeeper servers set a minimum session timeout).
fn short_ttl(t: &Target, wanted: Duration) -> Duration {
    wanted.max(t.store.capabilities().min_ttl)
}

/// Waits (bounded) until the queue of `name` has `len` entries.
async fn wait_queue_len(store: &Arc<dyn Store>, name: &str, len: usize) {
    let name = Name::new(name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let q = store.queue(&name).await.expect("queue");
        if q.entries.len() == len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue of {name} never reached {len}: {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

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

/// Without the session's secret nothing can be released, renewed or
/// proclaimed; reading a queue never reveals the secret.
pub async fn check_non_holder_cannot_act(t: &Target) {
    let name = Name::new(unique("owner")).unwrap();
    let spec = SessionSpec {
        ttl: Duration::from_secs(10),
        label: "test".into(),
    };
    let a = t.store.open_session(&spec).await.unwrap();
    let b = t.store.open_session(&spec).await.unwrap();
    let ja = t
        .store
        .join(&a.key, &name, EntryKind::Exclusive, b"a", JoinMode::Wait)
        .await
        .unwrap()
        .unwrap();
    assert!(ja.granted);
    let jb = t
        .store
        .join(&b.key, &name, EntryKind::Exclusive, b"b", JoinMode::Wait)
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

/// A holder that stops renewing learns of the loss before its local
/// deadline, and the lock passes on within TTL + one renew interval — never
/// before the old holder was told.
pub async fn check_crashed_holder_released(t: &Target) {
    let ttl = short_ttl(t, Duration::from_millis(600));
    let name = unique("crash");
    let opened = Instant::now();
    let a = crashing_session(&t.store, ttl).await;
    let g = Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let b = session(&t.store).await;
    let mb = Mutex::new(&b, &name).unwrap();
    let lost = tokio::spawn({
        let lost = g.lost();
        async move {
            let reason = lost.await;
            (reason, Instant::now())
        }
    });
    let gb = tokio::time::timeout(Duration::from_secs(10), mb.lock())
        .await
        .expect("lock passed on")
        .unwrap();
    let granted_at = Instant::now();
    let (reason, lost_at) = lost.await.unwrap();
    assert_eq!(reason, tenure::LostReason::Unconfirmed);
    assert!(
        lost_at <= granted_at,
        "new holder granted before the old one was told"
    );
    assert!(lost_at <= opened + ttl, "loss reported after the TTL");
    let renew = a.renew_interval();
    let slack = Duration::from_millis(300);
    assert!(
        granted_at <= opened + ttl + renew + slack,
        "released after {:?}",
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

pub async fn check_election_failover(t: &Target) {
    let name = unique("failover");
    let a = crashing_session(&t.store, short_ttl(t, Duration::from_millis(600))).await;
    let b = session(&t.store).await;
    let ea = Election::new(&a, &name).unwrap();
    let eb = Election::new(&b, &name).unwrap();
    let ta = ea.campaign("a").await.unwrap();
    let cb = tokio::spawn(async move { eb.campaign("b").await });
    let leader = ea.leader().await.unwrap().unwrap();
    assert_eq!(
        (leader.token, leader.value.as_slice()),
        (ta.token(), &b"a"[..])
    );
    assert_eq!(leader.since.is_some(), t.store.capabilities().grant_times);
    let tb = tokio::time::timeout(Duration::from_secs(10), cb)
        .await
        .expect("failover in time")
        .unwrap()
        .unwrap();
    assert!(ta.is_lost());
    assert!(tb.token() > ta.token());
    let leader = tenure::leader(t.store.as_ref(), &Name::new(&name).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (leader.token, leader.value_str().as_ref()),
        (tb.token(), "b")
    );
    assert!(matches!(
        ta.proclaim("late").await,
        Err(Error::SessionLost(_))
    ));
    tb.resign().await.unwrap();
}

async fn observe_next(obs: &mut tenure::Observer) -> Option<tenure::Leader> {
    tokio::time::timeout(Duration::from_secs(10), obs.next())
        .await
        .expect("observe in time")
        .unwrap()
}

async fn join(
    store: &Arc<dyn Store>,
    key: &SessionKey,
    name: &Name,
    kind: EntryKind,
) -> tenure::Result<Option<tenure::Joined>> {
    store.join(key, name, kind, b"", JoinMode::Wait).await
}

/// Observers see every term and proclaim, in order.
pub async fn check_observe_order(t: &Target) {
    let name = unique("observe");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let ea = Election::new(&a, &name).unwrap();
    let mut obs = ea.observe();
    assert_eq!(observe_next(&mut obs).await, None);
    let ta = ea.campaign("a1").await.unwrap();
    let l = observe_next(&mut obs).await.unwrap();
    assert_eq!((l.token, l.value_str().as_ref()), (ta.token(), "a1"));
    ta.proclaim("a2").await.unwrap();
    let l = observe_next(&mut obs).await.unwrap();
    assert_eq!((l.token, l.value_str().as_ref()), (ta.token(), "a2"));
    let eb = Election::new(&b, &name).unwrap();
    let cb = tokio::spawn(async move { eb.campaign("b1").await });
    wait_queue_len(&t.store, &name, 2).await;
    let first = ta.token();
    ta.resign().await.unwrap();
    let l = observe_next(&mut obs).await.unwrap();
    assert_eq!(l.value_str(), "b1");
    assert!(l.token > first);
    let tb = cb.await.unwrap().unwrap();
    assert_eq!(tb.token(), l.token);
    tb.resign().await.unwrap();
    assert_eq!(observe_next(&mut obs).await, None);
}

pub async fn check_proclaim_only_by_leader(t: &Target) {
    let name = unique("proclaim");
    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let ta = Election::new(&a, &name)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    assert!(Election::new(&b, &name)
        .unwrap()
        .try_campaign("b")
        .await
        .unwrap()
        .is_none());
    ta.proclaim("a-new").await.unwrap();
    let l = Election::new(&b, &name)
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(l.value, b"a-new");
    ta.resign().await.unwrap();
    let tb = Election::new(&b, &name)
        .unwrap()
        .try_campaign("b")
        .await
        .unwrap()
        .unwrap();
    tb.proclaim("b-new").await.unwrap();
    tb.resign().await.unwrap();
}

/// The elector calls back exactly once per term, and campaigns again after a
/// loss under a new session.
pub async fn check_elector_callbacks(t: &Target) {
    let name = unique("elector");
    let events = Arc::new(std::sync::Mutex::new(
        Vec::<(char, &'static str, u64)>::new(),
    ));
    let (stop_a, stop_a_rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_b, stop_b_rx) = tokio::sync::oneshot::channel::<()>();
    let options = SessionOptions::new().ttl(Duration::from_secs(2));
    let make = |who: char| {
        let (e1, e2) = (events.clone(), events.clone());
        Elector::new(&t.store, &name, who.to_string())
            .unwrap()
            .session_options(options.clone())
            .on_elected(move |term| e1.lock().unwrap().push((who, "elected", term.token())))
            .on_defeated(move |term| e2.lock().unwrap().push((who, "defeated", term.token())))
    };
    let a = tokio::spawn(make('a').run(async {
        let _ = stop_a_rx.await;
    }));
    let n = Name::new(&name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tenure::leader(t.store.as_ref(), &n)
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = tokio::spawn(make('b').run(async {
        let _ = stop_b_rx.await;
    }));
    wait_queue_len(&t.store, &name, 2).await;
    stop_a.send(()).unwrap();
    a.await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = tenure::leader(t.store.as_ref(), &n).await.unwrap();
        if l.as_ref().is_some_and(|l| l.value == b"b") {
            break;
        }
        assert!(Instant::now() < deadline, "b never led");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // b's callback runs once b itself learns of its grant (a wake-up or a
    // poll after the store granted it).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !events.lock().unwrap().iter().any(|e| e.0 == 'b') {
        assert!(Instant::now() < deadline, "b's on_elected never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_b.send(()).unwrap();
    b.await.unwrap().unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!((events[0].0, events[0].1), ('a', "elected"));
    assert_eq!(
        (events[1].0, events[1].1, events[1].2),
        ('a', "defeated", events[0].2)
    );
    assert_eq!((events[2].0, events[2].1), ('b', "elected"));
    assert_eq!(
        (events[3].0, events[3].1, events[3].2),
        ('b', "defeated", events[2].2)
    );
    assert!(events[2].2 > events[0].2);
}

/// Shared and permit entries follow the same queue rules everywhere.
pub async fn check_shared_and_permits(t: &Target) {
    let spec = SessionSpec {
        ttl: Duration::from_secs(10),
        label: "test".into(),
    };
    let caps = t.store.capabilities().clone();
    let (a, b, c) = (
        t.store.open_session(&spec).await.unwrap(),
        t.store.open_session(&spec).await.unwrap(),
        t.store.open_session(&spec).await.unwrap(),
    );
    if caps.shared {
        let n = Name::new(unique("rw")).unwrap();
        assert!(
            join(&t.store, &a.key, &n, EntryKind::Shared)
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        assert!(
            join(&t.store, &b.key, &n, EntryKind::Shared)
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        let w = join(&t.store, &c.key, &n, EntryKind::Exclusive)
            .await
            .unwrap()
            .unwrap();
        assert!(!w.granted);
        t.store.close_session(&a.key).await.unwrap();
        t.store.close_session(&b.key).await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(5),
            t.store.await_grant(&c.key, &n, w.seq),
        )
        .await
        .unwrap()
        .unwrap();
    }
    if caps.permits {
        let (a, b, c) = (
            t.store.open_session(&spec).await.unwrap(),
            t.store.open_session(&spec).await.unwrap(),
            t.store.open_session(&spec).await.unwrap(),
        );
        let n = Name::new(unique("sem")).unwrap();
        let p = |count| EntryKind::Permits { count, limit: 3 };
        assert!(
            join(&t.store, &a.key, &n, p(2))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        assert!(
            !join(&t.store, &b.key, &n, p(2))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        // Head-of-line: a small request waits behind the large one.
        assert!(
            !join(&t.store, &c.key, &n, p(1))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        let clash = t
            .store
            .join(
                &c.key,
                &n,
                EntryKind::Permits { count: 1, limit: 4 },
                b"",
                JoinMode::Wait,
            )
            .await;
        assert!(matches!(clash, Err(Error::Conflict { .. })), "{clash:?}");
        for k in [&a.key, &b.key, &c.key] {
            t.store.close_session(k).await.unwrap();
        }
    }
}

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
    let long = "n".repeat(tenure::MAX_NAME_LEN + 1);
    assert!(matches!(
        Mutex::new(&s, &long),
        Err(Error::InvalidName { .. })
    ));
    assert!(Mutex::new(&s, "n".repeat(tenure::MAX_NAME_LEN)).is_ok());
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

pub async fn check_rwlock(t: &Target) {
    use tenure::RwLock;
    let name = unique("rw");
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

pub async fn check_semaphore(t: &Target) {
    use tenure::Semaphore;
    const PERMITS: u32 = 3;
    let name = unique("sem");
    if !t.store.capabilities().permits {
        // A backend without semaphores says so, typed.
        let s = session(&t.store).await;
        let r = Semaphore::new(&s, &name, PERMITS)
            .unwrap()
            .try_acquire()
            .await;
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
        return;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (store, name, inside, max_inside) = (
            t.store.clone(),
            name.clone(),
            inside.clone(),
            max_inside.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let s = session(&store).await;
            let sem = Semaphore::new(&s, &name, PERMITS).unwrap();
            for _ in 0..4 {
                let p = sem.acquire().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .unwrap()
            .unwrap();
    }
    let max = max_inside.load(Ordering::SeqCst);
    assert!(
        max <= PERMITS as usize,
        "{max} holders of {PERMITS} permits"
    );
    assert!(max >= 2, "permits were never shared (max {max})");

    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let two = Semaphore::new(&a, &name, PERMITS)
        .unwrap()
        .acquire_many(2)
        .await
        .unwrap();
    let sb = Semaphore::new(&b, &name, PERMITS).unwrap();
    assert!(sb.try_acquire_many(2).await.unwrap().is_none());
    assert!(matches!(
        Semaphore::new(&b, &name, PERMITS + 1)
            .unwrap()
            .try_acquire()
            .await,
        Err(Error::Conflict { .. })
    ));
    assert!(matches!(
        Semaphore::new(&b, &name, 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        sb.acquire_many(4).await,
        Err(Error::InvalidArgument { .. })
    ));
    // Permits belong to the session and vanish with it.
    drop(two);
    a.close().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), sb.acquire_many(3))
        .await
        .unwrap()
        .unwrap();
    both.release().await.unwrap();
}

pub async fn check_once(t: &Target) {
    use tenure::{once, JobError, OnceOutcome, WhileRunning};
    let key = unique("once");
    let runs = Arc::new(AtomicUsize::new(0));
    let ttl = Duration::from_secs(10);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (store, key, runs) = (t.store.clone(), key.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            once(
                &store,
                &key,
                ttl,
                WhileRunning::Wait(Duration::from_secs(10)),
                || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(b"result".to_vec())
                },
            )
            .await
            .unwrap()
        }));
    }
    let mut ran = 0;
    for task in tasks {
        match task.await.unwrap() {
            OnceOutcome::Ran(r) => {
                ran += 1;
                assert_eq!(r, b"result");
            }
            OnceOutcome::Recorded(r) => assert_eq!(r, b"result"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ran, runs.load(Ordering::SeqCst)), (1, 1));

    // A duplicate that will not wait is told the job is in progress.
    let busy = unique("once-busy");
    let (store, k) = (t.store.clone(), busy.clone());
    let first = tokio::spawn(async move {
        once(&store, &k, ttl, WhileRunning::Fail, || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(vec![])
        })
        .await
    });
    wait_queue_len(&t.store, &format!("once/{busy}"), 1).await;
    let dup = once(&t.store, &busy, ttl, WhileRunning::Fail, || async {
        Ok(vec![])
    })
    .await;
    assert!(matches!(dup, Err(Error::InProgress(_))), "{dup:?}");
    assert_eq!(first.await.unwrap().unwrap(), OnceOutcome::Ran(vec![]));

    // A retryable failure is not recorded; a final one is.
    let k = unique("once-fail");
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Err(JobError::Retryable("later".into()))
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Retry("later".into()));
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Err(JobError::Final("no".into()))
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Failed("no".into()));
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Ok(vec![1])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Failed("no".into()));

    // The record lives its TTL after the job, then the job may run again.
    let k = unique("once-ttl");
    let short = short_ttl(t, Duration::from_millis(300));
    let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
        Ok(vec![1])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Ran(vec![1]));
    let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
        Ok(vec![2])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Recorded(vec![1]));
    // After the TTL the record goes (by the store's clock, which may act a
    // little late: etcd revokes expired leases in rounds).
    tokio::time::sleep(short).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
            Ok(vec![3])
        })
        .await;
        match r.unwrap() {
            OnceOutcome::Ran(v) => {
                assert_eq!(v, vec![3]);
                break;
            }
            OnceOutcome::Recorded(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("the record outlived its TTL by 3 s: {other:?}"),
        }
    }
}

/// Three instances on a one-second schedule: every tick runs exactly once.
pub async fn check_schedule_per_tick(t: &Target) {
    use tenure::{Schedule, ScheduleMode};
    let name = unique("cron");
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for instance in 0..3 {
        let schedule = Schedule::new(&t.store, &name, "* * * * * *")
            .unwrap()
            .mode(ScheduleMode::PerTick);
        let runs = runs.clone();
        tasks.push(tokio::spawn(schedule.run(
            move |tick| {
                let runs = runs.clone();
                async move { runs.lock().unwrap().push((tick.at, instance)) }
            },
            tokio::time::sleep(Duration::from_millis(3500)),
        )));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let mut ticks: Vec<_> = runs.iter().map(|r| r.0).collect();
    ticks.sort();
    let before = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), before, "a tick ran twice: {runs:?}");
    assert!(ticks.len() >= 2, "too few ticks ran: {runs:?}");
}

/// Only the leader runs ticks; pausing it hands the schedule to another.
pub async fn check_schedule_leader(t: &Target) {
    use tenure::{Schedule, ScheduleMode};
    let name = unique("cron-leader");
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for instance in 0..2 {
        let schedule = Schedule::new(&t.store, &name, "* * * * * *")
            .unwrap()
            .mode(ScheduleMode::Leader);
        handles.push(schedule.pause_handle());
        let runs = runs.clone();
        tasks.push(tokio::spawn(schedule.run(
            move |tick| {
                let runs = runs.clone();
                async move {
                    runs.lock()
                        .unwrap()
                        .push((tick.at, instance, tick.leader_token))
                }
            },
            tokio::time::sleep(Duration::from_millis(5000)),
        )));
    }
    // Let one lead for a while, then pause whoever ran the first tick.
    let deadline = Instant::now() + Duration::from_secs(4);
    let first = loop {
        if let Some(r) = runs.lock().unwrap().first() {
            break r.1;
        }
        assert!(Instant::now() < deadline, "no tick ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    handles[first].pause();
    let paused_at = chrono::Utc::now();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let mut ticks: Vec<_> = runs.iter().map(|r| r.0).collect();
    ticks.dedup();
    assert_eq!(ticks.len(), runs.len(), "a tick ran twice: {runs:?}");
    // Before the pause only the first leader ran; after it only the other.
    for (at, instance, token) in &runs {
        assert!(token.is_some());
        if *at < paused_at - chrono::Duration::milliseconds(1) {
            assert_eq!(*instance, first, "a follower ran a tick: {runs:?}");
        }
    }
    assert!(
        runs.iter().any(|r| r.1 != first && r.0 > paused_at),
        "nobody took over after the pause: {runs:?}"
    );
}

/// 64 waiters on one mutex: each release wakes exactly one of them, by the
/// store's own count of wake-ups (`wakeups`).
pub async fn check_no_thundering_herd(store: &Arc<dyn Store>, wakeups: impl Fn() -> u64) {
    const WAITERS: usize = 64;
    let name = unique("herd");
    let holder = Session::new(store).await.unwrap();
    let mut guard = Some(Mutex::new(&holder, &name).unwrap().lock().await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let s = Session::new(store).await.unwrap();
        let (tx, name) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
            tx.send(g).unwrap();
        });
    }
    wait_queue_len(store, &name, WAITERS + 1).await;
    // Let every waiter reach its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut last = 0;
    for i in 0..WAITERS {
        let before = wakeups();
        let g = guard.take().unwrap();
        assert!(g.token() > last, "tokens not increasing");
        last = g.token();
        g.release().await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the next waiter was granted")
            .unwrap();
        let woken = wakeups() - before;
        assert_eq!(woken, 1, "release {i} woke {woken} waiters");
        guard = Some(next);
    }
}

/// A cluster loses its leader (`first`, then another member after the
/// first is back) while a lock is held and two sessions wait: the holder
/// keeps its lease, the lock is never held twice, the waiters are granted in
/// turn and tokens keep increasing.
pub async fn check_cluster_failover(cluster: &mut dyn tenure_testkit::Cluster, first: usize) {
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
            g.release().await.unwrap();
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
pub async fn check_server_killed_and_restarted(server: &mut dyn tenure_testkit::Server) {
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

/// Server paused (SIGSTOP) while a lock is held: no error comes back, yet
/// the holder's lost() fires within the TTL; after SIGCONT the same store
/// takes the lock again, with a higher token.
pub async fn check_server_paused(server: &mut dyn tenure_testkit::Server) {
    let store = tenure::open(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1).max(store.capabilities().min_ttl);
    let s = Session::with_options(&store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let name = unique("paused");
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let before = guard.token();
    let paused = Instant::now();
    server.pause();
    let lost = tokio::time::timeout(ttl + Duration::from_millis(500), guard.lost()).await;
    let lost_after = paused.elapsed();
    server.resume();
    assert!(
        lost.is_ok(),
        "lost() did not fire while the server was paused"
    );
    assert!(lost_after <= ttl, "lost() after the TTL: {lost_after:?}");
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        let attempt = async {
            let s2 = Session::with_options(&store, SessionOptions::new().ttl(ttl)).await?;
            let g = tokio::time::timeout(Duration::from_secs(10), Mutex::new(&s2, &name)?.lock())
                .await
                .map_err(|_| Error::Timeout(Duration::from_secs(10)))??;
            Ok::<_, Error>((g, s2))
        };
        match attempt.await {
            Ok(done) => break done,
            Err(e) => {
                assert!(Instant::now() < deadline, "no lock after the resume: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(again.0.token() > before, "token went back after a pause");
    again.0.release().await.unwrap();
}

/// A server that is down at start: a typed "unavailable" error, in time.
pub async fn check_down_at_start(url: &str) {
    let start = Instant::now();
    let e = tenure::open(url).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// A wrong password: a typed auth error that does not show the password.
pub async fn check_wrong_password(url_with_hunter2: &str) {
    let e = tenure::open(url_with_hunter2).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
}

#[macro_export]
macro_rules! conformance_tests {
    ($target:expr) => {
        $crate::conformance_tests!(@each $target;
            check_exclusion, check_concurrent_first_use, check_try_lock_while_held, check_timeout, check_fifo,
            check_reentrancy, check_reentrant_waiters, check_non_holder_cannot_act, check_close_releases_everything,
            check_crashed_holder_released, check_waiter_session_expiry,
            check_cancelled_wait_leaves_queue, check_fencing_monotonic,
            check_election_failover, check_observe_order, check_proclaim_only_by_leader,
            check_elector_callbacks, check_shared_and_permits, check_bad_input,
            check_rwlock, check_semaphore, check_once, check_schedule_per_tick,
            check_schedule_leader);
    };
    (@each $target:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                // `None`: the server is missing and this is not CI (said on stderr).
                let Some(target) = $target.await else { return };
                conformance::$check(&target).await;
            }
        )*
    };
}
