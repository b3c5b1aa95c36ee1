//! The supervision suite: one contract for every runner (`lock`, `elect`,
//! `cron` in both modes, `crond`, `shards`), checked the same way on each, on SQLite,
//! PostgreSQL and Redis — as the conformance suite checks every store.
//!
//! Each run is `sh run.sh`: it appends `start` to `$D/events`, reports any
//! process of an earlier run still alive when it starts (`overlap`: the
//! overlap detector, read from the commands' own logs), and leaves two
//! grandchildren in its group: one that handles SIGTERM (appends
//! `handled`) and one that ignores it. A case then does to tenure (or to the
//! store) what a user's machine does, and checks what the contract says:
//! the run's whole group is gone before any other instance's run of the
//! same thing starts, by the lease's deadline, and a script's TERM handler
//! runs where a stop is graceful.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The TTL every instance runs with, and what follows from it.
const TTL: Duration = Duration::from_secs(2);
/// `--grace` of `cron` and `crond` (a stop's SIGTERM to SIGKILL).
const GRACE: Duration = Duration::from_secs(1);

/// A run: the overlap check, `start`, a TERM handler and a TERM ignorer.
const RUN: &str = r#"for f in "$D"/pids.*; do
  [ -e "$f" ] || continue
  for p in $(cat "$f"); do
    if [ -e /proc/$p/stat ] && ! grep -q ') Z' /proc/$p/stat 2>/dev/null; then
      echo "overlap $I $p" >> "$D/events"
    fi
  done
done
echo "start $I $$" >> "$D/events"
sh "$D/handler.sh" &
h=$!
sh "$D/ignorer.sh" &
g=$!
echo "$$ $h $g" > "$D/pids.$I.$$"
while :; do sleep 0.05; done
"#;

/// A grandchild whose TERM handler takes a moment to clean up (as a real
/// one does), then says it ran.
const HANDLER: &str = r#"trap 'sleep 0.15; echo "handled $I $$" >> "$D/events"; exit 0' TERM
echo "ready $I $$" >> "$D/events"
while :; do sleep 0.05; done
"#;

/// A grandchild that ignores TERM (its `sleep`s inherit that).
const IGNORER: &str = r#"trap '' TERM
while :; do sleep 0.05; done
"#;

/// How a run was started, from inside it, in one line (a crontab line
/// too): first whether `wait` for a background job returns (it hangs in a
/// shell started with SIGCHLD blocked), then the signal mask and ignored
/// signals a program it starts gets, and its process group. Its
/// descriptors are read from outside while it sleeps.
const FACTS: &str = r#"sleep 0.2 & wait $!; grep -E "^Sig(Blk|Ign):" /proc/self/status > "$D/sig.$I"; cut -d" " -f5 /proc/$$/stat > "$D/pgid.$I"; echo "$$ waited" > "$D/facts.$I"; sleep 30"#;

/// A program started directly, no shell between (a shell clears its own
/// signal mask at start): its mask and ignored signals, on its stdout.
const DIRECT: [&str; 4] = ["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runner {
    Lock,
    Elect,
    CronPerTick,
    CronLeader,
    Crond,
    /// `tenure shards` with one shard: one run at a time across instances.
    Shards,
}

impl Runner {
    /// Whether two instances' runs must never overlap (per-tick mode runs
    /// different ticks on different instances at once).
    fn exclusive(self) -> bool {
        self != Runner::CronPerTick
    }

    /// The arguments of an instance running `command` (a shell line).
    fn args(self, env: &Env, name: &str, command: &str) -> Vec<String> {
        self.args_argv(env, name, command, &["sh", "-c", command])
    }

    /// The arguments of an instance running `argv` (`crond`: the shell
    /// line `command`, which its crontab holds).
    fn args_argv(self, env: &Env, name: &str, command: &str, argv: &[&str]) -> Vec<String> {
        let ttl = format!("{}s", TTL.as_secs());
        let grace = format!("{}s", GRACE.as_secs());
        let sh = |args: &mut Vec<String>| {
            args.push("--".into());
            args.extend(argv.iter().map(|a| a.to_string()));
        };
        let mut args: Vec<String> = Vec::new();
        match self {
            Runner::Lock | Runner::Elect => {
                let verb = if self == Runner::Lock {
                    "lock"
                } else {
                    "elect"
                };
                args.extend([verb.into(), name.into(), "--ttl".into(), ttl]);
                sh(&mut args);
            }
            Runner::CronPerTick | Runner::CronLeader => {
                let mode = if self == Runner::CronLeader {
                    "leader"
                } else {
                    "per-tick"
                };
                args.extend(["cron", "@every 1s", name, "--mode", mode].map(String::from));
                args.extend(["--ttl".into(), ttl, "--grace".into(), grace]);
                sh(&mut args);
            }
            Runner::Shards => {
                args.extend(["shards", name, "--shards", "1"].map(String::from));
                args.extend(["--ttl".into(), ttl, "--grace".into(), grace]);
                sh(&mut args);
            }
            Runner::Crond => {
                let crontab = env.path("crontab");
                std::fs::write(&crontab, format!("name={name}-job @every 1s {command}\n")).unwrap();
                args.extend(["crond".into(), name.into(), "--crontab".into()]);
                args.push(crontab.display().to_string());
                args.extend(["--ttl".into(), ttl, "--grace".into(), grace]);
            }
        }
        args
    }

    /// How long after a stop's signal the group may still be there: the
    /// grace, and the time to notice.
    fn stop_bound(self) -> Duration {
        let grace = match self {
            // lock and elect: --kill-grace, TTL/6 by default.
            Runner::Lock | Runner::Elect => TTL / 6,
            _ => GRACE,
        };
        grace + Duration::from_secs(2)
    }
}

/// One case: a directory, a store, a name, and the instances started.
struct Case {
    env: Env,
    runner: Runner,
    name: String,
    children: Vec<Child>,
}

impl Case {
    fn new(runner: Runner, url: &str, name: &str) -> Case {
        let env = Env::with_url(url.to_string());
        for (file, text) in [
            ("run.sh", RUN),
            ("handler.sh", HANDLER),
            ("ignorer.sh", IGNORER),
        ] {
            std::fs::write(env.path(file), text).unwrap();
        }
        Case {
            env,
            runner,
            name: name.to_string(),
            children: Vec::new(),
        }
    }

    /// Starts instance `id` running `command`; `own_group` puts tenure in
    /// a process group of its own (as a job-control shell does).
    fn start_with(&mut self, id: &str, command: &str, own_group: bool) -> u32 {
        let args = self.runner.args(&self.env, &self.name, command);
        self.start_args(id, &args, own_group)
    }

    /// Starts instance `id` of tenure with `args`.
    fn start_args(&mut self, id: &str, args: &[String], own_group: bool) -> u32 {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = self.env.cmd(&args);
        cmd.env("I", id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.env.path(&format!("stderr.{id}"))).unwrap());
        if own_group {
            cmd.process_group(0);
        }
        let child = cmd.spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        pid
    }

    fn start(&mut self, id: &str) -> u32 {
        self.start_with(id, r#"sh "$D/run.sh""#, false)
    }

    fn events(&self) -> Vec<String> {
        std::fs::read_to_string(self.env.path("events"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// Waits (bounded) for an event line starting with `prefix`.
    fn wait_event(&self, prefix: &str, within: Duration) -> Duration {
        let start = Instant::now();
        while !self.events().iter().any(|e| e.starts_with(prefix)) {
            assert!(
                start.elapsed() < within,
                "{:?}: no {prefix:?} within {within:?}: {:?}\n{}",
                self.runner,
                self.events(),
                self.stderr_all()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    }

    /// The processes of instance `id`'s runs (the shell, the TERM handler,
    /// the TERM ignorer), once its first run has written them.
    fn group_of(&self, id: &str) -> Vec<i32> {
        let start = Instant::now();
        loop {
            let mut pids = Vec::new();
            for entry in std::fs::read_dir(self.env.dir.path()).unwrap() {
                let entry = entry.unwrap();
                let file = entry.file_name().to_string_lossy().to_string();
                if file.starts_with(&format!("pids.{id}.")) {
                    let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    pids.extend(
                        text.split_whitespace()
                            .filter_map(|p| p.parse::<i32>().ok()),
                    );
                }
            }
            let ready = self
                .events()
                .iter()
                .any(|e| e.starts_with(&format!("ready {id}")));
            if pids.len() >= 3 && ready {
                return pids;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{:?}: instance {id} never ran: {:?}\n{}",
                self.runner,
                self.events(),
                self.stderr_all()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr_all(&self) -> String {
        let mut all = String::new();
        for id in ["a", "b"] {
            let text =
                std::fs::read_to_string(self.env.path(&format!("stderr.{id}"))).unwrap_or_default();
            all.push_str(&format!("--- stderr of {id}:\n{text}"));
        }
        all
    }

    /// No run started while another's process was alive.
    fn assert_no_overlap(&self) {
        if !self.runner.exclusive() {
            return;
        }
        let overlaps: Vec<String> = self
            .events()
            .into_iter()
            .filter(|e| e.starts_with("overlap"))
            .collect();
        assert!(
            overlaps.is_empty(),
            "{:?}: a run started while another's group ran: {overlaps:?} in {:?}\n{}",
            self.runner,
            self.events(),
            self.stderr_all()
        );
    }

    fn handled(&self, id: &str) -> bool {
        self.events()
            .iter()
            .any(|e| e.starts_with(&format!("handled {id}")))
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        for child in &mut self.children {
            // A stopped instance (or group) cannot die of SIGKILL while
            // stopped only if never continued: continue it too.
            signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
        for p in self.group_of_all() {
            // SAFETY: kill(2) on a pid of this test's own processes.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

impl Case {
    fn group_of_all(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        if let Ok(dir) = std::fs::read_dir(self.env.dir.path()) {
            for entry in dir.flatten() {
                if entry.file_name().to_string_lossy().starts_with("pids.") {
                    let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    pids.extend(
                        text.split_whitespace()
                            .filter_map(|p| p.parse::<i32>().ok()),
                    );
                }
            }
        }
        pids
    }
}

/// The command starts as a shell would start it: an empty signal mask,
/// what tenure's parent ignored still ignored (here SIGHUP, as `nohup`
/// sets it) and nothing else, only descriptors 0-2 (tenure is started
/// with descriptor 9 open), a process group of its own, and `wait` for a
/// background job returns.
fn clean_start(runner: Runner, url: &str, name: &str) {
    let mut case = Case::new(runner, url, name);
    let args = runner.args(&case.env, name, FACTS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = case.env.cmd(&args);
    let inherited = std::fs::File::open("/dev/null").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&inherited);
    cmd.env("I", "a")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: dup2 and signal are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            libc::dup2(fd, 9);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    case.children.push(cmd.spawn().unwrap());
    let facts = wait_file(&case.env.path("facts.a"));
    let pid: i32 = facts.split(' ').next().unwrap().parse().unwrap();
    let sig = std::fs::read_to_string(case.env.path("sig.a")).unwrap();
    assert!(
        sig.contains("SigBlk:\t0000000000000000"),
        "{runner:?}: the command's signal mask is not empty: {sig}"
    );
    assert!(
        sig.contains("SigIgn:\t0000000000000001"),
        "{runner:?}: the command ignores other signals than SIGHUP (ignored by tenure's parent): {sig}"
    );
    // Read while the shell waits for its `sleep` (a builtin's redirection
    // holds a descriptor for a moment: let it go first).
    std::thread::sleep(Duration::from_millis(300));
    let mut fds: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    assert_eq!(
        fds,
        [0, 1, 2],
        "{runner:?}: the command has descriptors beyond 0-2"
    );
    let pgid: i32 = std::fs::read_to_string(case.env.path("pgid.a"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(pgid, pid, "{runner:?}: the command does not lead its group");
    drop(inherited);
    // SAFETY: kill(2) on the command this case started.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

/// A program the runner starts directly (no shell between) has an empty
/// signal mask and ignores only what tenure's parent ignored.
fn direct_start(runner: Runner, url: &str, name: &str) {
    let case = Case::new(runner, url, name);
    let args = runner.args_argv(&case.env, name, "", &DIRECT);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = case.env.cmd(&args);
    // SAFETY: signal is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let lines: Vec<String> = std::io::BufReader::new(stdout)
            .lines()
            .take(2)
            .map_while(Result::ok)
            .collect();
        let _ = tx.send(lines.join("\n"));
    });
    let got = rx.recv_timeout(Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    let got = got.expect("the command printed its status");
    assert!(
        got.contains("SigBlk:\t0000000000000000"),
        "{runner:?}: the command's signal mask is not empty: {got}"
    );
    assert!(
        got.contains("SigIgn:\t0000000000000001"),
        "{runner:?}: the command ignores other signals than SIGHUP: {got}"
    );
}

/// Waits (bounded) until every pid is dead.
fn gone_within(case: &Case, pids: &[i32], within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    while !pids.iter().all(|p| dead(*p)) {
        assert!(
            start.elapsed() < within,
            "{:?}: {what}: still alive after {within:?}: {:?}\n{}",
            case.runner,
            pids.iter().filter(|p| !dead(**p)).collect::<Vec<_>>(),
            case.stderr_all()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

/// tenure SIGKILLed: its run gets SIGTERM (the handler runs), SIGKILL
/// after the grace, and is gone before the standby's run starts.
fn tenure_sigkilled(runner: Runner, url: &str, name: &str) {
    let mut case = Case::new(runner, url, name);
    let a = case.start("a");
    let group = case.group_of("a");
    case.start("b");
    signal(a, libc::SIGKILL);
    let killed = Instant::now();
    let took = gone_within(
        &case,
        &group,
        TTL + Duration::from_secs(3),
        "after tenure's SIGKILL",
    );
    if runner.exclusive() {
        case.wait_event("start b", Duration::from_secs(30));
    }
    eprintln!(
        "[{runner:?} {url}] tenure SIGKILLed: its run's group gone after {took:?}; the standby's first run {:?} after the kill (TTL {TTL:?})",
        killed.elapsed()
    );
    case.assert_no_overlap();
    assert!(
        case.handled("a"),
        "{runner:?}: the script's TERM handler did not run: {:?}",
        case.events()
    );
}

/// tenure (or its whole process group) SIGSTOPped past its TTL: the
/// supervisor, in a group of its own, stops the run by the lease's local
/// deadline — SIGTERM the grace before it (the handler runs), SIGKILL at
/// it — before the standby's run starts.
fn tenure_sigstopped(runner: Runner, url: &str, name: &str, whole_group: bool) {
    let mut case = Case::new(runner, url, name);
    let a = case.start_with("a", r#"sh "$D/run.sh""#, whole_group);
    let group = case.group_of("a");
    case.start("b");
    let target = if whole_group { -(a as i32) } else { a as i32 };
    // SAFETY: kill(2) on this case's own tenure (or its group).
    unsafe { libc::kill(target, libc::SIGSTOP) };
    let stopped = Instant::now();
    let took = gone_within(
        &case,
        &group,
        TTL + Duration::from_secs(3),
        "tenure stopped",
    );
    if runner.exclusive() {
        case.wait_event("start b", Duration::from_secs(30));
    }
    eprintln!(
        "[{runner:?} {url}] tenure{} SIGSTOPped: its run's group gone after {took:?} (the lease's deadline: under the TTL, {TTL:?}); the standby's first run {:?} after the stop",
        if whole_group { "'s process group" } else { "" },
        stopped.elapsed()
    );
    assert!(
        took <= TTL + Duration::from_millis(500),
        "{runner:?}: the group outlived the lease's deadline: {took:?}"
    );
    case.assert_no_overlap();
    assert!(
        case.handled("a"),
        "{runner:?}: the script's TERM handler did not run before the deadline: {:?}",
        case.events()
    );
    // SAFETY: as above.
    unsafe { libc::kill(target, libc::SIGCONT) };
}

/// A signal to tenure: passed on to the whole group (the handler runs),
/// SIGKILL after the grace (the ignorer goes too), and tenure exits.
fn signal_to_tenure(runner: Runner, url: &str, name: &str, sig: i32) {
    let mut case = Case::new(runner, url, name);
    let a = case.start("a");
    let group = case.group_of("a");
    signal(a, sig);
    let took = gone_within(
        &case,
        &group,
        runner.stop_bound(),
        "after a signal to tenure",
    );
    assert!(
        case.handled("a"),
        "{runner:?}: the script's handler did not run on signal {sig}: {:?}",
        case.events()
    );
    let child = case.children.last_mut().unwrap();
    let status = wait_exit(child, Duration::from_secs(20));
    eprintln!("[{runner:?}] signal {sig} to tenure: its run's group gone after {took:?}; tenure exited {status:?}");
}

/// The lease taken away by the store (`tenure release --session TAG
/// --force`, an administrator's eviction): tenure hears of it at its next
/// renewal and stops the run as on any loss — SIGTERM to the group (the
/// handler runs), SIGKILL after the lease grace. (Another holder may be
/// granted before that: an eviction is safe only where the resource checks
/// fencing tokens, so no overlap is asserted here.)
fn lease_evicted(runner: Runner, url: &str, name: &str) {
    let mut case = Case::new(runner, url, name);
    let a = case.start("a");
    let group = case.group_of("a");
    // The session of instance a: its entries carry tenure's host:pid.
    let status = case.env.run(&["status", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let label = format!(":{a}");
    let tag = all
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|n| n["entries"].as_array().cloned().unwrap_or_default())
        .find(|e| e["label"].as_str().is_some_and(|l| l.ends_with(&label)))
        .and_then(|e| e["session"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("{runner:?}: no entry of instance a in {all}"));
    let out = case.env.run(&["release", "--session", &tag, "--force"]);
    assert!(out.status.success(), "{out:?}");
    let evicted = Instant::now();
    // One renew interval to hear of it (TTL/3), the lease grace, slack.
    let took = gone_within(&case, &group, TTL, "evicted");
    assert!(
        case.handled("a"),
        "{runner:?}: the script's handler did not run on eviction: {:?}",
        case.events()
    );
    eprintln!(
        "[{runner:?}] lease evicted: the run's group gone after {took:?} ({:?} since the eviction)",
        evicted.elapsed()
    );
}

/// The store stops answering (its server SIGSTOPped): no renewal is
/// confirmed, and the run is stopped by the lease's local deadline.
fn store_paused(runner: Runner, backend: &str, name: &str) {
    let Some(running) = (tenure_testkit::stores::store(backend).unwrap().start)() else {
        return;
    };
    let server = running.server.as_ref().unwrap();
    let mut case = Case::new(runner, &running.url, name);
    case.start("a");
    let group = case.group_of("a");
    server.pause();
    let paused = Instant::now();
    let took = gone_within(
        &case,
        &group,
        TTL + Duration::from_secs(3),
        "the store paused",
    );
    server.resume();
    eprintln!(
        "[{runner:?} {backend}] store paused: the run's group gone after {took:?} (TTL {TTL:?}); handled: {}",
        case.handled("a")
    );
    assert!(paused.elapsed() >= took);
    assert!(
        case.handled("a"),
        "{runner:?}: the script's handler did not run before the deadline: {:?}",
        case.events()
    );
}

/// A pause of `crond`'s elector (`tenure elector pause`): the run is
/// stopped gracefully before the leader steps down, and no other instance
/// runs while it is paused. (`tenure schedule pause` skips ticks; a run in
/// progress goes on.)
fn paused_by_operator(runner: Runner, url: &str, name: &str) {
    let mut case = Case::new(runner, url, name);
    case.start("a");
    let group = case.group_of("a");
    case.start("b");
    let out = case.env.run(&["elector", "pause", name]);
    assert!(out.status.success(), "{out:?}");
    let took = gone_within(&case, &group, Duration::from_secs(10), "paused");
    assert!(
        case.handled("a"),
        "{runner:?}: a pause did not let the handler run: {:?}",
        case.events()
    );
    eprintln!("[{runner:?}] paused: the run's group gone after {took:?}");
    std::thread::sleep(TTL);
    case.assert_no_overlap();
}

/// A shard that moves (`tenure shards`, two shards: a second member takes
/// one of the first's) is revoked: SIGTERM to its run's group (the handler
/// runs), and the new owner's run of that shard starts only once the old
/// run is gone; the other shard's run goes on.
fn shard_revoked(url: &str, name: &str) {
    let mut case = Case::new(Runner::Shards, url, name);
    std::fs::write(
        case.env.path("shard.sh"),
        r#"echo "start $I $TENURE_SHARD $$" >> "$D/events"
trap 'sleep 0.15; echo "handled $I $TENURE_SHARD $$" >> "$D/events"; exit 0' TERM
while :; do sleep 0.05; done
"#,
    )
    .unwrap();
    let run = r#"sh "$D/shard.sh""#;
    let args = |case: &Case| {
        let mut args = Runner::Shards.args(&case.env, name, run);
        // Two shards instead of one.
        let at = args.iter().position(|a| a == "--shards").unwrap();
        args[at + 1] = "2".into();
        args
    };
    let spawn = |case: &mut Case, id: &str| {
        let args = args(case);
        case.start_args(id, &args, false);
    };
    spawn(&mut case, "a");
    case.wait_event("start a 0", Duration::from_secs(20));
    case.wait_event("start a 1", Duration::from_secs(20));
    spawn(&mut case, "b");
    case.wait_event("start b", Duration::from_secs(20));
    let events = case.events();
    let b_start = events
        .iter()
        .position(|e| e.starts_with("start b"))
        .unwrap();
    let moved = events[b_start].split(' ').nth(2).unwrap().to_string();
    let handled = events
        .iter()
        .position(|e| e.starts_with(&format!("handled a {moved}")));
    assert!(
        handled.is_some_and(|h| h < b_start),
        "shard {moved}: b's run started before a's run of it was stopped: {events:?}\n{}",
        case.stderr_all()
    );
    let stayed = if moved == "0" { "1" } else { "0" };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !case
            .events()
            .iter()
            .any(|e| e.starts_with(&format!("handled a {stayed}"))),
        "the shard that did not move was stopped: {:?}",
        case.events()
    );
    eprintln!("[Shards] shard {moved} moved from a to b; its run was stopped first: {events:?}");
}

/// The cases every runner has, on one store.
macro_rules! runner_cases {
    ($url:expr, $runner:ident, $runner_v:expr, [$($extra:ident),*] $(, $direct:ident)?) => {
        mod $runner {
            use super::*;

            fn name(case: &str) -> String {
                format!("sv-{}-{}", stringify!($runner), case)
            }

            fn url() -> Option<String> {
                $url
            }

            #[test]
            fn starts_clean() {
                let Some(url) = url() else { return };
                clean_start($runner_v, &url, &name("clean"));
            }

            $(direct_case!($runner_v, $direct);)?

            #[test]
            fn tenure_sigkilled_run_gone_before_the_next() {
                let Some(url) = url() else { return };
                tenure_sigkilled($runner_v, &url, &name("kill"));
            }

            #[test]
            fn tenure_sigstopped_run_gone_by_the_deadline() {
                let Some(url) = url() else { return };
                tenure_sigstopped($runner_v, &url, &name("stop"), false);
            }

            #[test]
            fn tenure_group_sigstopped_run_gone_by_the_deadline() {
                let Some(url) = url() else { return };
                tenure_sigstopped($runner_v, &url, &name("stopgroup"), true);
            }

            #[test]
            fn sigterm_to_tenure_stops_the_run_gracefully() {
                let Some(url) = url() else { return };
                signal_to_tenure($runner_v, &url, &name("term"), libc::SIGTERM);
            }

            #[test]
            fn lease_evicted_run_stopped_gracefully() {
                let Some(url) = url() else { return };
                lease_evicted($runner_v, &url, &name("evict"));
            }

            #[test]
            fn sigint_to_tenure_stops_the_run_gracefully() {
                let Some(url) = url() else { return };
                signal_to_tenure($runner_v, &url, &name("int"), libc::SIGINT);
            }

            $(extra_case!($extra, $runner_v);)*
        }
    };
}

/// A program started directly: every runner but `crond`, whose commands
/// are crontab lines run by a shell.
macro_rules! direct_case {
    ($runner_v:expr, direct) => {
        #[test]
        fn starts_a_program_clean() {
            let Some(url) = url() else { return };
            direct_start($runner_v, &url, &name("direct"));
        }
    };
}

/// The cases only some runners or stores have.
macro_rules! extra_case {
    (hup, $runner_v:expr) => {
        /// (`crond` reads its crontab again on SIGHUP: not a stop.)
        #[test]
        fn sighup_to_tenure_stops_the_run_gracefully() {
            let Some(url) = url() else { return };
            signal_to_tenure($runner_v, &url, &name("hup"), libc::SIGHUP);
        }
    };
    (store_pause, $runner_v:expr) => {
        /// (A server store: an embedded file cannot be paused.)
        #[test]
        fn store_paused_run_gone_by_the_deadline() {
            let backend = module_path!().split("::").nth(1).unwrap();
            store_paused($runner_v, backend, &name("storepause"));
        }
    };
    (revoke, $runner_v:expr) => {
        #[test]
        fn shard_revoked_run_stopped_before_the_next_owner() {
            let Some(url) = url() else { return };
            shard_revoked(&url, &name("revoke"));
        }
    };
    (operator_pause, $runner_v:expr) => {
        #[test]
        fn elector_paused_run_stopped_gracefully() {
            let Some(url) = url() else { return };
            paused_by_operator($runner_v, &url, &name("pause"));
        }
    };
}

/// Every runner's cases on one store.
macro_rules! store_cases {
    ($store:ident, $url:expr, [$($store_extra:ident),*]) => {
        mod $store {
            use super::*;
            runner_cases!($url, lock, Runner::Lock, [hup $(, $store_extra)*], direct);
            runner_cases!($url, elect, Runner::Elect, [hup $(, $store_extra)*], direct);
            runner_cases!($url, cron_per_tick, Runner::CronPerTick, [hup $(, $store_extra)*], direct);
            runner_cases!($url, cron_leader, Runner::CronLeader, [hup $(, $store_extra)*], direct);
            runner_cases!($url, crond, Runner::Crond, [operator_pause $(, $store_extra)*]);
            runner_cases!($url, shards, Runner::Shards, [hup, revoke $(, $store_extra)*], direct);
        }
    };
}

/// A server of the store, shared by this binary's cases (each case uses
/// names of its own); `None` where it is missing and this is not CI.
fn shared_url(backend: &'static str) -> Option<String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Servers = Mutex<HashMap<&'static str, Option<tenure_testkit::stores::Running>>>;
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    let servers = SERVERS.get_or_init(Default::default);
    let mut servers = servers.lock().unwrap_or_else(|e| e.into_inner());
    servers
        .entry(backend)
        .or_insert_with(|| (tenure_testkit::stores::store(backend).unwrap().start)())
        .as_ref()
        .map(|r| r.url.clone())
}

fn sqlite_url() -> Option<String> {
    // One file per case would do as well; a shared one is closer to a
    // machine's default store.
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    Some(format!(
        "sqlite://{}",
        dir.path().join("supervision.db").display()
    ))
}

store_cases!(sqlite, sqlite_url(), []);
store_cases!(postgres, shared_url("postgres"), [store_pause]);
store_cases!(redis, shared_url("redis"), [store_pause]);
