//! Lock racer across OS processes on one SQLite file: four workers take one
//! lock in turns while a fifth process that held it was SIGKILLed. Inside the
//! critical section each worker creates a marker file that must not exist
//! (exclusion across processes) and appends its fencing token to a log
//! (tokens must strictly increase in grant order).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const ROUNDS: usize = 15;
const LOCK: &str = "racer";

fn child(role: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
    cmd.args(["racer", "--exact", "--nocapture", "--test-threads=1"])
        .env("TENURE_RACER_ROLE", role)
        .env("TENURE_RACER_DIR", dir);
    cmd
}

#[test]
fn racer() {
    if let Ok(role) = std::env::var("TENURE_RACER_ROLE") {
        let dir = PathBuf::from(std::env::var("TENURE_RACER_DIR").expect("racer dir"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let code = rt.block_on(worker(&role, &dir));
        std::process::exit(code);
    }
    let dir = tempfile::tempdir().unwrap();

    // A holder that is killed while it holds the lock.
    let mut hog = child("hog", dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let held = dir.path().join("hog-token");
    let started = Instant::now();
    let hog_token: u64 = loop {
        if let Ok(token) = std::fs::read_to_string(&held) {
            if let Ok(token) = token.trim().parse() {
                break token;
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = hog.kill();
            panic!("the holder process never took the lock");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    hog.kill().unwrap(); // SIGKILL: no release, no close
    hog.wait().unwrap();
    let killed_at = Instant::now();

    let mut workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            child("worker", dir.path())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for w in workers.iter_mut() {
        loop {
            if let Some(status) = w.try_wait().unwrap() {
                assert!(status.success(), "worker failed: {status}");
                break;
            }
            if Instant::now() > deadline {
                for w in workers.iter_mut() {
                    let _ = w.kill();
                }
                panic!("racer workers did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let tokens: Vec<u64> = log.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(tokens.len(), WORKERS * ROUNDS);
    assert!(
        tokens[0] > hog_token,
        "a worker's token {} not above the killed holder's {hog_token}",
        tokens[0]
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {tokens:?}"
    );
    eprintln!(
        "racer: {} grants across {WORKERS} processes in {:?} after the holder was killed",
        tokens.len(),
        killed_at.elapsed()
    );
}

async fn worker(role: &str, dir: &Path) -> i32 {
    let url = format!("sqlite://{}", dir.join("locks.db").display());
    let store = match tenure::open(&url).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("open: {e}");
            return 2;
        }
    };
    let options = tenure::SessionOptions::new().ttl(Duration::from_secs(1));
    let session = tenure::Session::with_options(&store, options)
        .await
        .unwrap();
    let mutex = tenure::Mutex::new(&session, LOCK).unwrap();
    if role == "hog" {
        let guard = mutex.lock().await.unwrap();
        // Write-then-rename so the parent never reads half a number.
        let tmp = dir.join("hog-token.tmp");
        std::fs::write(&tmp, guard.token().to_string()).unwrap();
        std::fs::rename(&tmp, dir.join("hog-token")).unwrap();
        std::future::pending::<()>().await;
    }
    let marker = dir.join("inside");
    for _ in 0..ROUNDS {
        let guard = match tokio::time::timeout(Duration::from_secs(60), mutex.lock()).await {
            Ok(Ok(g)) => g,
            other => {
                eprintln!("lock: {other:?}");
                return 2;
            }
        };
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
            .is_err()
        {
            eprintln!("two processes inside the critical section");
            return 3;
        }
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("log"))
            .unwrap();
        writeln!(log, "{}", guard.token()).unwrap();
        drop(log);
        tokio::time::sleep(Duration::from_millis(2)).await;
        std::fs::remove_file(&marker).unwrap();
        if let Err(e) = guard.release().await {
            eprintln!("release: {e}");
            return 2;
        }
    }
    session.close().await.unwrap();
    0
}
