//! Conformance: Elections: failover, observers, proclaim, the elector loop.

use super::*;

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

pub(super) async fn observe_next(obs: &mut tenure::Observer) -> Option<tenure::Leader> {
    tokio::time::timeout(Duration::from_secs(10), obs.next())
        .await
        .expect("observe in time")
        .unwrap()
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

/// Waits (at most `within`) until `cond` holds; the check fails otherwise.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} (waited {within:?})");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An elector running in a task, with its handle and a way to stop it.
struct Running {
    handle: tenure::ElectorHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<tenure::Result<()>>,
}

impl Running {
    fn start(elector: Elector) -> Running {
        let handle = elector.handle();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async {
            let _ = rx.await;
        }));
        Running { handle, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        // Stopping closes the elector's session (a store call): once on a
        // loaded CI machine, a store reached over TLS took more than 10 s.
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the elector stopped")
            .unwrap()
            .unwrap();
        assert!(!self.handle.is_leader(), "a stopped elector still leads");
    }
}

/// `is_leader()` and `token()` agree with the store; `resign()` hands
/// leadership to the next candidate and campaigns again behind it; a
/// resignation asked from inside `on_elected` ends that term and the
/// elector leads again in a new one; `resign()` off term does nothing.
pub async fn check_elector_resign_and_recampaign(t: &Target) {
    let name = unique("resign");
    let n = Name::new(&name).unwrap();
    let options = SessionOptions::new().ttl(short_ttl(t, Duration::from_secs(2)));
    let make = |who: &str| {
        Elector::new(&t.store, &name, who)
            .unwrap()
            .session_options(options.clone())
    };
    let a = Running::start(make("a"));
    until(Duration::from_secs(10), "a never led", || {
        a.handle.is_leader()
    })
    .await;
    let leader = tenure::leader(t.store.as_ref(), &n).await.unwrap().unwrap();
    assert_eq!(a.handle.token(), Some(leader.token));
    let b = Running::start(make("b"));
    wait_queue_len(&t.store, &name, 2).await;
    assert!(!b.handle.is_leader() && b.handle.token().is_none());
    assert!(!b.handle.resign(), "resign() off term said it was leading");
    let first = a.handle.token().unwrap();
    assert!(a.handle.resign());
    until(
        Duration::from_secs(10),
        "b did not lead after a resigned",
        || b.handle.is_leader(),
    )
    .await;
    assert!(!a.handle.is_leader());
    // a campaigns again, behind b.
    wait_queue_len(&t.store, &name, 2).await;
    b.stop().await;
    until(Duration::from_secs(10), "a did not lead again", || {
        a.handle.is_leader()
    })
    .await;
    assert!(a.handle.token().unwrap() > first);
    a.stop().await;

    // From inside the callback: the first term resigns itself at once.
    let terms = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let elector = make("c");
    let handle = elector.handle();
    let seen = terms.clone();
    let c = Running::start(
        elector
            .session_options(options.clone())
            .on_elected(move |term| {
                let mut seen = seen.lock().unwrap();
                seen.push(term.token());
                if seen.len() == 1 {
                    assert!(handle.resign(), "resign() inside on_elected");
                }
            }),
    );
    until(
        Duration::from_secs(10),
        "no second term after resigning in the callback",
        || terms.lock().unwrap().len() >= 2,
    )
    .await;
    let terms = terms.lock().unwrap().clone();
    assert!(terms[1] > terms[0], "{terms:?}");
    until(
        Duration::from_secs(5),
        "c does not lead its second term",
        || c.handle.is_leader(),
    )
    .await;
    c.stop().await;
}

/// An elector paused across the cluster: the sitting leader steps down
/// within one renew interval, nobody campaigns or leads until resumed, and
/// then one instance leads again. On a store without cells the pause is
/// refused, typed.
pub async fn check_elector_pause(t: &Target) {
    let name = unique("paused-elector");
    let n = Name::new(&name).unwrap();
    let board = tenure::ElectorBoard::new(&t.store, &name).unwrap();
    if !t.store.capabilities().cells {
        assert!(matches!(
            board.pause(None, "conformance", "drill").await,
            Err(Error::Unsupported { .. })
        ));
        eprintln!(
            "{}: no cells (capabilities): elector pauses are Unsupported",
            t.store.capabilities().backend
        );
        return;
    }
    let options = SessionOptions::new().ttl(short_ttl(t, Duration::from_secs(2)));
    let renew = Session::with_options(&t.store, options.clone())
        .await
        .unwrap();
    let every = renew.renew_interval();
    renew.close().await.unwrap();
    // The stop's own bound (stop grace + TTL) is not what this checks:
    // room for a session's close on a loaded machine (a ZooKeeper close
    // once took over the 2 s of a TTL alone).
    let make = |who: &str| {
        Running::start(
            Elector::new(&t.store, &name, who)
                .unwrap()
                .session_options(options.clone())
                .stop_grace(Duration::from_secs(5)),
        )
    };
    let (a, b) = (make("a"), make("b"));
    until(Duration::from_secs(10), "nobody led", || {
        a.handle.is_leader() || b.handle.is_leader()
    })
    .await;
    assert!(board.exists().await.unwrap(), "a started elector is listed");
    board.pause(None, "conformance", "drill").await.unwrap();
    let paused = Instant::now();
    until(
        every + Duration::from_secs(1),
        "the leader did not step down",
        || !a.handle.is_leader() && !b.handle.is_leader(),
    )
    .await;
    let stepped_down = paused.elapsed();
    // Nobody campaigns while paused: the election stays empty.
    let deadline = Instant::now() + every * 3;
    loop {
        let queue = t.store.queue(&n).await.unwrap();
        let settled = paused.elapsed() > every + Duration::from_secs(1);
        if settled {
            assert!(
                queue.entries.is_empty(),
                "a paused elector campaigns: {queue:?}"
            );
        }
        assert!(!a.handle.is_leader() && !b.handle.is_leader());
        if Instant::now() > deadline && settled {
            break;
        }
        tokio::time::sleep(every / 4).await;
    }
    assert!(a.handle.is_paused() && b.handle.is_paused());
    assert!(board.resume().await.unwrap());
    until(
        Duration::from_secs(10),
        "nobody led after the resume",
        || a.handle.is_leader() || b.handle.is_leader(),
    )
    .await;
    eprintln!("stepped down {stepped_down:?} after the pause (renew interval {every:?})");
    a.stop().await;
    b.stop().await;
}
