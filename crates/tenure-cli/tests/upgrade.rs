//! A rolling upgrade, command by command: the previous release's `tenure`
//! (`TENURE_OLD_EXE`) and this build's on one store, in both orders.
//! `scripts/mixed-torture` runs it on every store of the test kit's table
//! (not CI: it needs the previous release built).
//!
//! (a) The old build first: an old `tenure cron` keeps ticking throughout;
//! an old holder with old and new waiters queued behind it, this build's
//! `tenure status` meanwhile, then fresh old processes. (b) This build
//! first, on an empty store, then old processes joining, and both builds
//! contending. Every command exits 0, none is refused, and no two critical
//! sections of one name overlap.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{output_within, wait_exit, Env};

/// A critical section that writes its start and end (ns) to `$D/cs`.
const SECTION: &str = "echo start $(date +%s%N) $TENURE_LOCK >> \"$D/cs\"; sleep 0.3; echo end $(date +%s%N) $TENURE_LOCK >> \"$D/cs\"";

struct Builds {
    old: PathBuf,
    new: PathBuf,
}

impl Builds {
    fn cmd(&self, old: bool, env: &Env, args: &[&str]) -> Command {
        let mut c = Command::new(if old { &self.old } else { &self.new });
        c.arg("--store")
            .arg(&env.url)
            .args(args)
            .env("D", env.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    /// Runs one command to its end (bounded): it must exit 0.
    fn run(&self, old: bool, env: &Env, args: &[&str]) -> String {
        let out = output_within(self.cmd(old, env, args), Duration::from_secs(60));
        let who = if old { "old" } else { "new" };
        assert_eq!(out.status.code(), Some(0), "{who} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn spawn(&self, old: bool, env: &Env, args: &[&str]) -> Child {
        self.cmd(old, env, args).spawn().unwrap()
    }

    /// `lock NAME -- sh -c SECTION`.
    fn lock(&self, old: bool, env: &Env, name: &str) -> Child {
        self.spawn(old, env, &["lock", name, "--", "sh", "-c", SECTION])
    }
}

/// Waits (bounded) for every child; each must exit 0.
fn all_exit_0(children: Vec<(&str, Child)>) {
    for (what, mut c) in children {
        let status = wait_exit(&mut c, Duration::from_secs(60));
        let mut err = String::new();
        if let Some(mut e) = c.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        assert_eq!(status.code(), Some(0), "{what}: {status:?} {err}");
    }
}

/// No two critical sections of one name overlap (`$D/cs`).
fn no_overlap(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("cs")).unwrap_or_default();
    let mut open: std::collections::HashMap<String, u128> = Default::default();
    let mut sections = 0;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [what, at, name] = w[..] else { continue };
        let at: u128 = at.parse().unwrap();
        match what {
            "start" => {
                assert!(
                    open.insert(name.to_string(), at).is_none(),
                    "{name}: two holders at once\n{text}"
                );
                sections += 1;
            }
            _ => {
                open.remove(name);
            }
        }
    }
    assert!(sections > 0, "no critical section ran");
}

/// Waits (bounded) until `name` shows `entries` entries to this build.
fn wait_entries(b: &Builds, env: &Env, name: &str, entries: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output_within(
            {
                let mut c = b.cmd(false, env, &["status", name, "--json"]);
                c.stdout(Stdio::piped());
                c
            },
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(0), "status: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let n = v
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["name"] == name)
            .map(|n| n["entries"].as_array().map_or(0, Vec::len))
            .sum::<usize>();
        if n >= entries {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {n} entries, not {entries}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// (a): the old build first.
fn old_first(b: &Builds, env: &Env) {
    let ticks = env.path("ticks");
    let mut cron = b.spawn(
        true,
        env,
        &[
            "cron",
            "* * * * * *",
            "up-cron",
            "--",
            "sh",
            "-c",
            "echo tick >> \"$D/ticks\"",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&ticks) == 0 {
        assert!(Instant::now() < deadline, "the old cron never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let holder = b.spawn(
        true,
        env,
        &[
            "lock",
            "up/a",
            "--",
            "sh",
            "-c",
            &format!("{SECTION}; sleep 2"),
        ],
    );
    wait_entries(b, env, "up/a", 1);
    let old_waiter = b.lock(true, env, "up/a");
    let new_waiter = b.lock(false, env, "up/a");
    wait_entries(b, env, "up/a", 3);
    b.run(false, env, &["status"]);
    all_exit_0(vec![
        ("old holder", holder),
        ("old waiter", old_waiter),
        ("new waiter", new_waiter),
    ]);
    // Fresh old processes, after this build's first use.
    all_exit_0(vec![("fresh old", b.lock(true, env, "up/b"))]);
    b.run(true, env, &["status"]);
    // The old cron kept running through it all, and still ticks.
    let before = lines(&ticks);
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&ticks) <= before {
        assert!(Instant::now() < deadline, "the old cron stopped ticking");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cron.try_wait().unwrap().is_none(), "the old cron ended");
    // This build's status shows both builds (a holder of this build, and
    // the old cron, which recorded none).
    let mine = b.spawn(false, env, &["lock", "up/e", "--", "sleep", "4"]);
    wait_entries(b, env, "up/e", 1);
    let builds = upgrade_status(b, env);
    let releases: Vec<&serde_json::Value> = builds["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["release"])
        .collect();
    assert!(
        releases.contains(&&serde_json::Value::Null)
            && releases.contains(&&serde_json::json!(env!("CARGO_PKG_VERSION"))),
        "{builds}"
    );
    // Finishing is refused while the old cron lives...
    let out = output_within(
        b.cmd(false, env, &["upgrade", "finish"]),
        Duration::from_secs(60),
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "finish with an old session: {out:?}"
    );
    // ...and done once it has stopped (SIGTERM: it ends its session).
    common::signal(cron.id(), libc::SIGTERM);
    let status = wait_exit(&mut cron, Duration::from_secs(30));
    assert!(status.code().is_some(), "the old cron: {status:?}");
    all_exit_0(vec![("new holder", mine)]);
    let finished = output_within(
        {
            let mut c = b.cmd(false, env, &["upgrade", "finish"]);
            c.stdout(Stdio::piped());
            c
        },
        Duration::from_secs(60),
    );
    assert_eq!(finished.status.code(), Some(0), "finish: {finished:?}");
    b.run(false, env, &["upgrade", "finish"]);
    // What finishing said is what happens to an old build now: refused
    // where the store keeps a marker older builds read (64, or 69 from a
    // 0.1.0 build over independent nodes: no node would take it, naming
    // the layout); where it keeps none, it said that older builds are not
    // refused.
    let said_finish = String::from_utf8_lossy(&finished.stdout).into_owned();
    let fresh_old = output_within(
        b.cmd(true, env, &["lock", "up/f", "--", "true"]),
        Duration::from_secs(60),
    );
    if said_finish.contains("refuse") {
        let said = String::from_utf8_lossy(&fresh_old.stderr);
        assert!(
            fresh_old.status.code() != Some(0)
                && (said.contains("schema version") || said.contains("layout")),
            "old after finish: {fresh_old:?}"
        );
    } else {
        assert!(said_finish.contains("do not read it"), "{said_finish}");
    }
    all_exit_0(vec![("new after finish", b.lock(false, env, "up/f"))]);
    no_overlap(env.dir.path());
}

/// `tenure upgrade status --json` of this build.
fn upgrade_status(b: &Builds, env: &Env) -> serde_json::Value {
    let out = output_within(
        {
            let mut c = b.cmd(false, env, &["upgrade", "status", "--json"]);
            c.stdout(Stdio::piped());
            c
        },
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (b): this build first, on an empty store; then the old one, then both.
fn new_first(b: &Builds, env: &Env) {
    all_exit_0(vec![("new first", b.lock(false, env, "up/c"))]);
    all_exit_0(vec![("old after", b.lock(true, env, "up/c"))]);
    b.run(true, env, &["status"]);
    let both: Vec<(&str, Child)> = (0..4)
        .map(|i| {
            let old = i % 2 == 0;
            (if old { "old" } else { "new" }, b.lock(old, env, "up/d"))
        })
        .collect();
    all_exit_0(both);
    no_overlap(env.dir.path());
}

#[test]
#[ignore = "needs the previous release's binary: scripts/mixed-torture"]
fn rolling_upgrade_scenarios() {
    let old = std::env::var("TENURE_OLD_EXE")
        .or_else(|_| std::env::var("TORTURE_OLD_EXE"))
        .expect("TENURE_OLD_EXE: the previous release's tenure");
    let b = Builds {
        old: PathBuf::from(old),
        new: PathBuf::from(env!("CARGO_BIN_EXE_tenure")),
    };
    let only = std::env::var("TORTURE_STORE").ok();
    let stores = tenure_testkit::stores::STORES
        .iter()
        .filter(|s| s.is_built_in() && s.backend != "memory")
        .filter(|s| only.as_deref().is_none_or(|o| o == s.backend));
    for store in stores {
        eprintln!("== {}: the old build first", store.backend);
        let running = (store.start)().expect("the store's server");
        old_first(&b, &Env::with_url(running.url.clone()));
        eprintln!("== {}: this build first", store.backend);
        let running = (store.start)().expect("the store's server");
        new_first(&b, &Env::with_url(running.url.clone()));
    }
}
