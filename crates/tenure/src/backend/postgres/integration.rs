//! PostgreSQL beyond the conformance suite (`tests/conformance.rs`),
//! against a real PostgreSQL started from Debian's binaries.
#![cfg(feature = "postgres")]

use std::sync::OnceLock;

use tenure::{Error, Mutex, Session};
use tenure_testkit::PostgresServer;

fn shared() -> Option<&'static PostgresServer> {
    static SERVER: OnceLock<Option<PostgresServer>> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start_or_skip).as_ref()
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = shared() else { return };
    tenure_testkit::conformance::check_wrong_password(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/postgres",
        server.port()
    ))
    .await;
}

#[tokio::test]
async fn a_schema_of_its_own_and_bad_options() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&format!("{}?schema=app_locks", server.url()))
        .await
        .unwrap();
    let s = Session::new(&store).await.unwrap();
    let g = Mutex::new(&s, "x").unwrap().lock().await.unwrap();
    assert_eq!(g.token(), 1, "a fresh schema starts its own counters");
    for bad in ["?schema=Bad-Name", "?schema=", "?sslmode=sometimes"] {
        let e = tenure::open(&format!("{}{bad}", server.url()))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidUrl { .. }), "{bad}: {e:?}");
    }
    // TLS required of a server without TLS: refused, and not as something
    // to retry.
    let e = tenure::open(&format!("{}?sslmode=require", server.url()))
        .await
        .unwrap_err();
    assert!(!e.is_temporary() && e.to_string().contains("TLS"), "{e:?}");
}

#[tokio::test]
async fn an_older_schema_is_upgraded_and_a_newer_one_refused() {
    let Some(server) = shared() else { return };
    let url = format!("{}?schema=upgrading", server.url());
    drop(tenure::open(&url).await.unwrap());
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let version = || async {
        let row = client
            .query_one("SELECT value FROM upgrading.meta WHERE key = 'schema'", &[])
            .await
            .unwrap();
        row.get::<_, String>(0)
    };
    let current = version().await;
    // Version 1's functions: a join that fails, so an upgrade must replace it.
    client
        .batch_execute(
            "UPDATE upgrading.meta SET value = '1' WHERE key = 'schema';
             CREATE OR REPLACE FUNCTION upgrading.now_ms() RETURNS bigint LANGUAGE sql AS 'SELECT NULL::bigint';",
        )
        .await
        .unwrap();
    let store = tenure::open(&url).await.unwrap();
    assert_eq!(version().await, current, "upgraded in place");
    let s = Session::new(&store).await.unwrap();
    let g = Mutex::new(&s, "x").unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    s.close().await.unwrap();
    client
        .batch_execute("UPDATE upgrading.meta SET value = '99' WHERE key = 'schema'")
        .await
        .unwrap();
    let e = tenure::open(&url).await.unwrap_err();
    assert!(
        matches!(e, Error::SchemaMismatch { .. }) && e.to_string().contains("version 99"),
        "{e:?}"
    );
}

/// A join that waited for the name's lock reads its session after the
/// wait: a session ended meanwhile (here by hand, as an eviction or a
/// watcher's confirmation does) gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_waited_for_the_name_reads_its_session_after_the_wait() {
    let Some(server) = shared() else { return };
    let url = format!("{}?schema=staleclock", server.url());
    drop(tenure::open(&url).await.unwrap());
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    };
    let (holder, joiner) = (connect().await, connect().await);
    holder
        .batch_execute(
            "INSERT INTO staleclock.names (name, last_seq, version) VALUES ('n', 5, 0);
             INSERT INTO staleclock.sessions (id, tag, label, ttl_ms, expires_ms)
                  VALUES ('secret', 't', '', 300, staleclock.now_ms() + 300);",
        )
        .await
        .unwrap();
    // (A separate message: the rows above must be committed first.)
    holder
        .batch_execute("BEGIN; SELECT 1 FROM staleclock.names WHERE name = 'n' FOR UPDATE;")
        .await
        .unwrap();
    let join = tokio::spawn(async move {
        joiner
            .query_one(
                "SELECT status FROM staleclock.join('secret', 'n', 0::smallint, 1, 1, ''::bytea, false)",
                &[],
            )
            .await
            .map(|row| row.get::<_, String>(0))
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The session ends while the join waits for the name's row.
    holder
        .batch_execute("UPDATE staleclock.sessions SET expires_ms = 0 WHERE id = 'secret'; COMMIT")
        .await
        .unwrap();
    let status = join.await.unwrap().unwrap();
    assert_eq!(status, "lost");
    let entries: i64 = holder
        .query_one("SELECT count(*) FROM staleclock.entries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 0);
}

/// A database the server does not have is bad input (exit 64 from the
/// CLI), said in words: not PostgreSQL's bare "db error".
#[tokio::test]
async fn a_database_the_server_does_not_have_is_bad_input() {
    let Some(server) = shared() else { return };
    let url = server.url();
    let (base, _) = url.rsplit_once('/').unwrap();
    let e = tenure::open(&format!("{base}/no_such_db"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// A role that may not create tenure's schema is told so in the server's
/// own words, with the SQLSTATE and nothing of the password: not
/// PostgreSQL's bare "db error".
#[tokio::test]
async fn a_role_without_privileges_is_told_the_servers_words() {
    let Some(server) = shared() else { return };
    let url = server.url();
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let role = format!("weak_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'hunter2'"
        ))
        .await
        .unwrap();
    let port = server.port();
    let e = tenure::open(&format!(
        "postgres://{role}:hunter2@127.0.0.1:{port}/postgres?schema=weak_schema"
    ))
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("permission denied for database postgres (SQLSTATE 42501)"),
        "{text}"
    );
    assert!(!text.contains("db error"), "{text}");
    assert!(
        !text.contains("hunter2") && !format!("{e:?}").contains("hunter2"),
        "{text}"
    );
}

/// PostgreSQL's port given to the other server stores: each says that the
/// server there does not speak its protocol, and how it answered, beside
/// what its client said ("broken pipe", "connect timed out").
#[tokio::test]
async fn a_postgres_port_given_to_other_stores_is_named_as_such() {
    let Some(server) = shared() else { return };
    let at = format!("127.0.0.1:{}", server.port());
    let free = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let (quiet1, quiet2) = (free(), free());
    for (url, speaks) in [
        (format!("redis://:hunter2@{at}/0"), "Redis"),
        (format!("redlock://{at},{quiet1},{quiet2}"), "Redis"),
        (format!("mysql://u:hunter2@{at}/db"), "MySQL"),
        (format!("etcd://{at}"), "etcd's gRPC"),
        (format!("zk://{at}"), "ZooKeeper"),
    ] {
        let e = match tenure::open(&url).await {
            Ok(_) => panic!("{url} opened"),
            Err(Error::BackendDisabled { backend, .. }) => {
                eprintln!("SKIPPED: {backend} (not built in)");
                continue;
            }
            Err(e) => e,
        };
        let text = e.to_string();
        assert!(matches!(e, Error::Unavailable { .. }), "{url}: {e:?}");
        assert!(
            text.contains(&format!(
                "at {at}: the server there does not speak {speaks}: it "
            )) && text.contains("; the client said: "),
            "{url}: {text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}

/// 64 waiters on one mutex: while they wait no call is made (NOTIFY wakes
/// them, nobody polls), and each release and handoff costs one call, the
/// release (its grant is announced, and the next waiter takes it without
/// a look), however many wait.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    let pg = tenure::backend::postgres::PostgresStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(pg.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || pg.round_trips(), 1, 0).await;
}

/// A wake-up on the waiter's channel (`NOTIFY SCHEMA_wake`, which any
/// client of the database may send, and which `evict` sends for an entry
/// it grants and then ends) only wakes the waiter: it looks, and is
/// granted after the release. So does an announcement on `SCHEMA_grant`
/// without the proof made from the entry's session secret (any role that
/// can connect may NOTIFY on any channel): only a release's own
/// announcement is taken as the grant.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_or_an_unproven_announcement_grants_nothing() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let url = server.url();
    tenure_testkit::conformance::check_a_forged_wakeup_grants_nothing(
        &store,
        |name, seq| async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let forged = [
                ("tenure_wake", format!("{name}\t{seq}")),
                ("tenure_grant", format!("{name}\t{seq}")),
                ("tenure_grant", format!("{name}\t{seq}\t")),
                // The proof's form, from a secret that is not the waiter's.
                (
                    "tenure_grant",
                    format!("{name}\t{seq}\t{}", "0123456789abcdef".repeat(4)),
                ),
            ];
            for (channel, payload) in forged {
                client
                    .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
                    .await
                    .unwrap();
            }
        },
    )
    .await;
}

/// The LISTEN connection terminated by the server while waiters wait: none
/// is stranded, and waiting is free again once LISTEN is back.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_outlive_a_dropped_listen_connection() {
    let Some(server) = shared() else { return };
    // A schema of its own, so that only this store's LISTEN connection is
    // terminated.
    let url = format!("{}?schema=listen_drop", server.url());
    let pg = tenure::backend::postgres::PostgresStore::open(&url)
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(pg.clone());
    let kill = || async {
        let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let killed = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE query LIKE 'LISTEN listen_drop_grant%'",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(killed.len(), 1, "no LISTEN connection to terminate");
    };
    tenure_testkit::conformance::check_waiters_outlive_dropped_notifications(
        &store,
        || pg.round_trips(),
        kill,
    )
    .await;
}

/// Fencing in the application's own PostgreSQL: holder A stops renewing
/// (paused past its TTL), B is granted the lock and writes through the
/// fence in its own transaction; A's late write, in its transaction, is
/// refused by the database (`StaleToken` with B's token) and rolls back.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_late_write_is_refused_by_the_fence() {
    use tenure::Name;
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let (mut db, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    tenure::fencing::postgres::create_table(&db).await.unwrap();
    db.batch_execute("CREATE TABLE IF NOT EXISTS fenced_jobs (holder text NOT NULL)")
        .await
        .unwrap();
    let printer = Name::new("printer-e2e").unwrap();

    let (token_a, gb) =
        tenure_testkit::conformance::holder_paused_past_its_ttl(&store, "printer-e2e").await;
    for _ in 0..2 {
        let tx = db.transaction().await.unwrap();
        tenure::fencing::postgres::admit(&tx, &printer, gb.token())
            .await
            .unwrap();
        tx.execute("INSERT INTO fenced_jobs (holder) VALUES ('b')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO fenced_jobs (holder) VALUES ('a')", &[])
        .await
        .unwrap();
    let e = tenure::fencing::postgres::admit(&tx, &printer, token_a)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::StaleToken { token, highest, .. } if token == token_a && highest == gb.token()),
        "{e:?}"
    );
    tx.rollback().await.unwrap();
    let holders: Vec<String> = db
        .query("SELECT holder FROM fenced_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(holders, ["b", "b"]);
    gb.release().await.unwrap();
}

/// An observer (`wait_changed`) makes no calls while nothing changes and
/// notifications work (it wakes for a notification, or at the queue's first
/// expiry), and sees a release at once.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_do_not_poll() {
    let Some(server) = shared() else { return };
    let typed = tenure::backend::postgres::PostgresStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(typed.clone());
    tenure_testkit::conformance::check_observers_do_not_poll(&store, || typed.round_trips()).await;
}

/// The server's wall clock (libfaketime) steps forward by fifteen TTLs
/// while a lock is held and another session waits, then back by thirty
/// after a holder crashed: never two holders, and the crashed holder is
/// released within its TTL and one renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_clock_steps_neither_grant_twice_nor_delay_a_release() {
    let Some(server) = PostgresServer::start_with_clock_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let clock = server.clock().unwrap();
    tenure_testkit::conformance::check_server_clock_steps(&store, |s| clock.step(s)).await;
}

/// Two processes on one name: the one-statement take and release are
/// tried only where they may apply.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_are_tried_only_where_they_may_apply() {
    let Some(server) = shared() else { return };
    let url = server.url();
    let open = || tenure::backend::postgres::PostgresStore::open(&url);
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

/// A name nobody else wants is held in its row: taking and releasing it is
/// one statement each, and nothing goes into `entries`; a second comer
/// moves the holder into the queue.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_holder_is_kept_in_its_names_row() {
    let Some(server) = shared() else { return };
    let url = format!("{}?schema=lone", server.url());
    let pg = tenure::backend::postgres::PostgresStore::open(&url)
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(pg.clone());
    let (db, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let db = &db;
    let layout = || async move {
        let row = db
            .query_one(
                "SELECT (SELECT h_seq FROM lone.names WHERE name = 'n'),
                        (SELECT count(*) FROM lone.entries WHERE name = 'n')",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, Option<i64>>(0), row.get::<_, i64>(1))
    };
    tenure_testkit::conformance::check_lone_holder_layout(&store, "n", || pg.round_trips(), layout)
        .await;
}

/// The one-statement take never waits for the name's row: while someone
/// else has it locked, the take goes to the function, which judges the
/// session after the wait. A session ended meanwhile (by hand here, as an
/// eviction or a watcher's confirmation does) gets nothing.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_found_the_name_locked_reads_its_session_after_the_wait() {
    use std::time::Duration;
    let Some(server) = shared() else { return };
    let url = format!("{}?schema=lockedname", server.url());
    let store = tenure::open(&url).await.unwrap();
    let s = Session::new(&store).await.unwrap();
    drop(Mutex::new(&s, "n").unwrap().lock().await.unwrap());
    let (db, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db.batch_execute("BEGIN; SELECT 1 FROM lockedname.names WHERE name = 'n' FOR UPDATE;")
        .await
        .unwrap();
    let m = Mutex::new(&s, "n").unwrap();
    let take = tokio::spawn(async move { m.lock().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !take.is_finished(),
        "the take did not wait for the locked name"
    );
    db.batch_execute("UPDATE lockedname.sessions SET expires_ms = 0; COMMIT")
        .await
        .unwrap();
    let taken = tokio::time::timeout(Duration::from_secs(10), take)
        .await
        .expect("the take never returned")
        .unwrap();
    assert!(taken.is_err(), "an ended session was granted: {taken:?}");
    let holders: i64 = db
        .query_one(
            "SELECT (SELECT count(*) FROM lockedname.entries)
                  + (SELECT count(*) FROM lockedname.names WHERE h_session IS NOT NULL)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holders, 0);
}

/// A semaphore waiter whose look finds a live entry just ahead still
/// settles the name when another entry ahead belongs to an ended session.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_ended_elsewhere_is_passed_at_the_next_look() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    tenure_testkit::conformance::check_a_holder_ended_elsewhere_is_passed_at_the_next_look(&store)
        .await;
}

/// A queued waiter does not look at its entry once it listens: its join
/// (schema 10) said what a look would, one plain read confirms nothing was
/// granted in between, and the release's announcement is the grant. Here
/// `look` itself fails, in a schema of its own: a waiter that called it
/// would fail too.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_told_of_its_grant_never_looks() {
    use std::time::Duration;
    let Some(server) = shared() else { return };
    let url = format!("{}?schema=no_look", server.url());
    let pg = tenure::backend::postgres::PostgresStore::open(&url)
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(pg.clone());
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let options = || tenure::SessionOptions::new().ttl(Duration::from_secs(60));
    let holder = Session::with_options(&store, options()).await.unwrap();
    let waiter = Session::with_options(&store, options()).await.unwrap();
    let mut guard = Mutex::new(&holder, "n").unwrap().lock().await.unwrap();
    // Round 0 opens the process's LISTEN connection (on a slow machine,
    // longer than a join's answer stays fresh, and its waiter would look);
    // from round 1 on, `look` fails.
    for round in 0..4 {
        if round == 1 {
            client
                .batch_execute(
                    "CREATE OR REPLACE FUNCTION no_look.look(p_secret text, p_name text, p_seq bigint,
                         p_confirm text, OUT status text, OUT until_ms bigint, OUT next boolean,
                         OUT blockers text, OUT ttl_ms bigint)
                     LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'look was called'; END $$;",
                )
                .await
                .unwrap();
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = if round % 2 == 0 {
            waiter.clone()
        } else {
            holder.clone()
        };
        let since = pg.round_trips();
        tokio::spawn(async move {
            let _ = tx.send(Mutex::new(&w, "n").unwrap().lock().await);
        });
        // Joined and checked (a join and a read at least), then quiet: the
        // release must come after the check, or the waiter would look.
        tenure_testkit::conformance::wait_calls_settled(|| pg.round_trips(), since, 2).await;
        guard.release().await.unwrap();
        guard = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("the waiter was granted")
            .unwrap()
            .unwrap();
    }
    guard.release().await.unwrap();
    holder.close().await.unwrap();
    waiter.close().await.unwrap();
}

/// Opening a session is one step, its build record with it: while the
/// record's write is held up (another transaction locks the table against
/// writes), another client never sees a session without its record, and
/// the open fails (unanswered) rather than leave one behind that `tenure
/// upgrade finish` could not account for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opens_with_its_build_record_or_not_at_all() {
    use std::time::{Duration, Instant};
    let Some(server) = shared() else { return };
    let store = tenure::open(&format!("{}?schema=atomic_open", server.url()))
        .await
        .unwrap();
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    };
    let (mut locker, watcher) = (connect().await, connect().await);
    let unrecorded = "SELECT count(*) FROM atomic_open.sessions s WHERE s.expires_ms > 0 \
         AND NOT EXISTS (SELECT 1 FROM atomic_open.session_builds b WHERE b.session = s.id)";
    let count = || async {
        watcher
            .query_one(unrecorded, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(count().await, 0);
    let lock = locker.transaction().await.unwrap();
    // Blocks writes, not reads.
    lock.batch_execute("LOCK TABLE atomic_open.session_builds IN EXCLUSIVE MODE")
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
        assert_eq!(
            count().await,
            0,
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
    assert_eq!(
        count().await,
        0,
        "a session without its build record, after the open"
    );
    lock.rollback().await.unwrap();
    // The held-up statement may still end on the server: both or neither.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count().await,
        0,
        "a session without its build record, once unlocked"
    );
}
