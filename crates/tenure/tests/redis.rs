//! The conformance suite on `redis://`, against a real redis-server, plus
//! fault tests on the kit's own servers.

mod conformance;

use std::sync::OnceLock;

use tenure::Error;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    let Some(mut server) = RedisServer::start_or_skip() else {
        return;
    };
    conformance::check_server_killed_and_restarted(&mut server).await;
}

#[tokio::test]
async fn server_down_at_start_is_unavailable_in_time() {
    let port = tenure_testkit::free_port();
    conformance::check_down_at_start(&format!("redis://127.0.0.1:{port}/0")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_while_held() {
    let Some(mut server) = RedisServer::start_or_skip() else {
        return;
    };
    conformance::check_server_paused(&mut server).await;
}
