//! The conformance suite on `rediss://`, against a redis-server that speaks
//! only TLS with a certificate of a test CA, and on `rediss+sentinel://`
//! (a master, its replica and three sentinels, all TLS only); and what
//! happens when the client does not trust that CA.
#![cfg(all(feature = "redis", feature = "tls"))]

use std::sync::OnceLock;

use tenure::Error;
use tenure_testkit::RedisServer;

fn shared() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start_tls_or_skip).as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(target());

#[tokio::test]
async fn untrusted_certificate_is_refused_with_a_clear_error() {
    let Some(server) = shared() else { return };
    // The system's roots do not include the test CA.
    let url = format!("rediss://127.0.0.1:{}/0", server.port());
    let e = tenure::open(&url).await.unwrap_err();
    let text = e.to_string().to_lowercase();
    assert!(
        text.contains("certificate") || text.contains("tls") || text.contains("ssl"),
        "{e}"
    );
    // Plain text to a TLS-only port never gets a session.
    let plain = format!("redis://127.0.0.1:{}/0", server.port());
    assert!(tenure::open(&plain).await.is_err());
    // A missing CA file is a bad URL, not a connection error.
    let missing = format!(
        "rediss://127.0.0.1:{}/0?tls_ca=/nonexistent/ca.pem",
        server.port()
    );
    let e = tenure::open(&missing).await.unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
}

/// Behind Sentinel, everything by TLS: the suite, and the test CA not
/// trusted.
mod behind_sentinel {
    use std::sync::OnceLock;

    use tenure_testkit::RedisSentinel;

    fn shared() -> Option<&'static RedisSentinel> {
        static SET: OnceLock<Option<RedisSentinel>> = OnceLock::new();
        SET.get_or_init(RedisSentinel::start_tls_or_skip).as_ref()
    }

    async fn target() -> Option<tenure_testkit::conformance::Target> {
        let set = shared()?;
        Some(tenure_testkit::conformance::Target::new(set.url()).await)
    }

    tenure_testkit::conformance_tests!(target());

    #[tokio::test]
    async fn untrusted_certificate_is_refused_with_a_clear_error() {
        let Some(set) = shared() else { return };
        let url = set.url();
        let untrusted = &url[..url.find('?').unwrap_or(url.len())];
        let e = tenure::open(untrusted).await.unwrap_err();
        assert!(matches!(e, tenure::Error::Unavailable { .. }), "{e:?}");
        let text = e.to_string().to_lowercase();
        assert!(
            text.contains("certificate") || text.contains("tls") || text.contains("ssl"),
            "{e}"
        );
    }
}
