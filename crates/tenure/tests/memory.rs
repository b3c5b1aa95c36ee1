//! The memory store, the reference, beyond the conformance suite
//! (`tests/conformance.rs`).

/// A release wakes the next waiter only, never the whole queue.
#[tokio::test]
async fn release_wakes_next_waiter_only() {
    use std::sync::Arc;
    use tenure::backend::memory::MemoryStore;
    let memory = MemoryStore::new();
    let store: Arc<dyn tenure::Store> = Arc::new(memory.clone());
    let name = "herd";
    let holder = tenure::Session::new(&store).await.unwrap();
    let mut guard = Some(
        tenure::Mutex::new(&holder, name)
            .unwrap()
            .lock()
            .await
            .unwrap(),
    );
    const WAITERS: usize = 16;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let s = tenure::Session::new(&store).await.unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = tenure::Mutex::new(&s, name).unwrap().lock().await.unwrap();
            tx.send(g).unwrap();
        });
    }
    while store
        .queue(&tenure::Name::new(name).unwrap())
        .await
        .unwrap()
        .entries
        .len()
        < WAITERS + 1
    {
        tokio::task::yield_now().await;
    }
    for _ in 0..WAITERS {
        let before = memory.wakeups();
        guard.take().unwrap().release().await.unwrap();
        let next = rx.recv().await.unwrap();
        assert_eq!(
            memory.wakeups() - before,
            1,
            "one release woke more than one waiter"
        );
        guard = Some(next);
    }
}
