//! The SQLite backend's own tests: its URL, and its checkpoint thread.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::checkpoint::CHECKPOINT_EVERY;
use super::connect::parse_url;
use super::{SqliteStore, URL};
use crate::backend::url::StoreUrl;
use crate::error::Result;
use crate::store::Store;

fn parse(url: &str) -> Result<(PathBuf, &'static str)> {
    parse_url(&StoreUrl::parse(url, &URL)?)
}

/// The WAL is checkpointed by the store's own thread, which ends with
/// the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_checkpoints_the_wal_and_ends_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    let typed = SqliteStore::open(&url).await.unwrap();
    let checkpointer = typed
        .inner
        .checkpointer
        .clone()
        .expect("a checkpoint thread");
    let store: Arc<dyn Store> = Arc::new(typed);
    let session = crate::Session::new(&store).await.unwrap();
    let mutex = crate::Mutex::new(&session, "checkpointed").unwrap();
    let calls_before = checkpointer.calls.load(Ordering::Relaxed);
    for _ in 0..CHECKPOINT_EVERY {
        mutex.lock().await.unwrap().release().await.unwrap();
    }
    // Two calls a cycle: the thread was told at least once.
    assert!(checkpointer.calls.load(Ordering::Relaxed) - calls_before >= CHECKPOINT_EVERY * 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while checkpointer.checkpoints.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    session.close().await.unwrap();
    drop(mutex);
    drop(session);
    drop(store);
    // The thread let go of its handle: it ended.
    while Arc::strong_count(&checkpointer) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the checkpoint thread outlived its store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn urls() {
    assert_eq!(
        parse("sqlite:///tmp/a.db").unwrap().0,
        PathBuf::from("/tmp/a.db")
    );
    assert_eq!(parse("sqlite://a.db").unwrap().0, PathBuf::from("a.db"));
    assert_eq!(parse("sqlite:///a.db?synchronous=full").unwrap().1, "FULL");
    assert!(parse("sqlite://").is_err());
    assert!(parse("sqlite:///a.db?synchronous=maybe").is_err());
    assert!(parse("sqlite:///a.db?bogus=1").is_err());
}
