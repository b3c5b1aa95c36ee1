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
        assert!(matches!(e, Error::InvalidArgument { .. }), "{url}: {e:?}");
        assert!(e.to_string().contains("cannot open"), "{e}");
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
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("not an SQLite database"), "{e}");
}

/// A file of a newer tenure is a schema mismatch, said as such, and left
/// as it was.
#[tokio::test]
async fn a_file_of_a_newer_schema_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    let url = format!("sqlite://{}", path.display());
    drop(tenure::open(&url).await.unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE tenure_meta SET value = 99 WHERE key = 'schema'", [])
        .unwrap();
    drop(conn);
    let e = open_err(&url).await;
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("version 99"), "{e}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = conn
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(v, 99, "the newer file was changed");
}

/// A read-only file is said to be read-only. Root writes to any file, so
/// the file is opened read-only through a read-only bind mount in a user and
/// mount namespace of our own; where the kernel allows no such namespace,
/// the test says so and checks nothing.
#[test]
fn a_read_only_file_is_said_to_be_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        drop(
            tenure::open(&format!("sqlite://{}", path.display()))
                .await
                .unwrap(),
        )
    });
    let probe = std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .status();
    if !matches!(probe, Ok(s) if s.success()) {
        eprintln!("SKIPPED: no user and mount namespaces here (unshare -rm)");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs unshare -rm"
        );
        return;
    }
    let script = format!(
        "mount --bind {d} {d} && mount -o remount,bind,ro {d} && exec \"$0\" --exact read_only_child --nocapture",
        d = dir.path().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-rm", "sh", "-c", &script])
        .arg(std::env::current_exe().unwrap())
        .env("TENURE_RO_DB", &path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// Run by [`a_read_only_file_is_said_to_be_read_only`] inside its namespace.
#[tokio::test]
async fn read_only_child() {
    let Ok(path) = std::env::var("TENURE_RO_DB") else {
        return; // only meaningful inside the read-only namespace
    };
    let e = open_err(&format!("sqlite://{path}")).await;
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("read-only"), "{e}");
}

#[tokio::test]
async fn disabled_backends_name_their_feature_and_hide_passwords() {
    let dir = tempfile::tempdir().unwrap();
    for store in tenure_testkit::stores::STORES {
        let url = (store.bad_option_url)(dir.path());
        if tenure::backend_for(&url).unwrap().is_built_in() {
            continue; // built in: its own tests cover bad credentials
        }
        let e = open_err(&url).await;
        assert!(matches!(e, Error::BackendDisabled { .. }), "{url}: {e:?}");
        assert!(!e.to_string().contains("hunter2"));
        assert!(!format!("{e:?}").contains("hunter2"));
    }
}

/// Every store of the table refuses an option it does not take, naming it,
/// before any connection is tried (nothing listens on port 1).
#[tokio::test]
async fn every_backend_refuses_an_unknown_option_by_name_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    for store in tenure_testkit::stores::STORES {
        let url = (store.bad_option_url)(&dir.path().join("missing-dir"));
        if !tenure::backend_for(&url).unwrap().is_built_in() {
            continue;
        }
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

/// A server store pointed at a port where nothing listens: unavailable, in
/// words that name the server and say each cause once, without the
/// password. Stores whose feature is off in this build are skipped, named.
#[tokio::test]
async fn a_port_with_nothing_listening_is_named() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let at = format!("127.0.0.1:{port}");
    for url in [
        format!("postgres://u:hunter2@{at}/db"),
        format!("mysql://u:hunter2@{at}/db"),
        format!("redis://:hunter2@{at}"),
        format!("etcd://{at}"),
        format!("zk://{at}"),
    ] {
        let e = match tenure::open(&url).await {
            Ok(_) => panic!("{url} opened"),
            Err(Error::BackendDisabled { backend, .. }) => {
                eprintln!("SKIPPED: {backend} (not built in)");
                continue;
            }
            Err(e) => e,
        };
        assert!(matches!(e, Error::Unavailable { .. }), "{url}: {e:?}");
        let text = e.to_string();
        assert!(text.contains(&format!("at {at}: ")), "{text}");
        let parts: Vec<&str> = text.split(": ").collect();
        for (i, p) in parts.iter().enumerate() {
            assert!(!parts[..i].contains(p), "{p:?} said twice: {text}");
        }
        assert!(
            !text.contains("hunter2") && !format!("{e:?}").contains("hunter2"),
            "{text}"
        );
    }
}

/// Every secret a URL can carry — the user-info's password and every query
/// option that holds a secret (`sentinel_password`, or any option named
/// like a password, secret or token) — is hidden in every error, on every
/// scheme of every store built in, whatever the URL's fault: an option the
/// store does not take, an option's bad value, a malformed URL, or a server
/// that does not answer (nothing listens on port 1).
#[tokio::test]
async fn no_secret_shows_in_any_error_on_any_scheme() {
    const SECRETS: [&str; 4] = ["PwUser0", "PwSentinel1", "PwToken2", "PwSecret3"];
    let mut tried = 0;
    for backend in tenure::backends().iter().filter(|b| b.is_built_in()) {
        for scheme in backend.schemes {
            let options =
                "sentinel_password=PwSentinel1&auth_token=PwToken2&client_secret=PwSecret3";
            let urls = [
                format!("{scheme}://user:PwUser0@127.0.0.1:1/db?bogus=1&{options}"),
                format!("{scheme}://user:PwUser0@127.0.0.1:1/db?{options}&replicas=abc"),
                format!("{scheme}://user:PwUser0@127.0.0.1:1/m/99?replicas_timeout=x&{options}"),
                format!("{scheme}://user:PwUser0@127.0.0.1:1/db?node_timeout=x&{options}"),
                format!("{scheme}://user:PwUser0@[::1/db?{options}"),
                format!("{scheme}://:PwUser0@127.0.0.1:1,127.0.0.1:1/db?{options}"),
                format!("{scheme}://user:PwUser0@127.0.0.1:1/db?sentinel_password=PwSentinel1"),
            ];
            for url in urls {
                let opened =
                    tokio::time::timeout(std::time::Duration::from_secs(20), tenure::open(&url))
                        .await
                        .unwrap_or_else(|_| panic!("{scheme}: no answer within 20s"));
                let Err(e) = opened else {
                    panic!("{scheme}: opened");
                };
                tried += 1;
                let (text, debug) = (e.to_string(), format!("{e:?}"));
                for secret in SECRETS {
                    assert!(
                        !text.contains(secret) && !debug.contains(secret),
                        "{scheme}: {secret} shown in {text} / {debug}"
                    );
                }
            }
        }
    }
    assert!(tried >= 7, "only {tried} URLs were tried");
}
