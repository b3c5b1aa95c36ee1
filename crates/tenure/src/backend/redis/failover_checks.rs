//! What the failover tests of Redis behind Sentinel and of Redis Cluster
//! share: a lock held with another session waiting on it before the
//! master dies, and the handover after the failover.

use std::sync::Arc;
use std::time::Duration;

/// A lock held on "failover" (its session's TTL 15 s) and another session
/// waiting for it.
pub struct Held {
    pub guard: tenure::MutexGuard,
    pub first: u64,
    waiter_session: tenure::Session,
    waiter: tokio::task::JoinHandle<tenure::Result<tenure::MutexGuard>>,
}

/// Takes the lock and queues the waiter.
pub async fn hold_with_waiter(store: &Arc<dyn tenure::Store>) -> Held {
    let holder = tenure::Session::with_options(
        store,
        tenure::SessionOptions::new().ttl(Duration::from_secs(15)),
    )
    .await
    .unwrap();
    let guard = tenure::Mutex::new(&holder, "failover")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let first = guard.token();
    let waiter_session = tenure::Session::new(store).await.unwrap();
    let waiter = {
        let s = waiter_session.clone();
        tokio::spawn(async move { tenure::Mutex::new(&s, "failover").unwrap().lock().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    Held {
        guard,
        first,
        waiter_session,
        waiter,
    }
}

/// After the failover: the holder kept its lease and releases; the waiter
/// is granted with a higher token. A waiter whose call was in flight when
/// the master died is told the store was unavailable, and its entry may
/// stay queued with its session: it ends the session and locks again.
pub async fn hand_over(held: Held, store: &Arc<dyn tenure::Store>) {
    assert!(!held.guard.is_lost(), "the holder lost its lease");
    held.guard.release().await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(20), held.waiter)
        .await
        .expect("the waiter was answered in time")
        .unwrap();
    let granted = match waited {
        Ok(granted) => granted,
        Err(e @ (tenure::Error::Unavailable { .. } | tenure::Error::SessionLost(_))) => {
            eprintln!("the waiter was told {e}");
            let _ = held.waiter_session.close().await;
            let again = tenure::Session::new(store).await.unwrap();
            tenure::Mutex::new(&again, "failover")
                .unwrap()
                .lock_timeout(Duration::from_secs(20))
                .await
                .unwrap()
        }
        Err(e) => panic!("the waiter: {e:?}"),
    };
    assert!(granted.token() > held.first);
    granted.release().await.unwrap();
}
