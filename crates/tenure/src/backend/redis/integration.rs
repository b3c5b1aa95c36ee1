//! Redis beyond the conformance suite (`tests/conformance.rs`): its key
//! layout, passwords and faults, on the kit's own redis-servers.
#![cfg(feature = "redis")]

use std::sync::OnceLock;

use tenure::Error;
use tenure_testkit::RedisServer;

/// One server for the whole test binary.
fn shared() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start_or_skip).as_ref()
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = RedisServer::start_with_password(Some("right-one")) else {
        tenure_testkit::missing("redis-server", "redis-server");
        return;
    };
    let url = format!("redis://:hunter2@127.0.0.1:{}/0", server.port());
    let e = tenure::open(&url).await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    assert!(tenure::open(&server.url()).await.is_ok());
}

/// A prefix whose keys another key layout wrote is refused, with a reason;
/// and a client of layout 1 (a zset at `P:sessions`) cannot write next to us.
#[tokio::test]
async fn a_prefix_of_another_key_layout_is_refused() {
    let Some(server) = shared() else { return };
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let url = |p: &str| format!("{}?prefix={p}", server.url());

    // Layout 1 kept the session index as a zset under P:sessions.
    let _: () = redis::cmd("ZADD")
        .arg("{layout-one}:sessions")
        .arg(1)
        .arg("a-secret")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = tenure::open(&url("layout-one")).await.unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("layout 1"), "{e}");

    let _: () = redis::cmd("SET")
        .arg("{layout-nine}:sessions")
        .arg("9")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = tenure::open(&url("layout-nine")).await.unwrap_err();
    assert!(e.to_string().contains("layout 9"), "{e}");

    // A fresh prefix is marked, and a layout-1 client's index write fails.
    let store = tenure::open(&url("layout-fresh")).await.unwrap();
    tenure::Session::new(&store).await.unwrap();
    let old_write: redis::RedisResult<i64> = redis::cmd("ZADD")
        .arg("{layout-fresh}:sessions")
        .arg(1)
        .arg("old-client")
        .query_async(&mut conn)
        .await;
    assert!(old_write.is_err(), "{old_write:?}");
    assert!(tenure::open(&url("layout-fresh")).await.is_ok());
}

/// A database number the server does not have is bad input (exit 64 from
/// the CLI), said in words, not a store error.
#[tokio::test]
async fn a_database_the_server_does_not_have_is_bad_input() {
    let Some(server) = shared() else { return };
    let url = format!("redis://127.0.0.1:{}/99", server.port());
    let e = tenure::open(&url).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("no such database"), "{e}");
}

/// 64 waiters on one mutex: while they wait no script call is made (pub/sub
/// wakes them, nobody polls), and each release and handoff costs one call:
/// the release, whose grant message carries the keyspace's id, so the next
/// waiter takes it without looking again, however many wait.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    let redis = tenure::backend::redis::RedisStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(redis.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || redis.round_trips(), 1, 0)
        .await;
}

/// The pub/sub connection dropped (killed by the server) while waiters wait:
/// none is stranded, and waiting is free again once pub/sub is back.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_outlive_a_dropped_pubsub_connection() {
    // A server of its own: killing every pub/sub client must not disturb
    // the other tests.
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let redis = tenure::backend::redis::RedisStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(redis.clone());
    let kill = || async {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(killed >= 1, "no pub/sub connection to kill");
    };
    tenure_testkit::conformance::check_waiters_outlive_dropped_notifications(
        &store,
        || redis.round_trips(),
        kill,
    )
    .await;
}

/// An observer (`wait_changed`) makes no calls while nothing changes and
/// notifications work (it wakes for a notification, or at the queue's first
/// expiry), and sees a release at once.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_do_not_poll() {
    let Some(server) = shared() else { return };
    let typed = tenure::backend::redis::RedisStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(typed.clone());
    tenure_testkit::conformance::check_observers_do_not_poll(&store, || typed.round_trips()).await;
}

/// `redis-server` crashes under libfaketime, so its clock cannot be stepped
/// here; a step is played on the data instead: every session's lapse time
/// (the only thing TIME decides) moved by the step, the way a server whose
/// clock jumped would see it. The script's path is the one each Redlock
/// node runs. Never two holders, and a crashed holder is released within
/// its TTL and one renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_steps_neither_grant_twice_nor_delay_a_release() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let step = |seconds: i64| {
        // The server's clock ahead by `seconds`: lapse times look that
        // much earlier.
        let by = -seconds * 1000;
        let mut con = client.get_connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("{tenure}:s:*")
            .query(&mut con)
            .unwrap();
        for key in keys {
            let at: Option<i64> = redis::cmd("GET").arg(&key).query(&mut con).unwrap();
            if let Some(at) = at {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(at + by)
                    .query(&mut con)
                    .unwrap();
            }
        }
        let live: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg("{tenure}:live")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut con)
            .unwrap();
        for (secret, at) in live {
            let _: () = redis::cmd("ZADD")
                .arg("{tenure}:live")
                .arg(at + by)
                .arg(secret)
                .query(&mut con)
                .unwrap();
        }
    };
    tenure_testkit::conformance::check_server_clock_steps(&store, step).await;
}

/// A message on a waiter's channel that does not carry its keyspace's id
/// only wakes it: pub/sub ignores the database number, so a store of
/// another database with the same prefix could publish on the same
/// channel. The waiter looks before it takes such a grant; a forged
/// `granted` grants nothing.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_alone_grants_nothing() {
    let Some(server) = shared() else { return };
    forged_grant(server, "granted".into()).await;
}

/// Nor does a grant announced by a store of another database with the same
/// prefix: its keyspace has an id of its own, and a copy of this
/// keyspace's data there (the id travels with the keys) names its own
/// database.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_databases_announcement_grants_nothing() {
    let Some(server) = shared() else { return };
    let other = server.url().replace("/0", "/1");
    assert_ne!(other, server.url());
    drop(tenure::open(&other).await.unwrap());
    let client = redis::Client::open(other).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let id: String = redis::cmd("GET")
        .arg("{tenure}:id")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ours: String = {
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        drop(tenure::open(&server.url()).await.unwrap());
        redis::cmd("GET")
            .arg("{tenure}:id")
            .query_async(&mut conn)
            .await
            .unwrap()
    };
    assert_ne!(id, ours, "two databases share a keyspace id");
    forged_grant(server, format!("{id}:1")).await;
    forged_grant(server, format!("{ours}:1")).await;
}

/// Publishes `payload` on a waiter's channel while the lock is held: the
/// waiter must not be granted until the holder releases.
#[cfg(feature = "redis")]
async fn forged_grant(server: &RedisServer, payload: String) {
    let store = tenure::open(&server.url()).await.unwrap();
    let url = server.url();
    tenure_testkit::conformance::check_a_forged_wakeup_grants_nothing(
        &store,
        |name, seq| async move {
            let client = redis::Client::open(url).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let receivers: i64 = redis::cmd("PUBLISH")
                .arg(format!("{{tenure}}:w:{name}\t{seq:020}"))
                .arg(payload)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(receivers, 1, "the waiter's channel is not the one forged");
        },
    )
    .await;
}

/// The script calls one server sees, by `INFO commandstats`.
#[cfg(feature = "redis")]
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let calls = |command: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    calls("evalsha")
}

/// A queued waiter does not look at its entry once it listens: its join
/// said what a look would, and one `HGET` confirms nothing was granted in
/// between. So a handoff costs the server the join, the release and that
/// `HGET`, not a third script call (counted by the server itself; its
/// count of `HGET`s includes those inside scripts).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_does_not_look_before_its_grant() {
    use std::time::Duration;
    use tenure::{Mutex, Session, SessionOptions};
    // A server of its own: the counts are the whole server's.
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let redis = tenure::backend::redis::RedisStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(redis.clone());
    // Renewals every 20 s: none during the check.
    let options = || SessionOptions::new().ttl(Duration::from_secs(60));
    let holder = Session::with_options(&store, options()).await.unwrap();
    let waiter = Session::with_options(&store, options()).await.unwrap();
    let guard = Mutex::new(&holder, "n").unwrap().lock().await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let w = waiter.clone();
    let since = redis.round_trips();
    tokio::spawn(async move {
        let _ = tx.send(Mutex::new(&w, "n").unwrap().lock().await);
    });
    // Joined, subscribed and checked: a join and an HGET, then quiet.
    tenure_testkit::conformance::wait_calls_settled(|| redis.round_trips(), since, 2).await;
    assert_eq!(
        script_calls(&mut conn).await,
        1,
        "script calls while the waiter waits: its join alone"
    );
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the waiter was granted")
        .unwrap()
        .unwrap();
    assert_eq!(
        script_calls(&mut conn).await,
        2,
        "script calls for a handoff: the join and the release, no look"
    );
    next.release().await.unwrap();
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}

/// How many grant channels of the name `n` the server has subscribers on.
#[cfg(feature = "redis")]
async fn grant_channels(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*:w:n\t*")
        .query_async(conn)
        .await
        .unwrap();
    channels.len()
}

/// A waiter's grant channel is used once: when its waiter goes, it is
/// unsubscribed together with others, in one `UNSUBSCRIBE` for many (one
/// each was a command per grant), and none stays subscribed.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_channels_are_unsubscribed_in_batches() {
    use std::time::Duration;
    use tenure::{Mutex, Session, SessionOptions};
    const WAITERS: usize = 16;
    // A server of its own: the counts are the whole server's.
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let options = || SessionOptions::new().ttl(Duration::from_secs(60));
    let holder = Session::with_options(&store, options()).await.unwrap();
    let guard = Mutex::new(&holder, "n").unwrap().lock().await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let session = Session::with_options(&store, options()).await.unwrap();
        waiters.push(tokio::spawn(async move {
            let guard = Mutex::new(&session, "n").unwrap().lock().await.unwrap();
            guard.release().await.unwrap();
            session.close().await.unwrap();
        }));
    }
    let queued = tokio::time::Instant::now() + Duration::from_secs(20);
    while grant_channels(&mut conn).await < WAITERS {
        assert!(tokio::time::Instant::now() < queued, "every waiter listens");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    guard.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("every waiter is granted in turn")
            .unwrap();
    }
    let quiet = tokio::time::Instant::now() + Duration::from_secs(5);
    while grant_channels(&mut conn).await > 0 {
        assert!(
            tokio::time::Instant::now() < quiet,
            "a grant channel stays subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let unsubscribes = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_unsubscribe:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse::<usize>().unwrap());
    assert!(
        (1..=WAITERS / 2).contains(&unsubscribes),
        "{unsubscribes} UNSUBSCRIBE commands for {WAITERS} grant channels"
    );
    holder.close().await.unwrap();
}

/// A channel listened on again before its batch is unsubscribed stays
/// subscribed: an observer that stops, and another of the same name at
/// once, hears the next change (unsubscribed, it would wait for its safety
/// read, 30 s).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_listened_on_again_before_its_batch_goes_stays_subscribed() {
    use std::time::Duration;
    use tenure::{Mutex, Name, Session, SessionOptions, Store};
    let Some(server) = shared() else { return };
    let redis = tenure::backend::redis::RedisStore::open(&server.url())
        .await
        .unwrap();
    let name = Name::new("observed-again").unwrap();
    let version = redis.queue(&name).await.unwrap().version;
    // An observer that stops: its channel waits to be unsubscribed.
    let stopped = tokio::time::timeout(
        Duration::from_millis(100),
        redis.wait_changed(&name, version),
    )
    .await;
    assert!(stopped.is_err(), "nothing changed yet");
    // Polled here from now on, so it listens before the batch can go, and
    // listens while the batch goes.
    let mut again = std::pin::pin!(redis.wait_changed(&name, version));
    let early = tokio::time::timeout(Duration::from_millis(800), &mut again).await;
    assert!(early.is_err(), "nothing changed yet");
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(redis.clone());
    let session = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let guard = Mutex::new(&session, name.as_str())
        .unwrap()
        .lock()
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), again)
        .await
        .expect("the second observer heard the change")
        .unwrap();
    assert!(seen > version);
    guard.release().await.unwrap();
    session.close().await.unwrap();
}

/// `replicas=1` on a server with no replica: the grant is refused as not
/// acknowledged, and the refusal says how many replicas the master has
/// connected (none), so an operator sees why at once.
#[tokio::test]
async fn a_grant_no_replica_acknowledged_says_how_many_are_connected() {
    let Some(server) = shared() else { return };
    let url = format!(
        "{}?prefix=unacked&replicas=1&replicas_timeout=100ms",
        server.url()
    );
    let store = tenure::open(&url).await.unwrap();
    // A prefix of its own, new.
    store.declare_new().await.unwrap();
    let session = tenure::Session::new(&store).await.unwrap();
    let e = tenure::Mutex::new(&session, "unacked")
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("not acknowledged by 1 replica(s)"), "{text}");
    assert!(
        text.contains("the master has 0 replica(s) connected"),
        "{text}"
    );
}

/// A keyspace that comes back empty (the server restarted without
/// persistence: a loss looks the same as a new store) grants nothing until
/// the longest lease it could have held has lapsed (`max_ttl`), to a new
/// client or to one that knew it; the holder it forgot is told so, before
/// anyone else is granted. A store is declared new only while no session
/// lives on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_that_comes_back_empty_grants_nothing_until_max_ttl() {
    use std::time::{Duration, Instant};
    use tenure::{LostReason, Mutex, Session, SessionOptions};
    let Some(mut server) = RedisServer::start_or_skip() else {
        return;
    };
    let max_ttl = Duration::from_secs(3);
    let url = format!("{}?max_ttl=3s", server.url());
    let options = || SessionOptions::new().ttl(Duration::from_secs(2));
    let store = tenure::open(&url).await.unwrap();
    assert_eq!(store.capabilities().max_ttl, max_ttl);
    let e = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(4)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");

    // The kit declared the server new: granted at once.
    let holder = Session::with_options(&store, options()).await.unwrap();
    let _held = Mutex::new(&holder, "job")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("a store declared new grants at once");
    let e = store.declare_new().await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { reason, .. } if reason.contains("1 session(s) live")),
        "{e:?}"
    );

    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();
    // A client that knew the keyspace, and one that never saw it.
    // (The first call on a connection the restart broke fails; it reconnects.)
    let mut knew = Session::with_options(&store, options()).await;
    while knew.is_err() && restarted.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        knew = Session::with_options(&store, options()).await;
    }
    let knew = knew.unwrap();
    let other = tenure::open(&url).await.unwrap();
    let newcomer = Session::with_options(&other, options()).await.unwrap();
    for session in [&knew, &newcomer] {
        let got = Mutex::new(session, "job")
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        assert!(got.is_none(), "granted on a keyspace that lost its data");
    }
    let waiting = Mutex::new(&newcomer, "job").unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(15), waiting.lock())
        .await
        .expect("granted once the quiet ended")
        .unwrap();
    let waited = restarted.elapsed();
    assert!(
        holder.is_lost(),
        "the holder was not told before the next grant"
    );
    assert_eq!(holder.lost_reason(), Some(LostReason::Forgotten));
    assert!(
        waited >= max_ttl && waited < max_ttl + Duration::from_secs(3),
        "granted {waited:?} after the restart (max_ttl {max_ttl:?})"
    );
    granted.release().await.unwrap();
}
