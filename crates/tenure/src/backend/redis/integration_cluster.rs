//! Redis Cluster (`redis+cluster://`): the conformance suite through a
//! node that does not hold tenure's slot, with `replicas=1` (every grant,
//! renewal and fence admission acknowledged by the slot's replica; the
//! suite runs without `replicas` through Sentinel and on one server); a
//! `redis://` URL at a cluster node refused in words; a failover while a
//! lock is held; and the slot migrated to another master while locks
//! change hands.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tenure_testkit::RedisCluster;

#[path = "failover_checks.rs"]
mod failover_checks;

fn shared() -> Option<&'static RedisCluster> {
    static SET: OnceLock<Option<RedisCluster>> = OnceLock::new();
    SET.get_or_init(RedisCluster::start_or_skip).as_ref()
}

async fn target() -> Option<tenure_testkit::conformance::Target> {
    let set = shared()?;
    let url = format!("{}?replicas=1", set.url_not_at("{tenure}"));
    Some(tenure_testkit::conformance::Target::new(url).await)
}

tenure_testkit::conformance_tests!(target());

/// A cluster of its own, for a test that changes who holds the slot; one
/// such test at a time (six servers each, on a small machine).
async fn own() -> Option<(RedisCluster, tokio::sync::MutexGuard<'static, ()>)> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let turn = ONE_AT_A_TIME.lock().await;
    let set = tokio::task::spawn_blocking(RedisCluster::start_or_skip)
        .await
        .unwrap()?;
    Some((set, turn))
}

/// `redis://` at any node of a cluster, the one that holds tenure's slot
/// included, is refused with the URL to use.
#[tokio::test]
async fn a_redis_url_at_a_cluster_node_names_redis_cluster() {
    let Some(set) = shared() else { return };
    for node in &set.nodes {
        let url = format!("redis://127.0.0.1:{}/0", node.port());
        let Err(e) = tenure::open(&url).await else {
            panic!("{url} was opened");
        };
        let said = e.to_string();
        assert!(
            said.contains("Redis Cluster") && said.contains("redis+cluster://"),
            "{url}: {said}"
        );
    }
}

/// The master of tenure's slot SIGKILLed while a lock is held (with
/// `replicas=1`) and another waits: the cluster promotes its replica, the store follows, the holder
/// keeps its lease and hands over with a higher token. The old master
/// restarted (its cluster configuration kept) rejoins as a replica and is
/// never granted beside the holder, even to a client whose URL names it
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed() {
    let Some((mut set, _turn)) = own().await else {
        return;
    };
    let slot = set.slot("{tenure}");
    let old = set.owner(slot).expect("the slot has a master");
    // Grants wait for the replica: without `replicas=1`, a replica that
    // has not received the grant yet may be promoted (seen here when the
    // master was killed within a second of the replica's first sync).
    let url = format!("{}?replicas=1", RedisCluster::url_via(&[old]));
    let store = tenure::open(&url).await.unwrap();
    let held = failover_checks::hold_with_waiter(&store).await;

    set.node(old).unwrap().kill();
    let new = {
        let set = &set;
        tokio::task::block_in_place(|| set.wait_failover(slot, old, Duration::from_secs(30)))
    }
    .expect("the cluster promoted the replica");
    tokio::task::block_in_place(|| set.node(old).unwrap().restart());

    // Fresh clients whose URL names only the old master try the lock.
    let until = Instant::now() + Duration::from_secs(4);
    let (mut refused, mut unavailable) = (0, 0);
    while Instant::now() < until {
        let s = match tenure::open(&url).await {
            Ok(other) => tenure::Session::new(&other).await,
            Err(e) => Err(e),
        };
        match s {
            Ok(s) => {
                let got = tenure::Mutex::new(&s, "failover").unwrap().try_lock().await;
                match got {
                    Ok(Some(_)) => panic!("granted beside the holder after the failover"),
                    Ok(None) => refused += 1,
                    Err(tenure::Error::Unavailable { .. }) => unavailable += 1,
                    Err(e) => panic!("{e:?}"),
                }
                let _ = s.close().await;
            }
            Err(tenure::Error::Unavailable { .. }) => unavailable += 1,
            Err(e) => panic!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("old {old}, new {new}: {refused} tries refused, {unavailable} unavailable");
    assert!(refused > 0, "no try got an answer");

    failover_checks::hand_over(held, &store).await;
}

/// tenure's slot migrated to another master one key at a time, 50 ms
/// apart (so the slot stays half moved for a second), while a holder keeps
/// a lock and three clients take turns on another: no script runs while
/// the slot migrates (none is cut short by a key that moved), calls wait
/// and then follow the slot; never two holders at once, the holder keeps
/// its lease, and the clients are granted again on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharding_is_followed() {
    let Some((set, _turn)) = own().await else {
        return;
    };
    let slot = set.slot("{tenure}");
    let from = set.owner(slot).expect("the slot has a master");
    let to = set.other_master(from).expect("another master");
    let url = set.url_not_at("{tenure}");
    let store = tenure::open(&url).await.unwrap();
    let holder = tenure::Session::with_options(
        &store,
        tenure::SessionOptions::new().ttl(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let kept = tenure::Mutex::new(&holder, "kept")
        .unwrap()
        .lock()
        .await
        .unwrap();

    let (stop, inside) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (grants, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let said = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let url = url.clone();
        let (stop, inside, grants, failed, said) = (
            stop.clone(),
            inside.clone(),
            grants.clone(),
            failed.clone(),
            said.clone(),
        );
        clients.push(tokio::spawn(async move {
            let store = tenure::open(&url).await.unwrap();
            let session = tenure::Session::new(&store).await.unwrap();
            let lock = tenure::Mutex::new(&session, "turns").unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                match lock.lock_timeout(Duration::from_secs(5)).await {
                    Ok(guard) => {
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.store(false, Ordering::SeqCst);
                        grants.fetch_add(1, Ordering::SeqCst);
                        let _ = guard.release().await;
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::SeqCst);
                        said.lock().unwrap().push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = grants.load(Ordering::SeqCst);
    assert!(before > 0, "no grant before the migration");
    let set = Arc::new(set);
    let moved = {
        let set = set.clone();
        tokio::task::spawn_blocking(move || {
            set.migrate_slot(slot, to, 1, Duration::from_millis(50))
        })
        .await
        .unwrap()
    };
    let during = grants.load(Ordering::SeqCst) - before;
    assert_eq!(set.owner(slot), Some(to), "the slot moved");
    // After the migration: turns go on, on the new master.
    let after_from = grants.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(15);
    while grants.load(Ordering::SeqCst) < after_from + 20 {
        assert!(Instant::now() < deadline, "no grants after the migration");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    assert!(!kept.is_lost(), "the holder lost its lease");
    kept.release().await.unwrap();
    let said = said.lock().unwrap().clone();
    eprintln!(
        "{moved} keys moved; {before} grants before, {during} during, {} after; \
         {} failed calls: {said:?}",
        grants.load(Ordering::SeqCst) - after_from,
        failed.load(Ordering::SeqCst)
    );
    assert!(moved > 0, "the slot held tenure's keys");
    let cut: Vec<&String> = said
        .iter()
        .filter(|e| e.contains("non local key"))
        .collect();
    assert!(
        cut.is_empty(),
        "calls cut short by a key that had moved: {cut:?}"
    );
}
