//! The documented cost of each SQLite operation, counted by SQLite's trace
//! hook (its own test binary: the count is process-wide).
#![cfg(feature = "sqlite")]

use tenure::backend::sqlite::SqliteStore;

#[tokio::test]
async fn statements_per_operation() {
    let dir = tempfile::tempdir().unwrap();
    let store = tenure::open(&format!("sqlite://{}", dir.path().join("s.db").display()))
        .await
        .unwrap();
    let session = tenure::Session::new(&store).await.unwrap();
    let mutex = tenure::Mutex::new(&session, "count").unwrap();
    mutex.lock().await.unwrap().release().await.unwrap();
    let count = || SqliteStore::statements_executed();

    let before = count();
    let guard = mutex.lock().await.unwrap();
    assert_eq!(
        count() - before,
        5,
        "uncontended acquire: BEGIN, SELECT, upsert, INSERT, COMMIT"
    );
    let before = count();
    guard.release().await.unwrap();
    assert_eq!(
        count() - before,
        5,
        "release: BEGIN, DELETE, SELECT, version, COMMIT"
    );
    let before = count();
    assert!(mutex.try_lock().await.unwrap().is_some());
    assert_eq!(count() - before, 5, "try_lock that succeeds");
    let before = count();
    session.renew().await.unwrap();
    assert_eq!(count() - before, 1, "renew: one UPDATE");
}
