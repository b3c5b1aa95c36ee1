//! The conformance suite on `mysql://…?ssl-mode=VERIFY_IDENTITY&ssl-ca=…`,
//! against a MariaDB that accepts connections only over TLS; and the MySQL
//! client's `ssl-mode` meanings.
#![cfg(all(feature = "mysql", feature = "tls"))]

use std::sync::OnceLock;

use tenure::Error;
use tenure_testkit::{MariaDbServer, TlsFiles, PASSWORD};

fn shared() -> Option<&'static MariaDbServer> {
    static SERVER: OnceLock<Option<MariaDbServer>> = OnceLock::new();
    SERVER
        .get_or_init(MariaDbServer::start_tls_or_skip)
        .as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let server = shared()?;
    Some(tenure_testkit::conformance::Target::new(server.url()).await)
}

tenure_testkit::conformance_tests!(target());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_modes_mean_what_the_mysql_client_says() {
    let Some(server) = shared() else { return };
    let Some(tls) = server.tls() else { return };
    let base = format!(
        "mysql://tenure:{PASSWORD}@127.0.0.1:{}/tenure",
        server.port()
    );
    // The server refuses connections without TLS: not a credentials
    // problem to retry.
    let e = tenure::open(&base).await.unwrap_err();
    assert!(!e.is_temporary(), "{e:?}");
    // REQUIRED: encrypted, the certificate not checked.
    tenure::open(&format!("{base}?ssl-mode=REQUIRED"))
        .await
        .expect("ssl-mode=REQUIRED");
    // VERIFY_CA with the test CA.
    tenure::open(&format!(
        "{base}?ssl-mode=VERIFY_CA&ssl-ca={}",
        tls.ca.display()
    ))
    .await
    .expect("ssl-mode=VERIFY_CA");
    // VERIFY_IDENTITY with a CA that did not sign the server's
    // certificate: refused, with the reason, and not as something to retry.
    let other = tempfile::tempdir().unwrap();
    let stranger = TlsFiles::make(other.path()).unwrap();
    let e = tenure::open(&format!(
        "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        stranger.ca.display()
    ))
    .await
    .unwrap_err();
    assert!(!e.is_temporary(), "{e:?}");
    assert!(e.to_string().contains("TLS"), "{e}");
    assert!(!e.to_string().contains(PASSWORD), "{e}");
    // Bad modes and files are bad URLs.
    for bad in [
        "?ssl-mode=PREFERRED".to_string(),
        "?ssl-mode=sometimes".to_string(),
        "?ssl-mode=VERIFY_CA&ssl-ca=/no/such/ca.pem".to_string(),
    ] {
        let e = tenure::open(&format!("{base}{bad}")).await.unwrap_err();
        assert!(matches!(e, Error::InvalidUrl { .. }), "{bad}: {e:?}");
        assert!(!e.to_string().contains(PASSWORD));
    }
}
