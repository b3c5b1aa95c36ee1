//! `tenure torture`, bounded, on every backend its workers (OS processes)
//! can share: the client-side faults (SIGKILL and SIGSTOP of the holder),
//! the checker's rules asserted from the report.

mod common;

use std::time::Duration;

use common::{output_within, Env};
use tenure_testkit::{EtcdCluster, MariaDbServer, PostgresServer, RedisServer, ZkEnsemble};

/// A bounded run: 4 workers, 20 s, TTL 1 s (or the store's shortest), a
/// fault every 3 s or so.
fn torture(url: String, seed: u64) {
    torture_with(url, seed, "1s")
}

fn torture_with(url: String, seed: u64, ttl: &str) {
    torture_run(url, seed, ttl, &[])
}

fn torture_run(url: String, seed: u64, ttl: &str, extra: &[&str]) {
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
                "--duration",
                "20s",
                "--ttl",
                ttl,
                "--fault-interval",
                "3s",
                "--seed",
                &seed.to_string(),
            ]);
            cmd.arg("--report")
                .arg(&report)
                .arg("--history")
                .arg(&history)
                .args(extra);
            cmd
        },
        Duration::from_secs(90),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    if out.status.code() != Some(0) {
        // Kept for a look: the history checks again to the same verdict.
        let kept = std::env::temp_dir().join(format!("torture-{seed}.jsonl"));
        let _ = std::fs::copy(&history, &kept);
        eprintln!("history kept at {}", kept.display());
    }
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
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
}

#[test]
fn sqlite() {
    torture(Env::sqlite().url.clone(), 1);
}

#[test]
fn redis() {
    let Some(server) = RedisServer::start_or_skip() else {
        return;
    };
    torture(server.url(), 2);
}

#[test]
fn redlock() {
    let servers: Option<Vec<RedisServer>> = (0..3).map(|_| RedisServer::start_or_skip()).collect();
    let Some(servers) = servers else { return };
    torture(RedisServer::redlock_url(&servers), 3);
}

#[test]
fn postgres() {
    let Some(server) = PostgresServer::start_or_skip() else {
        return;
    };
    torture(server.url(), 4);
}

#[test]
fn mysql() {
    let Some(server) = MariaDbServer::start_or_skip() else {
        return;
    };
    torture(server.url(), 5);
}

#[test]
fn etcd() {
    let Some(cluster) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    // etcd's shortest lease is 2 s.
    torture_with(cluster.url(), 6, "2s");
}

#[test]
fn zookeeper() {
    let Some(ensemble) = ZkEnsemble::start_or_skip(1) else {
        return;
    };
    torture(ensemble.url(), 7);
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
fn mysql_with_clock_jumps() {
    let Some(server) = MariaDbServer::start_with_clock_or_skip() else {
        return;
    };
    clock_jumps(server.url(), server.clock().unwrap().file(), 9);
}

/// Memory lives in one process: refused with a clear message.
#[test]
fn memory_is_refused() {
    let env = Env::with_url("memory://".into());
    let out = env.run(&["torture", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("processes"));
}
