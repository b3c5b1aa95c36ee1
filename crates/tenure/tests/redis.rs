//! The conformance suite on `redis://`, against a real redis-server, plus
//! fault tests on the kit's own servers.

mod conformance;

use std::sync::OnceLock;
use std::time::Duration;

use tenure::{Error, Mutex, Session, SessionOptions};
use tenure_testkit::RedisServer;

/// One server for the whole test binary.
fn shared() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start_or_skip).as_ref()
}

async fn target() -> Option<conformance::Target> {
    let server = shared()?;
    Some(conformance::Target::new(server.url()).await)
}

conformance_tests!(target());

/// Killed while a lock is held: the holder's lost() fires within the TTL;
/// after a restart (data gone) locks work again and tokens still increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    let Some(mut server) = RedisServer::start_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1);
    let session = Session::with_options(&store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap();
    let guard = Mutex::new(&session, "fault").unwrap().lock().await.unwrap();
    let before = guard.token();
    let killed = tokio::time::Instant::now();
    server.kill();
    let lost = tokio::time::timeout(ttl + Duration::from_millis(500), guard.lost()).await;
    assert!(lost.is_ok(), "lost() did not fire within the TTL");
    assert!(
        killed.elapsed() <= ttl,
        "lost() fired after the TTL: {:?}",
        killed.elapsed()
    );
    server.restart();
    // The same store object reconnects.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let s2 = loop {
        match Session::with_options(&store, SessionOptions::new().ttl(ttl)).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(e.is_temporary(), "{e}");
                assert!(tokio::time::Instant::now() < deadline, "no reconnect: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let g2 = Mutex::new(&s2, "fault").unwrap().lock().await.unwrap();
    assert!(
        g2.token() > before,
        "token went back after data loss: {} <= {before}",
        g2.token()
    );
    g2.release().await.unwrap();
}

#[tokio::test]
async fn server_down_at_start_is_unavailable_in_time() {
    let port = tenure_testkit::free_port();
    let start = std::time::Instant::now();
    let e = tenure::open(&format!("redis://127.0.0.1:{port}/0"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = RedisServer::start_with_password(Some("right-one")) else {
        tenure_testkit::missing("redis-server", "redis-server");
        return;
    };
    let url = format!("redis://:hunter2@127.0.0.1:{}/0", server.port());
    let e = tenure::open(&url).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    assert!(tenure::open(&server.url()).await.is_ok());
}
