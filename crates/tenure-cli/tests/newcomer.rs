//! What a new user tripped on (issue 21, items 1–3, 7–12 and the exit-code
//! table), each checked on the real binary.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Item 1: a schedule with no future time is refused at once.
#[test]
fn cron_that_never_fires_is_refused() {
    let env = Env::sqlite();
    for schedule in ["0 0 0 30 2 *", "0 0 0 1 1 * 2020"] {
        let start = Instant::now();
        let out = env.run(&["cron", schedule, "j", "--", "true"]);
        assert_eq!(out.status.code(), Some(64), "{schedule}: {out:?}");
        assert!(stderr(&out).contains("never fires"), "{}", stderr(&out));
        assert!(start.elapsed() < Duration::from_secs(10));
    }
    // Rare but real: 29 February fires (the check must not refuse it). It
    // keeps running, so it is stopped after the check would have failed.
    let mut leap = env
        .cmd(&["cron", "0 0 0 29 2 *", "j", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(leap.try_wait().unwrap().is_none(), "29 February refused");
    signal(leap.id(), libc::SIGTERM);
    assert!(wait_exit(&mut leap, Duration::from_secs(10)).success());
}

/// Item 2 and the exit-code table: a missing command is 127 and a
/// non-executable one 126, checked at start, the same for lock, elect, cron.
#[test]
fn missing_or_non_executable_commands_exit_127_or_126_everywhere() {
    let env = Env::sqlite();
    let script = env.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = script.to_str().unwrap();
    for (program, code) in [
        ("/no/such/cmd", 127),
        ("no-such-command-anywhere", 127),
        (script, 126),
        ("/", 126),
    ] {
        for args in [
            vec!["lock", "x", "--", program],
            vec!["elect", "x", "--", program],
            vec!["cron", "* * * * * *", "x", "--", program],
        ] {
            let start = Instant::now();
            let out = env.run(&args);
            assert_eq!(out.status.code(), Some(code), "{args:?}: {out:?}");
            assert!(stderr(&out).contains("cannot run"), "{}", stderr(&out));
            assert!(start.elapsed() < Duration::from_secs(10), "{args:?}");
        }
    }
}

/// Item 3: TENURE_TICK_AT is in the schedule's zone.
#[test]
fn tick_at_is_in_the_schedules_time_zone() {
    let env = Env::sqlite();
    for (tz, offset) in [("Asia/Kolkata", "+05:30"), ("UTC", "+00:00")] {
        let file = env.path(&format!("at-{offset}"));
        let mut cron = env
            .cmd(&[
                "cron",
                "* * * * * *",
                &format!("tz-{}", offset.replace(':', "")),
                "--tz",
                tz,
                "--",
                "sh",
                "-c",
                &format!(r#"echo "$TENURE_TICK_AT" >> "{}""#, file.display()),
            ])
            .spawn()
            .unwrap();
        let at = wait_file(&file);
        signal(cron.id(), libc::SIGTERM);
        assert!(wait_exit(&mut cron, Duration::from_secs(10)).success());
        let first = at.lines().next().unwrap();
        assert!(first.ends_with(offset), "{tz}: {first}");
    }
}

/// Item 7: `--ttl 0` names the TTL.
#[test]
fn ttl_zero_names_the_ttl() {
    let env = Env::sqlite();
    for args in [
        vec!["lock", "x", "--ttl", "0", "--", "true"],
        vec!["elect", "x", "--ttl", "0s"],
        vec!["cron", "* * * * * *", "x", "--ttl", "0s", "--", "true"],
    ] {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert!(
            err.contains("--ttl") && !err.contains("kill-grace"),
            "{err}"
        );
    }
}

/// Item 8: no ANSI colour when stderr is not a terminal, even with -vv.
#[test]
fn no_colour_when_stderr_is_not_a_terminal() {
    let env = Env::sqlite();
    let out = env.run(&["-vv", "lock", "colour", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains("lock acquired"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// Item 8: on a terminal, colour unless NO_COLOR is set (a pseudo-terminal
/// through util-linux's `script`, when it is installed).
#[test]
fn colour_on_a_terminal_unless_no_color() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: no `script` (util-linux) for a pseudo-terminal");
        return;
    }
    let env = Env::sqlite();
    let run = |no_color: Option<&str>| -> String {
        let inner = format!(
            "{} --store {} -v lock tty -- true",
            env!("CARGO_BIN_EXE_tenure"),
            env.url
        );
        let mut cmd = std::process::Command::new("script");
        cmd.args(["-qec", &inner, "/dev/null"]);
        cmd.env_remove("NO_COLOR");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = output_within(cmd, Duration::from_secs(30));
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run(None).contains('\u{1b}'), "no colour on a terminal");
    let plain = run(Some("1"));
    assert!(plain.contains("lock acquired"), "{plain}");
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
}

/// Item 9: an empty store URL is refused, from the flag or the environment.
#[test]
fn empty_store_url_is_refused() {
    let bin = env!("CARGO_BIN_EXE_tenure");
    let out = output_within(
        {
            let mut c = std::process::Command::new(bin);
            c.args(["--store", "", "status"]);
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("empty"));
    let out = output_within(
        {
            let mut c = std::process::Command::new(bin);
            c.args(["status"]).env("TENURE_STORE", "");
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// Item 10: `--at-most 0s` is refused; `--at-least` says what it means.
#[test]
fn at_most_zero_is_refused_and_at_least_is_explained() {
    let env = Env::sqlite();
    let out = env.run(&["cron", "* * * * * *", "j", "--at-most", "0s", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("--at-most"));
    let out = env.run(&["cron", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("does NOT limit how often"), "{help}");
}

/// Item 11: the leader's value stays on one line in line output (escaped),
/// and round-trips unchanged through --json.
#[test]
fn leader_value_with_newlines_and_escapes_stays_on_one_line() {
    let env = Env::sqlite();
    let value = "evil\nnone\u{1b}[31m\\x";
    let mut elected = env
        .cmd(&["elect", "e", "--value", value])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _cleanup = KillOnDrop(vec![elected.id() as i32]);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(elected.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("elected "), "{line}");
    let out = env.run(&["leader", "e"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(
        text.starts_with(r"evil\nnone\u{1b}[31m\\x token="),
        "{text:?}"
    );
    assert!(!text.contains('\u{1b}'));
    let out = env.run(&["leader", "e", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["value"].as_str(), Some(value));
    signal(elected.id(), libc::SIGTERM);
    assert!(wait_exit(&mut elected, Duration::from_secs(10)).success());
}

/// The exit-code table is in --help, with 126 and 127.
#[test]
fn help_has_the_exit_code_table() {
    let out = output_within(
        {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"));
            c.arg("--help");
            c
        },
        Duration::from_secs(20),
    );
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "126",
        "127",
        "64",
        "69",
        "70",
        "75",
        "79",
        "same in every subcommand",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}

/// The supervisor is not a user command: absent from help, and refused by hand.
#[test]
fn the_supervisor_is_hidden_and_refuses_a_hand_call() {
    let bin = env!("CARGO_BIN_EXE_tenure");
    let out = output_within(
        {
            let mut c = std::process::Command::new(bin);
            c.arg("--help");
            c
        },
        Duration::from_secs(20),
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("supervise"));
    let out = output_within(
        {
            let mut c = std::process::Command::new(bin);
            c.args(["__supervise", "--", "true"]);
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    // Descriptors that are not open are refused, not trusted.
    let out = output_within(
        {
            let mut c = std::process::Command::new(bin);
            c.args(["__supervise", "900", "901", "1", "0", "-", "--", "true"]);
            c
        },
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}
