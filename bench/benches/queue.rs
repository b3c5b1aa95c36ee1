//! Queue-depth bench: how the cost of operations on one lock name grows with
//! the number of waiters queued on it, per backend.
//!
//! For each backend and each queue size N (`QUEUE_SIZES`, default
//! `0,16,256,1024`), on a fresh store and a fresh name `q-{N}`:
//!
//! 1. a holder session (TTL 30 s) takes `Mutex "q-{N}"`; N waiter sessions
//!    (TTL 30 s) each call `lock()` on it from a task of their own, which on
//!    grant notes the instant, releases at once and ends; the bench waits (at
//!    most 60 s, or until 10 reads in a row fail) until `Store::queue` shows
//!    N + 1 entries;
//! 2. idle: after a 1 s settle, the server's CPU over 2 s with nobody doing
//!    anything but the waiters' own background work (polls, renewals);
//! 3. probes from a separate session: `try_lock()` on `q-{N}` (must answer
//!    `None`) and lock + release of an unrelated name `free-{N}`, each at most
//!    200 operations or 3 s; median latency and the server's CPU per
//!    operation (the waiters' background load in that span included: the idle
//!    column gives its rate);
//! 4. handoff: the holder releases; the time from the release to the 16th
//!    grant (the Nth when N < 16), per handoff, and the server's CPU per
//!    handoff over that span (at most 30 s, else "timed out");
//! 5. teardown: the waiter tasks are aborted and every session is closed
//!    (bounded).
//!
//! "Server CPU" is the CPU time (Linux `schedstat`) of this process's child
//! server processes with the backend's process name; memory and SQLite have
//! no server, so their rows show the client's CPU only (the bench process's
//! own threads, in-process store included).
//!
//! Run: `cargo bench --manifest-path bench/Cargo.toml --bench queue`.
//! `QUEUE_SIZES=0,16` sets the queue sizes, `BENCH_ONLY=redis,postgres` runs
//! only those server backends (memory and SQLite always run, as in the cycle
//! bench), `BENCH_OUT` sets the JSON's path (default `bench/results/queue.json`),
//! `QUEUE_BUDGET_S` the bench's time budget (default 900 s), `QUEUE_TURNS`
//! the turns over all sizes per backend (default 3; each figure is the
//! median of the turns). Each backend gets an even share of what is left (at least 30 s) and starts no new size
//! past it. A size that runs into the queue-fill or the handoff limit skips
//! the backend's larger sizes. A row already started runs to its own bounds.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure::{Mutex, Name, Session, SessionOptions, Store};
use tokio::time::timeout;

use common::{process_cpu_ns, server_cpu_ns};
use tenure_testkit::stores::{StoreFixture, STORES};

/// Every session's TTL (`QUEUE_TTL_S` overrides it: renewals of N sessions
/// come N / (TTL / 3) times a second, a load of their own).
fn ttl() -> Duration {
    std::env::var("QUEUE_TTL_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(30))
}
const QUEUE_FILL_LIMIT: Duration = Duration::from_secs(60);
/// The wait for the queue to fill gives up after this many failed reads in
/// a row (etcd's `queue` can fail for good on a long queue).
const QUEUE_ERRORS_IN_A_ROW: usize = 10;
const OPEN_LIMIT: Duration = Duration::from_secs(60);
const IDLE_SETTLE: Duration = Duration::from_secs(1);
const IDLE_SPAN: Duration = Duration::from_secs(2);
const PROBE_OPS: usize = 200;
const PROBE_SPAN: Duration = Duration::from_secs(3);
const OP_LIMIT: Duration = Duration::from_secs(3);
const HANDOFFS: usize = 16;
const HANDOFF_LIMIT: Duration = Duration::from_secs(30);
const TEARDOWN_LIMIT: Duration = Duration::from_secs(60);
/// Sessions opened (and closed) at once.
const BATCH: usize = 32;

/// A point to measure from: wall clock, the server's CPU and the client's.
struct Mark {
    wall: Instant,
    server: Option<u64>,
    client: u64,
}

/// What passed since a [`Mark`].
struct Span {
    wall: Duration,
    server_ns: Option<u64>,
    client_ns: u64,
}

impl Mark {
    fn now(comm: Option<&str>) -> Mark {
        Mark {
            server: server_cpu_ns(comm),
            client: process_cpu_ns("self"),
            wall: Instant::now(),
        }
    }

    fn since(&self, comm: Option<&str>) -> Span {
        let wall = self.wall.elapsed();
        Span {
            wall,
            server_ns: self
                .server
                .zip(server_cpu_ns(comm))
                .map(|(a, b)| b.saturating_sub(a)),
            client_ns: process_cpu_ns("self").saturating_sub(self.client),
        }
    }
}

/// A store call (or any fallible future) under a time limit, its error as
/// text.
async fn within<T, E: std::fmt::Display>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: timed out after {limit:?}")),
    }
}

fn median_ms(samples: &mut [Duration]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    samples.sort();
    Some(samples[samples.len() / 2].as_secs_f64() * 1e3)
}

/// One bounded probe run.
#[derive(Default)]
struct Probe {
    ops: usize,
    median_ms: Option<f64>,
    server_us_per_op: Option<f64>,
    error: Option<String>,
}

impl Probe {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "ops": self.ops,
            "median_ms": self.median_ms,
            "server_cpu_us_per_op": self.server_us_per_op,
            "error": self.error,
        })
    }
}

#[derive(Default)]
struct Row {
    backend: String,
    n: usize,
    /// Entries the queue showed when the wait for N + 1 ended.
    queued: Option<usize>,
    queue_fill_s: Option<f64>,
    idle_server_ms_per_s: Option<f64>,
    idle_client_ms_per_s: Option<f64>,
    try_lock: Option<Probe>,
    free_cycle: Option<Probe>,
    /// Grants counted, ms per handoff, server CPU ms per handoff.
    handoffs: usize,
    handoff_ms: Option<f64>,
    handoff_server_ms: Option<f64>,
    handoff_error: Option<String>,
    /// An error that ended the row early (opening sessions, taking the lock).
    error: Option<String>,
    notes: Vec<String>,
    /// The row ran into the queue-fill or the handoff time limit: the
    /// backend's larger sizes are skipped.
    hit_limit: bool,
    wall_s: f64,
}

impl Row {
    fn new(backend: &str, n: usize) -> Row {
        Row {
            backend: backend.to_string(),
            n,
            ..Row::default()
        }
    }
}

/// Opens `count` sessions, `BATCH` at a time, within `OPEN_LIMIT`; on the
/// first failure returns those opened so far and the error.
async fn open_sessions(store: &Arc<dyn Store>, count: usize) -> (Vec<Session>, Option<String>) {
    let started = Instant::now();
    let mut sessions = Vec::with_capacity(count);
    while sessions.len() < count {
        let left = OPEN_LIMIT.saturating_sub(started.elapsed());
        if left.is_zero() {
            let error = format!(
                "opening waiter sessions: only {} of {count} opened in {OPEN_LIMIT:?}",
                sessions.len()
            );
            return (sessions, Some(error));
        }
        let batch = BATCH.min(count - sessions.len());
        let opened = futures_util::future::join_all((0..batch).map(|_| {
            within(
                left.min(Duration::from_secs(30)),
                "opening a waiter session",
                Session::with_options(store, SessionOptions::new().ttl(ttl())),
            )
        }))
        .await;
        let mut error = None;
        for result in opened {
            match result {
                Ok(session) => sessions.push(session),
                Err(e) => error = error.or(Some(e)),
            }
        }
        if let Some(e) = error {
            let e = format!("{e} (after {} of {count} opened)", sessions.len());
            return (sessions, Some(e));
        }
    }
    (sessions, None)
}

/// Closes every session, `BATCH` at a time, within `TEARDOWN_LIMIT`.
/// Returns a note if some could not be closed.
async fn close_sessions(sessions: Vec<Session>) -> Option<String> {
    let started = Instant::now();
    let total = sessions.len();
    let mut failed = 0;
    let mut first_error = None;
    let mut left_over = 0;
    for chunk in sessions.chunks(BATCH) {
        let left = TEARDOWN_LIMIT.saturating_sub(started.elapsed());
        if left.is_zero() {
            left_over += chunk.len();
            continue;
        }
        let results = futures_util::future::join_all(
            chunk
                .iter()
                .map(|s| within(left.min(Duration::from_secs(10)), "close", s.close())),
        )
        .await;
        for r in results {
            if let Err(e) = r {
                failed += 1;
                first_error = first_error.or(Some(e));
            }
        }
    }
    (failed > 0 || left_over > 0).then(|| {
        format!(
            "teardown: {failed} of {total} closes failed ({}), {left_over} not tried within {TEARDOWN_LIMIT:?}",
            first_error.unwrap_or_default()
        )
    })
}

/// `try_lock()` on the held name, at most `PROBE_OPS` or `PROBE_SPAN`.
async fn probe_try_lock(session: &Session, name: &str, comm: Option<&str>) -> Probe {
    let mut probe = Probe::default();
    let mutex = match Mutex::new(session, name) {
        Ok(m) => m,
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    let mut samples = Vec::new();
    let mark = Mark::now(comm);
    while samples.len() < PROBE_OPS && mark.wall.elapsed() < PROBE_SPAN {
        let t = Instant::now();
        match within(OP_LIMIT, "try_lock", mutex.try_lock()).await {
            Ok(None) => samples.push(t.elapsed()),
            Ok(Some(guard)) => {
                probe.error = Some("try_lock granted a held lock".into());
                let _ = within(OP_LIMIT, "release", guard.release()).await;
                break;
            }
            Err(e) => {
                probe.error = Some(e);
                break;
            }
        }
    }
    let span = mark.since(comm);
    probe.ops = samples.len();
    probe.server_us_per_op = span
        .server_ns
        .filter(|_| probe.ops > 0)
        .map(|ns| ns as f64 / 1e3 / probe.ops as f64);
    probe.median_ms = median_ms(&mut samples);
    probe
}

/// lock + release of an unrelated free name, at most `PROBE_OPS` or
/// `PROBE_SPAN`.
async fn probe_free_cycle(session: &Session, name: &str, comm: Option<&str>) -> Probe {
    let mut probe = Probe::default();
    let mutex = match Mutex::new(session, name) {
        Ok(m) => m,
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    let mut samples = Vec::new();
    let mark = Mark::now(comm);
    while samples.len() < PROBE_OPS && mark.wall.elapsed() < PROBE_SPAN {
        let t = Instant::now();
        let guard = match within(OP_LIMIT, "lock (free name)", mutex.lock()).await {
            Ok(g) => g,
            Err(e) => {
                probe.error = Some(e);
                break;
            }
        };
        if let Err(e) = within(OP_LIMIT, "release (free name)", guard.release()).await {
            probe.error = Some(e);
            break;
        }
        samples.push(t.elapsed());
    }
    let span = mark.since(comm);
    probe.ops = samples.len();
    probe.server_us_per_op = span
        .server_ns
        .filter(|_| probe.ops > 0)
        .map(|ns| ns as f64 / 1e3 / probe.ops as f64);
    probe.median_ms = median_ms(&mut samples);
    probe
}

/// What a waiter task reports: its grant instant, or why it got none.
type Report = Result<Instant, String>;

/// One row: a fresh store, N waiters on `q-{n}`, the measurements, teardown.
async fn run_row(url: &str, backend: &str, comm: Option<&str>, n: usize) -> Row {
    let started = Instant::now();
    let mut row = Row::new(backend, n);
    let store = match within(
        Duration::from_secs(30),
        "opening the store",
        tenure::open(url),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            row.error = Some(e);
            return row;
        }
    };
    let q = format!("q-{n}");
    let free = format!("free-{n}");
    let mut sessions: Vec<Session> = Vec::new();
    let mut tasks = Vec::new();
    measure_row(
        &store,
        comm,
        n,
        &q,
        &free,
        &mut row,
        &mut sessions,
        &mut tasks,
    )
    .await;
    // Teardown: the waiters first, then every session.
    for task in &tasks {
        task.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for task in tasks {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = timeout(left, task).await;
    }
    if let Some(note) = close_sessions(sessions).await {
        row.notes.push(note);
    }
    drop(store);
    row.wall_s = started.elapsed().as_secs_f64();
    row
}

#[allow(clippy::too_many_arguments)]
async fn measure_row(
    store: &Arc<dyn Store>,
    comm: Option<&str>,
    n: usize,
    q: &str,
    free: &str,
    row: &mut Row,
    sessions: &mut Vec<Session>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    // 1. The holder, then N waiters.
    let holder = match within(
        Duration::from_secs(30),
        "opening the holder session",
        Session::with_options(store, SessionOptions::new().ttl(ttl())),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            row.error = Some(e);
            return;
        }
    };
    sessions.push(holder.clone());
    let held = match Mutex::new(&holder, q) {
        Ok(m) => within(Duration::from_secs(10), "holder lock", m.lock()).await,
        Err(e) => Err(e.to_string()),
    };
    let held = match held {
        Ok(g) => g,
        Err(e) => {
            row.error = Some(e);
            return;
        }
    };
    let fill = Instant::now();
    let (waiters, error) = open_sessions(store, n).await;
    sessions.extend(waiters.iter().cloned());
    if let Some(e) = error {
        row.error = Some(e);
        return;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Report>();
    for session in waiters {
        let tx = tx.clone();
        let q = q.to_string();
        tasks.push(tokio::spawn(async move {
            let mutex = match Mutex::new(&session, &q) {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            match within(Duration::from_secs(600), "waiter lock", mutex.lock()).await {
                Ok(guard) => {
                    let _ = tx.send(Ok(Instant::now()));
                    if let Err(e) =
                        within(Duration::from_secs(10), "waiter release", guard.release()).await
                    {
                        let _ = tx.send(Err(e));
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }));
    }
    drop(tx);
    let name = Name::new(q).expect("a valid name");
    let mut seen = None;
    let mut last_error = None;
    let mut errors_in_a_row = 0;
    while fill.elapsed() < QUEUE_FILL_LIMIT && errors_in_a_row < QUEUE_ERRORS_IN_A_ROW {
        match within(Duration::from_secs(5), "queue", store.queue(&name)).await {
            Ok(queue) => {
                errors_in_a_row = 0;
                seen = Some(queue.entries.len());
                if queue.entries.len() > n {
                    break;
                }
            }
            Err(e) => {
                errors_in_a_row += 1;
                last_error = Some(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    row.queued = seen;
    row.queue_fill_s = Some(fill.elapsed().as_secs_f64());
    if seen.is_none_or(|k| k < n + 1) {
        let why = if errors_in_a_row >= QUEUE_ERRORS_IN_A_ROW {
            format!("{errors_in_a_row} queue reads failed in a row")
        } else {
            row.hit_limit = true;
            format!("{QUEUE_FILL_LIMIT:?} passed")
        };
        row.notes.push(format!(
            "queue showed {} of {} entries when {why}{}",
            seen.map_or("?".into(), |k| k.to_string()),
            n + 1,
            last_error
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        ));
    }
    // Early reports (there should be none: the holder holds).
    let mut early_grants = 0;
    let mut waiter_errors = Vec::new();
    while let Ok(report) = rx.try_recv() {
        match report {
            Ok(_) => early_grants += 1,
            Err(e) => waiter_errors.push(e),
        }
    }
    if early_grants > 0 {
        row.notes.push(format!(
            "{early_grants} waiters were granted while the holder held"
        ));
    }

    // 2. Idle.
    tokio::time::sleep(IDLE_SETTLE).await;
    let mark = Mark::now(comm);
    tokio::time::sleep(IDLE_SPAN).await;
    let idle = mark.since(comm);
    let secs = idle.wall.as_secs_f64();
    row.idle_server_ms_per_s = idle.server_ns.map(|ns| ns as f64 / 1e6 / secs);
    row.idle_client_ms_per_s = Some(idle.client_ns as f64 / 1e6 / secs);

    // 3. Probes from a separate session.
    match within(
        Duration::from_secs(30),
        "opening the probe session",
        Session::with_options(store, SessionOptions::new().ttl(ttl())),
    )
    .await
    {
        Ok(probe) => {
            sessions.push(probe.clone());
            row.try_lock = Some(probe_try_lock(&probe, q, comm).await);
            row.free_cycle = Some(probe_free_cycle(&probe, free, comm).await);
        }
        Err(e) => row.notes.push(e),
    }

    // 4. Handoff: from the holder's release to the 16th grant.
    let target = HANDOFFS.min(n);
    let mark = Mark::now(comm);
    if let Err(e) = within(Duration::from_secs(10), "holder release", held.release()).await {
        row.handoff_error = Some(e);
        return;
    }
    if target == 0 {
        return;
    }
    let deadline = tokio::time::Instant::now() + HANDOFF_LIMIT;
    let mut granted = 0;
    let mut last_grant = None;
    while granted < target {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Ok(at))) => {
                granted += 1;
                last_grant = Some(at);
            }
            Ok(Some(Err(e))) => waiter_errors.push(e),
            Ok(None) => break,
            Err(_) => break,
        }
    }
    let span = mark.since(comm);
    row.handoffs = granted;
    if granted < target {
        row.hit_limit = true;
        row.handoff_error = Some(format!(
            "timed out: {granted} of {target} grants in {HANDOFF_LIMIT:?}"
        ));
    } else if let Some(at) = last_grant {
        let wall = at.saturating_duration_since(mark.wall);
        row.handoff_ms = Some(wall.as_secs_f64() * 1e3 / granted as f64);
        row.handoff_server_ms = span.server_ns.map(|ns| ns as f64 / 1e6 / granted as f64);
    }
    while let Ok(report) = rx.try_recv() {
        if let Err(e) = report {
            waiter_errors.push(e);
        }
    }
    if let Some(first) = waiter_errors.first() {
        row.notes.push(format!(
            "{} waiter errors, first: {first}",
            waiter_errors.len()
        ));
    }
}

/// Every size for one backend, each row on a fresh store.
async fn run_backend(
    rows: &mut Vec<Row>,
    backend: &str,
    url: &str,
    comm: Option<&str>,
    sizes: &[usize],
    budget: &Budget,
) {
    let share = budget.share();
    let started = Instant::now();
    let mut stop: Option<String> = None;
    // Turns over all sizes in order (0, 16, 256, 1,024, 0, 16, …), so that a
    // slow spell of the machine falls on every size alike; each row reports
    // the median of its turns.
    let mut turns: Vec<Vec<Row>> = sizes.iter().map(|_| Vec::new()).collect();
    for turn in 0..queue_turns() {
        for (slot, &n) in turns.iter_mut().zip(sizes) {
            if stop.is_none() && started.elapsed() >= share {
                stop = Some(format!(
                    "skipped: {backend}'s share of the time budget ({share:.0?}) is spent"
                ));
            }
            if let Some(why) = &stop {
                if slot.is_empty() {
                    let mut row = Row::new(backend, n);
                    row.error = Some(why.clone());
                    slot.push(row);
                }
                continue;
            }
            eprintln!("queue bench: {backend} N={n} turn {} ...", turn + 1);
            let row = run_row(url, backend, comm, n).await;
            if row.hit_limit {
                stop = Some(format!("skipped: N={n} ran into a time limit"));
            }
            eprintln!(
                "queue bench: {backend} N={n} done in {:.1} s{}",
                row.wall_s,
                row.error
                    .as_deref()
                    .map(|e| format!(" (error: {e})"))
                    .unwrap_or_default()
            );
            slot.push(row);
        }
    }
    rows.extend(turns.into_iter().map(merge_turns));
}

/// How many turns each backend takes over all sizes (`QUEUE_TURNS`, default 3).
fn queue_turns() -> usize {
    std::env::var("QUEUE_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1)
}

/// The median of the values some turns measured.
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut v: Vec<f64> = values.flatten().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// One row from the turns of one size: each figure the median of its turns,
/// the notes and errors of all of them.
fn merge_turns(mut turns: Vec<Row>) -> Row {
    if turns.len() <= 1 {
        return turns.pop().unwrap_or_default();
    }
    let probe = |pick: fn(&Row) -> Option<&Probe>, turns: &[Row]| -> Option<Probe> {
        let probes: Vec<&Probe> = turns.iter().filter_map(pick).collect();
        if probes.is_empty() {
            return None;
        }
        Some(Probe {
            ops: probes.iter().map(|p| p.ops).sum(),
            median_ms: median_of(probes.iter().map(|p| p.median_ms)),
            server_us_per_op: median_of(probes.iter().map(|p| p.server_us_per_op)),
            error: probes.iter().find_map(|p| p.error.clone()),
        })
    };
    let mut row = Row::new(&turns[0].backend, turns[0].n);
    row.queued = turns.iter().filter_map(|r| r.queued).min();
    row.queue_fill_s = median_of(turns.iter().map(|r| r.queue_fill_s));
    row.idle_server_ms_per_s = median_of(turns.iter().map(|r| r.idle_server_ms_per_s));
    row.idle_client_ms_per_s = median_of(turns.iter().map(|r| r.idle_client_ms_per_s));
    row.try_lock = probe(|r| r.try_lock.as_ref(), &turns);
    row.free_cycle = probe(|r| r.free_cycle.as_ref(), &turns);
    row.handoffs = turns.iter().map(|r| r.handoffs).sum();
    row.handoff_ms = median_of(turns.iter().map(|r| r.handoff_ms));
    row.handoff_server_ms = median_of(turns.iter().map(|r| r.handoff_server_ms));
    row.handoff_error = turns.iter().find_map(|r| r.handoff_error.clone());
    row.error = turns
        .iter()
        .all(|r| r.error.is_some())
        .then(|| turns[0].error.clone())
        .flatten();
    row.notes = turns.iter().flat_map(|r| r.notes.clone()).collect();
    row.hit_limit = turns.iter().any(|r| r.hit_limit);
    row.wall_s = turns.iter().map(|r| r.wall_s).sum();
    row
}

/// The bench's time: each backend gets an even share of what is left
/// (at least `MIN_SHARE`) and starts no new size once its share is spent.
struct Budget {
    started: Instant,
    limit: Duration,
    backends: usize,
    begun: std::cell::Cell<usize>,
}

const MIN_SHARE: Duration = Duration::from_secs(30);

impl Budget {
    /// The share of the next backend to run.
    fn share(&self) -> Duration {
        let left = self.backends.saturating_sub(self.begun.get()).max(1);
        self.begun.set(self.begun.get() + 1);
        (self.limit.saturating_sub(self.started.elapsed()) / left as u32).max(MIN_SHARE)
    }
}

/// The URL the bench opens a store at, given the test kit's `url`: the one
/// place that knows a store's own needs here.
fn queue_url(backend: &str, url: &str) -> String {
    match backend {
        // One connection per session: the test kit's server takes any
        // number (maxClientCnxns=0), and the URL lifts the store's own
        // default cap of 50.
        "zookeeper" => format!("{url}?max_sessions=0"),
        _ => url.to_string(),
    }
}

/// The first of a store's packages that is not installed (its first one
/// when they all are).
fn missing_package(store: &StoreFixture) -> &'static str {
    store
        .packages
        .iter()
        .find(|p| !p.is_installed())
        .or(store.packages.first())
        .map_or(store.backend, |p| p.name)
}

fn missing_rows(rows: &mut Vec<Row>, backend: &str, sizes: &[usize], why: &str) {
    for &n in sizes {
        let mut row = Row::new(backend, n);
        row.error = Some(why.to_string());
        rows.push(row);
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn main() {
    let sizes: Vec<usize> = std::env::var("QUEUE_SIZES")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![0, 16, 256, 1024]);
    // BENCH_ONLY=redis,postgres runs just those server backends (memory and
    // SQLite always run: they need no server).
    let only = std::env::var("BENCH_ONLY").ok();
    let wanted = |store: &StoreFixture| {
        store.packages.is_empty()
            || only
                .as_deref()
                .is_none_or(|list| list.split(',').any(|b| b.trim() == store.backend))
    };
    let budget = Budget {
        started: Instant::now(),
        limit: Duration::from_secs(
            std::env::var("QUEUE_BUDGET_S")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(900),
        ),
        backends: STORES.iter().filter(|s| wanted(s)).count(),
        begun: std::cell::Cell::new(0),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for fixture in STORES.iter().filter(|s| wanted(s)) {
            // Each store's server runs through its rows alone.
            match (fixture.start)() {
                Some(running) => {
                    run_backend(
                        &mut rows,
                        fixture.backend,
                        &queue_url(fixture.backend, &running.url),
                        fixture.server_process,
                        &sizes,
                        &budget,
                    )
                    .await
                }
                None => missing_rows(
                    &mut rows,
                    fixture.backend,
                    &sizes,
                    &format!("{} is not installed", missing_package(fixture)),
                ),
            }
        }
        rows
    });
    // Background tasks of dropped stores and sessions end with the runtime.
    rt.shutdown_timeout(Duration::from_secs(5));
    let total = budget.started.elapsed();

    println!(
        "each figure is the median of {} turns over all sizes, taken in order",
        queue_turns()
    );
    println!(
        "{:<10} {:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10}",
        "backend",
        "N",
        "queued s",
        "try ms",
        "try srv µs",
        "free ms",
        "free srv µs",
        "handoff ms",
        "srv ms/hand",
        "idle srv",
        "idle cli"
    );
    println!(
        "{:<10} {:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10}",
        "", "", "", "(median)", "per op", "(median)", "per op", "", "", "ms/s", "ms/s"
    );
    for r in &rows {
        if let Some(e) = &r.error {
            println!("{:<10} {:>5} error: {e}", r.backend, r.n);
            for note in &r.notes {
                println!("{:<10} {:>5}   note: {note}", "", "");
            }
            continue;
        }
        let probe = |p: &Option<Probe>| match p {
            Some(p) if p.error.is_some() && p.ops == 0 => ("failed".to_string(), "-".to_string()),
            Some(p) => (fmt_opt(p.median_ms, 3), fmt_opt(p.server_us_per_op, 1)),
            None => ("-".into(), "-".into()),
        };
        let (try_ms, try_srv) = probe(&r.try_lock);
        let (free_ms, free_srv) = probe(&r.free_cycle);
        let handoff = match (&r.handoff_error, r.handoff_ms) {
            (Some(e), _) if e.starts_with("timed out") => "timed out".to_string(),
            (Some(_), _) => "failed".to_string(),
            (None, ms) => fmt_opt(ms, 3),
        };
        println!(
            "{:<10} {:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10}",
            r.backend,
            r.n,
            fmt_opt(r.queue_fill_s, 2),
            try_ms,
            try_srv,
            free_ms,
            free_srv,
            handoff,
            fmt_opt(r.handoff_server_ms, 3),
            fmt_opt(r.idle_server_ms_per_s, 1),
            fmt_opt(r.idle_client_ms_per_s, 1),
        );
        let mut notes = r.notes.clone();
        for (what, p) in [("try_lock", &r.try_lock), ("free cycle", &r.free_cycle)] {
            if let Some(p) = p {
                if let Some(e) = &p.error {
                    notes.push(format!("{what} probe stopped after {} ops: {e}", p.ops));
                } else if p.ops < PROBE_OPS {
                    notes.push(format!("{what} probe: {} ops in {PROBE_SPAN:?}", p.ops));
                }
            }
        }
        if let Some(e) = &r.handoff_error {
            notes.push(format!("handoff: {e}"));
        }
        for note in notes {
            println!("{:<10} {:>5}   note: {note}", "", "");
        }
    }
    println!("total {:.1} s", total.as_secs_f64());

    let json = serde_json::json!({
        "bench": "queue",
        "sizes": sizes,
        "total_s": total.as_secs_f64(),
        "machine": { "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0) },
        "rows": rows.iter().map(|r| serde_json::json!({
            "backend": r.backend,
            "n": r.n,
            "error": r.error,
            "queued_entries": r.queued,
            "queue_fill_s": r.queue_fill_s,
            "idle_server_cpu_ms_per_s": r.idle_server_ms_per_s,
            "idle_client_cpu_ms_per_s": r.idle_client_ms_per_s,
            "try_lock": r.try_lock.as_ref().map(Probe::json),
            "free_cycle": r.free_cycle.as_ref().map(Probe::json),
            "handoffs": r.handoffs,
            "handoff_ms": r.handoff_ms,
            "handoff_server_cpu_ms": r.handoff_server_ms,
            "handoff_error": r.handoff_error,
            "notes": r.notes,
            "row_wall_s": r.wall_s,
        })).collect::<Vec<_>>(),
    });
    let out = std::env::var("BENCH_OUT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/results/queue.json").to_string());
    if let Some(parent) = std::path::Path::new(&out).parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("wrote {out}");
}
