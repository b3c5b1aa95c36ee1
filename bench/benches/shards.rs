//! The shards bench: how long a group of M members takes to settle on N
//! shards, and the store operations a rebalance costs (a join, a leave),
//! beside a hand-rolled baseline: one lock per shard, every member trying
//! every shard it does not hold, twice a second.
//!
//! Run: `cargo bench --manifest-path bench/Cargo.toml --bench shards`
//! (`BENCH_ONLY=memory,postgres`, `SHARDS_MEMBERS=3,10,50`,
//! `SHARDS_COUNTS=64,1024`, `SHARDS_URL_OPTIONS=node_timeout=1s`,
//! `BENCH_OUT=path.json`).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{Mutex, MutexGuard, Session, SessionOptions, ShardOwner, Shards, Store};
use tenure_testkit::counting::Counting;
use tenure_testkit::stores::{StoreFixture, STORES};
use tokio::time::Instant;

/// The longest a group may take to settle before the row says so.
const SETTLE_LIMIT: Duration = Duration::from_secs(90);

/// The baseline's round: every member tries every shard it lacks.
const ROUND: Duration = Duration::from_millis(500);

/// How long the baseline is watched after a join (it never rebalances).
const BASELINE_WATCH: Duration = Duration::from_secs(2);

#[derive(Default, Debug)]
struct Row {
    backend: String,
    scheme: &'static str,
    members: usize,
    shards: u32,
    first_settle_ms: Option<f64>,
    join_settle_ms: Option<f64>,
    join_ops: Option<u64>,
    join_moved: Option<usize>,
    /// After the join: the fewest and the most shards a member owns.
    join_balance: Option<(usize, usize)>,
    leave_settle_ms: Option<f64>,
    leave_ops: Option<u64>,
    leave_moved: Option<usize>,
    /// Store operations per second of a settled group, keep-alives apart.
    idle_ops_per_s: Option<f64>,
    error: Option<String>,
}

impl Row {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": self.backend,
            "scheme": self.scheme,
            "members": self.members,
            "shards": self.shards,
            "first_settle_ms": self.first_settle_ms,
            "join_settle_ms": self.join_settle_ms,
            "join_store_ops": self.join_ops,
            "join_moved": self.join_moved,
            "join_balance": self.join_balance.map(|(lo, hi)| [lo, hi]),
            "leave_settle_ms": self.leave_settle_ms,
            "leave_store_ops": self.leave_ops,
            "leave_moved": self.leave_moved,
            "idle_store_ops_per_s": self.idle_ops_per_s,
            "error": self.error,
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ten_seconds() -> SessionOptions {
    SessionOptions::new().ttl(Duration::from_secs(10))
}

/// Each shard's owner (a member id), once every owner is settled and the
/// shards are owned once each.
async fn settled(owners: &[&ShardOwner], shards: u32) -> Result<BTreeMap<u32, u64>, String> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        let all: Vec<_> = owners.iter().map(|o| (o.member_id(), o.status())).collect();
        let mut map = BTreeMap::new();
        let mut twice = false;
        for (id, status) in &all {
            for &s in &status.owned {
                twice |= map.insert(s, *id).is_some();
            }
        }
        if all.iter().all(|(_, s)| s.settled) && !twice && map.len() == shards as usize {
            return Ok(map);
        }
        if Instant::now() >= deadline {
            return Err(format!("not settled within {SETTLE_LIMIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn moved(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> usize {
    before
        .iter()
        .filter(|(s, owner)| after.get(s) != Some(owner))
        .count()
}

async fn join(
    store: &Arc<dyn Store>,
    group: &str,
    shards: u32,
) -> tenure::Result<(Session, ShardOwner)> {
    let session = Session::with_options(store, ten_seconds()).await?;
    let owner = Shards::new(&session, group, shards)?
        .grace(Duration::from_secs(1))
        .join()
        .await?;
    Ok((session, owner))
}

/// tenure's `Shards`: M members join at once and settle; one more joins;
/// the first leaves.
async fn tenure_row(url: &str, backend: &str, members: usize, shards: u32) -> Row {
    let mut row = Row {
        backend: backend.into(),
        scheme: "tenure Shards",
        members,
        shards,
        ..Row::default()
    };
    if let Err(e) = tenure_phases(&mut row, url).await {
        row.error = Some(e);
    }
    row
}

/// Whether a member's session ended during `phase`: then the row says so
/// (how many, and why), rather than measure a smaller group.
fn none_lost(all: &[(Session, ShardOwner)], phase: &str) -> Result<(), String> {
    let lost: Vec<_> = all.iter().filter_map(|(s, _)| s.lost_reason()).collect();
    match lost.first() {
        None => Ok(()),
        Some(reason) => Err(format!(
            "{} of {} sessions lost by the end of the {phase}: {reason}",
            lost.len(),
            all.len()
        )),
    }
}

async fn tenure_phases(row: &mut Row, url: &str) -> Result<(), String> {
    let counting = Counting::wrap(tenure::open(url).await.map_err(|e| e.to_string())?);
    let store: Arc<dyn Store> = counting.clone();
    let group = format!(
        "bench-shards-{}-{}-{}",
        row.members,
        row.shards,
        std::process::id()
    );
    let started = Instant::now();
    // All at once, as a fleet that starts together.
    let joining: Vec<_> = (0..row.members)
        .map(|_| {
            let (store, group, shards) = (store.clone(), group.clone(), row.shards);
            tokio::spawn(async move { join(&store, &group, shards).await })
        })
        .collect();
    let mut all: Vec<(Session, ShardOwner)> = Vec::new();
    for j in joining {
        all.push(
            j.await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?,
        );
    }
    let before = settled(&all.iter().map(|(_, o)| o).collect::<Vec<_>>(), row.shards).await?;
    row.first_settle_ms = Some(ms(started.elapsed()));
    none_lost(&all, "first settle")?;
    // Idle: a settled group, for two seconds.
    let ops = counting.calls();
    tokio::time::sleep(Duration::from_secs(2)).await;
    row.idle_ops_per_s = Some((counting.calls() - ops) as f64 / 2.0);
    none_lost(&all, "idle time")?;
    // A join.
    let (ops, at) = (counting.calls(), Instant::now());
    all.push(
        join(&store, &group, row.shards)
            .await
            .map_err(|e| e.to_string())?,
    );
    let after = settled(&all.iter().map(|(_, o)| o).collect::<Vec<_>>(), row.shards).await?;
    row.join_settle_ms = Some(ms(at.elapsed()));
    row.join_ops = Some(counting.calls() - ops);
    row.join_moved = Some(moved(&before, &after));
    let mut counts: BTreeMap<u64, usize> = all.iter().map(|(_, o)| (o.member_id(), 0)).collect();
    for owner in after.values() {
        *counts.entry(*owner).or_default() += 1;
    }
    row.join_balance = Some((
        counts.values().copied().min().unwrap_or(0),
        counts.values().copied().max().unwrap_or(0),
    ));
    none_lost(&all, "join")?;
    // A leave.
    let (ops, at) = (counting.calls(), Instant::now());
    let (session, first) = all.remove(0);
    first.leave().await.map_err(|e| e.to_string())?;
    let last = settled(&all.iter().map(|(_, o)| o).collect::<Vec<_>>(), row.shards).await?;
    row.leave_settle_ms = Some(ms(at.elapsed()));
    row.leave_ops = Some(counting.calls() - ops);
    row.leave_moved = Some(moved(&after, &last));
    let _ = session.close().await;
    for (session, owner) in all {
        let _ = owner.leave().await;
        let _ = session.close().await;
    }
    Ok(())
}

/// One member of the baseline: holds what it gets, and every round tries
/// each shard it does not hold.
async fn baseline_member(
    session: Session,
    group: String,
    shards: u32,
    owned: Arc<AtomicUsize>,
    mine: Arc<AtomicUsize>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut held: BTreeMap<u32, MutexGuard> = BTreeMap::new();
    loop {
        for s in 0..shards {
            if held.contains_key(&s) {
                continue;
            }
            let Ok(mutex) = Mutex::new(&session, format!("{group}/{s}")) else {
                return;
            };
            if let Ok(Some(guard)) = mutex.try_lock().await {
                held.insert(s, guard);
                owned.fetch_add(1, Ordering::SeqCst);
                mine.fetch_add(1, Ordering::SeqCst);
            }
        }
        if *stop.borrow() {
            break;
        }
        tokio::time::sleep(ROUND).await;
        if *stop.borrow() {
            break;
        }
    }
    let n = held.len();
    for (_, guard) in held {
        let _ = guard.release().await;
    }
    owned.fetch_sub(n, Ordering::SeqCst);
    mine.fetch_sub(n, Ordering::SeqCst);
    let _ = session.close().await;
}

async fn baseline_row(url: &str, backend: &str, members: usize, shards: u32) -> Row {
    let mut row = Row {
        backend: backend.into(),
        scheme: "lock per shard, all try all",
        members,
        shards,
        ..Row::default()
    };
    if let Err(e) = baseline_phases(&mut row, url).await {
        row.error = Some(e);
    }
    row
}

async fn all_owned(owned: &AtomicUsize, shards: u32) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    while owned.load(Ordering::SeqCst) < shards as usize {
        if Instant::now() >= deadline {
            return Err(format!("not every shard owned within {SETTLE_LIMIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A running member of the baseline: its stop, its task, how many it owns.
type BaselineMember = (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
    Arc<AtomicUsize>,
);

async fn start_baseline(
    store: Arc<dyn Store>,
    group: String,
    shards: u32,
    owned: Arc<AtomicUsize>,
) -> Result<BaselineMember, String> {
    let session = Session::with_options(&store, ten_seconds())
        .await
        .map_err(|e| e.to_string())?;
    let mine = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(baseline_member(
        session,
        group,
        shards,
        owned,
        mine.clone(),
        stop,
    ));
    Ok((stop_tx, task, mine))
}

async fn baseline_phases(row: &mut Row, url: &str) -> Result<(), String> {
    let counting = Counting::wrap(tenure::open(url).await.map_err(|e| e.to_string())?);
    let store: Arc<dyn Store> = counting.clone();
    let group = format!(
        "bench-base-{}-{}-{}",
        row.members,
        row.shards,
        std::process::id()
    );
    let owned = Arc::new(AtomicUsize::new(0));
    let mut members = Vec::new();
    let start = || start_baseline(store.clone(), group.clone(), row.shards, owned.clone());
    let started = Instant::now();
    for _ in 0..row.members {
        members.push(start().await?);
    }
    all_owned(&owned, row.shards).await?;
    row.first_settle_ms = Some(ms(started.elapsed()));
    let ops = counting.calls();
    tokio::time::sleep(Duration::from_secs(2)).await;
    row.idle_ops_per_s = Some((counting.calls() - ops) as f64 / 2.0);
    // A join: the newcomer tries every round and gets nothing.
    let ops = counting.calls();
    members.push(start().await?);
    tokio::time::sleep(BASELINE_WATCH).await;
    row.join_ops = Some(counting.calls() - ops);
    row.join_moved = Some(0);
    let counts: Vec<usize> = members
        .iter()
        .map(|(_, _, m)| m.load(Ordering::SeqCst))
        .collect();
    row.join_balance = Some((
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    ));
    // A leave: its shards go to whoever tries first.
    let (stop, task, mine) = members.remove(0);
    let had = mine.load(Ordering::SeqCst);
    let (ops, at) = (counting.calls(), Instant::now());
    let _ = stop.send(true);
    let _ = task.await;
    all_owned(&owned, row.shards).await?;
    row.leave_settle_ms = Some(ms(at.elapsed()));
    row.leave_ops = Some(counting.calls() - ops);
    row.leave_moved = Some(had);
    for (stop, task, _) in members {
        let _ = stop.send(true);
        let _ = task.await;
    }
    Ok(())
}

fn list<T: std::str::FromStr>(var: &str, default: &[T]) -> Vec<T>
where
    T: Clone,
{
    std::env::var(var)
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect::<Vec<T>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

fn bench_url(backend: &str, url: &str) -> String {
    let url = match backend {
        // One connection per session; the test kit's server takes any number.
        "zookeeper" => format!("{url}?max_sessions=0"),
        _ => url.to_string(),
    };
    // SHARDS_URL_OPTIONS=node_timeout=1s: more of the store URL's options.
    match std::env::var("SHARDS_URL_OPTIONS") {
        Ok(more) if !more.is_empty() => {
            let join = if url.contains('?') { '&' } else { '?' };
            format!("{url}{join}{more}")
        }
        _ => url,
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

fn main() {
    let members: Vec<usize> = list("SHARDS_MEMBERS", &[3, 10, 50]);
    let counts: Vec<u32> = list("SHARDS_COUNTS", &[64, 1024]);
    let only = std::env::var("BENCH_ONLY").ok();
    // BENCH_ONLY=memory,redis: just those stores (all by default).
    let wanted = |store: &StoreFixture| {
        only.as_deref()
            .is_none_or(|list| list.split(',').any(|b| b.trim() == store.backend))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for fixture in STORES.iter().filter(|s| wanted(s)) {
            let Some(running) = (fixture.start)() else {
                rows.push(Row {
                    backend: fixture.backend.into(),
                    error: Some("the server is not installed".into()),
                    ..Row::default()
                });
                continue;
            };
            let url = bench_url(fixture.backend, &running.url);
            for &m in &members {
                for &n in &counts {
                    eprintln!("{} {m} members x {n} shards", fixture.backend);
                    for row in [
                        tenure_row(&url, fixture.backend, m, n).await,
                        baseline_row(&url, fixture.backend, m, n).await,
                    ] {
                        // Each row as it comes, should the run be cut short.
                        eprintln!("{}", row.json());
                        rows.push(row);
                    }
                }
            }
        }
        rows
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    println!(
        "{:<10} {:<28} {:>3} {:>5} {:>9} {:>9} {:>8} {:>6} {:>9} {:>9} {:>8} {:>6} {:>8}",
        "backend",
        "scheme",
        "M",
        "N",
        "first ms",
        "join ms",
        "join ops",
        "moved",
        "balance",
        "leave ms",
        "lv ops",
        "moved",
        "idle op/s"
    );
    for r in &rows {
        if let Some(e) = &r.error {
            println!(
                "{:<10} {:<28} {:>3} {:>5} error: {e}",
                r.backend, r.scheme, r.members, r.shards
            );
            continue;
        }
        println!(
            "{:<10} {:<28} {:>3} {:>5} {:>9} {:>9} {:>8} {:>6} {:>9} {:>9} {:>8} {:>6} {:>8}",
            r.backend,
            r.scheme,
            r.members,
            r.shards,
            opt_ms(r.first_settle_ms),
            opt_ms(r.join_settle_ms),
            opt(r.join_ops),
            opt(r.join_moved),
            r.join_balance
                .map_or("-".into(), |(lo, hi)| format!("{lo}-{hi}")),
            opt_ms(r.leave_settle_ms),
            opt(r.leave_ops),
            opt(r.leave_moved),
            r.idle_ops_per_s.map_or("-".into(), |v| format!("{v:.1}")),
        );
    }
    let out = std::env::var("BENCH_OUT").unwrap_or_else(|_| "results/shards.json".into());
    let json = serde_json::json!({
        "bench": "shards",
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    if let Err(e) = std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()) {
        eprintln!("cannot write {out}: {e}");
    }
}
