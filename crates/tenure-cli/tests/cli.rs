//! End-to-end tests of the real `tenure` binary on an SQLite store.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{dead, output_within, signal, wait_exit, wait_file, Env};

#[test]
fn two_lockers_never_overlap_and_fences_increase() {
    let env = Env::sqlite();
    let script = r#"mkdir "$D/inside" || exit 9; echo "$TENURE_FENCE" >> "$D/log"; sleep 0.05; rmdir "$D/inside""#;
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..4 {
                    let out = env.run(&["lock", "race", "--", "sh", "-c", script]);
                    assert!(out.status.success(), "{out:?}");
                }
            });
        }
    });
    let log = std::fs::read_to_string(env.path("log")).unwrap();
    let fences: Vec<u64> = log.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(fences.len(), 8);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

#[test]
fn no_wait_and_wait_give_75_on_a_held_lock() {
    let env = Env::sqlite();
    let mut holder = env
        .cmd(&["lock", "busy", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    env.wait_held("busy");
    let out = env.run(&["lock", "busy", "--no-wait", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not acquired"));
    let start = Instant::now();
    let out = env.run(&["lock", "busy", "--wait", "300ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(start.elapsed() >= Duration::from_millis(300));
    // SIGTERM to tenure reaches the command; the lock is released after.
    signal(holder.id(), libc::SIGTERM);
    let status = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let out = env.run(&["lock", "busy", "--no-wait", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn unfair_lockers_never_overlap_and_wait_out_a_holder() {
    let env = Env::sqlite();
    let script = r#"mkdir "$D/inside" || exit 9; echo "$TENURE_FENCE" >> "$D/log"; sleep 0.05; rmdir "$D/inside""#;
    let mut holder = env
        .cmd(&[
            "lock",
            "race",
            "--",
            "sh",
            "-c",
            &format!("{script}; sleep 1"),
        ])
        .spawn()
        .unwrap();
    env.wait_held("race");
    // Held: a non-fair try and a non-fair timed wait give 75, as the fair ones do.
    let out = env.run(&["lock", "race", "--unfair", "--wait", "200ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..3 {
                    let out = env.run(&["lock", "race", "--unfair", "--", "sh", "-c", script]);
                    assert!(out.status.success(), "{out:?}");
                }
            });
        }
    });
    assert!(wait_exit(&mut holder, Duration::from_secs(10)).success());
    let log = std::fs::read_to_string(env.path("log")).unwrap();
    let fences: Vec<u64> = log.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(fences.len(), 7, "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

#[test]
fn exit_code_of_the_command_is_passed_through() {
    let env = Env::sqlite();
    let out = env.run(&["lock", "code", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = env.run(&["lock", "code", "--", "/no/such/program"]);
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn sigkilled_holder_is_replaced_within_ttl_plus_renew() {
    let env = Env::sqlite();
    let ttl = Duration::from_secs(1);
    let mut holder = env
        .cmd(&[
            "lock",
            "crash",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$D/pid"; exec sleep 60"#,
        ])
        .spawn()
        .unwrap();
    let orphan: i32 = wait_file(&env.path("pid")).parse().unwrap();
    env.wait_held("crash");
    signal(holder.id(), libc::SIGKILL);
    let killed = Instant::now();
    holder.wait().unwrap();
    let out = env.run(&["lock", "crash", "--ttl", "1s", "--", "true"]);
    let took = killed.elapsed();
    assert!(out.status.success(), "{out:?}");
    // TTL + one renew interval (TTL/3) + process start-up slack.
    assert!(
        took <= ttl + ttl / 3 + Duration::from_millis(700),
        "took {took:?}"
    );
    unsafe { libc::kill(orphan, libc::SIGKILL) };
}

#[test]
fn lease_loss_kills_the_process_group() {
    let env = Env::sqlite();
    let mut holder = env
        .cmd(&[
            "lock",
            "doomed",
            "--ttl",
            "1s",
            "--",
            "sh",
            "-c",
            r#"sleep 300 & echo $! > "$D/grandchild"; echo $$ > "$D/child"; wait"#,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child: i32 = wait_file(&env.path("child")).parse().unwrap();
    let grandchild: i32 = wait_file(&env.path("grandchild")).parse().unwrap();
    env.wait_held("doomed");
    // Evicting the holder's session makes its next renewal fail: lease lost.
    let out = env.run(&["release", "doomed", "--force"]);
    assert!(out.status.success(), "{out:?}");
    let status = wait_exit(&mut holder, Duration::from_secs(5));
    assert_eq!(status.code(), Some(79));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(dead(child) && dead(grandchild)) {
        assert!(
            Instant::now() < deadline,
            "process group survived the lease"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("lease lost"), "{stderr}");
    // The holder is told what happened: evicted, not an expiry.
    assert!(
        stderr.contains("evicted") && !stderr.contains("the store expired"),
        "{stderr}"
    );
}

#[test]
fn elect_fails_over_and_leader_watch_shows_terms_in_order() {
    let env = Env::sqlite();
    let mut watch = env
        .cmd(&["leader", "sched", "--watch"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("watch line")
    };
    assert_eq!(next(), "none");

    let elected = |child: &mut Child| -> u64 {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim()
            .strip_prefix("elected ")
            .expect("elected line")
            .parse()
            .unwrap()
    };
    let mut a = env
        .cmd(&["elect", "sched", "--value", "A", "--ttl", "1s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ta = elected(&mut a);
    assert!(next().starts_with(&format!("A token={ta} ")));
    let mut b = env
        .cmd(&["elect", "sched", "--value", "B", "--ttl", "1s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    signal(a.id(), libc::SIGKILL);
    a.wait().unwrap();
    let tb = elected(&mut b);
    assert!(tb > ta);
    assert!(next().starts_with(&format!("B token={tb} ")));
    let out = env.run(&["leader", "sched", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["token"].as_u64(), v["value"].as_str()),
        (Some(tb), Some("B"))
    );
    // SIGTERM: B resigns and exits 0; the watcher sees the vacancy.
    signal(b.id(), libc::SIGTERM);
    assert!(wait_exit(&mut b, Duration::from_secs(5)).success());
    assert_eq!(next(), "none");
    let out = env.run(&["leader", "sched"]);
    assert_eq!(out.status.code(), Some(3));
    signal(watch.id(), libc::SIGTERM);
    wait_exit(&mut watch, Duration::from_secs(5));
}

#[test]
fn elect_runs_the_command_only_while_leader() {
    let env = Env::sqlite();
    let out = env.run(&[
        "elect",
        "job",
        "--value",
        "me",
        "--",
        "sh",
        "-c",
        r#"echo "$TENURE_FENCE $TENURE_LEADER_VALUE""#,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1 me");
}

/// Usage errors (exit 64, no secret shown) are in
/// `forty_bad_inputs_exit_64_with_a_message_and_no_secret`; here, the help
/// a newcomer reaches instead.
#[test]
fn help_shows_examples() {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["lock", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Example"));
}

#[test]
fn default_store_is_created_in_the_state_directory() {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["lock", "first-use", "--", "true"])
        .env_remove("TENURE_STORE")
        .env("XDG_STATE_HOME", state.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(state.path().join("tenure/tenure.db").exists());
}

/// `--version` names the release, the commit it was built from and the
/// format of every store built in; `-V` the first two.
#[test]
fn version_names_release_commit_and_store_formats() {
    let run = |flag: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .arg(flag)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let first = format!("tenure {} (commit {head})", env!("CARGO_PKG_VERSION"));
    assert_eq!(run("-V").trim_end(), first);
    let long = run("--version");
    let mut lines = long.lines();
    assert_eq!(lines.next(), Some(first.as_str()), "{long}");
    let formats = lines.next().unwrap_or_default();
    let mut named = 0;
    for b in tenure::backends() {
        if let Some(f) = b.format() {
            assert!(
                formats.contains(&format!("{} {f}", b.name)),
                "{b:?}: {long}"
            );
            named += 1;
        }
    }
    assert!(
        named >= 1 && formats.starts_with("store formats: "),
        "{long}"
    );
}

#[test]
fn backends_lists_the_capability_matrix() {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["backends", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    // Exactly the backends of the table of stores that this build has.
    let mut expected: Vec<&str> = tenure_testkit::stores::STORES
        .iter()
        .filter(|s| s.is_built_in())
        .map(|s| s.backend)
        .collect();
    let mut names = names;
    expected.sort_unstable();
    names.sort_unstable();
    assert_eq!(names, expected);
}

/// `tenure backends | head -1`, made certain: stdout is a pipe whose
/// reading end is closed before tenure starts, so every write fails with
/// EPIPE. No panic, and the command still succeeds.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe() fills two descriptors that nothing else owns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: each descriptor is owned once, here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read_end);
    for args in [
        &["backends"][..],
        &["completions", "bash"][..],
        &["man"][..],
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write_end.try_clone().unwrap()))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let (done, watchdog) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if watchdog.recv_timeout(Duration::from_secs(20)).is_err() {
                signal(pid, libc::SIGKILL);
            }
        });
        let out = child.wait_with_output().unwrap();
        let _ = done.send(());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
}

#[test]
fn the_default_build_has_every_backend() {
    // The default feature list itself (etcd was left out while its client
    // needed protoc): every backend and TLS.
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .expect("the CLI's Cargo.toml");
    let default = manifest
        .lines()
        .find(|l| l.starts_with("default = ["))
        .expect("a default feature list");
    let features = tenure_testkit::stores::STORES
        .iter()
        .map(|s| s.feature())
        .filter(|f| !f.is_empty())
        .chain(["tls"]);
    for feature in features {
        assert!(
            default.contains(&format!("\"{feature}\"")),
            "{feature} missing from {default}"
        );
    }
}

#[test]
fn nothing_the_command_started_outlives_the_lock() {
    let env = Env::sqlite();
    let out = env.run(&[
        "lock",
        "bg",
        "--",
        "sh",
        "-c",
        r#"sleep 300 & echo $! > "$D/bg"; echo "$!" > /dev/null"#,
    ]);
    assert!(out.status.success(), "{out:?}");
    let bg: i32 = wait_file(&env.path("bg")).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dead(bg) {
        assert!(
            Instant::now() < deadline,
            "a background job outlived the lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Three `tenure cron` instances on one store: each tick runs exactly once.
fn cron_instances_run_each_tick_once(mode: &str) {
    let env = Env::sqlite();
    let script = r#"echo "$TENURE_TICK $TENURE_FENCE" >> "$D/runs""#;
    let mut instances: Vec<Child> = (0..3)
        .map(|_| {
            env.cmd(&[
                "cron",
                "* * * * * *",
                "tick-job",
                "--mode",
                mode,
                "--ttl",
                "2s",
                "--",
                "sh",
                "-c",
                script,
            ])
            .spawn()
            .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(4500));
    for i in &instances {
        signal(i.id(), libc::SIGTERM);
    }
    for i in instances.iter_mut() {
        let status = wait_exit(i, Duration::from_secs(10));
        assert!(status.success(), "{status}");
    }
    let runs = std::fs::read_to_string(env.path("runs")).unwrap();
    let mut ticks: Vec<u64> = runs
        .lines()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let count = ticks.len();
    ticks.sort();
    ticks.dedup();
    assert_eq!(ticks.len(), count, "a tick ran twice:\n{runs}");
    assert!(count >= 3, "too few runs in 4.5 s:\n{runs}");
    if mode == "leader" {
        // One leader ran them all, with one fencing token.
        let fences: std::collections::BTreeSet<&str> =
            runs.lines().map(|l| l.split(' ').nth(1).unwrap()).collect();
        assert_eq!(fences.len(), 1, "{runs}");
    }
}

#[test]
fn cron_per_tick_runs_each_tick_once_across_three_instances() {
    cron_instances_run_each_tick_once("per-tick");
}

#[test]
fn cron_leader_mode_runs_each_tick_once_on_the_leader() {
    cron_instances_run_each_tick_once("leader");
}

#[test]
fn cron_rejects_bad_schedules_and_zones() {
    let env = Env::sqlite();
    for args in [
        vec!["cron", "every tuesday", "j", "--", "true"],
        vec![
            "cron",
            "* * * * * *",
            "j",
            "--tz",
            "Mars/Olympus",
            "--",
            "true",
        ],
        vec![
            "cron",
            "* * * * * *",
            "j",
            "--mode",
            "sometimes",
            "--",
            "true",
        ],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    }
}

#[test]
fn cron_at_most_kills_a_long_run_with_its_group() {
    let env = Env::sqlite();
    let script = r#"sleep 300 & echo $! >> "$D/pids"; wait"#;
    let mut cron = env
        .cmd(&[
            "cron",
            "* * * * * *",
            "slow",
            "--at-most",
            "300ms",
            "--",
            "sh",
            "-c",
            script,
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2600));
    signal(cron.id(), libc::SIGTERM);
    assert!(wait_exit(&mut cron, Duration::from_secs(10)).success());
    let pids: Vec<i32> = std::fs::read_to_string(env.path("pids"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(pids.len() >= 2, "{pids:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|p| dead(*p)) {
        assert!(
            Instant::now() < deadline,
            "a run outlived --at-most: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every backend this binary has refuses an option it does not take: exit
/// 64, the option named, no password shown, and no connection tried
/// (nothing listens on port 1, and the answer comes at once).
#[test]
fn every_backend_refuses_an_unknown_url_option_with_64() {
    let env = Env::sqlite();
    let out = env.run(&["backends", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let backends: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<String> = backends
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap().to_string())
        .collect();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let store = tenure_testkit::stores::store(&name)
            .unwrap_or_else(|| panic!("{name} is not in the table of stores"));
        let url = (store.bad_option_url)(&env.path("b"));
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["--store", &url, "status"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{name}: {stderr}");
        assert!(stderr.contains("\"bogus\""), "{name}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{name}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{name}: a connection was tried ({:?})",
            started.elapsed()
        );
    }
}

/// Completion scripts come from the CLI's own definition: every subcommand
/// is in them, bash accepts the script and registers it, zsh's and fish's
/// have their own shapes, and an unknown shell is a usage error (64).
#[test]
fn completions_for_bash_zsh_and_fish() {
    let env = Env::sqlite();
    let subcommands = [
        "lock", "elect", "leader", "status", "release", "cron", "backends",
    ];
    let bash = env.run(&["completions", "bash"]);
    assert!(bash.status.success(), "{bash:?}");
    let script = String::from_utf8(bash.stdout).unwrap();
    for sub in subcommands {
        assert!(script.contains(sub), "bash completion lacks {sub}");
    }
    assert!(
        !script.contains("__supervise"),
        "the hidden supervisor is offered"
    );
    let path = env.path("tenure.bash");
    std::fs::write(&path, &script).unwrap();
    let registered = Command::new("bash")
        .arg("-c")
        .arg(format!("source '{}' && complete -p tenure", path.display()))
        .output()
        .unwrap();
    assert!(registered.status.success(), "{registered:?}");
    assert!(
        String::from_utf8_lossy(&registered.stdout).contains("_tenure"),
        "{registered:?}"
    );

    let zsh = env.run(&["completions", "zsh"]);
    assert!(zsh.status.success());
    assert!(String::from_utf8_lossy(&zsh.stdout).starts_with("#compdef tenure"));
    let fish = env.run(&["completions", "fish"]);
    assert!(fish.status.success());
    let fish = String::from_utf8_lossy(&fish.stdout);
    assert!(
        fish.contains("complete -c tenure") && fish.contains("lock"),
        "{fish}"
    );

    let bad = env.run(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}

/// The manual page is generated from the CLI's definition: tenure(1) with a
/// section for each subcommand (its options and examples) and the exit
/// codes; man renders it without complaint where man is installed.
#[test]
fn man_page_covers_every_subcommand() {
    let env = Env::sqlite();
    let out = env.run(&["man"]);
    assert!(out.status.success(), "{out:?}");
    let roff = String::from_utf8(out.stdout).unwrap();
    assert!(
        roff.contains(".TH tenure 1"),
        "{}",
        &roff[..roff.len().min(300)]
    );
    // Every subcommand `--help` lists has its entry and its section.
    let help = String::from_utf8(env.run(&["--help"]).stdout).unwrap();
    let listed: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|sub| *sub != "help")
        .collect();
    assert!(listed.len() >= 17, "{help}");
    for sub in listed {
        let name = sub.replace('-', r"\-");
        assert!(
            roff.contains(&format!(".TP\n\\fBtenure {name}\\fR\n")),
            "no entry for {sub}"
        );
        assert!(
            roff.contains(&format!(".SH \"TENURE-{}\"", sub.to_uppercase())),
            "no section for {sub}"
        );
    }
    // It names no page but its own: there are no tenure-lock(1) pages.
    assert_eq!(
        roff.matches("(1)").count(),
        roff.matches("tenure(1)").count(),
        "a page that does not exist is named"
    );
    // The exit codes are its EXIT STATUS, one entry each.
    assert!(roff.contains(".SH \"EXIT STATUS\""));
    for code in ["64", "69", "70", "75", "79", "3", "126", "127"] {
        assert!(
            roff.contains(&format!(".TP\n\\fB{code}\\fR\n")),
            "exit {code}"
        );
    }
    assert!(roff.contains(".SH ENVIRONMENT\n.TP\n\\fBTENURE_STORE\\fR"));
    // roff writes a hyphen as \-.
    assert!(
        roff.contains(r"\-\-kill\-grace"),
        "lock's options are missing"
    );
    assert!(roff.contains("usage error"), "the exit codes are missing");
    assert!(!roff.contains("__supervise"));
    let path = env.path("tenure.1");
    std::fs::write(&path, &roff).unwrap();
    if std::path::Path::new("/usr/bin/man").exists() {
        let rendered = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&path)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "80")
            .output()
            .unwrap();
        assert!(rendered.status.success(), "{rendered:?}");
        let text = String::from_utf8_lossy(&rendered.stdout);
        assert!(
            text.contains("TENURE-LOCK") && text.contains("Run a command while holding a lock")
        );
        assert!(text.contains("EXIT STATUS"), "{text}");
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(warnings.trim().is_empty(), "man warns: {warnings}");
    }
}

/// `tenure fence`: 0 and `admitted` for a token at least the highest, 75 and
/// `stale` with the highest for a lower one, 64 for a token that is not a
/// positive number; a job under `tenure lock` checks its own token.
#[test]
fn fence_admits_the_current_holder_and_refuses_a_stale_token() {
    let env = Env::sqlite();
    let out = env.run(&["fence", "printer", "5"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "admitted token=5 highest=5"
    );
    let out = env.run(&["fence", "printer", "5"]);
    assert_eq!(out.status.code(), Some(0), "an equal token: {out:?}");
    let out = env.run(&["fence", "printer", "4", "--json"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["admitted"], false);
    assert_eq!(json["highest"], 5);
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused token 4"));
    for bad in [
        "0",
        "abc",
        "1.5",
        "18446744073709551616",
        "9223372036854775808",
        "+5",
        " 5",
        "",
    ] {
        let out = env.run(&["fence", "printer", bad]);
        assert_eq!(out.status.code(), Some(64), "token {bad:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("TOKEN"));
    }
    // Nothing above changed the fence.
    let out = env.run(&["fence", "printer", "5"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // The README's job: the lock's own token passes its fence.
    let job = r#""$T" fence job "$TENURE_FENCE" && echo "printed $TENURE_FENCE" >> "$D/log""#;
    for _ in 0..2 {
        let out = output_within(
            {
                let mut cmd = env.cmd(&["lock", "job", "--", "sh", "-c", job]);
                cmd.env("T", env!("CARGO_BIN_EXE_tenure"))
                    .env("TENURE_STORE", &env.url);
                cmd
            },
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{out:?}");
    }
    let log = std::fs::read_to_string(env.path("log")).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
    // A token older than the last holder's is refused.
    let first: u64 = log.lines().next().unwrap()["printed ".len()..]
        .parse()
        .unwrap();
    let out = env.run(&["fence", "job", &first.to_string()]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
}

/// `tenure cell`: get (3 when absent), put with --if-absent or
/// --if-version (75 and the current version on a mismatch), delete; bad
/// input is 64 and changes nothing.
#[test]
fn cell_get_put_delete_with_versions() {
    let env = Env::sqlite();
    let stdout = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let out = env.run(&["cell", "get", "config"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = env.run(&["cell", "put", "config", "one", "--if-absent"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v1: u64 = stdout(&out).trim()["version=".len()..].parse().unwrap();
    let out = env.run(&["cell", "put", "config", "again", "--if-absent"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("version {v1}")),
        "{out:?}"
    );
    let out = env.run(&[
        "cell",
        "put",
        "config",
        "two",
        "--if-version",
        &v1.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v2: u64 = stdout(&out).trim()["version=".len()..].parse().unwrap();
    assert!(v2 > v1);
    let out = env.run(&["cell", "get", "config"]);
    assert_eq!(stdout(&out), format!("version={v2}\ntwo\n"));
    let out = env.run(&["cell", "get", "config", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["version"].as_u64(), json["value"].as_str()),
        (Some(v2), Some("two"))
    );
    // A stale version is refused and changes nothing.
    let out = env.run(&[
        "cell",
        "put",
        "config",
        "late",
        "--if-version",
        &v1.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let out = env.run(&["cell", "delete", "config", "--if-version", &v1.to_string()]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");

    // Bad input: 64, nothing written.
    let long = "x".repeat(64 * 1024 + 1);
    for args in [
        vec!["cell", "put", "config", "x"],
        vec![
            "cell",
            "put",
            "config",
            "x",
            "--if-absent",
            "--if-version",
            "2",
        ],
        vec!["cell", "put", "config", "x", "--if-version", "two"],
        vec!["cell", "put", "config", "x", "--if-version", "0"],
        vec!["cell", "put", "config", "", "--if-absent"],
        vec!["cell", "put", "config", &long, "--if-absent"],
        vec!["cell", "delete", "config"],
        vec!["cell", "delete", "config", "--if-version", "-1"],
        vec!["cell", "get", ""],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(64), "{:?}: {out:?}", &args[..3]);
    }
    // A fence's name used as a cell, and a cell's as a fence: 64.
    assert_eq!(env.run(&["fence", "printer", "3"]).status.code(), Some(0));
    let out = env.run(&["cell", "get", "printer"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("it is a fence"));
    let out = env.run(&["fence", "config", "3"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let out = env.run(&["cell", "get", "config"]);
    assert_eq!(
        stdout(&out),
        format!("version={v2}\ntwo\n"),
        "bad input changed it"
    );

    let out = env.run(&["cell", "delete", "config", "--if-version", &v2.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = env.run(&["cell", "get", "config"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

/// A catalogue of bad input across the CLI (and the library under it):
/// names, TTLs, durations, URLs, credentials, tokens, versions, values,
/// permit counts, cron expressions, time zones, flags. Each is exit 64
/// with a message, no panic, and the password never shows.
#[test]
fn bad_input_catalogue_exits_64_with_a_message_and_no_secret() {
    let env = Env::sqlite();
    let long_name = "n".repeat(300);
    let long_value = "v".repeat(64 * 1024 + 1);
    let cases: Vec<Vec<&str>> = vec![
        // Names.
        vec!["lock", "", "--", "true"],
        vec!["lock", &long_name, "--", "true"],
        vec!["lock", "a\u{1}b", "--", "true"],
        vec!["lock", "x ", "--", "true"],
        vec!["elect", ""],
        vec!["leader", ""],
        vec!["fence", "", "5"],
        vec!["cell", "get", ""],
        // TTLs and durations.
        vec!["lock", "x", "--ttl", "0s", "--", "true"],
        vec!["lock", "x", "--ttl", "5parsecs", "--", "true"],
        vec!["lock", "x", "--ttl", "-1s", "--", "true"],
        vec!["lock", "x", "--ttl", "100000d", "--", "true"],
        vec!["lock", "x", "--wait", "soon", "--", "true"],
        vec![
            "lock",
            "x",
            "--ttl",
            "1s",
            "--kill-grace",
            "1s",
            "--",
            "true",
        ],
        vec!["elect", "x", "--ttl", "0s"],
        vec!["torture", "--ttl", "1ms", "--duration", "1s"],
        // Commands and flags.
        vec!["lock", "x", "--ttl", "-5s"],
        vec!["lock", "x", "--wait", "1s", "--no-wait", "--", "true"],
        vec!["release", "x"],
        vec!["frobnicate"],
        vec!["status", "--colour"],
        vec!["torture", "--clients", "1", "--duration", "1s"],
        vec!["torture", "--faults", "meteor", "--duration", "1s"],
        // Tokens, versions, values.
        vec!["fence", "x", "0"],
        vec!["fence", "x", "-5"],
        vec!["fence", "x", "ten"],
        vec!["fence", "x", "99999999999999999999"],
        vec!["cell", "put", "x", "v"],
        vec!["cell", "put", "x", "v", "--if-version", "0"],
        vec!["cell", "put", "x", "", "--if-absent"],
        vec!["cell", "put", "x", &long_value, "--if-absent"],
        vec!["cell", "delete", "x", "--if-version", "one"],
        // Cron expressions and time zones.
        vec!["cron", "every minute", "job", "--", "true"],
        vec!["cron", "0 0 31 2 *", "job", "--", "true"],
        vec![
            "cron",
            "* * * * *",
            "job",
            "--tz",
            "Mars/Olympus",
            "--",
            "true",
        ],
        vec!["cron", "* * * * *", "job", "--at-most", "0s", "--", "true"],
        vec![
            "cron",
            "* * * * *",
            "job",
            "--mode",
            "sometimes",
            "--",
            "true",
        ],
        // Completions of a shell nobody has.
        vec!["completions", "cmd.exe"],
    ];
    assert!(cases.len() >= 30);
    for args in &cases {
        let out = env.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{:?}: {out:?}", &args[..2]);
        assert!(!stderr.trim().is_empty(), "{:?}: no message", &args[..2]);
        assert!(!stderr.contains("panicked"), "{:?}: {stderr}", &args[..2]);
    }
    // The words of the cases this catalogue grew by, exactly.
    for (args, words) in [
        (
            vec!["lock", "x ", "--", "true"],
            "tenure: invalid name \"x \": a name must not end in a space (MySQL and MariaDB \
             would take it for the name without the space)",
        ),
        (
            vec!["lock", "a\nb", "--", "true"],
            "tenure: invalid name \"a\\nb\": a name must not contain control characters such as NUL or newline",
        ),
        (
            vec!["--store", "redis://:pa/ss@127.0.0.1:1/0", "status"],
            "tenure: invalid store URL redis://:***@127.0.0.1:1/0: a user name or password that \
             holds '/', '?', '#' or '@' must be percent-encoded in the URL ('/' as %2F, '?' as \
             %3F, '#' as %23, '@' as %40)",
        ),
        (
            vec!["--store", "postgres://u:pa?ss@127.0.0.1:1/db", "status"],
            "tenure: invalid store URL postgres://u:***@127.0.0.1:1/db: a user name or password \
             that holds '/', '?', '#' or '@' must be percent-encoded in the URL ('/' as %2F, '?' \
             as %3F, '#' as %23, '@' as %40)",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(&args)
            .env("TENURE_STORE", &env.url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim(),
            words,
            "{args:?}"
        );
    }
    // URLs and credentials: the password never reaches the output.
    let every_store = tenure_testkit::stores::STORES
        .iter()
        .flat_map(|s| s.bad_value_urls.iter().copied());
    for url in every_store.chain(["ftp://bob:hunter2@host/x", ""]) {
        let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(["--store", url, "status"])
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(64), "{url}: {all}");
        assert!(!all.contains("hunter2"), "{url}: {all}");
        assert!(!all.contains("panicked"), "{url}: {all}");
    }
}

/// `tenure schedule pause|resume|list` and `tenure release --session`: bad
/// input exits 64; a pause is listed with who and why, and lifted; ending
/// an unknown session exits 3; a real one stops its holder (79).
#[test]
fn schedule_pause_list_resume_and_end_session() {
    let env = Env::sqlite();
    let long = "j".repeat(240);
    for bad in [
        vec!["schedule", "pause", "job", "--for", "0s"],
        vec!["schedule", "pause", "job", "--for", "9000years"],
        vec!["schedule", "pause", "job", "--for", "20000000000years"],
        vec!["schedule", "pause", long.as_str()],
        vec!["schedule", "resume", ""],
        vec!["release", "--session", "", "--force"],
        vec!["release", "--session", "a\nb", "--force"],
        vec!["release", "name", "--session", "abc", "--force"],
    ] {
        let out = env.run(&bad);
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {out:?}");
    }
    let out = env.run(&["release", "--session", "0123456789ab", "--force"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // An instance runs a few ticks, so the job is listed with its last run.
    let mut cron = env
        .cmd(&["cron", "* * * * * *", "listed-job", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let list = || {
        let out = env.run(&["schedule", "list", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while list()[0]["last_run"].is_null() {
        assert!(Instant::now() < deadline, "no run was listed: {}", list());
        std::thread::sleep(Duration::from_millis(100));
    }
    let job = list()[0].clone();
    assert_eq!(job["job"], "listed-job");
    assert_eq!(job["expr"], "* * * * * *");
    assert_eq!(job["last_run"]["outcome"], "finished");
    assert!(job["paused"].is_null());

    let audit = env.path("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let out = env.run(&[
        "schedule",
        "pause",
        "listed-job",
        "--for",
        "1h",
        "--reason",
        "backup",
        "--audit-log",
        &audit_arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("paused listed-job until "));
    let listed = list();
    let paused = &listed[0]["paused"];
    assert_eq!(paused["reason"], "backup");
    assert!(paused["until"].is_string(), "{paused}");
    // The next ticks are those that will run: none within the hour's pause.
    let until = paused["until"].as_str().unwrap();
    let next = listed[0]["next_ticks"].as_array().unwrap();
    assert_eq!(next.len(), 3, "{listed}");
    for tick in next {
        let (tick, until) = (
            chrono::DateTime::parse_from_rfc3339(tick.as_str().unwrap()).unwrap(),
            chrono::DateTime::parse_from_rfc3339(until).unwrap(),
        );
        assert!(tick >= until, "a tick within the pause: {listed}");
    }
    let text = env.run(&["schedule", "list"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("PAUSED"),
        "{text:?}"
    );
    let out = env.run(&[
        "schedule",
        "resume",
        "listed-job",
        "--audit-log",
        &audit_arg,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "resumed listed-job"
    );
    let out = env.run(&["schedule", "resume", "listed-job"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "listed-job was not paused"
    );
    assert!(list()[0]["paused"].is_null());
    let records = std::fs::read_to_string(&audit).unwrap();
    assert_eq!(records.lines().count(), 2, "{records}");
    // A pause cell that tenure did not write: listed as unreadable, and
    // pause and resume overwrite it.
    let out = env.run(&[
        "cell",
        "put",
        "tenure.pause:listed-job",
        "garbage",
        "--if-absent",
    ]);
    assert!(out.status.success(), "{out:?}");
    let listed = list();
    assert!(
        listed[0]["error"]
            .as_str()
            .unwrap()
            .contains("tenure.pause:listed-job"),
        "{listed}"
    );
    let out = env.run(&["schedule", "list"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("unreadable"),
        "{out:?}"
    );
    let out = env.run(&[
        "schedule",
        "pause",
        "listed-job",
        "--reason",
        "over garbage",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(list()[0]["paused"]["reason"], "over garbage");
    let out = env.run(&["schedule", "resume", "listed-job"]);
    assert!(out.status.success(), "{out:?}");
    assert!(list()[0]["paused"].is_null());
    signal(cron.id(), libc::SIGTERM);
    assert!(wait_exit(&mut cron, Duration::from_secs(10)).success());

    // End a holder's session by its tag.
    let mut holder = env
        .cmd(&["lock", "by-session", "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    env.wait_held("by-session");
    let status = env.run(&["status", "by-session", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let tag = v[0]["entries"][0]["session"].as_str().unwrap().to_string();
    let out = env.run(&["release", "--session", &tag, "--force", "--reason", "stuck"]);
    assert!(out.status.success(), "{out:?}");
    let exit = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(exit.code(), Some(79), "{exit:?}");
}

/// Forty bad inputs across the CLI — names, TTLs and durations, store URLs
/// with credentials, tokens, cron schedules and time zones, flags and
/// subcommands — each an exit 64 at once with a message on stderr, no
/// panic, and no password in any output. (The library's own are in
/// `crates/tenure/tests/bad_input.rs`.)
#[test]
fn forty_bad_inputs_exit_64_with_a_message_and_no_secret() {
    let env = Env::sqlite();
    let sqlite = env.url.clone();
    let long = "n".repeat(256);
    let on = |store: &str, args: &[&str]| -> (String, Vec<String>) {
        (
            store.to_string(),
            args.iter().map(|a| a.to_string()).collect(),
        )
    };
    let mut cases = vec![
        // Names.
        on(&sqlite, &["lock", "", "--", "true"]),
        on(&sqlite, &["lock", "a\nb", "--", "true"]),
        on(&sqlite, &["lock", &long, "--", "true"]),
        on(&sqlite, &["elect", "tab\there", "--", "true"]),
        on(&sqlite, &["fence", "", "1"]),
        on(&sqlite, &["cell", "get", "bell\u{7}"]),
        on(&sqlite, &["leader", ""]),
        // TTLs and durations.
        on(&sqlite, &["lock", "x", "--ttl", "5parsecs", "--", "true"]),
        on(&sqlite, &["lock", "x", "--ttl", "-1s", "--", "true"]),
        on(&sqlite, &["lock", "x", "--ttl", "0s", "--", "true"]),
        on(&sqlite, &["lock", "x", "--wait", "soon", "--", "true"]),
        on(
            &sqlite,
            &[
                "lock",
                "x",
                "--ttl",
                "1s",
                "--kill-grace",
                "1s",
                "--",
                "true",
            ],
        ),
        on(&sqlite, &["torture", "--duration", "forever"]),
        on(&sqlite, &["torture", "--ttl", "1ns"]),
        on(&sqlite, &["console", "--refresh", "nope"]),
        // Store URLs, with credentials that must never be shown.
        on("", &["status"]),
        on("ftp://u:hunter2@host/x", &["status"]),
        on("etcd://bob:hunter2@db", &["status"]),
        on("memory://somewhere", &["status"]),
        // Tokens.
        on(&sqlite, &["fence", "printer", "abc"]),
        on(&sqlite, &["fence", "printer", "18446744073709551616"]),
        on(&sqlite, &["fence", "printer", "+5"]),
        // Cron schedules and time zones.
        on(&sqlite, &["cron", "every tuesday", "j", "--", "true"]),
        on(&sqlite, &["cron", "61 * * * * *", "j", "--", "true"]),
        on(
            &sqlite,
            &[
                "cron",
                "* * * * * *",
                "j",
                "--tz",
                "Mars/Olympus",
                "--",
                "true",
            ],
        ),
        on(
            &sqlite,
            &[
                "cron",
                "* * * * * *",
                "j",
                "--mode",
                "sometimes",
                "--",
                "true",
            ],
        ),
        // Flags and subcommands.
        on(&sqlite, &["frobnicate"]),
        on(&sqlite, &["lock", "x", "--wait", "-1s"]),
        on(&sqlite, &["release", "x"]),
        on(&sqlite, &["completions", "tcsh"]),
        on(&sqlite, &["console", "--listen", "not-an-address"]),
        on(&sqlite, &["torture", "--clients", "1"]),
        on(&sqlite, &["torture", "--faults", "meteor"]),
        // A network fault on a store without a network.
        on(&sqlite, &["torture", "--faults", "partition"]),
    ];
    // Every store's URL with an option none takes, and a password.
    for store in tenure_testkit::stores::STORES {
        cases.push(on(&(store.bad_option_url)(&env.path("b")), &["status"]));
    }
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (store, args) in &cases {
        let started = Instant::now();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
        cmd.arg("--store").arg(store).args(args);
        let out = output_within(cmd, Duration::from_secs(20));
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let what = format!("{store} {args:?}");
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        assert!(!stderr.trim().is_empty(), "{what}: no message");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert!(
            !stdout.contains("hunter2") && !stderr.contains("hunter2"),
            "{what}: the password was shown"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            started.elapsed()
        );
    }
}

/// flock's habits: `-n` gives up at once and `-w D` after D (both exit
/// 75); a negative duration is refused in words, not with clap's tip to
/// write `-- -5s` (which would make it the command).
#[test]
fn short_wait_flags_and_negative_durations() {
    let env = Env::sqlite();
    let out = env.run(&["lock", "neg", "--ttl", "-5s", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"-5s\" is negative"), "{err}");
    assert!(!err.contains("tip:"), "{err}");
    let mut holder = env
        .cmd(&["lock", "busy", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    env.wait_held("busy");
    let out = env.run(&["lock", "-n", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "-n: {out:?}");
    let started = Instant::now();
    let out = env.run(&["lock", "-w", "300ms", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "-w: {out:?}");
    // -v says who holds the name while waiting.
    let out = env.run(&["-v", "lock", "-w", "1s", "busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "-v -w: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("waiting for busy: held by "), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    signal(holder.id(), libc::SIGTERM);
    let _ = wait_exit(&mut holder, Duration::from_secs(15));
}

/// `tenure lock NAME` without a command holds the lock until SIGTERM, after
/// printing the name and the token, as `etcdctl lock` does; it then
/// releases and exits 0.
#[test]
fn lock_without_a_command_holds_until_interrupted() {
    use std::io::BufRead;
    let env = Env::sqlite();
    let mut holder = env
        .cmd(&["lock", "held-here"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{line:?}");
    assert_eq!((words[0], words[1]), ("locked", "held-here"), "{line:?}");
    assert!(words[2].parse::<u64>().unwrap() > 0, "{line:?}");
    let out = env.run(&["lock", "-n", "held-here", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    signal(holder.id(), libc::SIGTERM);
    assert!(wait_exit(&mut holder, Duration::from_secs(15)).success());
    let out = env.run(&["lock", "-n", "held-here", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "released at exit: {out:?}");
}

/// `tenure backends` speaks a user's words, not the capability fields'
/// names (those stay in `--json`).
#[test]
fn backends_are_described_in_words() {
    let out = Env::sqlite().run(&["backends"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for said in [
        "survives a restart: yes",
        "waiters granted in arrival order: yes",
        "a lease's expiry is judged by: ",
        "waiters are woken: ",
    ] {
        assert!(text.contains(said), "{said:?} missing:\n{text}");
    }
    for internal in [
        "exact_first",
        "NextOnly",
        "LocalOrPoll",
        "multi_process=",
        "=true",
    ] {
        assert!(!text.contains(internal), "{internal:?} shown:\n{text}");
    }
}

/// `lock --shared` (flock -s) and `lock --permits N` (consul lock -n N).
#[test]
fn shared_locks_and_permits() {
    use std::io::BufRead;
    let env = Env::sqlite();
    let hold = |args: &[&str]| {
        let mut child = env
            .cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("locked "), "{args:?}: {line:?}");
        child
    };
    // Shared: two readers at once; a writer waits.
    let mut reader = hold(&["lock", "--shared", "doc"]);
    let out = env.run(&["lock", "-s", "-n", "doc", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "a second reader: {out:?}");
    let out = env.run(&["lock", "-n", "doc", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "a writer beside a reader: {out:?}"
    );
    signal(reader.id(), libc::SIGTERM);
    assert!(wait_exit(&mut reader, Duration::from_secs(15)).success());
    let out = env.run(&["lock", "-n", "doc", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "a writer alone: {out:?}");

    // Two permits: two holders, a third waits.
    let mut first = hold(&["lock", "--permits", "2", "pool"]);
    let mut second = hold(&["lock", "--permits", "2", "pool"]);
    let out = env.run(&["lock", "--permits", "2", "-n", "pool", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "a third holder: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("all 2 permits of \"pool\" are held"));
    signal(first.id(), libc::SIGTERM);
    assert!(wait_exit(&mut first, Duration::from_secs(15)).success());
    let out = env.run(&["lock", "--permits", "2", "-n", "pool", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "a permit freed: {out:?}");
    signal(second.id(), libc::SIGTERM);
    assert!(wait_exit(&mut second, Duration::from_secs(15)).success());
    for bad in [
        vec!["lock", "x", "--permits", "0", "--", "true"],
        vec!["lock", "x", "--shared", "--permits", "2", "--", "true"],
        vec!["lock", "x", "--shared", "--unfair", "--", "true"],
    ] {
        assert_eq!(env.run(&bad).status.code(), Some(64), "{bad:?}");
    }
}

/// `tenure status` says what each name is — a lock, a read/write lock, a
/// semaphore, an election (its leader and candidates, a leader-mode cron's
/// too, whose leader says host:pid), a schedule's tick claim, a lock's
/// non-fair waiters (its wake-up line, whose first watches the lock) — in words
/// and in the JSON, where an entry's mode keeps its old `kind`.
#[test]
fn status_says_what_each_name_is() {
    let env = Env::sqlite();
    let spawn = |args: &[&str]| {
        env.cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut running = vec![
        spawn(&["lock", "plain"]),
        spawn(&["lock", "--shared", "doc"]),
        spawn(&["lock", "--permits", "3", "pool"]),
        spawn(&["elect", "sched", "--value", "10.0.0.7:8080"]),
        spawn(&["elect", "sched", "--value", "10.0.0.8:8080"]),
        spawn(&[
            "cron",
            "* * * * * *",
            "led",
            "--mode",
            "leader",
            "--",
            "true",
        ]),
        spawn(&["cron", "* * * * * *", "ticking", "--", "sleep", "3"]),
    ];
    // Held, so that a non-fair waiter of it waits in its wake-up line.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&env.run(&["status"]).stdout).contains("plain  (lock)") {
        assert!(Instant::now() < deadline, "plain was never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    running.push(spawn(&["lock", "--unfair", "plain", "--", "true"]));
    let want = [
        ("plain", "lock"),
        ("tenure.wake:plain", "non-fair waiters"),
        ("doc", "read/write lock"),
        ("pool", "semaphore"),
        ("sched", "election"),
        ("led", "election"),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let out = env.run(&["status", "--json"]);
        assert!(out.status.success(), "{out:?}");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let kind_of = |name: &str| {
            listed
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["name"] == name)
                .map(|n| (n["kind"].clone(), n["entries"].as_array().unwrap().len()))
        };
        let all_there = want.iter().all(|(n, _)| kind_of(n).is_some())
            && kind_of("sched").is_some_and(|(_, len)| len == 2)
            && listed
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["name"].as_str().unwrap().starts_with("ticking@"));
        if all_there {
            for (name, kind) in want {
                assert_eq!(kind_of(name).unwrap().0, kind, "{name}: {listed}");
            }
            break listed;
        }
        assert!(Instant::now() < deadline, "not all listed: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let claim = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"].as_str().unwrap().starts_with("ticking@"))
        .unwrap();
    assert_eq!(claim["kind"], "tick claim", "{listed}");
    let entry = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()["entries"][0]
            .clone()
    };
    assert_eq!(entry("pool")["kind"], "Permits { count: 1, limit: 3 }");
    assert_eq!(entry("pool")["mode"], "1 of 3 permits");
    assert_eq!(entry("sched")["kind"], "Exclusive");
    // A leader-mode cron's leader says who it is, as `tenure elect` does.
    let led = entry("led")["value"].as_str().unwrap().to_string();
    assert_eq!(led, entry("led")["label"].as_str().unwrap(), "{listed}");
    assert!(led.contains(':'), "{led}");

    let text = String::from_utf8(env.run(&["status"]).stdout).unwrap();
    for line in [
        "plain  (lock)",
        "doc  (read/write lock)",
        "pool  (semaphore)",
        "sched  (election)",
        "led  (election)",
        "tenure.wake:plain  (non-fair waiters)",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
    assert!(text.contains("  watching  token="), "{text}");
    assert!(text.contains("  leader    token="), "{text}");
    assert!(text.contains("  candidate token="), "{text}");
    assert!(text.contains(" value=10.0.0.7:8080"), "{text}");
    assert!(text.contains(" 1 of 3 permits label="), "{text}");
    assert!(text.contains("  (tick claim)"), "{text}");
    assert!(!text.contains("Exclusive"), "{text}");
    for child in &mut running {
        signal(child.id(), libc::SIGTERM);
    }
    for child in &mut running {
        wait_exit(child, Duration::from_secs(20));
    }
}

/// A shard group's members in `tenure status`: each member's own value,
/// weight and shard count, not the encoding the store keeps.
#[test]
fn status_shows_a_group_members_own_value() {
    let env = Env::sqlite();
    let mut member = env
        .cmd(&[
            "shards",
            "ingest",
            "--shards",
            "2",
            "--weight",
            "3",
            "--value",
            "10.0.0.7:80",
            "--",
            "sleep",
            "60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let group = "tenure.group:ingest";
    let deadline = Instant::now() + Duration::from_secs(15);
    let listed = loop {
        let out = env.run(&["status", group, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v[0]["entries"][0].is_object() {
            break v;
        }
        assert!(Instant::now() < deadline, "the member never listed: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(listed[0]["kind"], "group", "{listed}");
    let entry = &listed[0]["entries"][0];
    assert_eq!(entry["value"], "10.0.0.7:80", "{listed}");
    assert_eq!(entry["weight"], 3, "{listed}");
    assert_eq!(entry["shards"], 2, "{listed}");
    let text = env.run(&["status", group]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("weight=3 shards=2") && text.contains("value=10.0.0.7:80"),
        "{text}"
    );
    assert!(!text.contains("m1"), "{text}");
    signal(member.id(), libc::SIGTERM);
    assert!(wait_exit(&mut member, Duration::from_secs(10)).success());
}
