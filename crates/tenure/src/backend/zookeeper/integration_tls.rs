//! The conformance suite on `zks://…?tls_ca=…`, against a ZooKeeper that
//! takes clients only on its secure client port (Netty, TLS); and what
//! happens without TLS, with a CA that did not sign the server's
//! certificate, and with a CA file that is not there.
#![cfg(all(feature = "zookeeper", feature = "tls"))]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tenure::Error;
use tenure_testkit::{TlsFiles, ZkEnsemble};

/// ZooKeeper's digest auth takes any password; not `tenure_testkit::PASSWORD`,
/// which the kit's temporary directories' names (in the CA paths) contain.
const PASSWORD: &str = "zk-s3cret";

fn shared() -> Option<&'static ZkEnsemble> {
    static SERVER: OnceLock<Option<ZkEnsemble>> = OnceLock::new();
    SERVER.get_or_init(ZkEnsemble::start_tls_or_skip).as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(target());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_right_ca_over_tls_connects() {
    let Some(server) = shared() else { return };
    let Some(tls) = server.tls() else { return };
    // Digest auth makes the nodes creator-only: a path of its own, away
    // from the conformance suite's.
    let hosts = format!("tenure:{PASSWORD}@127.0.0.1:{}/tls-test", server.port(0));
    // With the test CA: locks work.
    // The store's connection and each session's are TLS connects to a JVM
    // that the whole suite is loading at once on 2 cores, and each has
    // been seen to fail ('no available hosts', a temporary error, once in
    // CI on the store's own): temporary errors are retried for up to 10 s.
    let url = format!("zks://{hosts}?tls_ca={}", tls.ca.display());
    let store = retry_temporary("zks:// with the test CA", || tenure::open(&url)).await;
    let s = retry_temporary("a session over TLS", || tenure::Session::new(&store)).await;
    let g = tenure::Mutex::new(&s, "tls").unwrap().lock().await.unwrap();
    assert!(g.token() > 0);
    g.release().await.unwrap();
    s.close().await.unwrap();

    // Plain text to a TLS-only port: the server drops the connection, which
    // the client cannot tell from a server going away, so the error is a
    // temporary one, but it comes within the connect timeout.
    let started = Instant::now();
    let e = tenure::open(&format!("zk://{hosts}")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e:?}");
    assert!(!e.to_string().contains(PASSWORD), "{e}");

    // A CA that did not sign the server's certificate: refused, with the
    // reason, and not as something to retry.
    let other = tempfile::tempdir().unwrap();
    let stranger = TlsFiles::make(other.path()).unwrap();
    let started = Instant::now();
    let e = tenure::open(&format!("zks://{hosts}?tls_ca={}", stranger.ca.display()))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e:?}");
    assert!(!e.is_temporary(), "{e:?}");
    assert!(e.to_string().contains("TLS"), "{e}");
    assert!(!e.to_string().contains(PASSWORD), "{e}");

    // Bad CA files, and TLS half asked for, are bad URLs.
    let not_pem = other.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    for bad in [
        "zks://HOSTS?tls_ca=/no/such/ca.pem".to_string(),
        format!("zks://HOSTS?tls_ca={}", not_pem.display()),
        "zks://HOSTS".to_string(),
        format!("zk://HOSTS?tls_ca={}", tls.ca.display()),
    ] {
        let url = bad.replace("HOSTS", &hosts);
        let e = tenure::open(&url).await.unwrap_err();
        assert!(matches!(e, Error::InvalidUrl { .. }), "{bad}: {e:?}");
        assert!(!e.to_string().contains(PASSWORD), "{e}");
    }
}

/// `attempt`'s value, retrying temporary errors every half second for up to
/// 10 s; any other error, or a temporary one after that, fails the test.
async fn retry_temporary<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = tenure::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                eprintln!("{what}: {e}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
}
