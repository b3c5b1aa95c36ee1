//! Workers of two builds (`--mixed-with`): a rolling upgrade under faults.
//! Worker `id`'s life `n` runs build `(id + n) % 2`, so both builds hold
//! the lock side by side from the start and every restart (a kill fault)
//! brings a worker back as the other build. What each build did is counted,
//! so a build the store refuses (it exits) or leaves without a grant fails
//! the run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex as StdMutex;

use serde::Serialize;

/// The builds a run's workers run, and what each did.
pub(super) struct Builds {
    exes: Vec<PathBuf>,
    labels: Vec<String>,
    /// Per worker, the build its current life runs.
    of_worker: StdMutex<std::collections::HashMap<u32, usize>>,
    lives: Vec<AtomicU64>,
    grants: Vec<AtomicU64>,
    exits: Vec<AtomicU64>,
    /// The last exit code each build's workers exited with on their own.
    last_exit: StdMutex<Vec<Option<i32>>>,
}

/// What one build's workers did, in the report.
#[derive(Serialize, Debug)]
pub(super) struct BuildReport {
    pub(super) build: String,
    /// Worker processes started with it.
    pub(super) lives: u64,
    pub(super) grants: u64,
    /// Workers that exited on their own (not killed by a fault, not stopped
    /// at the end): refused by the store, or dead of an error.
    pub(super) exits: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) last_exit_code: Option<i32>,
}

impl Builds {
    /// This binary, and `other` when given (its `-V` names it).
    pub(super) fn new(other: Option<&PathBuf>) -> Result<Builds, String> {
        let this = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let mut exes = vec![this];
        let mut labels = vec![format!("tenure {}", crate::version::short())];
        if let Some(other) = other {
            let out = std::process::Command::new(other)
                .arg("-V")
                .output()
                .map_err(|e| format!("--mixed-with {}: cannot run it: {e}", other.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "--mixed-with {}: `-V` failed: {}",
                    other.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            exes.push(other.clone());
            labels.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        let counters = || exes.iter().map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Ok(Builds {
            lives: counters(),
            grants: counters(),
            exits: counters(),
            last_exit: StdMutex::new(vec![None; exes.len()]),
            of_worker: StdMutex::new(std::collections::HashMap::new()),
            labels,
            exes,
        })
    }

    /// Whether workers of more than one build run.
    pub(super) fn mixed(&self) -> bool {
        self.exes.len() > 1
    }

    /// The binary worker `id` runs in its life `life`, counted.
    pub(super) fn start_life(&self, id: u32, life: u64) -> PathBuf {
        let build = (id as usize + life as usize) % self.exes.len();
        self.of_worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, build);
        self.lives[build].fetch_add(1, Ordering::Relaxed);
        self.exes[build].clone()
    }

    fn build_of(&self, id: u32) -> usize {
        self.of_worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    /// Worker `id` was granted the lock.
    pub(super) fn granted(&self, id: u32) {
        self.grants[self.build_of(id)].fetch_add(1, Ordering::Relaxed);
    }

    /// Worker `id` exited on its own with `code`.
    pub(super) fn exited(&self, id: u32, code: i32) {
        let build = self.build_of(id);
        self.exits[build].fetch_add(1, Ordering::Relaxed);
        self.last_exit.lock().unwrap_or_else(|e| e.into_inner())[build] = Some(code);
    }

    pub(super) fn report(&self) -> Vec<BuildReport> {
        let last = self.last_exit.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.exes.len())
            .map(|b| BuildReport {
                build: self.labels[b].clone(),
                lives: self.lives[b].load(Ordering::Relaxed),
                grants: self.grants[b].load(Ordering::Relaxed),
                exits: self.exits[b].load(Ordering::Relaxed),
                last_exit_code: last[b],
            })
            .collect()
    }

    /// Why a mixed run fails although it kept every safety rule: a build
    /// whose workers exited on their own, or that was never granted.
    pub(super) fn failure(&self) -> Option<String> {
        if !self.mixed() {
            return None;
        }
        let bad: Vec<String> = self
            .report()
            .into_iter()
            .filter(|b| b.exits > 0 || b.grants == 0)
            .map(|b| {
                format!(
                    "{}: {} grants, {} workers exited on their own (last code {:?})",
                    b.build, b.grants, b.exits, b.last_exit_code
                )
            })
            .collect();
        (!bad.is_empty()).then(|| bad.join("; "))
    }
}
