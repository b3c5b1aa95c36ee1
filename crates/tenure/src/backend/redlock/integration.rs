//! Redlock beyond the conformance suite (`tests/conformance.rs`): fault
//! tests over five real redis-servers, a minority killed, a majority killed,
//! a node restarted empty.
#![cfg(feature = "redlock")]

use std::time::Duration;

use tenure::{Error, Mutex, Session, SessionOptions};
use tenure_testkit::RedisServer;
use tokio::time::Instant;

fn start(n: usize) -> Option<Vec<RedisServer>> {
    (0..n).map(|_| RedisServer::start_or_skip()).collect()
}

fn url(servers: &[RedisServer]) -> String {
    tenure_testkit::stores::redlock_url(servers)
}

async fn session(store: &std::sync::Arc<dyn tenure::Store>, ttl: Duration) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(ttl))
        .await
        .expect("session")
}

/// Two of five nodes killed while a lock is held and another waits: the
/// holder keeps its lease, the waiter gets the lock after the release, and
/// tokens still increase. Then a third node goes: the holder's lost() fires
/// within its TTL, and new sessions are refused with a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_killed_keeps_working_majority_killed_is_unavailable() {
    let Some(mut servers) = start(5) else { return };
    let store = tenure::open(&url(&servers)).await.unwrap();
    let ttl = Duration::from_secs(1);
    let (a, b) = (session(&store, ttl).await, session(&store, ttl).await);
    let held = Mutex::new(&a, "minority").unwrap().lock().await.unwrap();
    let first = held.token();
    let mb = Mutex::new(&b, "minority").unwrap();
    let waiter = tokio::spawn(async move {
        let g = mb.lock().await;
        (g, b)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    servers[0].kill();
    servers[3].kill();
    // Three renewals later the holder still holds.
    let kept = tokio::time::timeout(ttl * 3, held.lost()).await;
    assert!(kept.is_err(), "lost() fired with a majority up");
    assert!(!waiter.is_finished(), "the waiter was granted a held lock");
    held.release().await.unwrap();
    let (g, b) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("waiter granted")
        .unwrap();
    let g = g.unwrap();
    assert!(g.token() > first, "{} <= {first}", g.token());

    // A third node down: no majority. The holder is told within its TTL.
    let killed = Instant::now();
    servers[1].kill();
    let lost = tokio::time::timeout(ttl + Duration::from_millis(500), g.lost()).await;
    assert!(lost.is_ok(), "lost() did not fire without a majority");
    assert!(
        killed.elapsed() <= ttl,
        "lost() after the TTL: {:?}",
        killed.elapsed()
    );
    drop(b);
    let e = Session::with_options(&store, SessionOptions::new().ttl(ttl))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let started = Instant::now();
    let e = tenure::open(&url(&servers)).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A node restarted empty after the delayed-restart wait (longer than the
/// TTL): it forgot the lock, but the majority did not, so nobody else is
/// granted it; after the release the next token is still higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_restarted_empty_no_double_grant() {
    let Some(mut servers) = start(5) else { return };
    let store = tenure::open(&url(&servers)).await.unwrap();
    let ttl = Duration::from_millis(800);
    let a = session(&store, ttl).await;
    let held = Mutex::new(&a, "restart").unwrap().lock().await.unwrap();
    let first = held.token();
    servers[2].kill();
    tokio::time::sleep(ttl + Duration::from_millis(200)).await; // delayed restart
    servers[2].restart();
    servers[4].kill();
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    servers[4].restart();
    // Two nodes are empty now; the other three still have the lock.
    let other = tenure::open(&url(&servers)).await.unwrap();
    let b = session(&other, ttl).await;
    let mb = Mutex::new(&b, "restart").unwrap();
    assert!(mb.try_lock().await.unwrap().is_none(), "granted twice");
    let waited = tokio::time::timeout(ttl * 2, mb.lock()).await;
    assert!(waited.is_err(), "granted twice while waiting");
    let alive = tokio::time::timeout(Duration::from_millis(10), held.lost()).await;
    assert!(
        alive.is_err(),
        "the holder lost its lease with a majority up"
    );
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), mb.lock())
        .await
        .expect("granted after the release")
        .unwrap();
    assert!(g.token() > first, "{} <= {first}", g.token());
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let servers: Option<Vec<RedisServer>> = (0..3)
        .map(|_| RedisServer::start_with_password(Some("right-one")))
        .collect();
    let Some(servers) = servers else {
        tenure_testkit::missing("redis-server", "redis-server");
        return;
    };
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let e = tenure::open(&format!("redlock://:hunter2@{}/0", hosts.join(",")))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    let ok = format!("redlock://:right-one@{}/0", hosts.join(","));
    assert!(tenure::open(&ok).await.is_ok());
}

#[tokio::test]
async fn all_down_at_start_is_unavailable_in_time() {
    // Three distinct free ports (the kernel may hand the same one out twice).
    let mut ports: Vec<String> = Vec::new();
    while ports.len() < 3 {
        let port = format!("127.0.0.1:{}", tenure_testkit::free_port());
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    tenure_testkit::conformance::check_down_at_start(&format!("redlock://{}/0", ports.join(",")))
        .await;
}

/// Tokens never go back, whatever a client's clock says: a client whose
/// clock is an hour ahead takes a lock (the nodes refuse a seq more than
/// 2 s past their own clocks, so it is taken near the nodes' time, not an
/// hour ahead), then every node loses its data (restarted empty at once:
/// each node, found empty, grants nothing for max_ttl, the delayed restart
/// Redlock asks for). A client with a right clock then gets a token above
/// the first, once max_ttl has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_go_back_after_a_client_ahead_and_a_total_data_loss() {
    let Some(mut servers) = start(3) else { return };
    let max_ttl = Duration::from_secs(1);
    let url = |servers: &[RedisServer]| format!("{}?max_ttl=1s", url(servers));
    let ahead = tenure::backend::redlock::RedlockStore::open(&url(&servers))
        .await
        .unwrap();
    ahead.shift_clock_for_tests(3_600_000_000);
    let ahead: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(ahead);
    let ttl = Duration::from_millis(800);
    let a = session(&ahead, ttl).await;
    let held = Mutex::new(&a, "clock-ahead").unwrap().lock().await.unwrap();
    let first = held.token();
    // Not an hour ahead of the nodes' clocks (µs since the epoch).
    let node_clock_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        first < node_clock_us + 60_000_000,
        "token {first} is far ahead of the nodes' clocks ({node_clock_us})"
    );
    held.release().await.unwrap();
    a.close().await.unwrap();
    for server in servers.iter_mut() {
        server.restart();
    }
    let restarted = std::time::Instant::now();
    let store = tenure::open(&url(&servers)).await.unwrap();
    let b = session(&store, ttl).await;
    let g = tokio::time::timeout(
        Duration::from_secs(5),
        Mutex::new(&b, "clock-ahead").unwrap().lock(),
    )
    .await
    .expect("granted")
    .unwrap();
    assert!(
        restarted.elapsed() >= max_ttl,
        "granted {:?} after every node came back empty",
        restarted.elapsed()
    );
    assert!(
        g.token() > first,
        "tokens went back: {} <= {first}",
        g.token()
    );
    // A second lock by the client that is ahead is still granted (it learns
    // to aim below the nodes' ceilings), with a higher token again.
    let second = g.token();
    g.release().await.unwrap();
    let ahead = tenure::backend::redlock::RedlockStore::open(&url(&servers))
        .await
        .unwrap();
    ahead.shift_clock_for_tests(3_600_000_000);
    let ahead: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(ahead);
    let a = session(&ahead, ttl).await;
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        Mutex::new(&a, "clock-ahead").unwrap().lock(),
    )
    .await
    .expect("granted to the client that is ahead")
    .unwrap();
    assert!(again.token() > second);
}

/// A token admitted on one node only (the others paused, so the caller is
/// told the store is unavailable) must not make the fence go backwards: once
/// a read has reported it, a lower token is refused, even by a majority of
/// nodes that never saw it (the read brought a majority up to it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_never_goes_back_after_a_token_reached_one_node() {
    let Some(servers) = start(3) else { return };
    let store = tenure::open(&format!("{}?node_timeout=200ms", url(&servers)))
        .await
        .unwrap();
    let fence = tenure::Fence::new(&store, "printer").unwrap();
    assert_eq!(fence.admit(10).await.unwrap(), 10);
    servers[1].pause();
    servers[2].pause();
    let e = fence.admit(20).await.unwrap_err();
    assert!(e.is_temporary(), "{e:?}");
    servers[1].resume();
    servers[2].resume();
    let read = fence.read().await.unwrap().highest;
    assert_eq!(read, 20, "the read saw the node that took 20");
    let e = fence.admit(15).await.unwrap_err();
    assert!(
        matches!(e, Error::StaleToken { highest: 20, .. }),
        "15 admitted after a read said 20: {e:?}"
    );
    assert_eq!(fence.admit(20).await.unwrap(), 20);
}

/// The commands a node ran since its counts were reset, by `INFO
/// commandstats` (those inside scripts included), without the script calls
/// themselves, this test's own `INFO` and a new connection's `CLIENT
/// SETINFO` (counted from Redis 7.2 on; 7.0 refuses it uncounted).
async fn commands_in_scripts(server: &RedisServer) -> (u64, u64, String) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (mut scripts, mut inside) = (0, 0);
    for line in info.lines() {
        let Some((command, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(":calls="))
        else {
            continue;
        };
        let calls: u64 = rest.split(',').next().unwrap().parse().unwrap();
        match command {
            "evalsha" | "eval" => scripts += calls,
            c if c == "info" || c.starts_with("config") || c.starts_with("client") => {}
            _ => inside += calls,
        }
    }
    (scripts, inside, info)
}

/// A lock on a free name and its release take the script's fast paths on
/// every node, as on Redis, although Redlock proposes the seq: two script
/// calls a node, with the few commands of those paths inside (the general
/// join walks the queue, reads the session's record and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_name_takes_the_fast_paths_on_every_node() {
    let Some(servers) = start(3) else { return };
    let store = tenure::open(&url(&servers)).await.unwrap();
    let a = session(&store, Duration::from_secs(60)).await;
    let mutex = Mutex::new(&a, "fast").unwrap();
    // The first lock seeds each node's counter for the name (the general
    // path, which answers with the seeded counter; then the proposal again).
    mutex.lock().await.unwrap().release().await.unwrap();
    for server in &servers {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let before = mutex.lock().await.unwrap();
    let token = before.token();
    before.release().await.unwrap();
    let again = mutex.lock().await.unwrap();
    assert!(again.token() > token, "tokens increase on the fast path");
    again.release().await.unwrap();
    for server in &servers {
        let (scripts, inside, info) = commands_in_scripts(server).await;
        assert_eq!(scripts, 4, "two joins and two releases: {info}");
        // The fast join: TIME, EXISTS ×2 (the name's entries, the quiet
        // of a keyspace found empty), GET ×2, DEL, SET, HSET, ZADD, SADD,
        // PUBLISH; the fast release: GET, ZCARD, HMGET, DEL, SREM, INCR,
        // PUBLISH. Twice each.
        // (The general join adds the walk of the queue, a ZRANGEBYSCORE,
        // and a look for the session's own entry, an HGET.)
        assert_eq!(inside, 2 * (11 + 7), "commands in the scripts: {info}");
    }
    a.close().await.unwrap();
}
