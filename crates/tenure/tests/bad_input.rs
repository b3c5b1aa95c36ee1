//! Bad URLs and paths get typed errors with clear messages, never a panic,
//! and never show a password.

use tenure::Error;

async fn open_err(url: &str) -> Error {
    match tenure::open(url).await {
        Ok(store) => panic!("{url} opened: {store:?}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn malformed_urls() {
    for url in [
        "",
        "sqlite",
        "no-scheme/path",
        "ftp://host/x",
        "memory://host",
        "sqlite://",
        "sqlite:///tmp/x.db?bogus=1",
    ] {
        let e = open_err(url).await;
        assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
}

#[tokio::test]
async fn unwritable_sqlite_paths() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("sqlite://{}/no/such/dir/x.db", dir.path().display());
    let as_dir = format!("sqlite://{}", dir.path().display());
    for url in [missing, as_dir, "sqlite:///proc/tenure.db".to_string()] {
        let e = open_err(&url).await;
        assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
        assert!(e.to_string().contains("cannot"), "{e}");
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.db");
    std::fs::write(
        &path,
        b"this is not an SQLite file, but it is long enough to have a header....",
    )
    .unwrap();
    let e = open_err(&format!("sqlite://{}", path.display())).await;
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
}

#[tokio::test]
async fn disabled_backends_name_their_feature_and_hide_passwords() {
    for url in [
        "postgres://bob:hunter2@db:5432/app",
        "mysql://bob:hunter2@db/app",
        "redis://:hunter2@localhost:6379/0",
        "redlock://:hunter2@a:1,b:2,c:3",
        "etcd://bob:hunter2@h:2379",
        "zk://h:2181/chroot",
    ] {
        if tenure::backend_for(url).unwrap().is_built_in() {
            continue; // built in: its own tests cover bad credentials
        }
        let e = open_err(url).await;
        assert!(matches!(e, Error::BackendDisabled { .. }), "{url}: {e:?}");
        assert!(!e.to_string().contains("hunter2"));
        assert!(!format!("{e:?}").contains("hunter2"));
    }
}

/// Every backend in the table refuses an option it does not take, naming it,
/// before any connection is tried (nothing listens on port 1).
#[tokio::test]
async fn every_backend_refuses_an_unknown_option_by_name_before_connecting() {
    let started = std::time::Instant::now();
    for backend in tenure::backends() {
        if !backend.is_built_in() {
            continue;
        }
        let scheme = backend.schemes[0];
        let url = match backend.name {
            "memory" => "memory://?bogus=1".to_string(),
            "sqlite" => "sqlite:///nonexistent-dir/x.db?bogus=1".to_string(),
            "redlock" => format!("{scheme}://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?bogus=1"),
            _ => format!("{scheme}://u:hunter2@127.0.0.1:1/db?bogus=1"),
        };
        let e = open_err(&url).await;
        assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
        let text = e.to_string();
        assert!(text.contains("\"bogus\""), "{url}: {text}");
        assert!(!text.contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "a connection was tried: {:?}",
        started.elapsed()
    );
}
