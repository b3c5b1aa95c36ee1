//! The conformance suite on `sqlite://`, the embedded default.

use std::sync::OnceLock;

/// One database file for the whole test binary, as several programs share one.
fn url() -> String {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"));
    format!("sqlite://{}", dir.path().join("conformance.db").display())
}

tenure_testkit::conformance_tests!(tenure_testkit::conformance::Target::some(url()));

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
