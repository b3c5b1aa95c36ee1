//! The conformance suite on `mysql://`, against a real MariaDB started
//! from Debian's binaries, plus fault tests on the kit's own server.

mod conformance;

use std::sync::OnceLock;
use std::time::Duration;

use tenure::{Error, Mutex, Session, SessionOptions};
use tenure_testkit::MariaDbServer;

fn shared() -> Option<&'static MariaDbServer> {
    static SERVER: OnceLock<Option<MariaDbServer>> = OnceLock::new();
    SERVER.get_or_init(MariaDbServer::start_or_skip).as_ref()
}

async fn target() -> Option<conformance::Target> {
    let server = shared()?;
    Some(conformance::Target::new(server.url()).await)
}

conformance_tests!(target());

/// Killed while a lock is held: lost() fires within the TTL; after a restart
/// locks work again and tokens still increase (the counters are durable
/// columns, not AUTO_INCREMENT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    let Some(mut server) = MariaDbServer::start_or_skip() else {
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
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
    assert!(g2.token() > before, "token went back after a restart");
    g2.release().await.unwrap();
}

#[tokio::test]
async fn server_down_at_start_is_unavailable_in_time() {
    let port = tenure_testkit::free_port();
    let start = std::time::Instant::now();
    let e = tenure::open(&format!("mysql://tenure:x@127.0.0.1:{port}/tenure"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = shared() else { return };
    let url = format!("mysql://tenure:hunter2@127.0.0.1:{}/tenure", server.port());
    let e = tenure::open(&url).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
}

#[tokio::test]
async fn a_prefix_of_its_own_and_bad_options() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&format!("{}?prefix=app_", server.url()))
        .await
        .unwrap();
    let s = Session::new(&store).await.unwrap();
    let g = Mutex::new(&s, "x").unwrap().lock().await.unwrap();
    assert_eq!(g.token(), 1, "a fresh prefix starts its own counters");
    for bad in ["?prefix=bad-name", "?prefix="] {
        let e = tenure::open(&format!("{}{bad}", server.url()))
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidUrl { .. } | Error::Unsupported { .. }),
            "{bad}: {e:?}"
        );
    }
}
