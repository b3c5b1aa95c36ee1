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
    let zk = tenure::backend::zookeeper::ZkStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(zk.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || zk.wakeups()).await;
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
