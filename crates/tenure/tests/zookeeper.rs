//! The conformance suite on `zk://`, against a real ZooKeeper (Debian's
//! zookeeper package) the test kit starts, plus fault tests.
#![cfg(feature = "zookeeper")]

use std::sync::OnceLock;

use tenure_testkit::ZkEnsemble;

/// One single server for the whole test binary.
fn shared() -> Option<&'static ZkEnsemble> {
    static SERVER: OnceLock<Option<ZkEnsemble>> = OnceLock::new();
    SERVER.get_or_init(|| ZkEnsemble::start_or_skip(1)).as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(
    target();
    server: ZkEnsemble::start_or_skip(1);
    down: |port| format!("zk://127.0.0.1:{port}")
);

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
