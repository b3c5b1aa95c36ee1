//! The harness's run: start the proxies and the workers, give each fault
//! its turn until the run is over, stop the workers, look for names left
//! behind, and tell the verdict.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tenure::{Mutex, Session, SessionOptions, Store};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::faults::{inject, nemesis};
use super::options::{Plan, TortureArgs, NETWORK_FAULTS, SQLITE_SKEW_S};
use super::report::{allowance, print_summary, recheck, violations, write_history, Bound, Report};
use super::workers::{keep_task_worker, keep_worker};
use super::{proxy, workers, Rng, Shared};

/// Runs the harness; returns the exit code (0 pass, 1 safety violation,
/// 2 liveness or leak failure).
pub async fn run(store: Arc<dyn Store>, url: &str, args: TortureArgs) -> Result<u8, String> {
    if let Some(path) = &args.check {
        return recheck(path, args.ttl, args.strict, args.report.as_deref());
    }
    let plan = Plan::new(store.as_ref(), &args)?;
    let run_id = tenure::store::random_hex(4).map_err(|e| e.to_string())?;
    let prefix = format!("tenure-torture/{run_id}/");
    // A lock's run contends for one lock; a run of shard owners is one
    // group (its names are `tenure.group:PREFIX…` and `tenure.shard:PREFIX…`).
    let shards = args.shards.unwrap_or(0);
    let name = match shards {
        0 => format!("{prefix}lock"),
        _ => format!("{prefix}group"),
    };
    let bound = Bound::of(store.as_ref(), &args);
    let (links, urls) = if plan.network {
        start_proxies(url, &args).await?
    } else {
        (HashMap::new(), HashMap::new())
    };
    let builds = super::builds::Builds::new(args.mixed_with.as_ref())?;
    let shared = Arc::new(Shared::new(links, builds, shards));
    let tasks = spawn_workers(&shared, &store, url, urls, &name, &args, &plan)?;
    drive(&shared, &args, &plan.faults, &bound).await;
    stop_workers(&shared, tasks).await;
    let mut leaked = 0;
    for prefix in [
        prefix.clone(),
        format!("{}{prefix}", tenure::GROUP_PREFIX),
        format!("{}{prefix}", tenure::SHARD_PREFIX),
    ] {
        leaked += leaks(&store, &prefix, args.ttl).await?;
    }
    let history = shared.history();
    let findings = bound.check(&history);
    let build_failure = shared.builds.failure();
    let code = if findings.unsafe_run() {
        1
    } else if findings.slow_recoveries > 0 || leaked > 0 || build_failure.is_some() {
        2
    } else {
        0
    };
    let verdict = ["pass", "safety violation", "liveness or leak failure"][code as usize];
    print_summary(&findings, leaked, &bound, verdict);
    if shared.builds.mixed() {
        for b in shared.builds.report() {
            println!(
                "  {}: {} worker lives, {} grants, {} exited on their own",
                b.build, b.lives, b.grants, b.exits
            );
        }
    }
    if let Some(why) = &build_failure {
        eprintln!("torture: a build did not take its part: {why}");
    }
    if let Some(path) = &args.history {
        write_history(path, &history)?;
    }
    if let Some(path) = &args.report {
        let report = Report {
            store: tenure::mask_password(url),
            seed: args.seed,
            clients: args.clients,
            ttl_ms: args.ttl.as_millis() as u64,
            faults: plan.faults,
            worker_0_boottime_ahead_s: plan.skewed.then_some(SQLITE_SKEW_S),
            fault_interval_ms: args.fault_interval.as_millis() as u64,
            nemesis: args.nemesis_exec.is_some(),
            shards: args.shards,
            recovery_bound_ms: bound.stated.as_millis() as u64,
            recovery_allowance_ms: allowance(args.strict).as_millis() as u64,
            findings,
            leaked_names: leaked,
            builds: shared.builds.report(),
            verdict,
        };
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(code)
}

/// Each worker's proxy to each store server, and the store URL that goes
/// through them (network faults only).
type Links = (HashMap<u32, Vec<proxy::Proxy>>, HashMap<u32, String>);

/// Starts a proxy per worker and store server.
async fn start_proxies(url: &str, args: &TortureArgs) -> Result<Links, String> {
    let mut links = HashMap::new();
    let mut urls = HashMap::new();
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
    Ok((links, urls))
}

/// Starts every worker (a process of this binary, or a task for a store
/// that lives in this process), each kept running until the harness stops;
/// `urls`: a worker's own store URL, through its proxies.
fn spawn_workers(
    shared: &Arc<Shared>,
    store: &Arc<dyn Store>,
    url: &str,
    mut urls: HashMap<u32, String>,
    name: &str,
    args: &TortureArgs,
    plan: &Plan,
) -> Result<Vec<JoinHandle<()>>, String> {
    let mut tasks = Vec::new();
    for id in 0..args.clients {
        let url = urls.remove(&id).unwrap_or_else(|| url.to_string());
        let (shared, name) = (shared.clone(), name.to_string());
        let (ttl, seed) = (args.ttl, args.seed);
        let skew = (plan.skewed && id == 0).then_some(SQLITE_SKEW_S);
        if plan.in_process {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                keep_task_worker(shared, store, name, ttl, seed, id).await
            }));
            continue;
        }
        tasks.push(tokio::spawn(async move {
            keep_worker(shared, url, name, ttl, seed, id, skew).await
        }));
    }
    Ok(tasks)
}

/// Gives each fault its turn, and tells the progress every 2 s, until the
/// run's time or its cycles are up; then waits for a fault of the user's in
/// force to end.
async fn drive(shared: &Arc<Shared>, args: &TortureArgs, faults: &[String], bound: &Bound) {
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
                    if !inject(shared, &fault, args.ttl, &mut rng).await {
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
            let f = bound.check(&history);
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
}

/// Stops the workers: SIGTERM, so each worker releases and closes its
/// session (over links that pass again); waits for each (at most 15 s).
async fn stop_workers(shared: &Shared, tasks: Vec<JoinHandle<()>>) {
    shared.stopping.store(true, Ordering::SeqCst);
    for p in shared.links.values().flatten() {
        p.set(proxy::Mode::Pass);
    }
    for (control, _) in workers(shared).values() {
        control.cont();
        control.terminate();
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    }
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
