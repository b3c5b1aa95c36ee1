//! SQLite beyond the conformance suite (`tests/conformance.rs`).
#![cfg(feature = "sqlite")]

/// Expiry counts from boot, so sessions of an earlier boot are dropped when
/// a store opens the file after a reboot (played here by changing the
/// recorded boot id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_an_earlier_boot_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot.db");
    let url = format!("sqlite://{}", path.display());
    let store = tenure::open(&url).await.unwrap();
    let session = tenure::Session::new(&store).await.unwrap();
    let guard = tenure::Mutex::new(&session, "across-boot")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let token = guard.token();
    // Neither released nor closed: as if the machine had gone down.
    std::mem::forget(guard);
    std::mem::forget(session);
    let name = tenure::Name::new("across-boot").unwrap();
    assert_eq!(store.queue(&name).await.unwrap().entries.len(), 1);
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE tenure_meta SET value = 'another-boot' WHERE key = 'boot_id'",
        [],
    )
    .unwrap();
    drop(raw);
    let reopened = tenure::open(&url).await.unwrap();
    assert!(reopened.queue(&name).await.unwrap().entries.is_empty());
    let s2 = tenure::Session::new(&reopened).await.unwrap();
    let g2 = tenure::Mutex::new(&s2, "across-boot")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("free after reboot");
    assert!(g2.token() > token, "tokens keep increasing across a reboot");
}

/// Runs this test binary's `shifted_child` in a time namespace whose
/// `CLOCK_BOOTTIME` is `offset_secs` ahead, with `mode` and the database;
/// its output, or `None` where the kernel allows no such namespace (said on
/// stderr; a failure on CI).
fn in_shifted_namespace(offset_secs: i64, mode: &str, db: &std::path::Path) -> Option<String> {
    let probe = std::process::Command::new("unshare")
        .args(["-rT", "--boottime", "1", "true"])
        .status();
    if !matches!(probe, Ok(s) if s.success()) {
        eprintln!("SKIPPED: no time namespaces here (unshare -rT --boottime)");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs time namespaces"
        );
        return None;
    }
    let out = std::process::Command::new("unshare")
        .args(["-rT", "--boottime", &offset_secs.to_string()])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shifted_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENURE_SHIFTED_MODE", mode)
        .env("TENURE_SHIFTED_DB", db)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    Some(text)
}

/// A process whose `CLOCK_BOOTTIME` is shifted by a time namespace agrees
/// with the others on expiry: it cannot take a lock a normal process holds
/// (before, it took it at once: two holders), and a lock it held when it
/// crashed frees within the TTL (before, others waited the shift out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_in_shifted_time_namespaces_agree_on_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shifted.db");
    let url = format!("sqlite://{}", db.display());
    let store = tenure::open(&url).await.unwrap();
    let session = tenure::Session::with_options(
        &store,
        tenure::SessionOptions::new().ttl(std::time::Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let held = tenure::Mutex::new(&session, "shifted")
        .unwrap()
        .lock()
        .await
        .unwrap();
    for offset in [100_000, -1] {
        let Some(text) = in_shifted_namespace(offset, "try", &db) else {
            return;
        };
        assert!(text.contains("SHIFTED: held"), "offset {offset}: {text}");
    }
    held.release().await.unwrap();

    // A holder in a namespace 100,000 s ahead takes the lock with a 2 s TTL
    // and dies without a word; the lock is free again within TTL + renew.
    let Some(text) = in_shifted_namespace(100_000, "hold-and-crash", &db) else {
        return;
    };
    assert!(text.contains("SHIFTED: took"), "{text}");
    let started = std::time::Instant::now();
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tenure::Mutex::new(&session, "shifted").unwrap().lock(),
    )
    .await
    .expect("the crashed holder's lock freed within 10 s")
    .unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "waited {:?} for a 2 s lease",
        started.elapsed()
    );
    again.release().await.unwrap();
}

/// Run by [`processes_in_shifted_time_namespaces_agree_on_expiry`] inside
/// its namespace; does nothing elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shifted_child() {
    let (Ok(mode), Ok(db)) = (
        std::env::var("TENURE_SHIFTED_MODE"),
        std::env::var("TENURE_SHIFTED_DB"),
    ) else {
        return;
    };
    let store = tenure::open(&format!("sqlite://{db}")).await.unwrap();
    let options = tenure::SessionOptions::new().ttl(std::time::Duration::from_secs(2));
    let session = tenure::Session::with_options(&store, options)
        .await
        .unwrap();
    let mutex = tenure::Mutex::new(&session, "shifted").unwrap();
    match mode.as_str() {
        "try" => match mutex.try_lock().await.unwrap() {
            Some(_) => println!("SHIFTED: granted"),
            None => println!("SHIFTED: held"),
        },
        _ => {
            let guard = mutex.try_lock().await.unwrap().expect("the lock is free");
            println!("SHIFTED: took {}", guard.token());
            // Die at once, holding it: no release, no close.
            std::mem::forget(guard);
            std::mem::forget(session);
            // SAFETY: ends the process without running anything further.
            unsafe { libc::_exit(0) };
        }
    }
}

/// 64 waiters on one mutex, in one process. A change made in this process
/// wakes its waiter directly; for changes made by other processes one waiter
/// polls — the next in line, at most every 100 ms — and the others wait for
/// a local wake-up: about 10 calls a second in all, not 640. Each release
/// and handoff costs at most 5 calls however many wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("herd.db").display());
    let sqlite = tenure::backend::sqlite::SqliteStore::open(&url)
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(sqlite.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || sqlite.round_trips(), 5, 12)
        .await;
}

/// Fencing in the application's own database: holder A stops renewing
/// (paused past its TTL), B is granted the lock and writes through the
/// fence in its own transaction; A's late write, in its transaction, is
/// refused by the database (`StaleToken` with B's token) and rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_write_is_refused_by_the_fence() {
    use tenure::{Error, Name};
    let dir = tempfile::tempdir().unwrap();
    let store = tenure::open(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ))
    .await
    .unwrap();
    let mut db = rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
    tenure::fencing::sqlite::create_table(&db).unwrap();
    db.execute_batch("CREATE TABLE jobs (holder TEXT NOT NULL)")
        .unwrap();
    let printer = Name::new("printer").unwrap();

    let (token_a, gb) =
        tenure_testkit::conformance::holder_paused_past_its_ttl(&store, "printer").await;
    for _ in 0..2 {
        // Equal tokens are admitted: one holder writes many times.
        let tx = db.transaction().unwrap();
        tenure::fencing::sqlite::admit(&tx, &printer, gb.token()).unwrap();
        tx.execute("INSERT INTO jobs (holder) VALUES ('b')", [])
            .unwrap();
        tx.commit().unwrap();
    }

    let tx = db.transaction().unwrap();
    tx.execute("INSERT INTO jobs (holder) VALUES ('a')", [])
        .unwrap();
    let e = tenure::fencing::sqlite::admit(&tx, &printer, token_a).unwrap_err();
    assert!(
        matches!(e, Error::StaleToken { token, highest, .. } if token == token_a && highest == gb.token()),
        "{e:?}"
    );
    drop(tx); // rolled back
    let holders: Vec<String> = db
        .prepare("SELECT holder FROM jobs")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(holders, ["b", "b"]);
    gb.release().await.unwrap();
}
