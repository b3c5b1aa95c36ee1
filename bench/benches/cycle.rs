//! Lock cycle bench: uncontended acquire + release per backend, beside the
//! backend's raw floor (the same client crate issuing the minimal commands),
//! and a contended run. Prints a table and writes `bench/results/cycle.json`.
//!
//! Run: `cargo bench --manifest-path bench/Cargo.toml` (set `BENCH_CYCLES`
//! to change the number of measured cycles, `BENCH_OUT` the JSON's path,
//! `BENCH_ONLY=redis,postgres` to run only some server backends,
//! `BENCH_CONTENDED_ONLY=1` for the contended rows alone; `BENCH_URL`: see
//! `bench/README.md`).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure::backend::sqlite::SqliteStore;
use tenure::{Mutex, Session, SessionOptions, Store};
use tenure_testkit::stores::{Running, StoreFixture, STORES};

struct Stats {
    label: String,
    samples: Vec<Duration>,
    total: Span,
    /// Cycles per second of each turn (one for a run not taken in turns).
    turns: Vec<f64>,
    /// Store operations per grant, by all contenders (keep-alives and each
    /// contender's session open and close not counted): contended rows.
    ops_per_grant: Option<f64>,
}

/// The name (`/proc/PID/comm`) of the server processes whose CPU time the
/// runs being measured are charged with: set before each backend's group.
static SERVER_COMM: std::sync::Mutex<Option<&'static str>> = std::sync::Mutex::new(None);

fn measure_server(comm: Option<&'static str>) {
    if let Ok(mut slot) = SERVER_COMM.lock() {
        *slot = comm;
    }
}

/// CPU time (ns) spent so far by every thread of every process named like
/// the server under measurement (Linux `schedstat`; `None` elsewhere).
/// The server's own cost of a run: steadier than wall-clock on a shared VM,
/// where the client, the server and the neighbours share two cores.
fn server_cpu_ns() -> Option<u64> {
    let comm = (*SERVER_COMM.lock().ok()?)?;
    let mut sum = 0u64;
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let path = proc_dir.path();
        let named = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if named.trim_end() != comm {
            continue;
        }
        if let Some(pid) = proc_dir.file_name().to_str() {
            sum += common::process_cpu_ns(pid);
        }
    }
    Some(sum)
}

/// A run's wall-clock time and the server's CPU time in it.
#[derive(Clone, Copy)]
struct Span {
    wall: Duration,
    server_ns: Option<u64>,
}

impl std::ops::AddAssign for Span {
    fn add_assign(&mut self, other: Span) {
        self.wall += other.wall;
        self.server_ns = self.server_ns.zip(other.server_ns).map(|(a, b)| a + b);
    }
}

struct Clock {
    wall: Instant,
    server_ns: Option<u64>,
}

impl Clock {
    fn start() -> Clock {
        let server_ns = server_cpu_ns();
        Clock {
            wall: Instant::now(),
            server_ns,
        }
    }

    fn elapsed(&self) -> Span {
        let wall = self.wall.elapsed();
        Span {
            wall,
            server_ns: self
                .server_ns
                .zip(server_cpu_ns())
                .map(|(before, after)| after.saturating_sub(before)),
        }
    }
}

impl Stats {
    fn cycles(&self) -> usize {
        self.samples.len()
    }

    fn per_sec(&self) -> f64 {
        self.samples.len() as f64 / self.total.wall.as_secs_f64()
    }

    /// The server's CPU time per cycle, in µs.
    fn server_us(&self) -> Option<f64> {
        self.total
            .server_ns
            .map(|ns| ns as f64 / 1e3 / self.samples.len().max(1) as f64)
    }

    fn percentile_us(&self, p: f64) -> f64 {
        let mut sorted = self.samples.clone();
        sorted.sort();
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[i].as_secs_f64() * 1e6
    }
}

fn stats(label: impl Into<String>, samples: Vec<Duration>, total: Span) -> Stats {
    let rate = samples.len() as f64 / total.wall.as_secs_f64().max(1e-9);
    Stats {
        label: label.into(),
        samples,
        total,
        turns: vec![rate],
        ops_per_grant: None,
    }
}

/// A row's time per cycle against its floor's: the median over the turns
/// of the ratio within each turn (the two ran back to back in it), so one
/// slow spell of the VM moves one turn's ratio, not the figure; pooled
/// when the two were not run in the same turns.
fn ratio_to_floor(row: &Stats, floor: &Stats) -> f64 {
    if row.turns.len() < 2 || row.turns.len() != floor.turns.len() {
        return floor.per_sec() / row.per_sec();
    }
    let mut ratios: Vec<f64> = row
        .turns
        .iter()
        .zip(&floor.turns)
        .map(|(r, f)| f / r)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let mid = ratios.len() / 2;
    if ratios.len() % 2 == 1 {
        ratios[mid]
    } else {
        (ratios[mid - 1] + ratios[mid]) / 2.0
    }
}

/// One measured run of `n` cycles (a tenure backend, its floor or a peer).
type Runner<'a> = Box<dyn FnMut(usize) -> Pin<Box<dyn Future<Output = Stats> + 'a>> + 'a>;

fn runner<'a, F, Fut>(mut f: F) -> Runner<'a>
where
    F: FnMut(usize) -> Fut + 'a,
    Fut: Future<Output = Stats> + 'a,
{
    Box::new(move |n| Box::pin(f(n)))
}

/// The turns [`interleaved`] takes.
const TURNS: usize = 10;

/// Runs every runner `cycles` times in all, in ten turns taken in order, so
/// that a slow spell of the machine (a VM's neighbours) falls on each of them
/// alike and the ratios between them stay fair (each row keeps its turns'
/// rates: its ratio to the floor is the median of the turns' ratios).
async fn interleaved(cycles: usize, mut runners: Vec<Runner<'_>>) -> Vec<Stats> {
    let mut out: Vec<Option<Stats>> = runners.iter().map(|_| None).collect();
    for _ in 0..TURNS {
        for (slot, run) in out.iter_mut().zip(runners.iter_mut()) {
            let turn = run((cycles / TURNS).max(1)).await;
            match slot {
                Some(all) => {
                    // Operations per grant over all turns, by their grants.
                    if let (Some(a), Some(t)) = (all.ops_per_grant, turn.ops_per_grant) {
                        let (na, nt) = (all.samples.len() as f64, turn.samples.len() as f64);
                        all.ops_per_grant = Some((a * na + t * nt) / (na + nt).max(1.0));
                    }
                    all.turns.extend(turn.turns);
                    all.samples.extend(turn.samples);
                    all.total += turn.total;
                }
                None => *slot = Some(turn),
            }
        }
    }
    out.into_iter().flatten().collect()
}

async fn uncontended(store: &Arc<dyn Store>, cycles: usize) -> Stats {
    uncontended_kind(store, cycles, true).await
}

/// The non-fair mutex's uncontended cycle (`Mutex::fair(false)`).
async fn uncontended_unfair(store: &Arc<dyn Store>, cycles: usize) -> Stats {
    uncontended_kind(store, cycles, false).await
}

async fn uncontended_kind(store: &Arc<dyn Store>, cycles: usize, fair: bool) -> Stats {
    let session = Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let mutex = Mutex::new(&session, "bench").unwrap().fair(fair);
    for _ in 0..cycles / 10 {
        mutex.lock().await.unwrap().release().await.unwrap();
    }
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let g = mutex.lock().await.unwrap();
        g.release().await.unwrap();
        samples.push(t.elapsed());
    }
    let total = start.elapsed();
    session.close().await.unwrap();
    let kind = if fair { "" } else { ", non-fair" };
    stats(
        format!("{} tenure{kind}", store.capabilities().backend),
        samples,
        total,
    )
}

async fn contended(store: &Arc<dyn Store>, tasks: usize, rounds: usize) -> Stats {
    contended_kind(store, tasks, rounds, true, None).await
}

/// [`contended`] with the non-fair mutex.
async fn contended_unfair(store: &Arc<dyn Store>, tasks: usize, rounds: usize) -> Stats {
    contended_kind(store, tasks, rounds, false, None).await
}

/// `tasks` contenders on one name, each taking it `rounds` times (or until
/// `budget` has passed: a contender still waiting then gives up), counting
/// the store operations every contender makes.
async fn contended_kind(
    store: &Arc<dyn Store>,
    tasks: usize,
    rounds: usize,
    fair: bool,
    budget: Option<Duration>,
) -> Stats {
    let counting = tenure_testkit::counting::Counting::wrap(store.clone());
    let counted: Arc<dyn Store> = counting.clone();
    let deadline = budget.map(|b| Instant::now() + b);
    let mut handles = Vec::new();
    let start = Clock::start();
    for _ in 0..tasks {
        let store = counted.clone();
        handles.push(tokio::spawn(async move {
            let session =
                Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
                    .await
                    .unwrap();
            let mutex = Mutex::new(&session, "contended").unwrap().fair(fair);
            let mut samples = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                let g = match deadline {
                    None => mutex.lock().await.unwrap(),
                    Some(d) => match mutex.lock_timeout(d.saturating_duration_since(t)).await {
                        Ok(g) => g,
                        Err(tenure::Error::Timeout(_)) => break,
                        Err(e) => panic!("{e}"),
                    },
                };
                samples.push(t.elapsed());
                // Let the others queue up behind the holder.
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
            session.close().await.unwrap();
            samples
        }));
    }
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await.unwrap());
    }
    let total = start.elapsed();
    let grants = samples.len().max(1) as f64;
    let ops = counting.calls().saturating_sub(2 * tasks as u64) as f64;
    let mut row = stats(
        format!(
            "{} tenure{}, {tasks} contenders (wait for grant)",
            store.capabilities().backend,
            if fair { "" } else { " non-fair" }
        ),
        samples,
        total,
    );
    row.ops_per_grant = Some(ops / grants);
    row
}

/// The floor: one INSERT to take a row-with-expiry lock, one DELETE to drop
/// it, autocommit, on a WAL file with the same pragmas. SQLite checkpoints
/// the WAL inside the commit that crosses 1,000 pages, as by default; with
/// a checkpoint thread, a thread of its own also checkpoints (`PASSIVE`)
/// every 32 cycles, as tenure's store does (every 64 calls), so that the
/// two compare the lock's work alone. One connection serves every turn, as
/// one store serves tenure's: closing the last connection checkpoints the
/// WAL, which a connection per turn would do outside the timed loops.
struct SqliteFloor {
    conn: rusqlite::Connection,
    checkpoint_due: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SqliteFloor {
    fn open(path: &std::path::Path, checkpoint_thread: bool) -> SqliteFloor {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch(
            "PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_ms INTEGER NOT NULL);",
        )
        .unwrap();
        let (mut checkpoint_due, mut thread) = (None, None);
        if checkpoint_thread {
            let (due, checkpoints) = std::sync::mpsc::channel::<()>();
            let checkpointer = rusqlite::Connection::open(path).unwrap();
            checkpoint_due = Some(due);
            thread = Some(std::thread::spawn(move || {
                while checkpoints.recv().is_ok() {
                    checkpointer
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .unwrap();
                }
            }));
        }
        SqliteFloor {
            conn,
            checkpoint_due,
            thread,
        }
    }

    fn run(&self, cycles: usize) -> Stats {
        let mut ins = self
            .conn
            .prepare_cached(
                "INSERT INTO locks (name, owner, expires_ms) VALUES (?1, ?2,
                   CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 30000)",
            )
            .unwrap();
        let mut del = self
            .conn
            .prepare_cached("DELETE FROM locks WHERE name = ?1 AND owner = ?2")
            .unwrap();
        let mut samples = Vec::with_capacity(cycles);
        let start = Clock::start();
        for i in 0..cycles {
            let t = Instant::now();
            ins.execute(["bench", "me"]).unwrap();
            del.execute(["bench", "me"]).unwrap();
            samples.push(t.elapsed());
            if let Some(due) = &self.checkpoint_due {
                if i % 32 == 31 {
                    due.send(()).unwrap();
                }
            }
        }
        stats(
            if self.checkpoint_due.is_some() {
                "sqlite raw floor checkpointed by a thread, as tenure is"
            } else {
                "sqlite raw floor (rusqlite INSERT + DELETE)"
            },
            samples,
            start.elapsed(),
        )
    }
}

impl Drop for SqliteFloor {
    fn drop(&mut self) {
        self.checkpoint_due = None;
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

/// The Redis floor: `SET key me NX PX 30000` to take, a compare-and-delete Lua
/// script (EVALSHA) to release — the seeds' minimal Redis lock.
async fn redis_floor(url: &str, cycles: usize) -> Stats {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    );
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let ok: Option<String> = redis::cmd("SET")
            .arg("floor")
            .arg("me")
            .arg("NX")
            .arg("PX")
            .arg(30000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ok.is_some());
        let _: i64 = release
            .key("floor")
            .arg("me")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "redis raw floor (SET NX PX + Lua compare-and-delete)",
        samples,
        start.elapsed(),
    )
}

/// tenure's own Redis script driven by the raw client, as the library sends
/// it (a session opened by the script, then join + leave on an empty queue):
/// the difference to the floor is the script's server time, the difference
/// to the tenure row is the library's own cost.
async fn redis_script_raw(url: &str, cycles: usize) -> Stats {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new(include_str!(
        "../../crates/tenure/src/backend/redis/redis.lua"
    ));
    let call = |args: &[&str]| {
        let mut invocation = script.key("{tenure}:sessions");
        invocation.arg("{tenure}");
        for a in args {
            invocation.arg(*a);
        }
        invocation
    };
    let secret = "bench-raw-script-session";
    let _: redis::Value = call(&["open", secret, "raw", "30000", "raw"])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let joined: redis::Value = call(&["join", secret, "raw", "X", "0", "0", "", "wait", ""])
            .invoke_async(&mut conn)
            .await
            .unwrap();
        // The fast join answers with the bare seq (negative when first).
        let seq = match joined {
            redis::Value::Int(n) => n.unsigned_abs().to_string(),
            other => panic!("join reply {other:?}"),
        };
        let _: redis::Value = call(&["leave", secret, "raw", &seq])
            .invoke_async(&mut conn)
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    let total = start.elapsed();
    let _: redis::Value = call(&["close", secret])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    stats(
        "redis its script alone, raw client (join + leave)",
        samples,
        total,
    )
}

/// The PostgreSQL floor: one INSERT of a row with an expiry to take, one
/// DELETE to release, prepared, autocommit.
async fn postgres_floor(url: &str, cycles: usize) -> Stats {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS floor_locks (name text PRIMARY KEY, owner text NOT NULL, expires timestamptz NOT NULL)",
        )
        .await
        .unwrap();
    let take = client
        .prepare("INSERT INTO floor_locks VALUES ($1, $2, now() + interval '30 seconds')")
        .await
        .unwrap();
    let drop = client
        .prepare("DELETE FROM floor_locks WHERE name = $1 AND owner = $2")
        .await
        .unwrap();
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        client.execute(&take, &[&"floor", &"me"]).await.unwrap();
        client.execute(&drop, &[&"floor", &"me"]).await.unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "postgres raw floor (INSERT + DELETE)",
        samples,
        start.elapsed(),
    )
}

/// The MySQL floor: one INSERT of a row with an expiry to take, one DELETE to
/// release, prepared, autocommit.
async fn mysql_floor(url: &str, cycles: usize) -> Stats {
    use mysql_async::prelude::Queryable;
    let pool = mysql_async::Pool::new(mysql_async::Opts::from_url(url).unwrap());
    let mut conn = pool.get_conn().await.unwrap();
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS floor_locks (name VARCHAR(64) PRIMARY KEY, owner VARCHAR(64) NOT NULL, expires DATETIME(3) NOT NULL) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        conn.exec_drop(
            "INSERT INTO floor_locks VALUES (?, ?, NOW(3) + INTERVAL 30 SECOND)",
            ("floor", "me"),
        )
        .await
        .unwrap();
        conn.exec_drop(
            "DELETE FROM floor_locks WHERE name = ? AND owner = ?",
            ("floor", "me"),
        )
        .await
        .unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "mysql raw floor (INSERT + DELETE)",
        samples,
        start.elapsed(),
    )
}

/// The Redlock floor: `SET NX PX` on every node at once to take, the Lua
/// compare-and-delete on every node at once to release.
async fn redlock_floor(urls: &[String], cycles: usize) -> Stats {
    let mut conns = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).unwrap();
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    );
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let taken = futures_util::future::join_all(conns.iter().map(|c| {
            let mut c = c.clone();
            async move {
                let ok: Option<String> = redis::cmd("SET")
                    .arg("floor")
                    .arg("me")
                    .arg("NX")
                    .arg("PX")
                    .arg(30000)
                    .query_async(&mut c)
                    .await
                    .unwrap();
                ok.is_some()
            }
        }))
        .await;
        assert!(taken.iter().all(|t| *t));
        futures_util::future::join_all(conns.iter().map(|c| {
            let mut c = c.clone();
            let release = &release;
            async move {
                let _: i64 = release
                    .key("floor")
                    .arg("me")
                    .invoke_async(&mut c)
                    .await
                    .unwrap();
            }
        }))
        .await;
        samples.push(t.elapsed());
    }
    stats(
        format!(
            "redlock raw floor (SET NX PX + Lua delete, {} nodes)",
            urls.len()
        ),
        samples,
        start.elapsed(),
    )
}

/// The rslock crate (a Redlock peer) on the same nodes: lock + unlock.
async fn rslock_uncontended(urls: &[String], cycles: usize) -> Stats {
    let manager = rslock::LockManager::new(urls.to_vec());
    let ttl = Duration::from_secs(30);
    for _ in 0..cycles / 10 {
        let lock = manager.lock("rslock-bench", ttl).await.unwrap();
        manager.unlock(&lock).await;
    }
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let lock = manager.lock("rslock-bench", ttl).await.unwrap();
        manager.unlock(&lock).await;
        samples.push(t.elapsed());
    }
    stats("redlock rslock 0.10 (peer)", samples, start.elapsed())
}

/// rslock with 16 contenders, each looping `acquire` (its retry: up to 3
/// tries, a random pause of up to 200 ms between, its defaults).
async fn rslock_contended(urls: &[String], tasks: usize, rounds: usize) -> Stats {
    let manager = rslock::LockManager::new(urls.to_vec());
    let start = Clock::start();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let manager = manager.clone();
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                let guard = manager
                    .acquire("rslock-contended", Duration::from_secs(30))
                    .await
                    .unwrap();
                samples.push(t.elapsed());
                tokio::task::yield_now().await;
                guard.release().await;
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await.unwrap());
    }
    stats(
        format!("redlock rslock 0.10 (peer), {tasks} contenders"),
        samples,
        start.elapsed(),
    )
}

/// The etcd floor: a transaction that creates the key if absent (with a
/// lease, as a lock would) to take, a delete to release.
async fn etcd_floor(url: &str, cycles: usize) -> Stats {
    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
    let endpoints: Vec<String> = url
        .trim_start_matches("etcd://")
        .split(',')
        .map(|h| format!("http://{h}"))
        .collect();
    let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let take = Txn::new()
            .when(vec![Compare::create_revision("floor", CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                "floor",
                "me",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        assert!(client.txn(take).await.unwrap().succeeded());
        client.delete("floor", None).await.unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "etcd raw floor (txn put-if-absent + delete)",
        samples,
        start.elapsed(),
    )
}

/// etcd's own server-side Lock API (the etcd-client crate's lock client) on
/// the same server: lock + unlock under a lease.
async fn etcd_lock_api(url: &str, cycles: usize) -> Stats {
    let endpoints: Vec<String> = url
        .trim_start_matches("etcd://")
        .split(',')
        .map(|h| format!("http://{h}"))
        .collect();
    let mut client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let options = || Some(etcd_client::LockOptions::new().with_lease(lease));
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        let key = client.lock("api", options()).await.unwrap().key().to_vec();
        client.unlock(key).await.unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "etcd Lock API (etcd-client lock + unlock, peer)",
        samples,
        start.elapsed(),
    )
}

/// etcd's Lock API with 16 contenders, each with a lease of its own.
async fn etcd_lock_api_contended(url: &str, tasks: usize, rounds: usize) -> Stats {
    let endpoints: Vec<String> = url
        .trim_start_matches("etcd://")
        .split(',')
        .map(|h| format!("http://{h}"))
        .collect();
    let client = etcd_client::Client::connect(endpoints, None).await.unwrap();
    let start = Clock::start();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let mut client = client.clone();
        handles.push(tokio::spawn(async move {
            let lease = client.lease_grant(30, None).await.unwrap().id();
            let mut samples = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                let options = etcd_client::LockOptions::new().with_lease(lease);
                let key = client
                    .lock("api-contended", Some(options))
                    .await
                    .unwrap()
                    .key()
                    .to_vec();
                samples.push(t.elapsed());
                tokio::task::yield_now().await;
                client.unlock(key).await.unwrap();
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await.unwrap());
    }
    stats(
        format!("etcd Lock API (peer), {tasks} contenders"),
        samples,
        start.elapsed(),
    )
}

/// The ZooKeeper floor: create an ephemeral node to take, delete it to
/// release.
async fn zk_floor(url: &str, cycles: usize) -> Stats {
    use zookeeper_client as zk;
    let client = zk::Client::connect(url.trim_start_matches("zk://"))
        .await
        .unwrap();
    let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let mut samples = Vec::with_capacity(cycles);
    let start = Clock::start();
    for _ in 0..cycles {
        let t = Instant::now();
        client.create("/floor", b"me", &options).await.unwrap();
        client.delete("/floor", None).await.unwrap();
        samples.push(t.elapsed());
    }
    stats(
        "zookeeper raw floor (create ephemeral + delete)",
        samples,
        start.elapsed(),
    )
}

/// What a store adds to tenure's generic rows (its uncontended and
/// contended cycles, fair and non-fair): its raw floors, its peers, and
/// variants of its own.
struct Extras<'a> {
    /// Run in turns after tenure's two uncontended rows of the store.
    uncontended: Vec<Runner<'a>>,
    /// Run once each after tenure's two contended rows, given the rounds
    /// per contender (16 contenders); they borrow nothing, as they outlive
    /// the store's uncontended turns.
    contended: Vec<Runner<'static>>,
    /// Rounds per contender of the store's contended rows.
    contended_rounds: usize,
}

/// The extra runners of the store `backend` at `url` (`store` is tenure's
/// store there, `dir` a directory for the bench's own files): the one place
/// that knows each store's floors and peers. A store it does not name gets
/// tenure's generic rows alone.
fn extras<'a>(
    backend: &str,
    url: &str,
    store: &Arc<dyn Store>,
    dir: &std::path::Path,
    cycles: usize,
) -> Extras<'a> {
    let mut extras = Extras {
        uncontended: Vec::new(),
        contended: Vec::new(),
        contended_rounds: (cycles / 64).max(5),
    };
    match backend {
        "memory" => {
            // Metrics on (the default: `Recording::Auto`, and no recorder is
            // installed, so nothing is timed or keyed: what a user who never
            // looks at metrics pays) against off (`Recording::Off`), and
            // against forced on into the no-op recorder (`Recording::On`:
            // every key built and every clock read, what recording costs
            // apart from the recorder's own work), interleaved.
            let with = |setting: tenure::metrics::Recording, label: &'static str| {
                let store = store.clone();
                runner(move |n| {
                    let store = store.clone();
                    async move {
                        tenure::metrics::set_recording(setting);
                        let mut stats = uncontended(&store, n).await;
                        tenure::metrics::set_recording(tenure::metrics::Recording::Auto);
                        stats.label = label.into();
                        stats
                    }
                })
            };
            extras.uncontended = vec![
                with(
                    tenure::metrics::Recording::Off,
                    "memory tenure, metrics off",
                ),
                with(
                    tenure::metrics::Recording::On,
                    "memory tenure, metrics forced on (no-op recorder)",
                ),
            ];
            // In-process: fast enough for more rounds.
            extras.contended_rounds = (cycles / 16).max(10);
        }
        "sqlite" => {
            let floor = |file: &str, checkpoint_thread: bool| {
                let floor = std::rc::Rc::new(SqliteFloor::open(&dir.join(file), checkpoint_thread));
                runner(move |n| {
                    let floor = floor.clone();
                    async move { tokio::task::block_in_place(|| floor.run(n)) }
                })
            };
            extras.uncontended = vec![
                floor("floor.db", false),
                floor("floor-checkpointed.db", true),
            ];
        }
        "redis" => {
            let url = url.to_string();
            extras.uncontended = vec![
                owning(
                    url.clone(),
                    |url, n| async move { redis_floor(&url, n).await },
                ),
                owning(url, |url, n| async move { redis_script_raw(&url, n).await }),
            ];
            // The same cycle behind Sentinel and on a Redis Cluster, each
            // with and without replicas=1 (against the single server's floor:
            // the same redis-server on loopback).
            for (what, deployed) in redis_deployments() {
                let labelled = |mut stats: Stats, what: &str| {
                    stats.label =
                        stats
                            .label
                            .replacen("redis tenure", &format!("redis tenure {what}"), 1);
                    stats
                };
                let d = deployed.clone();
                let what_u = what.clone();
                extras.uncontended.push(owning(d, move |d, n| {
                    let what = what_u.clone();
                    async move {
                        let store = tenure::open(&d.0).await.unwrap();
                        labelled(uncontended(&store, n).await, &what)
                    }
                }));
                extras.contended.push(owning(deployed, move |d, rounds| {
                    let what = what.clone();
                    async move {
                        let store = tenure::open(&d.0).await.unwrap();
                        labelled(contended(&store, 16, rounds).await, &what)
                    }
                }));
            }
        }
        "redlock" => {
            let nodes = redlock_nodes(url);
            extras.uncontended = vec![
                owning(nodes.clone(), |nodes, n| async move {
                    redlock_floor(&nodes, n).await
                }),
                owning(nodes.clone(), |nodes, n| async move {
                    rslock_uncontended(&nodes, n).await
                }),
            ];
            extras.contended = vec![owning(nodes, |nodes, rounds| async move {
                rslock_contended(&nodes, 16, rounds).await
            })];
        }
        "postgres" => {
            extras.uncontended = vec![owning(url.to_string(), |url, n| async move {
                postgres_floor(&url, n).await
            })];
        }
        "mysql" => {
            extras.uncontended = vec![owning(url.to_string(), |url, n| async move {
                mysql_floor(&url, n).await
            })];
        }
        "etcd" => {
            let url = url.to_string();
            extras.uncontended = vec![
                owning(
                    url.clone(),
                    |url, n| async move { etcd_floor(&url, n).await },
                ),
                owning(
                    url.clone(),
                    |url, n| async move { etcd_lock_api(&url, n).await },
                ),
            ];
            extras.contended = vec![owning(url, |url, rounds| async move {
                etcd_lock_api_contended(&url, 16, rounds).await
            })];
        }
        "zookeeper" => {
            extras.uncontended = vec![owning(url.to_string(), |url, n| async move {
                zk_floor(&url, n).await
            })];
        }
        _ => {}
    }
    extras
}

/// A store URL and the servers behind it, kept running while a row needs
/// them.
type Deployed = Arc<(String, Box<dyn std::any::Any + Send + Sync>)>;

/// Redis behind Sentinel and on a cluster, each with and without
/// `replicas=1`: (what, URL and servers). None when redis-server is missing.
fn redis_deployments() -> Vec<(String, Deployed)> {
    let mut out = Vec::new();
    if let Some(set) = tenure_testkit::RedisSentinel::start_or_skip() {
        let url = set.url();
        let servers: Arc<Box<dyn std::any::Any + Send + Sync>> = Arc::new(Box::new(set));
        for (what, url) in [
            ("via Sentinel".to_string(), url.clone()),
            (
                "via Sentinel replicas=1".to_string(),
                format!("{url}?replicas=1"),
            ),
        ] {
            let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(servers.clone());
            out.push((what, Arc::new((url, keep))));
        }
    }
    if let Some(set) = tenure_testkit::RedisCluster::start_or_skip() {
        let url = set.url_not_at("{tenure}");
        let servers: Arc<Box<dyn std::any::Any + Send + Sync>> = Arc::new(Box::new(set));
        for (what, url) in [
            ("on Cluster".to_string(), url.clone()),
            (
                "on Cluster replicas=1".to_string(),
                format!("{url}?replicas=1"),
            ),
        ] {
            let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(servers.clone());
            out.push((what, Arc::new((url, keep))));
        }
    }
    out
}

/// A runner of `f` on a copy of `arg` of its own for each run (a URL, the
/// nodes' URLs), so that it borrows nothing.
fn owning<'a, T, F, Fut>(arg: T, f: F) -> Runner<'a>
where
    T: Clone + 'a,
    F: Fn(T, usize) -> Fut + 'a,
    Fut: Future<Output = Stats> + 'a,
{
    runner(move |n| f(arg.clone(), n))
}

/// The `redis://` URL of each node of a `redlock://` URL of the test kit's
/// (no TLS, no password).
fn redlock_nodes(url: &str) -> Vec<String> {
    let rest = url.trim_start_matches("redlock://");
    let (hosts, db) = rest.split_once('/').unwrap_or((rest, "0"));
    hosts
        .split(',')
        .map(|host| format!("redis://{host}/{db}"))
        .collect()
}

/// Statements per operation (acquire, release, renew) of a SQLite store,
/// counted by SQLite's trace hook.
async fn sqlite_statements(sqlite: &Arc<dyn Store>) -> (u64, u64, u64) {
    let session = Session::new(sqlite).await.unwrap();
    let mutex = Mutex::new(&session, "count").unwrap();
    mutex.lock().await.unwrap().release().await.unwrap();
    let before = SqliteStore::statements_executed();
    let g = mutex.lock().await.unwrap();
    let acquire = SqliteStore::statements_executed() - before;
    let before = SqliteStore::statements_executed();
    g.release().await.unwrap();
    let release = SqliteStore::statements_executed() - before;
    let before = SqliteStore::statements_executed();
    session.renew().await.unwrap();
    let renew = SqliteStore::statements_executed() - before;
    session.close().await.unwrap();
    (acquire, release, renew)
}

/// A store the bench started and measured uncontended, kept for its
/// contended rows.
struct Started {
    fixture: &'static StoreFixture,
    /// Keeps the store's server running.
    _running: Running,
    store: Arc<dyn Store>,
    /// Its peers' contended runners and the rounds per contender.
    contended: Vec<Runner<'static>>,
    contended_rounds: usize,
}

/// How long the thousand contenders' rows may take, per store and lock.
const THOUSAND_BUDGET: Duration = Duration::from_secs(20);

fn main() {
    let cycles: usize = std::env::var("BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    // BENCH_ONLY=redis,postgres runs just those backends (memory and SQLite
    // always run: they need no server).
    let only = std::env::var("BENCH_ONLY").ok();
    let want = |backend: &str| {
        only.as_deref()
            .is_none_or(|list| list.split(',').any(|b| b.trim() == backend))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BENCH_URL=<store URL> runs only tenure's rows against a server of
    // one's own (one started with its profiling on: pg_stat_statements,
    // performance_schema…), and prints them; no floor, no server CPU.
    if let Ok(url) = std::env::var("BENCH_URL") {
        let rows = rt.block_on(async {
            let store = tenure::open(&url).await.unwrap();
            // BENCH_URL_ROWS=contended: that row alone; =fairness: the fair
            // and non-fair contended rows at 16 and 1,000 contenders.
            let mut rows = Vec::new();
            if std::env::var("BENCH_URL_ROWS").as_deref() == Ok("fairness") {
                let rounds = (cycles / 16).max(5);
                for fair in [true, false] {
                    rows.push(contended_kind(&store, 16, rounds, fair, None).await);
                }
                for fair in [true, false] {
                    let budget = Some(THOUSAND_BUDGET);
                    rows.push(contended_kind(&store, 1000, 1, fair, budget).await);
                }
                return rows;
            }
            if std::env::var("BENCH_URL_ROWS").as_deref() != Ok("contended") {
                rows.push(uncontended(&store, cycles).await);
            }
            rows.push(contended(&store, 16, (cycles / 64).max(5)).await);
            rows
        });
        for r in &rows {
            println!(
                "{:<58} {:>10} {:>12.0} {:>10.1} {:>10.1} {:>8.1}",
                r.label,
                r.cycles(),
                r.per_sec(),
                r.percentile_us(0.50),
                r.percentile_us(0.99),
                r.ops_per_grant.unwrap_or(f64::NAN)
            );
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (rows, (acquire, release, renew)) = rt.block_on(async {
        let mut rows = Vec::new();
        let mut statements = (0, 0, 0);
        // Every store's uncontended rows, store by store in the table's
        // order; each store's server runs on through the contended rows.
        let mut started = Vec::new();
        for fixture in STORES {
            // Memory and SQLite always run: they need no server.
            if !fixture.packages.is_empty() && !want(fixture.backend) {
                continue;
            }
            let Some(running) = (fixture.start)() else {
                eprintln!(
                    "{}'s server is not installed: no {} rows",
                    fixture.backend, fixture.backend
                );
                continue;
            };
            let store = tenure::open(&running.url).await.unwrap();
            if fixture.backend == "sqlite" {
                statements = sqlite_statements(&store).await;
            }
            let Extras {
                uncontended: more,
                contended: peers,
                contended_rounds,
            } = extras(fixture.backend, &running.url, &store, dir.path(), cycles);
            measure_server(fixture.server_process);
            // BENCH_CONTENDED_ONLY=1: the contended rows alone.
            if std::env::var_os("BENCH_CONTENDED_ONLY").is_none() {
                let mut runners = vec![
                    runner(|n| uncontended(&store, n)),
                    runner(|n| uncontended_unfair(&store, n)),
                ];
                runners.extend(more);
                rows.extend(interleaved(cycles, runners).await);
            }
            started.push(Started {
                fixture,
                _running: running,
                store,
                contended: peers,
                contended_rounds,
            });
        }
        for mut s in started {
            measure_server(s.fixture.server_process);
            // The fair and non-fair lock at 16 contenders in turns taken
            // in order, each turn as many rounds as one run used to take.
            let store = &s.store;
            let rounds = s.contended_rounds;
            let both = vec![
                runner(move |n| contended(store, 16, n)),
                runner(move |n| contended_unfair(store, 16, n)),
            ];
            rows.extend(interleaved(rounds * TURNS, both).await);
            // Store operations per grant as waiters grow: one contender
            // (as many grants as the 16 take), and a thousand, each once,
            // within a budget.
            for fair in [true, false] {
                let grants = 16 * s.contended_rounds;
                rows.push(contended_kind(&s.store, 1, grants, fair, None).await);
                // A ZooKeeper session is a connection, and the server takes
                // 60 from one address (tenure's store stops at 50).
                if s.fixture.backend == "zookeeper" {
                    eprintln!(
                        "zookeeper: no row of a thousand contenders (a session per connection)"
                    );
                    continue;
                }
                rows.push(contended_kind(&s.store, 1000, 1, fair, Some(THOUSAND_BUDGET)).await);
            }
            for peer in &mut s.contended {
                rows.push(peer(s.contended_rounds).await);
            }
        }
        (rows, statements)
    });
    // Each backend's uncontended cycle is compared with its own floor.
    let floor_of = |backend: &str| {
        rows.iter()
            .find(|r| r.label.starts_with(backend) && r.label.contains("floor"))
    };
    println!(
        "{:<58} {:>10} {:>12} {:>10} {:>10} {:>9} {:>10} {:>9}",
        "run", "cycles", "cycles/s", "p50 µs", "p99 µs", "vs floor", "server µs", "ops/grant"
    );
    let mut ratios = serde_json::Map::new();
    let mut peers = serde_json::Map::new();
    for r in &rows {
        let backend = r.label.split(' ').next().unwrap_or("");
        let ratio = match floor_of(backend) {
            Some(floor) if !r.label.contains("contenders") => {
                let median = ratio_to_floor(r, floor);
                if r.label.contains("non-fair") {
                    ratios.insert(format!("{backend} non-fair"), serde_json::json!(median));
                } else if r.label == format!("{backend} tenure") {
                    ratios.insert(backend.to_string(), serde_json::json!(median));
                } else if r.label.starts_with(&format!("{backend} tenure")) {
                    // Another deployment of the backend (Sentinel, Cluster).
                    ratios.insert(r.label.clone(), serde_json::json!(median));
                } else if r.label.contains("peer") {
                    peers.insert(r.label.clone(), serde_json::json!(median));
                }
                format!("{median:.2}×")
            }
            _ => "-".into(),
        };
        println!(
            "{:<58} {:>10} {:>12.0} {:>10.1} {:>10.1} {:>9} {:>10} {:>9}",
            r.label,
            r.cycles(),
            r.per_sec(),
            r.percentile_us(0.50),
            r.percentile_us(0.99),
            ratio,
            r.server_us().map_or("-".into(), |us| format!("{us:.1}")),
            r.ops_per_grant.map_or("-".into(), |n| format!("{n:.1}"))
        );
    }
    // SQLite's tenure rows against the floor checkpointed as tenure is.
    let mut sqlite_checkpointed = serde_json::Map::new();
    if let Some(floor) = rows
        .iter()
        .find(|r| r.label.contains("checkpointed by a thread"))
    {
        for r in rows
            .iter()
            .filter(|r| r.label.starts_with("sqlite tenure") && !r.label.contains("contenders"))
        {
            let median = ratio_to_floor(r, floor);
            println!(
                "{} vs the floor checkpointed by a thread: {median:.2}×",
                r.label
            );
            sqlite_checkpointed.insert(r.label.clone(), serde_json::json!(median));
        }
    }
    println!("sqlite statements per operation: acquire {acquire}, release {release}, renew {renew} (BEGIN/COMMIT included)");
    let json = serde_json::json!({
        "bench": "cycle",
        "cycles": cycles,
        "machine": { "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0) },
        "runs": rows.iter().map(|r| serde_json::json!({
            "run": r.label, "cycles": r.cycles(), "per_sec": r.per_sec(),
            "p50_us": r.percentile_us(0.50), "p99_us": r.percentile_us(0.99),
            "server_cpu_us_per_cycle": r.server_us(),
            "store_ops_per_grant": r.ops_per_grant,
            "turns_per_sec": r.turns,
        })).collect::<Vec<_>>(),
        "sqlite_statements": { "acquire": acquire, "release": release, "renew": renew },
        // Medians over the turns of each turn's ratio (see `ratio_to_floor`).
        "uncontended_cycle_vs_floor": ratios,
        "peers_uncontended_cycle_vs_floor": peers,
        "sqlite_vs_floor_checkpointed_by_a_thread": sqlite_checkpointed,
    });
    let out = std::env::var("BENCH_OUT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/results/cycle.json").to_string());
    if let Some(parent) = std::path::Path::new(&out).parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("wrote {out}");
}
