//! MySQL/MariaDB beyond the conformance suite (`tests/conformance.rs`),
//! against a real MariaDB started from Debian's binaries.
#![cfg(feature = "mysql")]

use std::sync::OnceLock;

use tenure::{Error, Mutex, Session};
use tenure_testkit::MariaDbServer;

fn shared() -> Option<&'static MariaDbServer> {
    static SERVER: OnceLock<Option<MariaDbServer>> = OnceLock::new();
    SERVER.get_or_init(MariaDbServer::start_or_skip).as_ref()
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = shared() else { return };
    tenure_testkit::conformance::check_wrong_password(&format!(
        "mysql://tenure:hunter2@127.0.0.1:{}/tenure",
        server.port()
    ))
    .await;
}

#[tokio::test]
async fn a_prefix_of_its_own_and_bad_options() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&format!("{}?prefix=app_", server.url()))
        .await
        .unwrap();
    let s = Session::new(&store).await.unwrap();
    let g = Mutex::new(&s, "x").unwrap().lock().await.unwrap();
    assert_eq!(g.token(), 1, "a fresh prefix starts its own counters");
    for bad in ["?prefix=bad-name", "?prefix="] {
        let e = tenure::open(&format!("{}{bad}", server.url()))
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidUrl { .. } | Error::Unsupported { .. }),
            "{bad}: {e:?}"
        );
    }
}

/// A user without privileges on the database is told so in the server's
/// own words, with the error number and SQLSTATE, and nothing of the
/// password. (The test kit's user may create users but not grant, so this
/// one has no privileges at all.)
#[tokio::test]
async fn a_user_without_privileges_is_told_the_servers_words() {
    use mysql_async::prelude::Queryable;
    let Some(server) = shared() else { return };
    let mut admin = raw_conn(server).await;
    let user = format!("weak_{}", std::process::id());
    for statement in [
        format!("DROP USER IF EXISTS '{user}'@'%'"),
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'hunter2'"),
    ] {
        admin.query_drop(statement).await.unwrap();
    }
    let e = tenure::open(&format!(
        "mysql://{user}:hunter2@127.0.0.1:{}/tenure?prefix=weak_",
        server.port()
    ))
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert!(
        text.contains(&format!(
            "Access denied for user '{user}'@'%' to database 'tenure' (error 1044, SQLSTATE 42000)"
        )),
        "{text}"
    );
    assert!(!text.contains("Server error"), "{text}");
    assert!(
        !text.contains("hunter2") && !format!("{e:?}").contains("hunter2"),
        "{text}"
    );
}

async fn raw_conn(server: &MariaDbServer) -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&server.url()).unwrap();
    mysql_async::Conn::new(opts).await.unwrap()
}

#[tokio::test]
async fn an_older_schema_is_upgraded_and_a_newer_one_refused() {
    use mysql_async::prelude::Queryable;
    let Some(server) = shared() else { return };
    let url = format!("{}?prefix=upgrading_", server.url());
    drop(tenure::open(&url).await.unwrap());
    let mut conn = raw_conn(server).await;
    let current: Option<String> = conn
        .query_first("SELECT v FROM upgrading_meta WHERE k = 'schema'")
        .await
        .unwrap();
    // Version 1, and its join gone: an upgrade must create the procedures again.
    conn.query_drop("UPDATE upgrading_meta SET v = '1' WHERE k = 'schema'")
        .await
        .unwrap();
    conn.query_drop("DROP PROCEDURE upgrading_join")
        .await
        .unwrap();
    let store = tenure::open(&url).await.unwrap();
    let now: Option<String> = conn
        .query_first("SELECT v FROM upgrading_meta WHERE k = 'schema'")
        .await
        .unwrap();
    assert_eq!(now, current, "upgraded in place");
    let s = Session::new(&store).await.unwrap();
    let g = Mutex::new(&s, "x").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
    conn.query_drop("UPDATE upgrading_meta SET v = '99' WHERE k = 'schema'")
        .await
        .unwrap();
    let e = tenure::open(&url).await.unwrap_err();
    assert!(
        matches!(e, Error::SchemaMismatch { .. }) && e.to_string().contains("version \"99\""),
        "{e:?}"
    );
}

/// A join that waited for the name's lock reads its session after the
/// wait: a session ended meanwhile (here by hand, as an eviction or a
/// watcher's confirmation does) gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_waited_for_the_name_reads_its_session_after_the_wait() {
    use mysql_async::prelude::Queryable;
    let Some(server) = shared() else { return };
    let url = format!("{}?prefix=staleclock_", server.url());
    drop(tenure::open(&url).await.unwrap());
    let (mut holder, mut joiner) = (raw_conn(server).await, raw_conn(server).await);
    holder
        .query_drop(
            "INSERT INTO staleclock_names (name, last_seq, version) VALUES ('n', 5, 0);
             INSERT INTO staleclock_sessions (id, tag, label, ttl_ms, expires_ms)
                  VALUES ('secret', 't', '', 300, CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + 300);",
        )
        .await
        .unwrap();
    holder
        .query_drop(
            "START TRANSACTION; SELECT 1 FROM staleclock_names WHERE name = 'n' FOR UPDATE;",
        )
        .await
        .unwrap();
    let join = tokio::spawn(async move {
        let row: Option<mysql_async::Row> = joiner
            .query_first("CALL staleclock_join('secret', 'n', 0, 1, 1, '', FALSE)")
            .await
            .unwrap();
        row.and_then(|r| r.get::<String, _>(0))
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The session ends while the join waits for the name's row.
    holder
        .query_drop("UPDATE staleclock_sessions SET expires_ms = 0 WHERE id = 'secret'; COMMIT")
        .await
        .unwrap();
    let status = join.await.unwrap();
    assert_eq!(status.as_deref(), Some("lost"));
    let entries: Option<i64> = holder
        .query_first("SELECT COUNT(*) FROM staleclock_entries")
        .await
        .unwrap();
    assert_eq!(entries, Some(0));
}

/// The take of a free name is one plain `UPDATE`, not the `CALL`: it too
/// must not grant to a session that ends while it waits for the name's row.
/// Here the session ends, by hand, in the transaction that holds the name's
/// row, as an eviction or a watcher's confirmation would. The take reads the
/// session with a shared lock, so the two may deadlock, and the server
/// then rolls one back: either the ending went through, and the take reads
/// "lost", or the ending was rolled back, and the take is granted to a
/// session that is still live. Never a grant to an ended session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_take_that_waited_for_the_name_reads_its_session_after_the_wait() {
    let Some(server) = shared() else { return };
    fast_take_meets_an_ending(server, "fastlost_").await;
}

/// The same on a server whose connections default to `READ COMMITTED`,
/// where a subquery's read in an `UPDATE` takes no lock unless it asks:
/// the take's statement asks (`LOCK IN SHARE MODE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_take_reads_its_session_locked_at_read_committed() {
    use mysql_async::prelude::Queryable;
    let Some(server) = MariaDbServer::start_or_skip() else {
        return;
    };
    let mut root = raw_conn(&server).await;
    root.query_drop("SET GLOBAL tx_isolation = 'READ-COMMITTED'")
        .await
        .unwrap();
    let isolation: Option<String> = raw_conn(&server)
        .await
        .query_first("SELECT @@tx_isolation")
        .await
        .unwrap();
    assert_eq!(isolation.as_deref(), Some("READ-COMMITTED"));
    fast_take_meets_an_ending(&server, "fastrc_").await;
}

async fn fast_take_meets_an_ending(server: &MariaDbServer, prefix: &str) {
    use mysql_async::prelude::Queryable;
    use std::time::Duration;
    let url = format!("{}?prefix={prefix}", server.url());
    let store = tenure::open(&url).await.unwrap();
    let s = tenure::Session::with_options(
        &store,
        tenure::SessionOptions::new().ttl(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    // The name's row exists (its first take made it), and is free.
    Mutex::new(&s, "n")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (mut holder, mut watcher) = (raw_conn(server).await, raw_conn(server).await);
    let secret: String = holder
        .query_first(format!("SELECT id FROM {prefix}sessions"))
        .await
        .unwrap()
        .unwrap();
    holder
        .query_drop(format!(
            "START TRANSACTION; SELECT 1 FROM {prefix}names WHERE name = 'n' FOR UPDATE;"
        ))
        .await
        .unwrap();
    let m = Mutex::new(&s, "n").unwrap();
    let take = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(20), m.lock())
            .await
            .expect("the take never finished")
    });
    // The one-statement take (not the CALL) runs, and waits for the name's
    // row. (The server's list of transactions does not always show it.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: Option<i64> = watcher
            .query_first(format!(
                "SELECT COUNT(*) FROM information_schema.processlist
                  WHERE info LIKE 'UPDATE {prefix}names%'"
            ))
            .await
            .unwrap();
        if waiting == Some(1) {
            break;
        }
        assert!(
            !take.is_finished(),
            "the take did not wait for the name's row"
        );
        if tokio::time::Instant::now() >= deadline {
            let trx: Vec<(String, Option<String>)> = watcher
                .query("SELECT COALESCE(state, ''), info FROM information_schema.processlist")
                .await
                .unwrap();
            panic!("the one-statement take never waited for the name's row: {trx:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ended = holder
        .exec_drop(
            format!("UPDATE {prefix}sessions SET expires_ms = 0 WHERE id = ?"),
            (secret.clone(),),
        )
        .await;
    let ended = match ended {
        Ok(()) => {
            holder.query_drop("COMMIT").await.unwrap();
            true
        }
        Err(mysql_async::Error::Server(e)) if e.code == 1213 => false,
        Err(e) => panic!("ending the session: {e}"),
    };
    // (The guard is kept while the row is read: a dropped one releases.)
    let taken = take.await.unwrap();
    let (held_by, live): (Option<String>, i64) = holder
        .exec_first(
            format!(
                "SELECT (SELECT h_session FROM {prefix}names WHERE name = 'n'),
                        (SELECT expires_ms > 0 FROM {prefix}sessions WHERE id = ?)"
            ),
            (secret.clone(),),
        )
        .await
        .map(|row: Option<(Option<String>, i64)>| row.unwrap())
        .unwrap_or_else(|e| panic!("reading the name's row: {e}"));
    if ended {
        assert!(
            matches!(taken, Err(Error::SessionLost(_))),
            "a take granted to a session that ended while it waited: {:?}",
            taken.map(|g| g.token())
        );
        assert_eq!(held_by, None, "the name is held by an ended session");
        assert_eq!(live, 0);
    } else {
        // The ending lost the deadlock and was rolled back.
        assert!(taken.is_ok(), "the session still lives: {:?}", taken.err());
        assert_eq!(held_by.as_deref(), Some(secret.as_str()));
        assert_eq!(live, 1);
    }
}

/// A release answers with the entries it granted: a waiter of the same
/// process takes its grant without a look (a handoff is one call).
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_here_costs_the_release_alone() {
    let Some(server) = shared() else { return };
    let my = tenure::backend::mysql::MysqlStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(my.clone());
    tenure_testkit::conformance::check_a_handoff_here_costs_the_release_alone(&store, || {
        my.round_trips()
    })
    .await;
}

/// 64 waiters on one mutex, in one process. MySQL cannot notify, so one of
/// them polls — the next in line, at most every 100 ms — and the others wait
/// for a local wake-up: about 10 calls a second in all, not 640. Each
/// release and handoff costs at most 5 calls (the release, which says whom
/// it granted, so that waiter does not look; the look of the waiter that
/// takes over polling; polls), however many wait.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    let my = tenure::backend::mysql::MysqlStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(my.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || my.round_trips(), 5, 12).await;
}

/// Fencing in the application's own MySQL/MariaDB: holder A stops renewing
/// (paused past its TTL), B is granted the lock and writes through the
/// fence in its own transaction; A's late write, in its transaction, is
/// refused by the database (`StaleToken` with B's token) and rolls back.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_write_is_refused_by_the_fence() {
    use mysql_async::prelude::Queryable;
    use tenure::{Error, Name};
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let pool = mysql_async::Pool::new(server.url().as_str());
    let mut conn = pool.get_conn().await.unwrap();
    tenure::fencing::mysql::create_table(&mut conn)
        .await
        .unwrap();
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS fenced_jobs (holder VARCHAR(8) NOT NULL) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    let printer = Name::new("printer-e2e").unwrap();

    let (token_a, gb) =
        tenure_testkit::conformance::holder_paused_past_its_ttl(&store, "printer-e2e").await;
    for _ in 0..2 {
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await
            .unwrap();
        tenure::fencing::mysql::admit(&mut tx, &printer, gb.token())
            .await
            .unwrap();
        tx.query_drop("INSERT INTO fenced_jobs (holder) VALUES ('b')")
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    tx.query_drop("INSERT INTO fenced_jobs (holder) VALUES ('a')")
        .await
        .unwrap();
    let e = tenure::fencing::mysql::admit(&mut tx, &printer, token_a)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::StaleToken { token, highest, .. } if token == token_a && highest == gb.token()),
        "{e:?}"
    );
    tx.rollback().await.unwrap();
    let holders: Vec<String> = conn.query("SELECT holder FROM fenced_jobs").await.unwrap();
    assert_eq!(holders, ["b", "b"]);
    gb.release().await.unwrap();
    drop(conn);
    pool.disconnect().await.unwrap();
}

/// The server's wall clock (libfaketime) steps forward by fifteen TTLs
/// while a lock is held and another session waits, then back by thirty
/// after a holder crashed: never two holders, and the crashed holder is
/// released within its TTL and one renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_steps_neither_grant_twice_nor_delay_a_release() {
    let Some(server) = MariaDbServer::start_with_clock_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let clock = server.clock().unwrap();
    tenure_testkit::conformance::check_server_clock_steps(&store, |s| clock.step(s)).await;
}

/// Opening a session collects a few sessions that lapsed a minute ago and
/// hold nothing, oldest first; one that still has an entry stays (only a
/// watcher may end it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_collects_lapsed_sessions_that_hold_nothing() {
    use mysql_async::prelude::Queryable;
    let Some(server) = shared() else { return };
    let url = format!("{}?prefix=collect_", server.url());
    let store = tenure::open(&url).await.unwrap();
    let mut conn = raw_conn(server).await;
    conn.query_drop(
        "INSERT INTO collect_sessions (id, tag, label, ttl_ms, expires_ms) VALUES
           ('lapsed-empty', 'a', '', 1000, 1000),
           ('lapsed-holding', 'b', '', 1000, 1000),
           ('lapsed-row-holding', 'c', '', 1000, 1000);
         INSERT INTO collect_names (name, last_seq, version) VALUES ('held', 1, 1);
         INSERT INTO collect_names (name, last_seq, version, h_seq, h_session, h_kind, h_count,
                                    h_lim, h_value, h_granted_ms, queued)
           VALUES ('held-in-row', 1, 1, 1, 'lapsed-row-holding', 0, 1, 1, '', 1000, FALSE);
         INSERT INTO collect_entries (name, seq, session, kind, count, lim, holds, value, granted_ms)
           VALUES ('held', 1, 'lapsed-holding', 0, 1, 1, 1, '', 1000);",
    )
    .await
    .unwrap();
    let s = Session::new(&store).await.unwrap();
    let left: Vec<String> = conn
        .query("SELECT id FROM collect_sessions WHERE id LIKE 'lapsed-%' ORDER BY id")
        .await
        .unwrap();
    assert_eq!(
        left,
        vec![
            "lapsed-holding".to_string(),
            "lapsed-row-holding".to_string()
        ]
    );
    s.close().await.unwrap();
}

/// Two processes on one name: the one-statement take and release are
/// tried only where they may apply.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_are_tried_only_where_they_may_apply() {
    let Some(server) = shared() else { return };
    let url = server.url();
    let open = || tenure::backend::mysql::MysqlStore::open(&url);
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let a: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(a);
    let b_store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(b.clone());
    tenure_testkit::conformance::check_fast_paths_tried_where_they_may_apply(
        &a,
        &b_store,
        "fast-hints",
        || b.round_trips(),
    )
    .await;
}

/// A waiter makes no call it need not: a queued join says what its first
/// look would, a grant announced before its waiter waits is kept for it,
/// and only the first waiter of a name in a process polls, the next taking
/// over without a look.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_make_no_call_they_need_not() {
    use tenure_testkit::conformance as c;
    let Some(server) = shared() else { return };
    let my = tenure::backend::mysql::MysqlStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(my.clone());
    let calls = || my.round_trips();
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        c::check_queued_join_answers_the_first_look(&store, "first-look", calls).await;
        c::check_polling_handed_on_without_a_look(&store, "hand-over", calls).await;
    })
    .await
    .expect("the checks took over a minute");
}

/// A name nobody else wants is held in its row: nothing goes into
/// `entries`; a second comer moves the holder into the queue.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_holder_is_kept_in_its_names_row() {
    use mysql_async::prelude::Queryable;
    let Some(server) = shared() else { return };
    let url = format!("{}?prefix=lone_", server.url());
    let my = tenure::backend::mysql::MysqlStore::open(&url)
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(my.clone());
    let conn = tokio::sync::Mutex::new(raw_conn(server).await);
    let conn = &conn;
    let layout = || async move {
        let row: Option<(Option<i64>, i64)> = conn
            .lock()
            .await
            .query_first(
                "SELECT (SELECT h_seq FROM lone_names WHERE name = 'n'),
                        (SELECT COUNT(*) FROM lone_entries WHERE name = 'n')",
            )
            .await
            .unwrap();
        row.unwrap()
    };
    tenure_testkit::conformance::check_lone_holder_layout(&store, "n", || my.round_trips(), layout)
        .await;
}

/// A semaphore waiter whose look finds a live entry just ahead still
/// settles the name when another entry ahead belongs to an ended session.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_ended_elsewhere_is_passed_at_the_next_look() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    tenure_testkit::conformance::check_a_holder_ended_elsewhere_is_passed_at_the_next_look(&store)
        .await;
}

/// Opening a session is one step, its build record with it: while the
/// record's write is held up (another transaction holds every row and gap
/// of the table `FOR UPDATE`), another client never sees a session without
/// its record, and the open fails (unanswered) rather than leave one behind
/// that `tenure upgrade finish` could not account for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opens_with_its_build_record_or_not_at_all() {
    use mysql_async::prelude::Queryable;
    use std::time::{Duration, Instant};
    let Some(server) = shared() else { return };
    let store = tenure::open(&format!("{}?prefix=atomic_", server.url()))
        .await
        .unwrap();
    let (mut locker, mut watcher) = (raw_conn(server).await, raw_conn(server).await);
    let unrecorded = "SELECT count(*) FROM atomic_sessions s WHERE s.expires_ms > 0 \
         AND NOT EXISTS (SELECT 1 FROM atomic_session_builds b WHERE b.session = s.id)";
    let first: Option<i64> = watcher.query_first(unrecorded).await.unwrap();
    assert_eq!(first, Some(0));
    locker.query_drop("START TRANSACTION").await.unwrap();
    locker
        .query_drop("SELECT * FROM atomic_session_builds FOR UPDATE")
        .await
        .unwrap();
    let opening = tokio::spawn({
        let store = store.clone();
        async move { Session::new(&store).await.map(drop) }
    });
    let until = Instant::now() + Duration::from_secs(15);
    let mut looks = 0;
    while !opening.is_finished() {
        assert!(Instant::now() < until, "the open did not end");
        let n: Option<i64> = watcher.query_first(unrecorded).await.unwrap();
        assert_eq!(
            n,
            Some(0),
            "a session without its build record (look {looks})"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened = opening.await.unwrap();
    assert!(
        opened.is_err(),
        "opened while its record could not be written"
    );
    locker.query_drop("ROLLBACK").await.unwrap();
    // The held-up statement may still end on the server: both or neither.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n: Option<i64> = watcher.query_first(unrecorded).await.unwrap();
    assert_eq!(
        n,
        Some(0),
        "a session without its build record, once unlocked"
    );
}
