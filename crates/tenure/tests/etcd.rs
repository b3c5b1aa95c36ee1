//! The conformance suite on `etcd://`, against a real etcd (Debian's
//! etcd-server) the test kit starts, plus fault tests.
#![cfg(feature = "etcd")]

use std::sync::OnceLock;

use tenure_testkit::EtcdCluster;

/// One single-member cluster for the whole test binary.
fn shared() -> Option<&'static EtcdCluster> {
    static SERVER: OnceLock<Option<EtcdCluster>> = OnceLock::new();
    SERVER
        .get_or_init(|| EtcdCluster::start_or_skip(1))
        .as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(
    target();
    server: EtcdCluster::start_or_skip(1);
    down: |port| format!("etcd://127.0.0.1:{port}")
);

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    server.enable_auth("right-one");
    let hosts = server.url().trim_start_matches("etcd://").to_string();
    let e = tenure::open(&format!("etcd://root:hunter2@{hosts}"))
        .await
        .unwrap_err();
    assert!(matches!(e, tenure::Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    let store = tenure::open(&format!("etcd://root:right-one@{hosts}"))
        .await
        .unwrap();
    let s = tenure::Session::new(&store).await.unwrap();
    let g = tenure::Mutex::new(&s, "auth")
        .unwrap()
        .lock()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// 64 waiters on one mutex: each release wakes exactly one of them (each
/// waiter watches only the entry just ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    let etcd = tenure::backend::etcd::EtcdStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(etcd.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || etcd.wakeups(), 1, 0).await;
}

/// A 3-member cluster: the raft leader killed while a lock is held and two
/// waiters wait, then a follower: the holder keeps its lease, no two
/// holders at once, waiters proceed in order, tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_and_member_killed() {
    let Some(mut cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let leader = cluster
        .wait_leader(std::time::Duration::from_secs(20))
        .expect("a leader");
    tenure_testkit::conformance::check_cluster_failover(&mut cluster, leader).await;
}

/// `etcds://` against a member that serves clients only over TLS: locks
/// work with the test CA trusted, and are refused without it.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls() {
    let Some(server) = EtcdCluster::start_tls_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let s = tenure::Session::new(&store).await.unwrap();
    let g = tenure::Mutex::new(&s, "tls").unwrap().lock().await.unwrap();
    assert!(g.token() > 0);
    g.release().await.unwrap();
    let untrusted = server.url().split_once('?').unwrap().0.to_string();
    assert!(tenure::open(&untrusted).await.is_err());
    let plain = untrusted.replace("etcds://", "etcd://");
    assert!(tenure::open(&plain).await.is_err());
}

/// A queue of more entries than etcd takes operations in one transaction
/// (128 by default) reads whole, with every session's tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_longer_than_one_transaction_reads_whole() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..150 {
        let session = tenure::Session::new(&store).await.unwrap();
        let guard = tenure::RwLock::new(&session, "long-queue")
            .unwrap()
            .read()
            .await
            .unwrap();
        held.push((guard, session));
    }
    let queue = store
        .queue(&tenure::Name::new("long-queue").unwrap())
        .await
        .unwrap();
    assert_eq!(queue.entries.len(), 150);
    assert!(queue
        .entries
        .iter()
        .all(|e| e.granted && !e.session_tag.is_empty()));
    for (guard, session) in held {
        guard.release().await.unwrap();
        session.close().await.unwrap();
    }
}
