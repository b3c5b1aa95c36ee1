//! Redlock over nodes that take clients only over TLS (`redlocks://`).
#![cfg(all(feature = "redlock", feature = "tls"))]

use tenure_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tls) = tenure_testkit::TlsFiles::make(dir.path()) else {
        return;
    };
    let servers: Option<Vec<RedisServer>> = (0..3)
        .map(|_| RedisServer::start_tls_with(tls.clone()))
        .collect();
    let Some(servers) = servers else { return };
    let url = tenure_testkit::stores::redlock_url(&servers);
    let store = tenure::open(&url).await.unwrap();
    let (a, b) = (
        tenure::Session::new(&store).await.unwrap(),
        tenure::Session::new(&store).await.unwrap(),
    );
    let g = tenure::Mutex::new(&a, "tls").unwrap().lock().await.unwrap();
    let mb = tenure::Mutex::new(&b, "tls").unwrap();
    assert!(mb.try_lock().await.unwrap().is_none());
    let first = g.token();
    g.release().await.unwrap();
    let g2 = mb.lock().await.unwrap();
    assert!(g2.token() > first);
    // Without the CA, no node is trusted: no majority.
    let untrusted = url.split_once('?').map(|(u, _)| u.to_string()).unwrap();
    assert!(tenure::open(&untrusted).await.is_err());
}
