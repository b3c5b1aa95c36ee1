//! ZooKeeper beyond the conformance suite (`tests/conformance.rs`),
//! against real ZooKeeper servers the kit starts.
#![cfg(feature = "zookeeper")]

use std::sync::OnceLock;

use tenure_testkit::ZkEnsemble;

/// One single server for the whole test binary.
fn shared() -> Option<&'static ZkEnsemble> {
    static SERVER: OnceLock<Option<ZkEnsemble>> = OnceLock::new();
    SERVER.get_or_init(|| ZkEnsemble::start_or_skip(1)).as_ref()
}

/// 64 waiters on one mutex: each release wakes exactly one of them (each
/// waiter watches only the child just ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    // 64 sessions, one connection each: more than a store opens by default.
    // The test kit's server takes any number (maxClientCnxns=0).
    let zk = tenure::backend::zookeeper::ZkStore::open(&format!("{}?max_sessions=0", server.url()))
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(zk.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || zk.wakeups(), 1, 0).await;
}

/// A 3-server ensemble: the leader killed while a lock is held and two
/// waiters wait, then another server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_and_member_killed() {
    let Some(mut ensemble) = ZkEnsemble::start_or_skip(3) else {
        return;
    };
    let leader = ensemble.leader().expect("a leader");
    tenure_testkit::conformance::check_cluster_failover(&mut ensemble, leader).await;
}

/// Each session is a ZooKeeper connection and servers cap connections per
/// address (maxClientCnxns, 60 by default): a store opens at most 50
/// sessions unless its URL says `max_sessions=N`, and refuses the next with
/// a typed error that names both settings, before connecting. A closed
/// session frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_beyond_max_sessions_are_refused_with_a_typed_error() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let mut sessions = Vec::new();
    for _ in 0..50 {
        sessions.push(tenure::Session::new(&store).await.unwrap());
    }
    let started = std::time::Instant::now();
    let e = tenure::Session::new(&store).await.unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert!(matches!(e, tenure::Error::InvalidArgument { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("maxClientCnxns") && text.contains("max_sessions"),
        "{text}"
    );
    sessions.pop().unwrap().close().await.unwrap();
    sessions.push(tenure::Session::new(&store).await.unwrap());

    let small = tenure::open(&format!("{}?max_sessions=2", server.url()))
        .await
        .unwrap();
    let a = tenure::Session::new(&small).await.unwrap();
    let b = tenure::Session::new(&small).await.unwrap();
    assert!(tenure::Session::new(&small).await.is_err());
    for s in [a, b].into_iter().chain(sessions) {
        s.close().await.unwrap();
    }
    let e = tenure::open(&format!("{}?max_sessions=many", server.url()))
        .await
        .unwrap_err();
    assert!(matches!(e, tenure::Error::InvalidUrl { .. }), "{e:?}");
}

/// `evict` ends the values bound to the sessions it ends, at once: right
/// after it returns, a bound cell of the evicted holder reads `None` (on the
/// evicting store and on the holder's) and the holder's next bound write
/// fails with `SessionLost`, whether the holder's session is the evicting
/// store's own or another store's (as it is for `tenure release --force`,
/// a process of its own). A session that was not evicted keeps its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_ends_the_holders_bound_cells_at_once() {
    use tenure::{Cell, Error, Expect, Mutex, Name, Session, SessionOptions};
    use tenure_testkit::conformance::unique;

    let Some(server) = shared() else { return };
    for same_store in [true, false] {
        let holders = tenure::open(&server.url()).await.unwrap();
        let evictor = if same_store {
            holders.clone()
        } else {
            tenure::open(&server.url()).await.unwrap()
        };
        // Long enough that no renewal tells the holder before it writes.
        let options = || SessionOptions::new().ttl(std::time::Duration::from_secs(30));
        let a = Session::with_options(&holders, options()).await.unwrap();
        let b = Session::with_options(&holders, options()).await.unwrap();
        let lock = unique("evict-cells");
        let guard = Mutex::new(&a, &lock).unwrap().lock().await.unwrap();
        let a_cell = Cell::bound_to(&a, unique("evict-cell-a")).unwrap();
        let v = a_cell.put(b"a's", Expect::Absent).await.unwrap();
        let b_cell = Cell::bound_to(&b, unique("evict-cell-b")).unwrap();
        let w = b_cell.put(b"b's", Expect::Absent).await.unwrap();
        for store in [&holders, &evictor] {
            let plain = Cell::new(store, a_cell.name().as_str()).unwrap();
            assert_eq!(plain.get().await.unwrap().map(|c| c.version), Some(v));
        }

        let evicted = evictor.evict(&Name::new(&lock).unwrap()).await.unwrap();
        assert_eq!(evicted, 1, "evict ended {evicted} sessions");
        for store in [&holders, &evictor] {
            let plain = Cell::new(store, a_cell.name().as_str()).unwrap();
            assert_eq!(
                plain.get().await.unwrap(),
                None,
                "an evicted holder's bound cell (same store: {same_store})"
            );
            let other = Cell::new(store, b_cell.name().as_str()).unwrap();
            assert_eq!(
                other.get().await.unwrap().map(|c| c.version),
                Some(w),
                "a bound cell of a session that was not evicted"
            );
        }
        let e = a_cell.put(b"after", Expect::Absent).await.unwrap_err();
        assert!(
            matches!(e, Error::SessionLost(_)),
            "same store: {same_store}: {e:?}"
        );
        let plain = Cell::new(&evictor, a_cell.name().as_str()).unwrap();
        assert_eq!(plain.get().await.unwrap(), None);
        let next = plain.put(b"anyone's", Expect::Absent).await.unwrap();
        assert!(next > v, "{next} after {v}");

        let _ = guard.release().await;
        b.close().await.unwrap();
        let _ = a.close().await;
    }
}

/// A cell's versions are never reused, even when its node is deleted and
/// made again (an operator cleaning up `PATH/r` by hand, a restored
/// backup): a writer that still holds a version from before cannot write
/// over the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cell_versions_are_not_reused_after_the_node_is_made_again() {
    use tenure::{Cell, Error, Expect};
    use tenure_testkit::conformance::unique;

    const CLI: &str = "/usr/share/zookeeper/bin/zkCli.sh";
    let Some(server) = shared() else { return };
    // The zookeeper package that gave the server gives its CLI too.
    assert!(std::path::Path::new(CLI).exists(), "{CLI} is missing");
    let store = tenure::open(&server.url()).await.unwrap();
    // Only [a-z0-9-]: the node's name is the cell's, unencoded.
    let name = unique("cell-remade");
    let cell = Cell::new(&store, &name).unwrap();
    let v1 = cell.put(b"one", Expect::Absent).await.unwrap();
    let v2 = cell.put(b"two", Expect::Version(v1)).await.unwrap();
    assert!(v2 > v1, "{v2} after {v1}");

    // The operator deletes the node by hand.
    let port = server.port(0);
    let path = format!("/tenure/r/{name}");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(CLI)
            .args(["-server", &format!("127.0.0.1:{port}"), "deleteall", &path])
            .env(
                "JVMFLAGS",
                "-Xmx64m -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            )
            .env("ZOO_LOG4J_PROP", "ERROR,CONSOLE")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(out.status.success(), "zkCli.sh: {out:?}");

    // The store still remembers the node: its write is refused, and the
    // answer comes from a fresh read.
    let e = cell.put(b"stale", Expect::Version(v2)).await.unwrap_err();
    assert!(
        matches!(e, Error::VersionMismatch { current: None, .. }),
        "{e:?}"
    );
    let v3 = cell.put(b"three", Expect::Absent).await.unwrap();
    assert!(
        v3 > v2,
        "a remade node's version went back: {v3} after {v2}"
    );
    // With versions counted from the node's data version, v3 would be v1
    // again and this write would go over "three".
    for old in [v1, v2] {
        let e = cell.put(b"stale", Expect::Version(old)).await.unwrap_err();
        assert!(
            matches!(e, Error::VersionMismatch { current: Some(c), .. } if c == v3),
            "{e:?}"
        );
    }
    let got = cell.get().await.unwrap().unwrap();
    assert_eq!((got.value.as_slice(), got.version), (&b"three"[..], v3));
    cell.delete(v3).await.unwrap();
    let v4 = cell.put(b"four", Expect::Absent).await.unwrap();
    assert!(v4 > v3, "{v4} after {v3}");
}

/// A queued waiter's first wait lists nothing: it watches the child its
/// join's own listing named. Counted by the store's waiter listings: none
/// while it waits, one after the wake-up (before: one more, first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_first_wait_uses_its_joins_listing() {
    use std::time::Duration;
    use tenure::{Mutex, Session, SessionOptions};
    let Some(server) = shared() else { return };
    let zk = tenure::backend::zookeeper::ZkStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(zk.clone());
    let options = || SessionOptions::new().ttl(Duration::from_secs(60));
    let name = tenure_testkit::conformance::unique("first-wait");
    let holder = Session::with_options(&store, options()).await.unwrap();
    let waiter = Session::with_options(&store, options()).await.unwrap();
    let guard = Mutex::new(&holder, &name).unwrap().lock().await.unwrap();
    let before = zk.waiter_listings();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (w, n) = (waiter.clone(), name.clone());
    tokio::spawn(async move {
        let _ = tx.send(Mutex::new(&w, &n).unwrap().lock().await);
    });
    let queued = tenure::Name::new(name.clone()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.queue(&queued).await.unwrap().entries.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(zk.waiter_listings() - before, 0, "listings while waiting");
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the waiter was granted")
        .unwrap()
        .unwrap();
    assert_eq!(zk.waiter_listings() - before, 1, "listings for the handoff");
    next.release().await.unwrap();
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}
