//! `tenure torture`: many worker processes contend for one lock while the
//! harness injects faults, keeps a fenced register and its unfenced twin,
//! records the history on its own monotonic clock, and checks it.
//!
//! A worker is this binary again (`tenure torture-worker`), so a fault is a
//! fault of a real process: SIGKILL, or SIGSTOP past its TTL. It talks to
//! the harness in lines over its stdin and stdout: it tells what happens to
//! it (`req`, `grant TOKEN`, `release`, `lost`), and asks the harness's
//! registers (`read TOKEN`, `write TOKEN VALUE`), which answer.
//!
//! A store that lives in one process (`memory://`) gets its workers as
//! tasks of the harness instead, each over a [`gate::Gated`] view of the
//! store: a kill cuts the task and its store calls off for good (its
//! session is never closed, so it expires), a pause holds the task's store
//! calls and its lines until it ends.

mod builds;
pub mod check;
mod faults;
mod gate;
mod options;
mod proxy;
mod report;
mod run;
mod shard_worker;
mod worker;
mod workers;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::time::Instant;

use check::{Op, Record};
use faults::Control;
pub use options::{TortureArgs, WorkerArgs};
pub use run::run;
pub use worker::worker;

/// A small deterministic random source (xorshift).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A duration from `lo` to `hi`.
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros().max(1) as u64;
        lo + Duration::from_micros(self.next() % span)
    }
}

/// The harness's two registers.
#[derive(Default)]
struct Registers {
    highest: u64,
    fenced: u64,
    twin: u64,
}

/// This machine's CLOCK_MONOTONIC in ns: one clock for the harness and its
/// workers, which stamp their own events when they happen (a grant once the
/// lock is taken, a release before it is given back), so the order of two
/// workers' lines through their pipes does not matter.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the harness shares between its tasks.
struct Shared {
    start: Instant,
    start_ns: u64,
    history: StdMutex<Vec<Record>>,
    /// The registers: one pair for a lock's run, one per shard for a run
    /// of shard owners (by shard; `None` for the lock).
    registers: StdMutex<HashMap<Option<u32>, Registers>>,
    /// A run of shard owners (`--shards N`): the group's shard count, and
    /// workers' lines name a shard; 0 for a lock's run.
    shards: u32,
    /// Per worker: how to reach it, and the token it holds (0: none).
    workers: StdMutex<HashMap<u32, (Control, u64)>>,
    grants: AtomicU64,
    /// Workers the harness is to pause when they next write: the write is
    /// then applied only once the pause is over, as the write of a process
    /// that checked its lease and paused just as it sent it lands late.
    pause_on_write: StdMutex<Vec<u32>>,
    /// Workers paused now: a second pause would end with the first's
    /// SIGCONT, shorter than it says.
    paused: StdMutex<std::collections::HashSet<u32>>,
    stopping: AtomicBool,
    /// Per worker, its proxy to each store server (network faults only).
    links: HashMap<u32, Vec<proxy::Proxy>>,
    /// Partitions so far (a cluster's first, third… are of a minority of
    /// its servers).
    partitions: AtomicU64,
    /// A network fault is in force (one at a time: a second one's end
    /// would cut the first short).
    network_busy: AtomicBool,
    /// The builds the workers run (two with `--mixed-with`).
    builds: builds::Builds,
}

impl Shared {
    /// The state of a run starting now, with each worker's proxies (network
    /// faults only).
    fn new(links: HashMap<u32, Vec<proxy::Proxy>>, builds: builds::Builds, shards: u32) -> Shared {
        Shared {
            start: Instant::now(),
            start_ns: mono_ns(),
            history: StdMutex::new(Vec::new()),
            registers: StdMutex::new(HashMap::new()),
            shards,
            workers: StdMutex::new(HashMap::new()),
            grants: AtomicU64::new(0),
            pause_on_write: StdMutex::new(Vec::new()),
            paused: StdMutex::new(std::collections::HashSet::new()),
            stopping: AtomicBool::new(false),
            links,
            partitions: AtomicU64::new(0),
            network_busy: AtomicBool::new(false),
            builds,
        }
    }

    /// Records an event the harness itself sees happen now.
    fn record(&self, worker: Option<u32>, op: Op) {
        self.record_at(mono_ns(), worker, op);
    }

    /// Records an event stamped at `ns` (CLOCK_MONOTONIC).
    fn record_at(&self, ns: u64, worker: Option<u32>, op: Op) {
        self.record_shard_at(ns, worker, None, op);
    }

    /// Records an event of one shard (`None`: of the lock, or of every
    /// shard of the worker) stamped at `ns`.
    fn record_shard_at(&self, ns: u64, worker: Option<u32>, shard: Option<u32>, op: Op) {
        let at_us = ns.saturating_sub(self.start_ns) / 1000;
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        history.push(Record {
            at_us,
            worker,
            shard,
            op,
        });
    }

    /// The history so far, in time order.
    fn history(&self) -> Vec<Record> {
        let mut history = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Stable: events of one stamp keep the order they were recorded in.
        history.sort_by_key(|r| r.at_us);
        history
    }
}

/// Each worker: how to reach it, and the token it holds (0: none).
fn workers(shared: &Shared) -> HashMap<u32, (Control, u64)> {
    shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}
