//! Conformance: a server that stops answering (SIGSTOP) or is not there:
//! every call fails within the store's call deadline, and every stop ends
//! within its stated bound.

use super::*;

/// Server paused (SIGSTOP) while a lock is held: no error comes back, yet
/// the holder's lost() fires within the TTL; after SIGCONT the same store
/// takes the lock again, with a higher token.
///
/// And calls to it end in time: a release and a lock's join made as it
/// stops, by sessions whose TTL outlasts the pause, each fail within the
/// store's call deadline with a temporary error that names the server
/// (the URL's first `host:port`), and the holder whose release went
/// unanswered is told it may have lost the lock.
pub async fn check_server_paused(server: &mut dyn crate::Server) {
    let store = tenure::open(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1).max(store.capabilities().min_ttl);
    let s = Session::with_options(&store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let name = unique("paused");
    let guard = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
    let before = guard.token();
    let outlasting = SessionOptions::new().ttl(Duration::from_secs(30));
    let holder = Session::with_options(&store, outlasting.clone())
        .await
        .unwrap();
    let asker = Session::with_options(&store, outlasting).await.unwrap();
    let releasing = Mutex::new(&holder, unique("paused-release"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let asking = Mutex::new(&asker, unique("paused-join")).unwrap();
    // An elector leading when the server stops: its handle says it no
    // longer leads no later than the term's lost() resolves.
    let (term_tx, term_rx) = tokio::sync::oneshot::channel();
    let mut term_tx = Some(term_tx);
    let elector = Elector::new(&store, unique("paused-elector"), "a")
        .unwrap()
        .session_options(SessionOptions::new().ttl(ttl))
        .on_elected(move |term| {
            if let Some(tx) = term_tx.take() {
                let _ = tx.send(term.lost());
            }
        });
    let leading = elector.handle();
    let (stop_elector, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let elector = tokio::spawn(elector.run(async {
        let _ = stop_rx.await;
    }));
    let term_lost = tokio::time::timeout(Duration::from_secs(10), term_rx)
        .await
        .expect("the elector led")
        .unwrap();
    assert!(leading.is_leader());
    let told = tokio::spawn({
        let leading = leading.clone();
        async move {
            term_lost.await;
            // At the moment lost() resolves, is_leader() is already false.
            !leading.is_leader()
        }
    });
    let paused = Instant::now();
    server.pause();
    // Both at once, while the rest of the check waits.
    let call_deadline = store.capabilities().call_deadline;
    let limit = call_deadline + Duration::from_secs(20);
    let calls = tokio::spawn(async move {
        tokio::join!(
            timed(limit, async { releasing.release().await.map(drop) }),
            timed(limit, async { asking.lock().await.map(drop) }),
        )
    });
    let lost = tokio::time::timeout(ttl + Duration::from_millis(500), guard.lost()).await;
    let lost_after = paused.elapsed();
    let elector_told = tokio::time::timeout(ttl + Duration::from_millis(500), told).await;
    let ((released, release_took), (joined, join_took)) = calls.await.unwrap();
    let holder_told = holder.is_lost();
    server.resume();
    let names = first_server(&server.url());
    for (what, answer, took) in [
        ("a release", released, release_took),
        ("a lock's join", joined, join_took),
    ] {
        let e = answer
            .unwrap_or_else(|| panic!("{what} to a paused server did not return in {took:?}"))
            .expect_err(&format!("{what} to a paused server succeeded"));
        eprintln!("{what} to a paused server: {e} (after {took:?})");
        assert!(e.is_temporary(), "{what}: {e:?}");
        assert!(
            e.to_string().contains(&names),
            "{what}: {e} does not name {names}"
        );
        assert!(
            took <= call_deadline + STOP_ALLOWANCE,
            "{what} returned after {took:?}, deadline {call_deadline:?}"
        );
    }
    assert!(
        holder_told,
        "the holder whose release went unanswered was not told"
    );
    assert!(
        elector_told
            .expect("the term's lost() resolved while paused")
            .unwrap(),
        "is_leader() was still true when the term's lost() resolved"
    );
    let _ = stop_elector.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), elector).await;
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

/// The first `host:port` a store URL names (after any user info).
fn first_server(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    hosts.split(',').next().unwrap_or(hosts).to_string()
}

/// `call`'s output if it came within `limit`, and how long it took.
async fn timed<T>(
    limit: Duration,
    call: impl std::future::Future<Output = T>,
) -> (Option<T>, Duration) {
    let started = Instant::now();
    let answer = tokio::time::timeout(limit, call).await.ok();
    (answer, started.elapsed())
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

/// What a stop or a failing call may take beyond its stated bound on a
/// loaded test machine (scheduling, not waiting on the store).
const STOP_ALLOWANCE: Duration = Duration::from_millis(300);

/// Stopping ends on a server that does not answer (SIGSTOP): an elector
/// that leads, a schedule whose leader is in the middle of a run and a
/// session's close, each stopped while the server is paused, return within
/// their stated bounds — the stop grace plus the session's TTL for
/// `Elector::run` and `Schedule::run`, the TTL for `Session::close` (which
/// says `Unavailable`) — and the stopped elector does not say it leads.
pub async fn check_stops_end_on_a_paused_server(server: &mut dyn crate::Server) {
    use tenure::{Schedule, ScheduleMode};
    let store = tenure::open(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1).max(store.capabilities().min_ttl);
    let options = SessionOptions::new().ttl(ttl);
    let grace = Duration::from_millis(200);

    let elector = Elector::new(&store, unique("stop-elector"), "a")
        .unwrap()
        .session_options(options.clone())
        .stop_grace(grace);
    let leading = elector.handle();
    let (stop_elector, rx) = tokio::sync::oneshot::channel::<()>();
    let elector = tokio::spawn(elector.run(async {
        let _ = rx.await;
    }));

    let (started_tx, started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let schedule = Schedule::new(&store, unique("stop-schedule"), "* * * * * *")
        .unwrap()
        .mode(ScheduleMode::Leader)
        .session_options(options.clone())
        .stop_grace(grace);
    let (stop_schedule, rx) = tokio::sync::oneshot::channel::<()>();
    let schedule = tokio::spawn(schedule.run(
        move |_tick| {
            let started = started_tx.clone();
            async move {
                let _ = started.send(());
                // Ignores being told to stop: only the grace ends it.
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        },
        async {
            let _ = rx.await;
        },
    ));
    let session = Session::with_options(&store, options).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    while !leading.is_leader() {
        assert!(Instant::now() < deadline, "the elector never led");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut started = started;
    tokio::time::timeout(Duration::from_secs(10), started.recv())
        .await
        .expect("the schedule never ran");

    server.pause();
    let stopping = Instant::now();
    let _ = stop_elector.send(());
    let _ = stop_schedule.send(());
    let limit = grace + ttl + Duration::from_secs(10);
    let timed = |task: tokio::task::JoinHandle<tenure::Result<()>>| async move {
        let ended = tokio::time::timeout(limit, task).await;
        (ended.map(|joined| joined.unwrap()), stopping.elapsed())
    };
    let ((elector, elector_took), (schedule, schedule_took), (closed, close_took)) =
        tokio::join!(timed(elector), timed(schedule), async {
            let closed = tokio::time::timeout(limit, session.close()).await;
            (closed, stopping.elapsed())
        });
    server.resume();
    eprintln!(
        "on a paused server: the elector stopped after {elector_took:?} ({elector:?}), the \
         schedule after {schedule_took:?} ({schedule:?}), the close after {close_took:?} \
         ({closed:?}); TTL {ttl:?}, grace {grace:?}"
    );
    for (what, ended, took, bound) in [
        ("Elector::run", elector.is_ok(), elector_took, grace + ttl),
        (
            "Schedule::run",
            schedule.is_ok(),
            schedule_took,
            grace + ttl,
        ),
        ("Session::close", closed.is_ok(), close_took, ttl),
    ] {
        assert!(ended, "{what} had not returned after {took:?}");
        assert!(
            took <= bound + STOP_ALLOWANCE,
            "{what} returned after {took:?}, bound {bound:?}"
        );
    }
    // The server never answered; ZooKeeper's client may itself have judged
    // the session expired by then (it was: the close is done).
    let closed = closed.unwrap();
    assert!(
        matches!(closed, Ok(()) | Err(tenure::Error::Unavailable { .. })),
        "a close the paused server never answered: {closed:?}"
    );
    assert!(!leading.is_leader(), "a stopped elector says it leads");
}

/// Every kind of store call made to a server that stopped answering
/// (SIGSTOP) fails within the store's stated call deadline
/// ([`Capabilities::call_deadline`](tenure::Capabilities)), retries
/// included, with a temporary error: opening a store and a session, a
/// join (`lock`, `try_lock`), a release, a renewal, a close, cell and fence
/// operations and a read of the leader. Sessions live 30 s, so no call is
/// ended by its session's loss.
pub async fn check_every_call_fails_in_time_on_a_paused_server(server: &mut dyn crate::Server) {
    use tenure::{Cell, Expect, Fence};
    let url = server.url();
    let store = tenure::open(&url).await.unwrap();
    let deadline = store.capabilities().call_deadline;
    let long = SessionOptions::new().ttl(Duration::from_secs(30));
    let session = |o: SessionOptions| {
        let store = store.clone();
        async move { Session::with_options(&store, o).await.unwrap() }
    };
    let (holder, asker, trier, renewer, closer) = (
        session(long.clone()).await,
        session(long.clone()).await,
        session(long.clone()).await,
        session(long.clone().auto_renew(false)).await,
        session(long.clone()).await,
    );
    let held = Mutex::new(&holder, unique("calls-held"))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let asking = Mutex::new(&asker, unique("calls-join")).unwrap();
    let trying = Mutex::new(&trier, unique("calls-try")).unwrap();
    let cell = Cell::new(&store, unique("calls-cell")).unwrap();
    cell.put(b"v", Expect::Absent).await.unwrap();
    let fence = Fence::new(&store, unique("calls-fence")).unwrap();
    fence.admit(1).await.unwrap();
    let led = Name::new(unique("calls-leader")).unwrap();

    server.pause();
    let limit = deadline + Duration::from_secs(20);
    type Call<'a> =
        std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'a>>;
    // Each call: `None` if it succeeded, else its error as text.
    fn failed<T>(r: tenure::Result<T>) -> Option<String> {
        r.err().map(|e| {
            format!(
                "{}{e}",
                if e.is_temporary() {
                    ""
                } else {
                    "NOT TEMPORARY: "
                }
            )
        })
    }
    let calls: Vec<(&str, Call<'_>)> = vec![
        (
            "open a store",
            Box::pin(async { failed(tenure::open(&url).await) }),
        ),
        (
            "open a session",
            Box::pin(async { failed(Session::with_options(&store, long.clone()).await) }),
        ),
        (
            "join (lock)",
            Box::pin(async { failed(asking.lock().await) }),
        ),
        (
            "join (try_lock)",
            Box::pin(async { failed(trying.try_lock().await) }),
        ),
        ("release", Box::pin(async { failed(held.release().await) })),
        ("renewal", Box::pin(async { failed(renewer.renew().await) })),
        ("close", Box::pin(async { failed(closer.close().await) })),
        ("cell get", Box::pin(async { failed(cell.get().await) })),
        (
            "cell put",
            Box::pin(async { failed(cell.put(b"w", Expect::Version(1)).await) }),
        ),
        (
            "fence admit",
            Box::pin(async { failed(fence.admit(2).await) }),
        ),
        ("fence read", Box::pin(async { failed(fence.read().await) })),
        (
            "leader",
            Box::pin(async { failed(tenure::leader(store.as_ref(), &led).await) }),
        ),
    ];
    let timed_calls = calls.into_iter().map(|(what, call)| async move {
        let (answer, took) = timed(limit, call).await;
        (what, answer, took)
    });
    let results = futures_util::future::join_all(timed_calls).await;
    server.resume();
    let mut late = Vec::new();
    for (what, answer, took) in results {
        eprintln!("{what} to a paused server: {answer:?} after {took:?} (deadline {deadline:?})");
        match answer {
            None => late.push(format!("{what}: no answer after {took:?}")),
            Some(None) => late.push(format!("{what}: succeeded")),
            Some(Some(e)) if e.starts_with("NOT TEMPORARY") => late.push(format!("{what}: {e}")),
            Some(Some(_)) if took > deadline + STOP_ALLOWANCE => {
                late.push(format!("{what}: failed after {took:?}"))
            }
            Some(Some(_)) => {}
        }
    }
    assert!(late.is_empty(), "deadline {deadline:?}: {late:#?}");
}
