//! `tenure crond`: three instances of a service, one election, two jobs —
//! on SQLite and on PostgreSQL. Each run appends `JOB TICK FENCE INSTANCE`
//! to a file; the checks read it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tenure_testkit::PostgresServer;

const TTL: Duration = Duration::from_secs(2);
/// The session's renew interval at that TTL (a third of it).
const RENEW: Duration = Duration::from_millis(667);

const CRONTAB: &str = r#"# two jobs of one service
name=fast @every 1s echo "$TENURE_JOB $TENURE_TICK $TENURE_FENCE $INSTANCE" >> "$D/runs"
name=slow @every 3s echo "$TENURE_JOB $TENURE_TICK $TENURE_FENCE $INSTANCE" >> "$D/runs"
"#;

/// The same jobs, in the other order.
const REORDERED: &str = r#"name=slow @every 3s echo "$TENURE_JOB $TENURE_TICK $TENURE_FENCE $INSTANCE" >> "$D/runs"
# reordered
name=fast @every 1s echo "$TENURE_JOB $TENURE_TICK $TENURE_FENCE $INSTANCE" >> "$D/runs"
"#;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    job: String,
    tick: u64,
    fence: u64,
    instance: String,
}

fn runs(env: &Env) -> Vec<Run> {
    let text = std::fs::read_to_string(env.path("runs")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some(Run {
                job: f.first()?.to_string(),
                tick: f.get(1)?.parse().ok()?,
                fence: f.get(2)?.parse().ok()?,
                instance: f.get(3)?.to_string(),
            })
        })
        .collect()
}

fn instance(env: &Env, name: &str, i: usize, extra: &[&str]) -> Child {
    let crontab = env.path("crontab").display().to_string();
    let ttl = format!("{}s", TTL.as_secs());
    let mut args = vec![
        "crond",
        name,
        "--crontab",
        &crontab,
        "--ttl",
        &ttl,
        "--grace",
        "2s",
    ];
    args.extend_from_slice(extra);
    env.cmd(&args)
        .env("INSTANCE", i.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until `cond` holds on the runs so far.
fn wait_runs(env: &Env, within: Duration, what: &str, cond: impl Fn(&[Run]) -> bool) -> Vec<Run> {
    let deadline = Instant::now() + within;
    loop {
        let all = runs(env);
        if cond(&all) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}: {all:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn no_tick_twice(all: &[Run]) {
    let mut seen = BTreeSet::new();
    for r in all {
        assert!(
            seen.insert((r.job.clone(), r.tick)),
            "{} tick {} ran twice: {all:?}",
            r.job,
            r.tick
        );
    }
}

fn summary(label: &str, all: &[Run]) {
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in all {
        *by.entry((r.job.clone(), r.instance.clone())).or_default() += 1;
    }
    let fences: BTreeSet<u64> = all.iter().map(|r| r.fence).collect();
    eprintln!("{label}: runs by (job, instance): {by:?}; terms (fences): {fences:?}");
}

fn elector_status(env: &Env, name: &str) -> serde_json::Value {
    let out = env.run(&["elector", "status", name, "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The seed's scenario: both jobs always on the one leader, no tick twice;
/// the leader SIGKILLed and another takes over in time; a pause stops
/// every run and leaves nobody leading until resumed; a reordered crontab
/// read again on SIGHUP runs no tick twice.
fn three_instances_two_jobs(env: &Env) {
    let name = "billing";
    std::fs::write(env.path("crontab"), CRONTAB).unwrap();
    let mut instances: Vec<Option<Child>> =
        (0..3).map(|i| Some(instance(env, name, i, &[]))).collect();

    // Both jobs run, on one instance, in one term.
    let first = wait_runs(env, Duration::from_secs(20), "both jobs ran", |all| {
        all.iter().any(|r| r.job == "slow") && all.iter().filter(|r| r.job == "fast").count() >= 3
    });
    let leader: BTreeSet<&str> = first.iter().map(|r| r.instance.as_str()).collect();
    assert_eq!(
        leader.len(),
        1,
        "two instances ran jobs in one term: {first:?}"
    );
    let leader: usize = first[0].instance.parse().unwrap();
    let status = elector_status(env, name);
    assert_eq!(status["leader"]["token"], first[0].fence, "{status}");

    // The leader dies: another instance runs both jobs, in time.
    let killed_at = Instant::now();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut dead = instances[leader].take().unwrap();
    signal(dead.id(), libc::SIGKILL);
    let _ = dead.wait();
    // TTL + one renew interval + the slow job's period, and a second of slack
    // for starting a run on a loaded machine.
    let bound = TTL + RENEW + Duration::from_secs(3) + Duration::from_secs(1);
    let after = wait_runs(env, bound, "the jobs resumed on another instance", |all| {
        ["fast", "slow"].iter().all(|job| {
            all.iter()
                .any(|r| r.job == *job && r.tick > now_s && r.instance != leader.to_string())
        })
    });
    let resumed_in = killed_at.elapsed();
    let new_leader = after
        .iter()
        .rev()
        .find(|r| r.instance != leader.to_string())
        .unwrap()
        .instance
        .clone();
    no_tick_twice(&after);

    // A pause: the leader steps down, nobody runs or leads until resumed.
    let out = env.run(&["elector", "pause", name, "--reason", "maintenance"]);
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(RENEW + Duration::from_millis(700));
    let at_pause = runs(env).len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(runs(env).len(), at_pause, "runs while paused");
    let status = elector_status(env, name);
    assert!(
        status["leader"].is_null(),
        "a leader while paused: {status}"
    );
    assert_eq!(status["paused"]["reason"], "maintenance", "{status}");
    let out = env.run(&["elector", "resume", name]);
    assert!(out.status.success(), "{out:?}");
    wait_runs(
        env,
        Duration::from_secs(10),
        "runs after the resume",
        |all| all.len() > at_pause + 1,
    );

    // The crontab reordered and read again on SIGHUP: no tick twice.
    std::fs::write(env.path("crontab"), REORDERED).unwrap();
    for i in instances.iter().flatten() {
        signal(i.id(), libc::SIGHUP);
    }
    let before = runs(env).len();
    wait_runs(env, Duration::from_secs(10), "runs after SIGHUP", |all| {
        all.len() >= before + 4
    });

    for i in instances.iter().flatten() {
        signal(i.id(), libc::SIGTERM);
    }
    for i in instances.iter_mut().flatten() {
        let status = wait_exit(i, Duration::from_secs(15));
        assert!(status.success(), "{status}");
    }
    let all = runs(env);
    no_tick_twice(&all);
    // Within each term, both jobs ran on its one instance.
    let mut by_fence: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for r in &all {
        by_fence
            .entry(r.fence)
            .or_default()
            .insert(r.instance.clone());
    }
    for (fence, on) in &by_fence {
        assert_eq!(on.len(), 1, "term {fence} ran on {on:?}");
    }
    summary(
        &format!(
            "{} (leader {leader} killed, {new_leader} took over in {resumed_in:?})",
            env.url.split(':').next().unwrap_or("")
        ),
        &all,
    );
}

#[test]
fn crond_on_sqlite_one_leader_runs_both_jobs() {
    three_instances_two_jobs(&Env::sqlite());
}

#[test]
fn crond_on_postgres_one_leader_runs_both_jobs() {
    let Some(server) = PostgresServer::start_or_skip() else {
        return;
    };
    three_instances_two_jobs(&Env::with_url(server.url()));
}

/// A job that always fails, with on-failure=resign: each failure moves
/// leadership to another instance; the board records the failure and the
/// metrics never count a success.
#[test]
fn crond_failing_job_resigns_and_is_recorded_as_failed() {
    let env = Env::sqlite();
    std::fs::write(
        env.path("crontab"),
        "name=flaky on-failure=resign @every 1s echo \"$TENURE_JOB $TENURE_TICK $TENURE_FENCE $INSTANCE\" >> \"$D/runs\"; exit 3\n",
    )
    .unwrap();
    // Instance 0 serves its metrics, on a port picked just before it
    // starts: another test may take the port in between (instance 0 then
    // exits), so it is started again on another, up to three times, and
    // the others start once it answers.
    let (first, port) = (0..3)
        .find_map(|_| {
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let metrics = format!("127.0.0.1:{port}");
            let mut child = instance(&env, "flaky-svc", 0, &["--metrics", &metrics]);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if !http_get(port, "/metrics").is_empty() {
                    return Some((child, port));
                }
                if child.try_wait().ok().flatten().is_some() {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            None
        })
        .expect("instance 0 never served its metrics (three ports tried)");
    let mut instances: Vec<Child> = vec![first];
    instances.extend((1..3).map(|i| instance(&env, "flaky-svc", i, &[])));
    let all = wait_runs(
        &env,
        Duration::from_secs(30),
        "runs on two instances",
        |all| {
            all.iter()
                .map(|r| &r.instance)
                .collect::<BTreeSet<_>>()
                .len()
                >= 2
                && all.len() >= 4
        },
    );
    no_tick_twice(&all);
    // Every failed run ended its term: no term ran twice.
    let fences: BTreeSet<u64> = all.iter().map(|r| r.fence).collect();
    assert_eq!(
        fences.len(),
        all.len(),
        "a term outlived its failed run: {all:?}"
    );
    // The next tick after a failure already ran in a new term.
    let mut ticks: Vec<&Run> = all.iter().collect();
    ticks.sort_by_key(|r| r.tick);
    let consecutive = ticks
        .windows(2)
        .filter(|w| w[1].tick == w[0].tick + 1)
        .count();
    assert!(
        consecutive >= 1,
        "leadership never moved within one tick: {ticks:?}"
    );

    let out = env.run(&["schedule", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = list
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "flaky")
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(job["last_run"]["outcome"], "failed: exit 3", "{job}");
    // Instance 0 serves its metrics: runs counted, no success ever.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = http_get(port, "/metrics");
        if text.contains("tenure_cron_ticks_total{outcome=\"failed\",name=\"flaky\"}") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "instance 0 never ran the job: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        !text.contains("tenure_cron_last_success_timestamp_seconds{name=\"flaky\"}"),
        "a failed run counted as a success:\n{text}"
    );
    summary("failing job with on-failure=resign", &runs(&env));
    for i in &instances {
        signal(i.id(), libc::SIGTERM);
    }
    for i in instances.iter_mut() {
        assert!(wait_exit(i, Duration::from_secs(15)).success());
    }
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// Schedules in the user's terms, and names nobody started refused.
#[test]
fn schedules_explain_themselves_and_unknown_names_are_refused() {
    let env = Env::sqlite();
    let out = env.run(&["cron", "61 * * * *", "j", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("minute must be 0-59, not 61"), "{err}");
    assert!(
        err.contains("61 * * * *") && !err.contains("0 61 * * * *"),
        "{err}"
    );
    for ok in ["@every 1s", "@every 90m"] {
        let out = output_within(
            {
                let mut c = env.cmd(&["cron", ok, "j", "--", "true"]);
                c.stdin(Stdio::null());
                c
            },
            Duration::from_secs(2),
        );
        // Started (and killed after 2 s): not refused.
        assert_ne!(out.status.code(), Some(64), "{ok}: {out:?}");
    }
    // A bad name is escaped once, not twice.
    let out = env.run(&["lock", "a\nb", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"invalid name "a\nb""#), "{err}");
    let out = env.run(&["schedule", "pause", "never-ran-job"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job named never-ran-job"));
    let out = env.run(&["elector", "pause", "no-such-elector"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = env.run(&["elector", "resume", "no-such-elector"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

/// SIGTERM: no new run starts, the run in progress gets SIGTERM (and
/// finishes its own cleanup), and the leader resigns only once it is gone.
#[test]
fn crond_resigns_only_after_its_runs_are_gone() {
    let env = Env::sqlite();
    std::fs::write(
        env.path("crontab"),
        "name=slow-stop @every 1s [ -e \"$D/started\" ] || { trap 'sleep 0.6; touch \"$D/cleaned\"; exit 0' TERM; echo >> \"$D/started\"; sleep 30 & wait; }\n",
    )
    .unwrap();
    let mut crond = instance(&env, "stopper", 0, &[]);
    wait_file(&env.path("started"));
    let leader = |env: &Env| {
        let out = env.run(&["leader", "stopper", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()["token"]
            .clone()
    };
    assert!(!leader(&env).is_null(), "no leader while the run is alive");
    signal(crond.id(), libc::SIGTERM);
    // The run's cleanup takes 0.6 s (of the 2 s grace, so that a loaded
    // machine still fits it in): the leader stays until it is done.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !env.path("cleaned").exists(),
        "the run did not get a second for its cleanup"
    );
    assert!(!leader(&env).is_null(), "resigned while a run was alive");
    let status = wait_exit(&mut crond, Duration::from_secs(15));
    assert!(status.success(), "{status}");
    assert!(
        env.path("cleaned").exists(),
        "the run's cleanup did not finish"
    );
    assert!(leader(&env).is_null(), "still leading after exit");
}

/// With `$USER` and `$LOGNAME` unset (cron, containers), a pause names
/// the operator from the process's uid, in the pause and the audit record.
#[test]
fn a_pause_names_the_operator_without_user() {
    let env = Env::sqlite();
    let who = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    assert!(!who.is_empty());
    std::fs::write(env.path("crontab"), "name=named @every 1s true\n").unwrap();
    let mut crond = instance(&env, "named-svc", 0, &[]);
    let audit = env.path("audit.jsonl").display().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        let mut cmd = env.cmd(&["elector", "pause", "named-svc", "--audit-log", &audit]);
        cmd.env_remove("USER").env_remove("LOGNAME");
        let out = output_within(cmd, Duration::from_secs(30));
        if out.status.code() != Some(3) || Instant::now() > deadline {
            break out;
        }
        // Not listed yet: the instance lists its elector as it starts.
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(out.status.success(), "{out:?}");
    // A routine pause is not logged as a forced action (WARN, shown by default).
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("forced action"),
        "{out:?}"
    );
    let status = elector_status(&env, "named-svc");
    let by = status["paused"]["by"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(by.starts_with(&format!("{who} on ")), "{status}");
    let record: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(env.path("audit.jsonl"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    assert_eq!(record["who"], who.as_str(), "{record}");
    signal(crond.id(), libc::SIGTERM);
    assert!(wait_exit(&mut crond, Duration::from_secs(15)).success());
}

/// A resignation drains: with on-failure=resign, the leader starts no new
/// run, lets the runs in progress end (here a healthy job's, 1.5 s each,
/// under a 2 s grace), then resigns. No run of the healthy job gets SIGTERM
/// for another job's failure, and every one that started ends.
#[test]
fn a_resignation_lets_the_other_jobs_runs_finish() {
    let env = Env::sqlite();
    std::fs::write(
        env.path("crontab"),
        concat!(
            "name=bad on-failure=resign @every 2s echo \"$INSTANCE\" >> \"$D/bad\"; exit 1\n",
            "name=long @every 1s trap 'echo \"term $INSTANCE $TENURE_TICK\" >> \"$D/long\"' TERM; ",
            "echo \"start $INSTANCE $TENURE_TICK\" >> \"$D/long\"; sleep 1.5; ",
            "echo \"end $INSTANCE $TENURE_TICK\" >> \"$D/long\"\n",
        ),
    )
    .unwrap();
    let mut instances: Vec<Child> = (0..2).map(|i| instance(&env, "drain", i, &[])).collect();
    let read = |file: &str| std::fs::read_to_string(env.path(file)).unwrap_or_default();
    // Leadership moved at least five times, each time by a resignation.
    let deadline = Instant::now() + Duration::from_secs(40);
    while read("bad").lines().count() < 6 {
        assert!(
            Instant::now() < deadline,
            "the failing job did not run six times: {:?} / {:?}",
            read("bad"),
            read("long")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let cutoff = chrono::Utc::now().timestamp() - 3;
    for i in &mut instances {
        let _ = i.kill();
        let _ = i.wait();
    }
    let long = read("long");
    let lines: Vec<Vec<&str>> = long.lines().map(|l| l.split(' ').collect()).collect();
    let before = |l: &&Vec<&str>| {
        l.get(2)
            .and_then(|t| t.parse::<i64>().ok())
            .is_some_and(|t| t < cutoff)
    };
    let started: Vec<_> = lines
        .iter()
        .filter(before)
        .filter(|l| l[0] == "start")
        .collect();
    assert!(started.len() >= 3, "the healthy job hardly ran: {long}");
    for l in lines.iter().filter(before) {
        assert_ne!(
            l[0], "term",
            "a healthy run got SIGTERM for another job's failure: {long}"
        );
    }
    for s in &started {
        assert!(
            lines.iter().any(|l| l[0] == "end" && l[1..] == s[1..]),
            "a run of the healthy job did not end: {s:?} in {long}"
        );
    }
    let bad = read("bad");
    let leaders: BTreeSet<&str> = bad.lines().map(str::trim).collect();
    eprintln!(
        "resignations drained: {} healthy runs all ended; leaders {leaders:?}",
        started.len()
    );
}
