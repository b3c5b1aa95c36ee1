//! `tenure torture`: many worker processes contend for one lock while the
//! harness injects faults, keeps a fenced register and its unfenced twin,
//! records the history on its own monotonic clock, and checks it.
//!
//! A worker is this binary again (`tenure torture-worker`), so a fault is a
//! fault of a real process: SIGKILL, or SIGSTOP past its TTL. It talks to
//! the harness in lines over its stdin and stdout: it tells what happens to
//! it (`req`, `grant TOKEN`, `release`, `lost`), and asks the harness's
//! registers (`read TOKEN`, `write TOKEN VALUE`), which answer.
//!
//! A store that lives in one process (`memory://`) gets its workers as
//! tasks of the harness instead, each over a [`gate::Gated`] view of the
//! store: a kill cuts the task and its store calls off for good (its
//! session is never closed, so it expires), a pause holds the task's store
//! calls and its lines until it ends.

pub mod check;
mod gate;
mod proxy;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

use check::{Findings, Op, Record};
use tenure::{Error, Mutex, Name, Session, SessionOptions, Store};

/// Client-side faults, safe on anyone's deployment: the default set.
const CLIENT_FAULTS: &[&str] = &["kill", "pause"];

/// Network faults, on the links of the harness's own workers only (each
/// reaches each store server through a proxy of the harness): as safe, but
/// only for stores over a network.
const NETWORK_FAULTS: &[&str] = &["partition", "delay", "hold"];

/// SQLite's `clock`: worker 0 runs in a time namespace of its own
/// (`unshare -rT --boottime`), its `CLOCK_BOOTTIME` (SQLite's lease clock)
/// this far ahead of everyone else's.
const SQLITE_SKEW_S: u32 = 3600;

#[derive(Args, Debug)]
pub struct TortureArgs {
    /// Worker processes contending for the lock.
    #[arg(long, default_value_t = 6)]
    pub clients: u32,
    /// How long to run (unless --cycles ends it first).
    #[arg(long, default_value = "60s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Stop after this many grants.
    #[arg(long)]
    pub cycles: Option<usize>,
    /// The workers' session TTL.
    #[arg(long, default_value = "2s", value_parser = crate::cli::parse_duration)]
    pub ttl: Duration,
    /// Faults to inject, comma-separated: kill, pause (the client-side
    /// faults, the default); partition, delay, hold (network faults on a
    /// worker's links, through a loopback proxy per worker and server;
    /// with three or more servers every other partition cuts a minority of
    /// the servers off from every worker); clock (SQLite: one worker runs
    /// with its CLOCK_BOOTTIME an hour ahead, in a time namespace of its
    /// own); or none.
    #[arg(long, default_value = "kill,pause", value_delimiter = ',')]
    pub faults: Vec<String>,
    /// Time between faults.
    #[arg(long, default_value = "3s", value_parser = crate::cli::parse_duration)]
    pub fault_interval: Duration,
    /// Seed of the random choices (faults, critical-section times).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the report (JSON) here (with --check: the findings of the
    /// history checked again).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Write the history (JSON lines) here, to check it again later.
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Check a history a run wrote (--history) again, with this --ttl's
    /// bound, instead of running; exit as the run would.
    #[arg(long, value_name = "FILE.jsonl")]
    pub check: Option<std::path::PathBuf>,
    /// Your own fault, taking its turn with the others: run as
    /// `sh -c "CMD start"` to begin it and `sh -c "CMD stop"` 1.5-3 TTLs
    /// later (pause your server, step its clock, cut a link…). Overlaps
    /// during it must be 0.
    #[arg(long, value_name = "CMD")]
    pub nemesis_exec: Option<String>,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The lock's name.
    #[arg(long)]
    pub name: String,
    /// Session TTL.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub ttl: Duration,
    /// Seed of this worker's critical-section times.
    #[arg(long)]
    pub seed: u64,
}

/// A small deterministic random source (xorshift).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A duration from `lo` to `hi`.
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros().max(1) as u64;
        lo + Duration::from_micros(self.next() % span)
    }
}

/// The harness's two registers.
#[derive(Default)]
struct Registers {
    highest: u64,
    fenced: u64,
    twin: u64,
}

/// This machine's CLOCK_MONOTONIC in ns: one clock for the harness and its
/// workers, which stamp their own events when they happen (a grant once the
/// lock is taken, a release before it is given back), so the order of two
/// workers' lines through their pipes does not matter.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the harness shares between its tasks.
struct Shared {
    start: Instant,
    start_ns: u64,
    history: StdMutex<Vec<Record>>,
    registers: StdMutex<Registers>,
    /// Per worker: how to reach it, and the token it holds (0: none).
    workers: StdMutex<HashMap<u32, (Control, u64)>>,
    grants: AtomicU64,
    /// Workers the harness is to pause when they next write: the write is
    /// then applied only once the pause is over, as the write of a process
    /// that checked its lease and paused just as it sent it lands late.
    pause_on_write: StdMutex<Vec<u32>>,
    /// Workers paused now: a second pause would end with the first's
    /// SIGCONT, shorter than it says.
    paused: StdMutex<std::collections::HashSet<u32>>,
    stopping: AtomicBool,
    /// Per worker, its proxy to each store server (network faults only).
    links: HashMap<u32, Vec<proxy::Proxy>>,
    /// Partitions so far (a cluster's first, third… are of a minority of
    /// its servers).
    partitions: AtomicU64,
    /// A network fault is in force (one at a time: a second one's end
    /// would cut the first short).
    network_busy: AtomicBool,
}

impl Shared {
    /// Records an event the harness itself sees happen now.
    fn record(&self, worker: Option<u32>, op: Op) {
        self.record_at(mono_ns(), worker, op);
    }

    /// Records an event stamped at `ns` (CLOCK_MONOTONIC).
    fn record_at(&self, ns: u64, worker: Option<u32>, op: Op) {
        let at_us = ns.saturating_sub(self.start_ns) / 1000;
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history.push(Record { at_us, worker, op });
    }

    /// The history so far, in time order.
    fn history(&self) -> Vec<Record> {
        let mut history = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Stable: events of one stamp keep the order they were recorded in.
        history.sort_by_key(|r| r.at_us);
        history
    }
}

/// Runs the harness; returns the exit code (0 pass, 1 safety violation,
/// 2 liveness or leak failure).
pub async fn run(store: Arc<dyn Store>, url: &str, args: TortureArgs) -> Result<u8, String> {
    if let Some(path) = &args.check {
        return recheck(path, args.ttl, args.report.as_deref());
    }
    // Workers are processes, unless the store lives in this one.
    let in_process = !store.capabilities().multi_process;
    let mut faults: Vec<String> = args
        .faults
        .iter()
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty() && f != "none")
        .collect();
    let skewed = faults.iter().any(|f| f == "clock");
    faults.retain(|f| f != "clock");
    if skewed && store.capabilities().backend != "sqlite" {
        return Err(
            "the clock fault is built in for SQLite only (a worker in a time namespace); a server's clock jump needs the server: use --nemesis-exec with libfaketime (see the README)"
                .into(),
        );
    }
    for f in &faults {
        if !CLIENT_FAULTS.contains(&f.as_str()) && !NETWORK_FAULTS.contains(&f.as_str()) {
            return Err(format!(
                "unknown or not yet supported fault {f:?}: this build injects {}, {}, clock (SQLite) (or none)",
                CLIENT_FAULTS.join(", "),
                NETWORK_FAULTS.join(", ")
            ));
        }
    }
    let network = faults.iter().any(|f| NETWORK_FAULTS.contains(&f.as_str()));
    if in_process && network {
        return Err(format!(
            "the {} store lives in this process: it has no network to fault",
            store.capabilities().backend
        ));
    }
    let min_ttl = store.capabilities().min_ttl;
    if args.ttl < min_ttl {
        return Err(format!(
            "--ttl {:?} is shorter than the {} backend's shortest, {min_ttl:?}",
            args.ttl,
            store.capabilities().backend
        ));
    }
    if args.nemesis_exec.is_some() {
        faults.push("nemesis".into());
    }
    if args.clients < 2 {
        return Err("--clients must be at least 2: torture needs contention".into());
    }
    let run_id = tenure::store::random_hex(4).map_err(|e| e.to_string())?;
    let prefix = format!("tenure-torture/{run_id}/");
    let name = format!("{prefix}lock");
    let mut links = HashMap::new();
    let mut urls = HashMap::new();
    if network {
        let servers = proxy::servers_of(url).map_err(|e| {
            format!(
                "{e}: network faults ({}) need a store over a network",
                NETWORK_FAULTS.join(", ")
            )
        })?;
        for id in 0..args.clients {
            let mut proxies = Vec::new();
            for (i, server) in servers.iter().enumerate() {
                let seed = args.seed ^ (u64::from(id) << 16) ^ i as u64;
                let p = proxy::Proxy::start(server.clone(), seed)
                    .await
                    .map_err(|e| format!("cannot start a proxy to {server}: {e}"))?;
                proxies.push(p);
            }
            let addrs: Vec<_> = proxies.iter().map(proxy::Proxy::addr).collect();
            urls.insert(id, proxy::with_servers(url, &addrs)?);
            links.insert(id, proxies);
        }
    }
    let shared = Arc::new(Shared {
        start: Instant::now(),
        start_ns: mono_ns(),
        history: StdMutex::new(Vec::new()),
        registers: StdMutex::new(Registers::default()),
        workers: StdMutex::new(HashMap::new()),
        grants: AtomicU64::new(0),
        pause_on_write: StdMutex::new(Vec::new()),
        paused: StdMutex::new(std::collections::HashSet::new()),
        stopping: AtomicBool::new(false),
        links,
        partitions: AtomicU64::new(0),
        network_busy: AtomicBool::new(false),
    });
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut tasks = Vec::new();
    for id in 0..args.clients {
        let url = urls.remove(&id).unwrap_or_else(|| url.to_string());
        let (shared, exe, name) = (shared.clone(), exe.clone(), name.clone());
        let (ttl, seed) = (args.ttl, args.seed);
        let skew = (skewed && id == 0).then_some(SQLITE_SKEW_S);
        if in_process {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                keep_task_worker(shared, store, name, ttl, seed, id).await
            }));
            continue;
        }
        tasks.push(tokio::spawn(async move {
            keep_worker(shared, exe, url, name, ttl, seed, id, skew).await
        }));
    }
    let deadline = Instant::now() + args.duration;
    let mut rng = Rng::new(args.seed);
    let mut next_fault = Instant::now() + args.fault_interval;
    let mut last_progress = Instant::now();
    let mut turn = 0usize;
    let mut nemeses = Vec::new();
    loop {
        let grants = shared.grants.load(Ordering::Relaxed) as usize;
        if Instant::now() >= deadline || args.cycles.is_some_and(|c| grants >= c) {
            break;
        }
        if !faults.is_empty() && Instant::now() >= next_fault {
            let fault = faults[turn % faults.len()].clone();
            turn += 1;
            match (&args.nemesis_exec, fault.as_str()) {
                // One of the user's faults at a time: a second `start`
                // before the first `stop` would be a fault the command may
                // not expect (its turn is skipped).
                (Some(_), "nemesis")
                    if nemeses
                        .last()
                        .is_some_and(|n: &tokio::task::JoinHandle<()>| !n.is_finished()) => {}
                (Some(cmd), "nemesis") => {
                    let length = rng.between(args.ttl * 3 / 2, args.ttl * 3);
                    nemeses.push(tokio::spawn(nemesis(shared.clone(), cmd.clone(), length)));
                }
                _ => {
                    if !inject(&shared, &fault, args.ttl, &mut rng).await {
                        // Its turn again shortly (a network fault waits
                        // for the one in force to end).
                        turn -= 1;
                        next_fault = Instant::now() + Duration::from_millis(200);
                        continue;
                    }
                }
            }
            next_fault =
                Instant::now() + rng.between(args.fault_interval / 2, args.fault_interval * 3 / 2);
        }
        if last_progress.elapsed() >= Duration::from_secs(2) {
            last_progress = Instant::now();
            let history = shared.history();
            let f = check::check(&history, bound(args.ttl).as_micros() as u64);
            eprintln!(
                "torture: {:>5.1}s  grants {}  faults {}  violations {}",
                shared.start.elapsed().as_secs_f64(),
                f.grants,
                f.faults,
                violations(&f)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A fault of the user's in force is ended first.
    for nemesis in nemeses {
        let _ = nemesis.await;
    }
    // Stop: SIGTERM, so each worker releases and closes its session (over
    // links that pass again).
    shared.stopping.store(true, Ordering::SeqCst);
    for p in shared.links.values().flatten() {
        p.set(proxy::Mode::Pass);
    }
    for (control, _) in workers(&shared).values() {
        control.cont();
        control.terminate();
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    }
    let leaked = leaks(&store, &prefix, args.ttl).await?;
    let history = shared.history();
    let findings = check::check(&history, bound(args.ttl).as_micros() as u64);
    let code = if findings.unsafe_run() {
        1
    } else if findings.slow_recoveries > 0 || leaked > 0 {
        2
    } else {
        0
    };
    let verdict = ["pass", "safety violation", "liveness or leak failure"][code as usize];
    print_summary(&findings, leaked, args.ttl, verdict);
    if let Some(path) = &args.history {
        let mut out = String::new();
        for r in &history {
            out.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
            out.push('\n');
        }
        std::fs::write(path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.report {
        let report = Report {
            store: tenure::mask_password(url),
            seed: args.seed,
            clients: args.clients,
            ttl_ms: args.ttl.as_millis() as u64,
            faults,
            worker_0_boottime_ahead_s: skewed.then_some(SQLITE_SKEW_S),
            fault_interval_ms: args.fault_interval.as_millis() as u64,
            nemesis: args.nemesis_exec.is_some(),
            recovery_bound_ms: bound(args.ttl).as_millis() as u64,
            findings,
            leaked_names: leaked,
            verdict,
        };
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(code)
}

/// Checks a saved history again; with `report`, writes the findings there
/// (JSON).
fn recheck(
    path: &std::path::Path,
    ttl: Duration,
    report: Option<&std::path::Path>,
) -> Result<u8, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut history = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let record: Record = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not a history line: {e}", path.display(), i + 1))?;
        history.push(record);
    }
    history.sort_by_key(|r| r.at_us);
    let findings = check::check(&history, bound(ttl).as_micros() as u64);
    let code = if findings.unsafe_run() {
        1
    } else if findings.slow_recoveries > 0 {
        2
    } else {
        0
    };
    let verdict = ["pass", "safety violation", "liveness failure"][code as usize];
    print_summary(&findings, 0, ttl, verdict);
    if let Some(out) = report {
        let kinds: std::collections::BTreeSet<&str> = history
            .iter()
            .filter_map(|r| match &r.op {
                Op::FaultStart { fault } => Some(fault.as_str()),
                _ => None,
            })
            .collect();
        let json = serde_json::json!({
            "checked_history": path.display().to_string(),
            "fault_kinds": kinds,
            "ttl_ms": ttl.as_millis() as u64,
            "recovery_bound_ms": bound(ttl).as_millis() as u64,
            "findings": findings,
            "verdict": verdict,
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    }
    Ok(code)
}

/// The report, as JSON.
#[derive(Serialize)]
struct Report {
    store: String,
    seed: u64,
    clients: u32,
    ttl_ms: u64,
    faults: Vec<String>,
    /// SQLite's `clock`: how far worker 0's CLOCK_BOOTTIME runs ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_0_boottime_ahead_s: Option<u32>,
    fault_interval_ms: u64,
    /// Whether a `--nemesis-exec` fault took turns (its command is not
    /// shown: it may hold secrets).
    nemesis: bool,
    recovery_bound_ms: u64,
    findings: Findings,
    leaked_names: usize,
    verdict: &'static str,
}

/// The longest a fault on a holder may keep the lock from everyone else:
/// its TTL and one renew interval, the watchers' 1 % and 10 ms, and a
/// second for processes to start and stores to answer under load.
fn bound(ttl: Duration) -> Duration {
    ttl + ttl / 3 + ttl / 100 + Duration::from_millis(10) + Duration::from_secs(1)
}

fn violations(f: &Findings) -> usize {
    f.fenced_lost_writes
        + f.fenced_lower_token_accepted
        + f.duplicate_tokens
        + f.tokens_backwards
        + f.overlaps_unpaused
}

fn workers(shared: &Shared) -> HashMap<u32, (Control, u64)> {
    shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// How the harness reaches a worker to fault it.
#[derive(Clone)]
enum Control {
    /// An OS process, by its id (0: none, never signalled: kill(0) would
    /// signal the harness's own process group).
    Process(u32),
    /// A task of this process, for a store that lives in it.
    Task(Arc<gate::TaskControl>),
}

impl Control {
    fn kill(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGKILL),
            Control::Task(t) => t.kill(),
        }
    }
    fn stop(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGSTOP),
            Control::Task(t) => t.set(gate::Gate::Frozen),
        }
    }
    fn cont(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGCONT),
            Control::Task(t) => t.set(gate::Gate::Open),
        }
    }
    fn terminate(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGTERM),
            Control::Task(t) => t.terminate(),
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid == 0 {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a pid of a child of ours; no memory is touched.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// One fault: on the holder if there is one, else on a random worker.
/// False if it could not be injected now (a network fault in force).
async fn inject(shared: &Arc<Shared>, fault: &str, ttl: Duration, rng: &mut Rng) -> bool {
    let all = workers(shared);
    if all.is_empty() {
        return true;
    }
    let holder = all
        .iter()
        .find(|(_, (_, token))| *token != 0)
        .map(|(id, _)| *id);
    let mut ids: Vec<u32> = all.keys().copied().collect();
    ids.sort_unstable();
    let target = holder.unwrap_or(ids[(rng.next() % ids.len() as u64) as usize]);
    let Some((control, _)) = all.get(&target).cloned() else {
        return true;
    };
    match fault {
        "kill" => {
            shared.record(
                Some(target),
                Op::FaultStart {
                    fault: "kill".into(),
                },
            );
            control.kill();
            // The worker's task records its exit and starts it again.
        }
        "pause" => {
            // One pause at a time per worker: a paused or soon-paused one
            // is passed over for another (none left: the turn is skipped).
            let busy = |id: &u32| {
                shared
                    .paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(id)
                    || shared
                        .pause_on_write
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(id)
            };
            let (target, control) = if busy(&target) {
                let free: Vec<u32> = ids.iter().copied().filter(|id| !busy(id)).collect();
                let Some(&other) = free.get((rng.next() % free.len().max(1) as u64) as usize)
                else {
                    return true;
                };
                match all.get(&other) {
                    Some((control, _)) => (other, control.clone()),
                    None => return true,
                }
            } else {
                (target, control)
            };
            // Every other pause lands on a holder's write, after its last
            // look at its lease (its late write then meets the fence); the
            // others wherever the worker is (in its critical section, or
            // waiting).
            if rng.next() % 2 == 0 {
                shared
                    .pause_on_write
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(target);
            } else {
                pause(shared.clone(), target, control, ttl, rng.next());
            }
        }
        "partition" | "delay" | "hold" => return network_fault(shared, fault, target, ttl, rng),
        _ => {}
    }
    true
}

/// A network fault for 1.5–3 TTLs, in the background: on every link of
/// `target` (the holder if any), or, for the first, third… partition of a
/// cluster of three or more servers, on the links of every worker to a
/// minority of the servers.
fn network_fault(
    shared: &Arc<Shared>,
    fault: &str,
    target: u32,
    ttl: Duration,
    rng: &mut Rng,
) -> bool {
    if shared.network_busy.swap(true, Ordering::SeqCst) {
        return false;
    }
    let mode = match fault {
        "partition" => proxy::Mode::Cut,
        "hold" => proxy::Mode::Hold,
        _ => proxy::Mode::Delay {
            base: ttl / 8,
            jitter: ttl / 16,
        },
    };
    let servers = shared.links.values().next().map_or(0, Vec::len);
    let minority = fault == "partition"
        && servers >= 3
        && shared.partitions.fetch_add(1, Ordering::Relaxed) % 2 == 0;
    let (worker, links): (Option<u32>, Vec<(u32, usize)>) = if minority {
        // Which servers: a random window of (servers - 1) / 2 of them.
        let count = (servers - 1) / 2;
        let first = (rng.next() % servers as u64) as usize;
        let cut: Vec<usize> = (0..count).map(|k| (first + k) % servers).collect();
        let links = shared
            .links
            .keys()
            .flat_map(|id| cut.iter().map(move |i| (*id, *i)))
            .collect();
        (None, links)
    } else {
        (Some(target), (0..servers).map(|i| (target, i)).collect())
    };
    let name = if minority {
        "partition-minority"
    } else {
        fault
    };
    let length = rng.between(ttl * 3 / 2, ttl * 3);
    shared.record(worker, Op::FaultStart { fault: name.into() });
    set_links(shared, &links, mode);
    let shared = shared.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        set_links(&shared, &links, proxy::Mode::Pass);
        shared.record(worker, Op::FaultEnd { fault: name });
        shared.network_busy.store(false, Ordering::SeqCst);
    });
    true
}

/// Sets the links `(worker, server)` to `mode`.
fn set_links(shared: &Shared, links: &[(u32, usize)], mode: proxy::Mode) {
    for (id, i) in links {
        if let Some(p) = shared.links.get(id).and_then(|ps| ps.get(*i)) {
            p.set(mode);
        }
    }
}

/// The user's fault: `CMD start`, `length`, `CMD stop` (each bounded to
/// 30 s).
async fn nemesis(shared: Arc<Shared>, cmd: String, length: Duration) {
    let run = |phase: &'static str| {
        let cmd = format!("{cmd} {phase}");
        async move {
            let child = Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(Duration::from_secs(30), child).await {
                Ok(Ok(status)) if status.success() => {}
                other => eprintln!("torture: nemesis {phase}: {other:?}"),
            }
        }
    };
    shared.record(
        None,
        Op::FaultStart {
            fault: "nemesis".into(),
        },
    );
    run("start").await;
    tokio::time::sleep(length).await;
    run("stop").await;
    shared.record(
        None,
        Op::FaultEnd {
            fault: "nemesis".into(),
        },
    );
}

/// Stops a worker for 1.5–3 TTLs, in the background.
/// Returns how long.
fn pause(shared: Arc<Shared>, id: u32, control: Control, ttl: Duration, seed: u64) -> Duration {
    let mut rng = Rng::new(seed);
    let length = rng.between(ttl * 3 / 2, ttl * 3);
    shared
        .paused
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id);
    shared.record(
        Some(id),
        Op::FaultStart {
            fault: "pause".into(),
        },
    );
    control.stop();
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        control.cont();
        // Recorded before the worker may be paused again: its next pause's
        // start must come after this end in the history.
        shared.record(
            Some(id),
            Op::FaultEnd {
                fault: "pause".into(),
            },
        );
        shared
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    });
    length
}

/// Runs worker `id`, and again whenever its process dies, until the harness
/// stops; with `skew`, in a time namespace whose CLOCK_BOOTTIME is that
/// many seconds ahead.
#[allow(clippy::too_many_arguments)]
async fn keep_worker(
    shared: Arc<Shared>,
    exe: std::path::PathBuf,
    url: String,
    name: String,
    ttl: Duration,
    seed: u64,
    id: u32,
    skew: Option<u32>,
) {
    let mut life = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        life += 1;
        let mut command = match skew {
            Some(s) => {
                // `unshare` forks the worker into the new namespace (and
                // kills it if it dies itself); faults go to the worker.
                let mut c = Command::new("unshare");
                c.args(["-rT", "--kill-child", "--boottime", &s.to_string()])
                    .arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let child = command
            .arg("--store")
            .arg(&url)
            .arg("torture-worker")
            .arg("--name")
            .arg(&name)
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .arg("--seed")
            .arg((seed ^ (u64::from(id) << 32) ^ life).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let Ok(mut child) = child else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut pid = child.id().unwrap_or(0);
        if skew.is_some() {
            match forked_child(pid).await {
                Some(worker) => pid = worker,
                None => {
                    eprintln!("torture: the worker in a time namespace did not start (is `unshare -rT` allowed here?)");
                    let _ = child.kill().await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        shared
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (Control::Process(pid), 0));
        if let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) {
            serve(&shared, id, Control::Process(pid), ttl, stdout, stdin).await;
        }
        let _ = child.wait().await;
        worker_gone(&shared, id);
    }
}

/// Records a worker's end; one the harness did not stop was killed, and
/// its kill ends here.
fn worker_gone(shared: &Shared, id: u32) {
    shared.record(Some(id), Op::Exit);
    let was = shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    if was.is_some() && !shared.stopping.load(Ordering::SeqCst) {
        shared.record(
            Some(id),
            Op::FaultEnd {
                fault: "kill".into(),
            },
        );
    }
}

/// Runs worker `id` as a task of this process (for a store that lives in
/// it), over its own gated view of the store, and again whenever it is
/// killed, until the harness stops.
async fn keep_task_worker(
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    name: String,
    ttl: Duration,
    seed: u64,
    id: u32,
) {
    let mut life = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        life += 1;
        let (gated, gate) = gate::Gated::wrap(store.clone());
        let (term_tx, term) = tokio::sync::watch::channel(false);
        // The worker's stdin and stdout.
        let (harness_end, worker_end) = tokio::io::duplex(64 * 1024);
        let (worker_read, worker_write) = tokio::io::split(worker_end);
        let args = WorkerArgs {
            name: name.clone(),
            ttl,
            seed: seed ^ (u64::from(id) << 32) ^ life,
        };
        let frozen = gate.subscribe();
        let task = tokio::spawn(async move {
            let _ = worker_loop(gated, args, worker_read, worker_write, term, Some(frozen)).await;
        });
        let control = Arc::new(gate::TaskControl::new(gate, term_tx, task.abort_handle()));
        shared
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (Control::Task(control.clone()), 0));
        let (harness_read, harness_write) = tokio::io::split(harness_end);
        serve(
            &shared,
            id,
            Control::Task(control),
            ttl,
            harness_read,
            harness_write,
        )
        .await;
        let _ = task.await;
        worker_gone(&shared, id);
    }
}

/// The one child process of `pid` (bounded: 5 s).
async fn forked_child(pid: u32) -> Option<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Some(child) = text.split_whitespace().next().and_then(|c| c.parse().ok()) {
                return Some(child);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Reads a worker's lines until it exits, recording them and answering its
/// reads and writes.
async fn serve(
    shared: &Arc<Shared>,
    id: u32,
    control: Control,
    ttl: Duration,
    output: impl tokio::io::AsyncRead + Unpin,
    mut stdin: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut lines = BufReader::new(output).lines();
    let mut rng = Rng::new(u64::from(id) ^ mono_ns());
    while let Ok(Some(line)) = lines.next_line().await {
        // "<the worker's stamp, ns> <what> <numbers…>"; reads and writes
        // are stamped by the harness as it applies them, in their order.
        let all: Vec<&str> = line.split_whitespace().collect();
        let Some((stamp, words)) = all.split_first() else {
            continue;
        };
        let stamp = stamp.parse::<u64>().unwrap_or_else(|_| mono_ns());
        let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        match (words.first().copied(), number(1), number(2)) {
            (Some("req"), _, _) => shared.record_at(stamp, Some(id), Op::Request),
            (Some("grant"), Some(token), _) => {
                shared.grants.fetch_add(1, Ordering::Relaxed);
                set_token(shared, id, token);
                shared.record_at(stamp, Some(id), Op::Grant { token });
            }
            (Some("release"), _, _) => {
                set_token(shared, id, 0);
                shared.record_at(stamp, Some(id), Op::Release);
            }
            (Some("lost"), _, _) => {
                set_token(shared, id, 0);
                shared.record_at(stamp, Some(id), Op::Lost);
            }
            (Some("read"), Some(token), _) => {
                let answer = {
                    let mut regs = shared.registers.lock().unwrap_or_else(|e| e.into_inner());
                    let fenced = (token >= regs.highest).then(|| {
                        regs.highest = token;
                        regs.fenced
                    });
                    shared.record(
                        Some(id),
                        Op::Read {
                            token,
                            fenced,
                            twin: regs.twin,
                        },
                    );
                    match fenced {
                        Some(v) => format!("ok {v} {}\n", regs.twin),
                        None => format!("refused {} {}\n", regs.highest, regs.twin),
                    }
                };
                if reply(&mut stdin, &answer).await.is_err() {
                    return;
                }
            }
            (Some("write"), Some(token), Some(value)) => {
                let paused = {
                    let mut queue = shared
                        .pause_on_write
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    let at = queue.iter().position(|w| *w == id);
                    let found = at.map(|i| queue.remove(i)).is_some();
                    if found {
                        // Marked paused before it leaves this queue, so no
                        // other pause picks it in between.
                        shared
                            .paused
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id);
                    }
                    found
                };
                if paused {
                    // The write is in flight while its writer is stopped.
                    let length = pause(shared.clone(), id, control.clone(), ttl, rng.next());
                    tokio::time::sleep(length).await;
                }
                let answer = {
                    let mut regs = shared.registers.lock().unwrap_or_else(|e| e.into_inner());
                    let accepted = token >= regs.highest;
                    let (fenced_before, twin_before) = (regs.fenced, regs.twin);
                    if accepted {
                        regs.highest = token;
                        regs.fenced = value;
                    }
                    regs.twin = value;
                    shared.record(
                        Some(id),
                        Op::Write {
                            token,
                            value,
                            accepted,
                            fenced_before,
                            twin_before,
                        },
                    );
                    if accepted {
                        "ok\n"
                    } else {
                        "refused\n"
                    }
                };
                if reply(&mut stdin, answer).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

fn set_token(shared: &Shared, id: u32, token: u64) {
    if let Some(entry) = shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&id)
    {
        entry.1 = token;
    }
}

async fn reply(
    stdin: &mut (impl tokio::io::AsyncWrite + Unpin),
    line: &str,
) -> std::io::Result<()> {
    stdin.write_all(line.as_bytes()).await?;
    stdin.flush().await
}

/// Names the run left in the store. Workers that were killed leave their
/// sessions behind; a try-lock watches and ends them (as any newcomer's
/// would), then every name must be gone.
async fn leaks(store: &Arc<dyn Store>, prefix: &str, ttl: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + ttl * 4 + Duration::from_secs(5);
    loop {
        // A server the run restarted answers again after a reconnect: a
        // connection it broke fails once, then works.
        let names = match store.names(prefix).await {
            Ok(names) => names,
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        if names.is_empty() {
            return Ok(0);
        }
        if Instant::now() >= deadline {
            return Ok(names.len());
        }
        let session = match Session::with_options(store, SessionOptions::new().ttl(ttl)).await {
            Ok(s) => s,
            Err(e) if e.is_temporary() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        for name in &names {
            if let Ok(Some(guard)) = Mutex::new(&session, name.as_str())
                .map_err(|e| e.to_string())?
                .try_lock()
                .await
            {
                let _ = guard.release().await;
            }
        }
        let _ = session.close().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn print_summary(f: &Findings, leaked: usize, ttl: Duration, verdict: &str) {
    let rows: Vec<(&str, String, &str)> = vec![
        ("grants", f.grants.to_string(), ""),
        ("faults injected", f.faults.to_string(), ""),
        (
            "fenced: lost acknowledged writes",
            f.fenced_lost_writes.to_string(),
            "must be 0",
        ),
        (
            "fenced: lower token accepted",
            f.fenced_lower_token_accepted.to_string(),
            "must be 0",
        ),
        (
            "duplicate tokens",
            f.duplicate_tokens.to_string(),
            "must be 0",
        ),
        (
            "tokens backwards",
            f.tokens_backwards.to_string(),
            "must be 0",
        ),
        (
            "overlaps, no pause in force",
            f.overlaps_unpaused.to_string(),
            "must be 0",
        ),
        (
            "overlaps under a pause",
            f.overlaps_paused.to_string(),
            "expected",
        ),
        (
            "longest overlap (ms)",
            format!("{:.1}", f.longest_overlap_ms),
            "",
        ),
        (
            "fenced: late writes refused",
            f.fenced_refusals.to_string(),
            "",
        ),
        (
            "unfenced twin: lost writes",
            f.twin_lost_writes.to_string(),
            "the control",
        ),
        (
            "worst recovery (ms)",
            format!("{:.0}", f.worst_recovery_ms),
            "",
        ),
        (
            "recoveries over the bound",
            f.slow_recoveries.to_string(),
            "must be 0",
        ),
        (
            "faults during another's recovery",
            f.compound_faults.to_string(),
            "not bounded",
        ),
        ("names left in the store", leaked.to_string(), "must be 0"),
    ];
    outln!("torture: TTL {ttl:?}, recovery bound {:?}", bound(ttl));
    for (what, figure, rule) in rows {
        outln!("  {what:<36} {figure:>8}  {rule}");
    }
    for told in &f.explained {
        outln!("  overlap: {told}");
    }
    outln!("verdict: {verdict}");
}

/// The worker: lock, read, a random critical section, write, release; a
/// new session after a lost one; on SIGTERM, close the session and go.
pub async fn worker(store: Arc<dyn Store>, args: WorkerArgs) -> Result<u8, String> {
    // SIGTERM from the harness: finish cleanly (close the session).
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let (stop, term) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signal.recv().await;
        let _ = stop.send(true);
    });
    worker_loop(
        store,
        args,
        tokio::io::stdin(),
        tokio::io::stdout(),
        term,
        None,
    )
    .await
}

/// The worker's loop, over its input (the harness's answers) and output
/// (its lines), until `term` says stop. `frozen`: an in-process worker's
/// gate, which it waits at before every line it says (a process is stopped
/// by SIGSTOP instead).
async fn worker_loop(
    store: Arc<dyn Store>,
    args: WorkerArgs,
    input: impl tokio::io::AsyncRead + Unpin,
    output: impl tokio::io::AsyncWrite + Unpin,
    mut term: tokio::sync::watch::Receiver<bool>,
    frozen: Option<tokio::sync::watch::Receiver<gate::Gate>>,
) -> Result<u8, String> {
    let name = Name::new(&args.name).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(args.seed);
    let mut answers = BufReader::new(input).lines();
    let mut out = Lines {
        out: output,
        frozen,
    };
    let mut session: Option<Session> = None;
    loop {
        let s = match &session {
            Some(s) if !s.is_lost() => s.clone(),
            _ => {
                let opened = tokio::select! {
                    s = Session::with_options(&store, SessionOptions::new().ttl(args.ttl)) => s,
                    _ = term.changed() => return Ok(0),
                };
                match opened {
                    Ok(s) => {
                        session = Some(s.clone());
                        s
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        out.say("req").await?;
        let mutex = Mutex::new(&s, name.as_str()).map_err(|e| e.to_string())?;
        let guard = tokio::select! {
            g = mutex.lock() => g,
            _ = term.changed() => {
                let _ = s.close().await;
                return Ok(0);
            }
        };
        let guard = match guard {
            Ok(g) => g,
            Err(Error::SessionLost(_)) => {
                out.say("lost").await?;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.token();
        out.say(&format!("grant {token}")).await?;
        let mut last_act = out.say(&format!("read {token}")).await?;
        let answer = answers
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let words: Vec<&str> = answer.split_whitespace().collect();
        let value = match words.as_slice() {
            ["ok", fenced, _] => fenced.parse::<u64>().unwrap_or(0),
            ["refused", _, twin] => twin.parse::<u64>().unwrap_or(0),
            _ => return Ok(0),
        };
        // A careful holder: it stops acting the moment its session is lost
        // (the library tells it before anyone else can be granted), and
        // looks once more just before it writes.
        let lost = tokio::select! {
            () = tokio::time::sleep(rng.between(Duration::from_millis(2), Duration::from_millis(30))) => s.is_lost(),
            _ = s.lost() => true,
        };
        if lost {
            out.say_at(lost_at(&s, last_act), "lost").await?;
            drop(guard);
            continue;
        }
        last_act = out.say(&format!("write {token} {}", value + 1)).await?;
        let _ = answers.next_line().await.map_err(|e| e.to_string())?;
        if s.is_lost() {
            out.say_at(lost_at(&s, last_act), "lost").await?;
            drop(guard);
            continue;
        }
        // The critical section ends here, before the lock is given back
        // (a release the store has not seen yet holds nothing more).
        out.say("release").await?;
        let _ = guard.release().await;
        if *term.borrow() {
            let _ = s.close().await;
            return Ok(0);
        }
    }
}

/// A worker's output to the harness.
struct Lines<W> {
    out: W,
    frozen: Option<tokio::sync::watch::Receiver<gate::Gate>>,
}

impl<W: tokio::io::AsyncWrite + Unpin> Lines<W> {
    /// Tells the harness `line`, stamped now (after a freeze, if one is on);
    /// returns the stamp.
    async fn say(&mut self, line: &str) -> Result<u64, String> {
        self.say_at(0, line).await
    }

    /// Tells the harness `line`, stamped `at` (0: now, after a freeze).
    async fn say_at(&mut self, at: u64, line: &str) -> Result<u64, String> {
        if let Some(frozen) = &mut self.frozen {
            let _ = frozen.wait_for(|g| *g != gate::Gate::Frozen).await;
        }
        let at = if at == 0 { mono_ns() } else { at };
        self.out
            .write_all(format!("{at} {line}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        self.out.flush().await.map_err(|e| e.to_string())?;
        Ok(at)
    }
}

/// When a holder's hold ended, by the library's word: a loss by the local
/// deadline dates from the deadline (from then on `is_lost` says so, and
/// the worker asks it before each act), or from the worker's last act if
/// that came later (a worker stopped between its check and its write acts
/// on waking, and the checker must see that); any other loss dates from
/// now, when the worker learned it. So a worker slow to notice (a busy
/// scheduler, an answer of the harness it was awaiting) is not counted as
/// holding past the moment the library told it.
fn lost_at(s: &Session, last_act: u64) -> u64 {
    let now = mono_ns();
    let told = match s.lost_reason() {
        Some(tenure::LostReason::Unconfirmed) => {
            let since = Instant::now().saturating_duration_since(s.deadline());
            now.saturating_sub(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
        }
        _ => now,
    };
    told.max(last_act).min(now)
}
