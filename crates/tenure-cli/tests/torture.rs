//! `tenure torture`, bounded, on every backend its workers (OS processes)
//! can share: the client-side faults (SIGKILL and SIGSTOP of the holder),
//! on stores over a network the network faults too (a worker's links cut,
//! delayed, held; a minority of a cluster's servers cut off), the checker's
//! rules asserted from the report.

mod common;

use std::time::Duration;

use common::{output_within, Env};
use tenure_testkit::faults::Fault;
use tenure_testkit::stores::{StoreFixture, STORES};

/// The network faults first (one at a time, each 1.5-3 TTLs), then the
/// client faults, a fault every 2 s or so.
const ALL_CLIENT_FAULTS: &[&str] = &[
    "--faults",
    "partition,delay,hold,kill,pause",
    "--fault-interval",
    "2s",
];

/// A bounded run with every client and network fault; the report names
/// each network fault that was injected.
fn torture_networked(url: String, seed: u64, ttl: &str, network_faults: &[&str]) {
    let report = torture_run(url, seed, ttl, ALL_CLIENT_FAULTS);
    let history = report.history;
    for fault in network_faults {
        assert!(
            history.contains(&format!("\"fault\":\"{fault}\"")),
            "no {fault} in the run"
        );
    }
}

/// What a run left to look at.
struct Ran {
    /// The history, as written (JSON lines).
    history: String,
    /// The report, as written (JSON).
    report: String,
}

fn torture_run(url: String, seed: u64, ttl: &str, extra: &[&str]) -> Ran {
    torture_run_granting(url, seed, ttl, extra, 100)
}

/// [`torture_run`], asking at least `min_grants` grants of the run.
fn torture_run_granting(url: String, seed: u64, ttl: &str, extra: &[&str], min_grants: u64) -> Ran {
    // One run at a time: each is four busy processes and a server, and
    // recoveries are held to a bound of a second or two on 2 cores.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::with_url(url);
    let report = env.path("report.json");
    let history = env.path("history.jsonl");
    let out = output_within(
        {
            let mut cmd = env.cmd(&[
                "torture",
                "--clients",
                "4",
                "--ttl",
                ttl,
                "--seed",
                &seed.to_string(),
            ]);
            if !extra.contains(&"--fault-interval") {
                cmd.args(["--fault-interval", "3s"]);
            }
            if !extra.contains(&"--duration") {
                cmd.args(["--duration", "20s"]);
            }
            cmd.arg("--report")
                .arg(&report)
                .arg("--history")
                .arg(&history)
                .args(extra);
            cmd
        },
        if extra.contains(&"--cycles") {
            LONG_RUN_LIMIT
        } else {
            Duration::from_secs(90)
        },
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    if out.status.code() != Some(0) {
        // Kept for a look: the history checks again to the same verdict.
        let kept = std::env::temp_dir().join(format!("torture-{seed}.jsonl"));
        let _ = std::fs::copy(&history, &kept);
        eprintln!("history kept at {}", kept.display());
        let status = env.run(&["status", "--json"]);
        eprintln!(
            "left in the store: {}",
            String::from_utf8_lossy(&status.stdout)
        );
    }
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report_text = std::fs::read_to_string(&report).unwrap();
    let report: serde_json::Value = serde_json::from_str(&report_text).unwrap();
    let f = &report["findings"];
    eprintln!(
        "torture at TTL {ttl}: worst recovery {} ms, stated bound {} ms, {} recoveries over it",
        f["worst_recovery_ms"], report["recovery_bound_ms"], f["recoveries_over_stated"]
    );
    for rule in [
        "fenced_lost_writes",
        "fenced_lower_token_accepted",
        "duplicate_tokens",
        "tokens_backwards",
        "overlaps_unpaused",
        "slow_recoveries",
    ] {
        assert_eq!(f[rule], 0, "{rule}: {report}");
    }
    assert_eq!(report["leaked_names"], 0, "{report}");
    assert!(
        f["grants"].as_u64().unwrap() >= min_grants,
        "too few grants: {report}"
    );
    assert!(
        f["faults"].as_u64().unwrap() >= 4,
        "too few faults: {report}"
    );
    // The password never reaches the report.
    assert!(!report.to_string().contains(tenure_testkit::PASSWORD));
    // The history checks again to the same verdict: one line per event.
    let lines = std::fs::read_to_string(&history).unwrap();
    // A lock's grant is a request, a grant, a read, a write and a release;
    // a shard's has no request.
    let per_grant = if extra.contains(&"--shards") { 3 } else { 4 };
    assert!(lines.lines().count() > per_grant * f["grants"].as_u64().unwrap() as usize);
    let mut again = env.cmd(&["torture", "--ttl", ttl, "--check"]);
    again.arg(&history);
    let out = output_within(again, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("verdict: pass"));
    Ran {
        history: lines,
        report: report_text,
    }
}

/// A bounded run on every store of the test kit's table that this build
/// has: the client faults everywhere, and on a store over a network the
/// network faults too, each of which the report must name. `memory://`
/// lives in one process: its workers are tasks of the harness, each over a
/// gated view of the store (a kill cuts a task off for good, its session
/// left to expire; a pause holds its calls and its lines). Runs go one at a
/// time anyway, so one test takes the stores in turn and names every store
/// that failed.
#[test]
fn every_store_of_the_table() {
    let mut failed = Vec::new();
    for (seed, store) in (1..).zip(STORES.iter().filter(|s| s.is_built_in())) {
        eprintln!("== {}", store.backend);
        if std::panic::catch_unwind(|| bounded_run(store, seed)).is_err() {
            failed.push(store.backend);
        }
    }
    assert!(failed.is_empty(), "torture failed on {failed:?}");
}

/// TTL 2 s, or the store's shortest TTL if that is longer, in whole
/// seconds.
fn two_seconds_or_shortest(store: &StoreFixture) -> String {
    let shortest = store
        .registry()
        .and_then(|b| b.capabilities())
        .map_or(Duration::ZERO, |c| c.min_ttl);
    format!("{}s", shortest.as_secs_f64().ceil().max(2.0))
}

fn bounded_run(store: &StoreFixture, seed: u64) {
    let Some(running) = (store.start)() else {
        eprintln!("SKIPPED: {}: server not installed", store.backend);
        return;
    };
    // TTL 2 s (or the store's shortest, if longer), where a recovery of
    // two TTLs shows over the bound and its allowance; TORTURE_TTL for
    // another.
    let ttl = match std::env::var("TORTURE_TTL") {
        Ok(ttl) => ttl,
        Err(_) => two_seconds_or_shortest(store),
    };
    if store.torture_network_faults.is_empty() {
        torture_run(running.url.clone(), seed, &ttl, &[]);
    } else {
        torture_networked(
            running.url.clone(),
            seed,
            &ttl,
            store.torture_network_faults,
        );
    }
}

/// Shard owners (`--shards 16`) on every store of the table: four members
/// of one group under kills and pauses (and on a store over a network, its
/// links cut, delayed and held), each shard checked as a lock is (one
/// owner at a time, tokens rising, the fenced register per shard) and each
/// shard lost with its owner owned again within the shards' bound.
#[test]
fn shard_owners_on_every_store_of_the_table() {
    let mut failed = Vec::new();
    for (seed, store) in (21..).zip(STORES.iter().filter(|s| s.is_built_in())) {
        eprintln!("== {} (shards)", store.backend);
        let ran = std::panic::catch_unwind(|| {
            let Some(running) = (store.start)() else {
                eprintln!("SKIPPED: {}: server not installed", store.backend);
                return;
            };
            let ttl = two_seconds_or_shortest(store);
            // The client faults first: a network fault lasts 1.5-3 TTLs.
            let faults = if store.torture_network_faults.is_empty() {
                "kill,pause"
            } else {
                "kill,pause,partition,delay,hold"
            };
            let extra = [
                "--shards",
                "16",
                "--faults",
                faults,
                "--fault-interval",
                "2s",
                "--duration",
                "16s",
            ];
            let ran = torture_run_granting(running.url.clone(), seed, &ttl, &extra, 16);
            assert!(ran.report.contains("\"shards\": 16"), "{}", ran.report);
        });
        if ran.is_err() {
            failed.push(store.backend);
        }
    }
    assert!(
        failed.is_empty(),
        "shard owners' torture failed on {failed:?}"
    );
}

/// One worker's CLOCK_BOOTTIME (SQLite's lease clock) an hour ahead of
/// the others', in a time namespace of its own: its leases mean the same
/// to everyone, killed or paused.
#[test]
fn sqlite_with_a_worker_an_hour_ahead() {
    let ran = torture_run(
        Env::sqlite().url.clone(),
        8,
        "1s",
        &["--faults", "kill,pause,clock"],
    );
    assert!(
        ran.report.contains("\"worker_0_boottime_ahead_s\": 3600"),
        "{}",
        ran.report
    );
    // Worker 0 took part: granted, and faulted at least once.
    assert!(ran.history.contains("\"worker\":0,\"op\":\"grant\""));
}

/// ...and it has no network to fault.
#[test]
fn memory_refuses_network_faults() {
    let env = Env::with_url("memory://".into());
    let out = env.run(&["torture", "--duration", "1s", "--faults", "partition"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no network"));
}

/// Runs a bounded torture with the test itself as the nemesis: the
/// harness's `--nemesis-exec` script asks (a file in a directory of its
/// own) and waits (bounded) until this thread has started or stopped
/// `fault`, so the server faults come from the test kit, which owns the
/// servers (the harness runs one such fault at a time). Safety rules as in
/// every run; the recovery bound applies to the client faults, which take
/// turns with it.
fn torture_with_faults<F: Fault>(fault: F, url: String, seed: u64, ttl: &str) {
    torture_with_faults_and(fault, url, seed, ttl, &[]);
}

fn torture_with_faults_and<F: Fault>(
    fault: F,
    url: String,
    seed: u64,
    ttl: &str,
    extra: &[&str],
) -> Ran {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let script = d.join("nemesis");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\nprintf '%s\\n' \"$1\" > {d}/req.tmp\nmv {d}/req.tmp {d}/req\n\
             i=0\nwhile [ ! -e {d}/ack ]; do sleep 0.05; i=$((i+1)); [ $i -lt 1200 ] || exit 1; done\n\
             rm {d}/ack\n",
            d = d.display()
        ),
    )
    .unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let acting = {
        let (stop, d) = (stop.clone(), d.clone());
        std::thread::spawn(move || {
            let mut fault = fault;
            let mut turns = 0usize;
            // Whether a fault is in force: the end undoes it.
            let mut started = false;
            while !stop.load(Ordering::Relaxed) {
                let Ok(phase) = std::fs::read_to_string(d.join("req")) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = std::fs::remove_file(d.join("req"));
                match phase.trim() {
                    "start" if !started => {
                        turns += 1;
                        fault.start(turns);
                        started = true;
                    }
                    "stop" if started => {
                        fault.stop(turns);
                        started = false;
                    }
                    _ => {}
                }
                std::fs::write(d.join("ack"), "").unwrap();
            }
            if started {
                fault.stop(turns);
            }
            (fault, turns)
        })
    };
    // Whatever happens to the run (a failed assertion), the thread stops
    // and the fault is undone, then the servers dropped.
    struct Stop<T>(
        std::sync::Arc<AtomicBool>,
        Option<std::thread::JoinHandle<T>>,
    );
    impl<T> Drop for Stop<T> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
            if let Some(t) = self.1.take() {
                let _ = t.join();
            }
        }
    }
    let mut guard = Stop(stop, Some(acting));
    let cmd = format!("sh {}", script.display());
    let mut args = vec!["--nemesis-exec", &cmd];
    args.extend(extra);
    let ran = torture_run(url, seed, ttl, &args);
    guard.0.store(true, Ordering::Relaxed);
    let (_fault, turns) = guard.1.take().unwrap().join().unwrap();
    assert!(turns >= 1, "no server fault took its turn");
    ran
}

/// Every store of the table that this build has, with each of the server
/// faults its row names, one bounded run each, in turn; every scenario that
/// failed is named.
#[test]
fn every_store_with_its_server_faults() {
    let mut failed = Vec::new();
    let scenarios = STORES
        .iter()
        .filter(|s| s.is_built_in())
        .flat_map(|s| s.torture_scenarios.iter().map(move |t| (s.backend, t)));
    // TORTURE_SCENARIO=sentinel (say) runs only the scenarios whose
    // "backend: name" holds it, to try one by hand.
    let only = std::env::var("TORTURE_SCENARIO").unwrap_or_default();
    for (seed, (backend, scenario)) in (12..).zip(scenarios) {
        if !format!("{backend}: {}", scenario.name).contains(&only) {
            continue;
        }
        eprintln!("== {backend}: {}", scenario.name);
        let Some(faulted) = (scenario.start)() else {
            eprintln!("SKIPPED: {backend}: server not installed");
            continue;
        };
        let run = || torture_with_faults(faulted.fault, faulted.url, seed, scenario.ttl);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
            failed.push(format!("{backend}: {}", scenario.name));
        }
    }
    assert!(failed.is_empty(), "torture failed on {failed:?}");
}

// The long run (`scripts/torture`, not CI): at least 10,000 grants per
// backend with every fault this machine can inject there, the report kept
// in `torture/long/BACKEND.json` for the table in docs/torture.md.

/// A long run's own limit (it ends at 10,000 grants, or 40 minutes).
const LONG_RUN_LIMIT: Duration = Duration::from_secs(45 * 60);

/// How many grants a long run takes (`TORTURE_LONG_CYCLES`, default 10,000;
/// a smaller count only to try the script).
fn long_cycles() -> String {
    std::env::var("TORTURE_LONG_CYCLES").unwrap_or_else(|_| "10000".into())
}

fn keep_long_report(backend: &str, ran: &Ran) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../torture/long");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{backend}.json")), &ran.report).unwrap();
    let report: serde_json::Value = serde_json::from_str(&ran.report).unwrap();
    let want: u64 = long_cycles().parse().unwrap();
    assert!(
        report["findings"]["grants"].as_u64().unwrap() >= want,
        "fewer than {want} grants in 40 minutes: {report}"
    );
}

fn long_args(cycles: &str, faults: &'static str) -> Vec<String> {
    [
        "--cycles",
        cycles,
        "--duration",
        "40m",
        "--faults",
        faults,
        "--fault-interval",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The long run of one store of the table, named by `TORTURE_STORE`
/// (`scripts/torture` runs each in turn).
#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run() {
    let backend = std::env::var("TORTURE_STORE").expect("TORTURE_STORE names a store");
    let store = tenure_testkit::stores::store(&backend).expect("a store of the table");
    let long = store.long_run;
    let cycles = long_cycles();
    let args = long_args(&cycles, long.faults);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Seeds as the long runs have always had them, by the table's order.
    let seed = 101
        + STORES
            .iter()
            .position(|s| s.backend == backend)
            .unwrap_or(0) as u64;
    let ran = match long.scenario {
        Some(start) => {
            let faulted = start().expect("the store's servers");
            torture_with_faults_and(faulted.fault, faulted.url, seed, long.ttl, &args)
        }
        None => {
            let running = (store.start)().expect("the store");
            torture_run(running.url.clone(), seed, long.ttl, &args)
        }
    };
    keep_long_report(&backend, &ran);
}

// Builds side by side (`--mixed-with`): workers of two builds share the
// store, each worker's lives alternating between them.

/// Workers of two builds (here this binary twice, so the run is about the
/// harness): both are granted, and the report counts each build's part.
#[test]
fn mixed_builds_take_turns() {
    let exe = env!("CARGO_BIN_EXE_tenure");
    let ran = torture_run(
        Env::sqlite().url.clone(),
        21,
        "1s",
        // Faults come every 1 to 3 s here (half to one and a half the
        // interval), so at least four fall in the run: the harness's rule.
        &[
            "--mixed-with",
            exe,
            "--duration",
            "14s",
            "--fault-interval",
            "2s",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&ran.report).unwrap();
    let builds = report["builds"].as_array().unwrap();
    assert_eq!(builds.len(), 2, "{report}");
    for b in builds {
        assert!(b["grants"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(b["exits"], 0, "{report}");
    }
}

/// A build the store refuses (its workers exit at once, as an old build
/// facing a schema it does not know did) fails the run, named.
#[test]
fn mixed_builds_fail_when_one_is_refused() {
    let env = Env::sqlite();
    let refused = env.path("refused.sh");
    std::fs::write(
        &refused,
        "#!/bin/sh\n[ \"$1\" = -V ] && { echo 'tenure refused-build'; exit 0; }\necho refused >&2\nexit 64\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&refused, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = env.cmd(&[
        "torture",
        "--clients",
        "2",
        "--ttl",
        "1s",
        "--duration",
        "4s",
        "--faults",
        "none",
        "--mixed-with",
    ]);
    cmd.arg(&refused);
    let out = output_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tenure refused-build") && stderr.contains("exited on their own"),
        "{stderr}"
    );
}

/// The rolling upgrade under faults (`scripts/mixed-torture`, not CI): the
/// store named by `TORTURE_STORE`, workers of this build and of
/// `TORTURE_OLD_EXE` (the previous release's binary), the client faults and
/// the store's network faults; its report goes to
/// `torture/mixed/STORE.json`.
#[test]
#[ignore = "the mixed-build run: scripts/mixed-torture"]
fn mixed_builds() {
    let backend = std::env::var("TORTURE_STORE").expect("TORTURE_STORE names a store");
    let old = std::env::var("TORTURE_OLD_EXE").expect("TORTURE_OLD_EXE: the older build");
    let duration = std::env::var("TORTURE_MIXED_DURATION").unwrap_or_else(|_| "60s".into());
    let store = tenure_testkit::stores::store(&backend).expect("a store of the table");
    let running = (store.start)().expect("the store's server");
    // The faults and TTL of the bounded run: the network faults where the
    // store has a network, a TTL of 1 s or the store's shortest.
    let faults = if store.torture_network_faults.is_empty() {
        "kill,pause"
    } else {
        "partition,delay,hold,kill,pause"
    };
    let shortest = store
        .registry()
        .and_then(|b| b.capabilities())
        .map_or(Duration::ZERO, |c| c.min_ttl);
    let ttl = format!("{}s", shortest.as_secs_f64().ceil().max(1.0));
    let ran = torture_run(
        running.url.clone(),
        300,
        &ttl,
        &[
            "--mixed-with",
            &old,
            "--duration",
            &duration,
            "--faults",
            faults,
            "--fault-interval",
            "2s",
        ],
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../torture/mixed");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{backend}.json")), &ran.report).unwrap();
    let report: serde_json::Value = serde_json::from_str(&ran.report).unwrap();
    for b in report["builds"].as_array().unwrap() {
        assert!(b["grants"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(b["exits"], 0, "{report}");
    }
}
