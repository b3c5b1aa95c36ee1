//! Conformance: Shared and permit entries, semaphores.

use super::*;

pub(super) async fn join(
    store: &Arc<dyn Store>,
    key: &SessionKey,
    name: &Name,
    kind: EntryKind,
) -> tenure::Result<Option<tenure::store::Joined>> {
    store.join(key, request(name, kind, b"")).await
}

/// Shared and permit entries follow the same queue rules everywhere.
pub async fn check_shared_and_permits(t: &Target) {
    let spec = SessionSpec {
        ttl: Duration::from_secs(10),
        label: "test".into(),
    };
    let caps = t.store.capabilities().clone();
    let (a, b, c) = (
        t.store.open_session(&spec).await.unwrap(),
        t.store.open_session(&spec).await.unwrap(),
        t.store.open_session(&spec).await.unwrap(),
    );
    if caps.shared {
        let n = Name::new(unique("rw")).unwrap();
        assert!(
            join(&t.store, &a.key, &n, EntryKind::Shared)
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        assert!(
            join(&t.store, &b.key, &n, EntryKind::Shared)
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        let w = join(&t.store, &c.key, &n, EntryKind::Exclusive)
            .await
            .unwrap()
            .unwrap();
        assert!(!w.granted);
        t.store.close_session(&a.key).await.unwrap();
        t.store.close_session(&b.key).await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(5),
            t.store.await_grant(&c.key, &n, w.seq),
        )
        .await
        .unwrap()
        .unwrap();
    }
    if caps.permits {
        let (a, b, c) = (
            t.store.open_session(&spec).await.unwrap(),
            t.store.open_session(&spec).await.unwrap(),
            t.store.open_session(&spec).await.unwrap(),
        );
        let n = Name::new(unique("sem")).unwrap();
        let p = |count| EntryKind::Permits { count, limit: 3 };
        assert!(
            join(&t.store, &a.key, &n, p(2))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        assert!(
            !join(&t.store, &b.key, &n, p(2))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        // Head-of-line: a small request waits behind the large one.
        assert!(
            !join(&t.store, &c.key, &n, p(1))
                .await
                .unwrap()
                .unwrap()
                .granted
        );
        let clash = t
            .store
            .join(
                &c.key,
                request(&n, EntryKind::Permits { count: 1, limit: 4 }, b""),
            )
            .await;
        assert!(matches!(clash, Err(Error::Conflict { .. })), "{clash:?}");
        for k in [&a.key, &b.key, &c.key] {
            t.store.close_session(k).await.unwrap();
        }
    }
}

pub async fn check_semaphore(t: &Target) {
    use tenure::Semaphore;
    const PERMITS: u32 = 3;
    let name = unique("sem");
    if !t.store.capabilities().permits {
        // A backend without semaphores says so, typed.
        let s = session(&t.store).await;
        let r = Semaphore::new(&s, &name, PERMITS)
            .unwrap()
            .try_acquire()
            .await;
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
        return;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (store, name, inside, max_inside) = (
            t.store.clone(),
            name.clone(),
            inside.clone(),
            max_inside.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let s = session(&store).await;
            let sem = Semaphore::new(&s, &name, PERMITS).unwrap();
            for _ in 0..4 {
                let p = sem.acquire().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .unwrap()
            .unwrap();
    }
    let max = max_inside.load(Ordering::SeqCst);
    assert!(
        max <= PERMITS as usize,
        "{max} holders of {PERMITS} permits"
    );
    assert!(max >= 2, "permits were never shared (max {max})");

    let (a, b) = (session(&t.store).await, session(&t.store).await);
    let two = Semaphore::new(&a, &name, PERMITS)
        .unwrap()
        .acquire_many(2)
        .await
        .unwrap();
    let sb = Semaphore::new(&b, &name, PERMITS).unwrap();
    assert!(sb.try_acquire_many(2).await.unwrap().is_none());
    assert!(matches!(
        Semaphore::new(&b, &name, PERMITS + 1)
            .unwrap()
            .try_acquire()
            .await,
        Err(Error::Conflict { .. })
    ));
    assert!(matches!(
        Semaphore::new(&b, &name, 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        sb.acquire_many(4).await,
        Err(Error::InvalidArgument { .. })
    ));
    // Permits belong to the session and vanish with it.
    drop(two);
    a.close().await.unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), sb.acquire_many(3))
        .await
        .unwrap()
        .unwrap();
    both.release().await.unwrap();

    // A name may change class when it empties, and a try of the other
    // class then names the conflict (it does not just say "held"),
    // whichever way the change goes.
    let switched = format!("{name}-switched");
    let (c, d) = (session(&t.store).await, session(&t.store).await);
    let locked = Mutex::new(&c, &switched).unwrap().lock().await.unwrap();
    assert!(matches!(
        Semaphore::new(&d, &switched, PERMITS)
            .unwrap()
            .try_acquire()
            .await,
        Err(Error::Conflict { .. })
    ));
    locked.release().await.unwrap();
    let permit = Semaphore::new(&c, &switched, PERMITS)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let tried = Mutex::new(&d, &switched).unwrap().try_lock().await;
    assert!(matches!(tried, Err(Error::Conflict { .. })), "{tried:?}");
    let tried = tenure::RwLock::new(&d, &switched).unwrap().try_read().await;
    assert!(matches!(tried, Err(Error::Conflict { .. })), "{tried:?}");
    permit.release().await.unwrap();
    let locked = Mutex::new(&d, &switched).unwrap().try_lock().await.unwrap();
    assert!(locked.is_some(), "the emptied name is a lock's again");
    let tried = Mutex::new(&c, &switched).unwrap().try_lock().await;
    assert!(matches!(tried, Ok(None)), "{tried:?}");
    drop(locked);
    c.close().await.unwrap();
    d.close().await.unwrap();
}

/// A semaphore's next in line waits for every granted entry ahead, not
/// only the one just ahead: when a session that holds one of those ends by
/// an eviction on another name (which settles that name alone), the waiter
/// is granted at its next look, within a third of the TTL, not after
/// watching the ended holder for a whole TTL. For stores whose looks skip
/// settling while the entry just ahead is live (PostgreSQL, MySQL).
pub async fn check_a_holder_ended_elsewhere_is_passed_at_the_next_look(store: &Arc<dyn Store>) {
    let ttl = Duration::from_secs(3);
    let spec = SessionSpec {
        ttl,
        label: "test".into(),
    };
    let (a, b, c) = (
        store.open_session(&spec).await.unwrap(),
        store.open_session(&spec).await.unwrap(),
        store.open_session(&spec).await.unwrap(),
    );
    let (sem, other) = (
        Name::new(unique("sem")).unwrap(),
        Name::new(unique("other")).unwrap(),
    );
    let permit = EntryKind::Permits { count: 1, limit: 2 };
    for key in [&a.key, &b.key] {
        assert!(
            join(store, key, &sem, permit)
                .await
                .unwrap()
                .unwrap()
                .granted
        );
    }
    assert!(
        join(store, &a.key, &other, EntryKind::Exclusive)
            .await
            .unwrap()
            .unwrap()
            .granted
    );
    let waiter = join(store, &c.key, &sem, permit).await.unwrap().unwrap();
    assert!(!waiter.granted);
    // B and C renew (B's lease is watched too), bounded: 10 s at most.
    let renewing = {
        let (store, b, c) = (store.clone(), b.key.clone(), c.key.clone());
        tokio::spawn(async move {
            for _ in 0..20 {
                let _ = store.keep_alive(&b).await;
                let _ = store.keep_alive(&c).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let granted = {
        let (store, key, sem) = (store.clone(), c.key.clone(), sem.clone());
        tokio::spawn(async move { store.await_grant(&key, &sem, waiter.seq).await })
    };
    // The waiter reaches its watch, then A's session ends by the eviction.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.evict(&other).await.unwrap(), 1);
    let within = ttl * 5 / 6;
    tokio::time::timeout(within, granted)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not granted within {within:?} of the eviction"))
        .unwrap()
        .unwrap();
    renewing.abort();
    for key in [&b.key, &c.key] {
        let _ = store.close_session(key).await;
    }
}
