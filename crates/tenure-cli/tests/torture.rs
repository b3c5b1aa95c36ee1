//! `tenure torture`, bounded, on every backend its workers (OS processes)
//! can share: the client-side faults (SIGKILL and SIGSTOP of the holder),
//! on stores over a network the network faults too (a worker's links cut,
//! delayed, held; a minority of a cluster's servers cut off), the checker's
//! rules asserted from the report.

mod common;

use std::time::Duration;

use common::{output_within, Env};
use tenure_testkit::stores::{StoreFixture, STORES};
use tenure_testkit::{EtcdCluster, MariaDbServer, PostgresServer, RedisServer, Server, ZkEnsemble};

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
        f["grants"].as_u64().unwrap() >= 100,
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
    assert!(lines.lines().count() > 4 * f["grants"].as_u64().unwrap() as usize);
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

fn bounded_run(store: &StoreFixture, seed: u64) {
    let Some(running) = (store.start)() else {
        eprintln!("SKIPPED: {}: server not installed", store.backend);
        return;
    };
    // TTL 1 s, or the store's shortest (etcd's leases count whole seconds).
    let shortest = store
        .registry()
        .and_then(|b| b.capabilities())
        .map_or(Duration::ZERO, |c| c.min_ttl);
    let ttl = format!("{}s", shortest.as_secs_f64().ceil().max(1.0));
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

/// A nemesis that steps the server's wall clock 30 s forward (libfaketime)
/// and back again, taking turns with the client faults: still no overlap
/// outside a pause, and every recovery within its bound.
fn clock_jumps(url: String, clock_file: &std::path::Path, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nemesis");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\ncase \"$1\" in\n  start) printf '+30\\n' > {f}.tmp ;;\n  stop) printf '+0\\n' > {f}.tmp ;;\nesac\nmv {f}.tmp {f}\n",
            f = clock_file.display()
        ),
    )
    .unwrap();
    let cmd = format!("sh {}", script.display());
    torture_run(url, seed, "1s", &["--nemesis-exec", &cmd]);
}

#[test]
fn postgres_with_clock_jumps() {
    let Some(server) = PostgresServer::start_with_clock_or_skip() else {
        return;
    };
    clock_jumps(server.url(), server.clock().unwrap().file(), 8);
}

#[test]
fn zookeeper_with_clock_jumps() {
    let Some(ensemble) = ZkEnsemble::start_with_clock_or_skip() else {
        return;
    };
    clock_jumps(ensemble.url(), ensemble.clock().unwrap().file(), 10);
}

#[test]
fn mysql_with_clock_jumps() {
    let Some(server) = MariaDbServer::start_with_clock_or_skip() else {
        return;
    };
    clock_jumps(server.url(), server.clock().unwrap().file(), 9);
}

/// ...and it has no network to fault.
#[test]
fn memory_refuses_network_faults() {
    let env = Env::with_url("memory://".into());
    let out = env.run(&["torture", "--duration", "1s", "--faults", "partition"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no network"));
}

/// What the test does at each `--nemesis-exec` turn (from 1): start a
/// fault, then stop it.
trait Fault: Send + 'static {
    fn start(&mut self, turn: usize);
    fn stop(&mut self, turn: usize);
}

/// A server's own faults: SIGSTOP then SIGCONT, or (every other turn, where
/// the server keeps its data) kill -9 then a restart on its data.
struct ServerFault<S> {
    server: S,
    restarts: bool,
    killed: bool,
}

impl<S: Server + Send + 'static> Fault for ServerFault<S> {
    fn start(&mut self, turn: usize) {
        self.killed = self.restarts && turn % 2 == 0;
        if self.killed {
            self.server.kill();
        } else {
            self.server.pause();
        }
    }
    fn stop(&mut self, _: usize) {
        if std::mem::take(&mut self.killed) {
            self.server.restart();
        } else {
            self.server.resume();
        }
    }
}

/// A cluster's minority killed -9 and restarted on its data (etcd,
/// ZooKeeper), a different member each turn.
struct MemberKilled<C> {
    cluster: C,
    members: usize,
}

impl<C: tenure_testkit::Cluster + Send + 'static> Fault for MemberKilled<C> {
    fn start(&mut self, turn: usize) {
        self.cluster.kill_member(turn % self.members);
    }
    fn stop(&mut self, turn: usize) {
        self.cluster.restart_member(turn % self.members);
    }
}

/// Two Redlock nodes of five killed -9, and restarted empty after the
/// fault's 1.5–3 TTLs (the delayed restart Redlock asks for), other nodes
/// each turn.
struct RedlockMinorityKilled(Vec<RedisServer>);

impl RedlockMinorityKilled {
    fn two(&self, turn: usize) -> [usize; 2] {
        let n = self.0.len();
        [turn % n, (turn + 2) % n]
    }
}

impl Fault for RedlockMinorityKilled {
    fn start(&mut self, turn: usize) {
        for i in self.two(turn) {
            self.0[i].kill();
        }
    }
    fn stop(&mut self, turn: usize) {
        for i in self.two(turn) {
            self.0[i].restart();
        }
    }
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

fn paused<S: Server + Send + 'static>(server: S) -> ServerFault<S> {
    ServerFault {
        server,
        restarts: false,
        killed: false,
    }
}

fn paused_or_restarted<S: Server + Send + 'static>(server: S) -> ServerFault<S> {
    ServerFault {
        server,
        restarts: true,
        killed: false,
    }
}

#[test]
fn redis_server_paused() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    let url = server.url();
    // A killed Redis comes back empty (no persistence): paused only.
    torture_with_faults(paused(server), url, 12, "1s");
}

#[test]
fn redlock_minority_paused() {
    let servers: Option<Vec<RedisServer>> = (0..3).map(|_| RedisServer::start_or_skip()).collect();
    let Some(mut servers) = servers else { return };
    let url = RedisServer::redlock_url(&servers);
    // One node of three: the majority goes on.
    let node = servers.remove(0);
    torture_with_faults(paused(node), url, 13, "1s");
    drop(servers);
}

#[test]
fn redlock_five_nodes_two_killed() {
    let servers: Option<Vec<RedisServer>> = (0..5).map(|_| RedisServer::start_or_skip()).collect();
    let Some(servers) = servers else { return };
    let url = RedisServer::redlock_url(&servers);
    torture_with_faults(RedlockMinorityKilled(servers), url, 18, "1s");
}

#[test]
fn postgres_server_paused_and_restarted() {
    let Some(server) = PostgresServer::start_or_skip() else {
        return;
    };
    let url = server.url();
    torture_with_faults(paused_or_restarted(server), url, 14, "1s");
}

#[test]
fn mysql_server_paused_and_restarted() {
    let Some(server) = MariaDbServer::start_or_skip() else {
        return;
    };
    let url = server.url();
    torture_with_faults(paused_or_restarted(server), url, 15, "1s");
}

#[test]
fn etcd_server_paused_and_restarted() {
    let Some(cluster) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    let url = cluster.url();
    torture_with_faults(paused_or_restarted(cluster), url, 16, "2s");
}

#[test]
fn etcd_three_members_one_killed() {
    let Some(cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let url = cluster.url();
    let fault = MemberKilled {
        cluster,
        members: 3,
    };
    torture_with_faults(fault, url, 19, "2s");
}

#[test]
fn zookeeper_server_paused_and_restarted() {
    let Some(ensemble) = ZkEnsemble::start_or_skip(1) else {
        return;
    };
    let url = ensemble.url();
    torture_with_faults(paused_or_restarted(ensemble), url, 17, "1s");
}

#[test]
fn zookeeper_three_servers_one_killed() {
    let Some(ensemble) = ZkEnsemble::start_or_skip(3) else {
        return;
    };
    let url = ensemble.url();
    let fault = MemberKilled {
        cluster: ensemble,
        members: 3,
    };
    torture_with_faults(fault, url, 20, "2s");
}

/// A server's wall clock stepped 30 s forward for the fault, back after it
/// (libfaketime, through the test kit's clock file).
struct ClockJump(std::path::PathBuf);

impl ClockJump {
    fn set(&self, offset: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset}\n")).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Fault for ClockJump {
    fn start(&mut self, _: usize) {
        self.set("+30");
    }
    fn stop(&mut self, _: usize) {
        self.set("+0");
    }
}

/// `A` on odd turns, `B` on even ones (each counting its own turns).
struct Alternate<A, B>(A, B);

impl<A: Fault, B: Fault> Fault for Alternate<A, B> {
    fn start(&mut self, turn: usize) {
        if turn % 2 == 1 {
            self.0.start(turn.div_ceil(2));
        } else {
            self.1.start(turn / 2);
        }
    }
    fn stop(&mut self, turn: usize) {
        if turn % 2 == 1 {
            self.0.stop(turn.div_ceil(2));
        } else {
            self.1.stop(turn / 2);
        }
    }
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

const LONG_NETWORK: &str = "partition,delay,hold,kill,pause";

fn long_run(backend: &str, url: String, seed: u64, ttl: &str, faults: &'static str) {
    let cycles = long_cycles();
    let args = long_args(&cycles, faults);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = torture_run(url, seed, ttl, &args);
    keep_long_report(backend, &ran);
}

fn long_run_with<F: Fault>(backend: &str, fault: F, url: String, seed: u64, ttl: &str) {
    let cycles = long_cycles();
    let args = long_args(&cycles, LONG_NETWORK);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = torture_with_faults_and(fault, url, seed, ttl, &args);
    keep_long_report(backend, &ran);
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_memory() {
    long_run("memory", "memory://".into(), 101, "1s", "kill,pause");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_sqlite() {
    long_run(
        "sqlite",
        Env::sqlite().url.clone(),
        102,
        "1s",
        "kill,pause,clock",
    );
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_redis() {
    let server = RedisServer::start_or_skip().expect("redis-server");
    let url = server.url();
    long_run_with("redis", paused(server), url, 103, "1s");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_redlock() {
    let servers: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start_or_skip().expect("redis-server"))
        .collect();
    let url = RedisServer::redlock_url(&servers);
    long_run_with("redlock", RedlockMinorityKilled(servers), url, 104, "1s");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_postgres() {
    let server = PostgresServer::start_with_clock_or_skip().expect("postgres with libfaketime");
    let (url, clock) = (server.url(), server.clock().unwrap().file().to_path_buf());
    let fault = Alternate(paused_or_restarted(server), ClockJump(clock));
    long_run_with("postgres", fault, url, 105, "1s");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_mysql() {
    let server = MariaDbServer::start_with_clock_or_skip().expect("mariadb with libfaketime");
    let (url, clock) = (server.url(), server.clock().unwrap().file().to_path_buf());
    let fault = Alternate(paused_or_restarted(server), ClockJump(clock));
    long_run_with("mysql", fault, url, 106, "1s");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_etcd() {
    let cluster = EtcdCluster::start_or_skip(3).expect("etcd");
    let url = cluster.url();
    let fault = MemberKilled {
        cluster,
        members: 3,
    };
    long_run_with("etcd", fault, url, 107, "2s");
}

#[test]
#[ignore = "the long run: scripts/torture"]
fn long_run_zookeeper() {
    let ensemble = ZkEnsemble::start_or_skip(3).expect("zookeeper");
    let url = ensemble.url();
    let fault = MemberKilled {
        cluster: ensemble,
        members: 3,
    };
    long_run_with("zookeeper", fault, url, 108, "1s");
}
