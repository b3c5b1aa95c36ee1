//! Helpers shared by the end-to-end tests of the real `tenure` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A temporary directory (`$D` in the commands) and a store URL.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Env {
    /// An SQLite store in the directory.
    pub fn sqlite() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        Env { dir, url }
    }

    /// Another store (such as a test Redis server's URL).
    pub fn with_url(url: String) -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
            url,
        }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenure"));
        cmd.arg("--store")
            .arg(&self.url)
            .args(args)
            .env("D", self.dir.path())
            .env_remove("NO_COLOR");
        cmd
    }

    /// Runs to completion, bounded by 60 s.
    pub fn run(&self, args: &[&str]) -> Output {
        output_within(self.cmd(args), Duration::from_secs(60))
    }

    /// Waits (bounded) until `name` has a holder.
    pub fn wait_held(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.run(&["status", name, "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let held = v.as_array().into_iter().flatten().any(|n| {
                n["name"] == name
                    && n["entries"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|e| e["state"] == "holder")
            });
            if held {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never held");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs a command with piped output, killing it if it outlasts `within`.
pub fn output_within(mut cmd: Command, within: Duration) -> Output {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(within).is_err() {
            signal(pid, libc::SIGKILL);
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = tx.send(());
    out
}

pub fn wait_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a process is gone (a zombie counts as gone: it runs nothing).
pub fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Waits (bounded) until all of `pids` are dead; returns how long it took.
pub fn wait_dead(pids: &[i32], within: Duration) -> Duration {
    let start = Instant::now();
    while !pids.iter().all(|p| dead(*p)) {
        assert!(
            start.elapsed() < within,
            "still alive after {within:?}: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

pub fn signal(pid: u32, sig: i32) {
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Kills leftovers of a failed test so they do not outlive it.
pub struct KillOnDrop(pub Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            unsafe { libc::kill(*p, libc::SIGKILL) };
        }
    }
}
