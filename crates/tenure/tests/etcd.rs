//! The conformance suite on `etcd://`, against a real etcd (Debian's
//! etcd-server) the test kit starts, plus fault tests.
#![cfg(feature = "etcd")]

mod conformance;

use std::sync::OnceLock;

use tenure_testkit::EtcdCluster;

/// One single-member cluster for the whole test binary.
fn shared() -> Option<&'static EtcdCluster> {
    static SERVER: OnceLock<Option<EtcdCluster>> = OnceLock::new();
    SERVER
        .get_or_init(|| EtcdCluster::start_or_skip(1))
        .as_ref()
}

async fn target() -> Option<conformance::Target> {
    let server = shared()?;
    Some(conformance::Target::new(server.url()).await)
}

conformance_tests!(target());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted() {
    let Some(mut server) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    conformance::check_server_killed_and_restarted(&mut server).await;
}

#[tokio::test]
async fn server_down_at_start_is_unavailable_in_time() {
    let port = tenure_testkit::free_port();
    conformance::check_down_at_start(&format!("etcd://127.0.0.1:{port}")).await;
}
