//! The conformance suite on `postgres://…?sslmode=verify-full`, against a
//! PostgreSQL that accepts TCP logins only over TLS; and libpq's `sslmode`
//! meanings.
#![cfg(all(feature = "postgres", feature = "tls"))]

use std::sync::OnceLock;

use tenure::Error;
use tenure_testkit::{PostgresServer, PASSWORD};

fn shared() -> Option<&'static PostgresServer> {
    static SERVER: OnceLock<Option<PostgresServer>> = OnceLock::new();
    SERVER
        .get_or_init(PostgresServer::start_tls_or_skip)
        .as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(target());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_mean_what_libpq_says() {
    let Some(server) = shared() else { return };
    let base = format!(
        "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres",
        server.port()
    );
    // The server refuses logins without TLS.
    let e = tenure::open(&format!("{base}?sslmode=disable"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    // require: encrypted, certificate not checked (libpq's meaning).
    tenure::open(&format!("{base}?sslmode=require"))
        .await
        .expect("sslmode=require");
    // The default (prefer) uses TLS when the server offers it.
    tenure::open(&base).await.expect("sslmode=prefer");
    // verify-full without trusting the test CA: refused, with the reason,
    // and not as something to retry.
    let e = tenure::open(&format!("{base}?sslmode=verify-full"))
        .await
        .unwrap_err();
    assert!(!e.is_temporary(), "{e:?}");
    assert!(e.to_string().contains("TLS"), "{e}");
    // A bad sslmode is a bad URL.
    let e = tenure::open(&format!("{base}?sslmode=sometimes"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert!(!e.to_string().contains(PASSWORD));
}
