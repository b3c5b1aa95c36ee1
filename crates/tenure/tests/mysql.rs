//! The conformance suite on `mysql://`, against a real MariaDB started
//! from Debian's binaries, plus fault tests on the kit's own server.

mod conformance;

use std::sync::OnceLock;

use tenure::{Error, Mutex, Session};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    let Some(mut server) = MariaDbServer::start_or_skip() else {
        return;
    };
    conformance::check_server_killed_and_restarted(&mut server).await;
}

#[tokio::test]
async fn server_down_at_start_is_unavailable_in_time() {
    let port = tenure_testkit::free_port();
    conformance::check_down_at_start(&format!("mysql://tenure:x@127.0.0.1:{port}/tenure")).await;
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = shared() else { return };
    conformance::check_wrong_password(&format!(
        "mysql://tenure:hunter2@127.0.0.1:{}/tenure",
        server.port()
    ))
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_paused_while_held() {
    let Some(mut server) = MariaDbServer::start_or_skip() else {
        return;
    };
    conformance::check_server_paused(&mut server).await;
}
