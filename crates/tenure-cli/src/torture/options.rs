//! What a run is told: its options (the harness's and a worker's), and
//! the faults they ask for, checked against the store.

use std::time::Duration;

use clap::Args;
use tenure::Store;

/// Client-side faults, safe on anyone's deployment: the default set.
const CLIENT_FAULTS: &[&str] = &["kill", "pause"];

/// Network faults, on the links of the harness's own workers only (each
/// reaches each store server through a proxy of the harness): as safe, but
/// only for stores over a network.
pub(super) const NETWORK_FAULTS: &[&str] = &["partition", "delay", "hold"];

/// SQLite's `clock`: worker 0 runs in a time namespace of its own
/// (`unshare -rT --boottime`), its `CLOCK_BOOTTIME` (SQLite's lease clock)
/// this far ahead of everyone else's.
pub(super) const SQLITE_SKEW_S: u32 = 3600;

#[derive(Args, Debug)]
pub struct TortureArgs {
    /// Worker processes contending for the lock.
    #[arg(long, default_value_t = 6)]
    pub clients: u32,
    /// How long to run (unless --cycles ends it first).
    #[arg(long, default_value = "60s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Stop after this many grants.
    #[arg(long)]
    pub cycles: Option<usize>,
    /// The workers' session TTL.
    #[arg(long, default_value = "2s", value_parser = crate::cli::parse_duration)]
    pub ttl: Duration,
    /// Faults to inject, comma-separated: kill, pause (the client-side
    /// faults, the default); partition, delay, hold (network faults on a
    /// worker's links, through a loopback proxy per worker and server;
    /// with three or more servers every other partition cuts a minority of
    /// the servers off from every worker); clock (SQLite: one worker runs
    /// with its CLOCK_BOOTTIME an hour ahead, in a time namespace of its
    /// own); or none.
    #[arg(long, default_value = "kill,pause", value_delimiter = ',')]
    pub faults: Vec<String>,
    /// Time between faults.
    #[arg(long, default_value = "3s", value_parser = crate::cli::parse_duration)]
    pub fault_interval: Duration,
    /// Seed of the random choices (faults, critical-section times).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the report (JSON) here (with --check: the findings of the
    /// history checked again).
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
    /// Write the history (JSON lines) here, to check it again later.
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Hold every recovery to the bound the library states (TTL, one renew
    /// interval, 1 % and 10 ms) with no allowance: for a quiet machine.
    /// Without it a second more is allowed (processes starting, a loaded
    /// store), and recoveries past the stated bound are counted.
    #[arg(long)]
    pub strict: bool,
    /// Check a history a run wrote (--history) again, with this --ttl's
    /// bound, instead of running; exit as the run would.
    #[arg(long, value_name = "FILE.jsonl")]
    pub check: Option<std::path::PathBuf>,
    /// Your own fault, taking its turn with the others: run as
    /// `sh -c "CMD start"` to begin it and `sh -c "CMD stop"` 1.5-3 TTLs
    /// later (pause your server, step its clock, cut a link…). Overlaps
    /// during it must be 0.
    #[arg(long, value_name = "CMD")]
    pub nemesis_exec: Option<String>,
    /// Another build of tenure (the previous release's binary) for half the
    /// workers: each worker's lives alternate between this build and that
    /// one, so both hold the lock side by side and a killed worker comes
    /// back as the other build — a rolling upgrade under faults. Fails if a
    /// build's workers exit on their own (refused by the store, or dead of
    /// an error) or are never granted.
    #[arg(long, value_name = "EXE")]
    pub mixed_with: Option<std::path::PathBuf>,
    /// Shard owners instead of lock holders: the workers are the members of
    /// one group of this many shards ([`tenure::Shards`]); each works on
    /// every shard it is granted (a read and a write of that shard's
    /// registers), hands a revoked shard back, and the checker holds each
    /// shard to what it holds a lock to (one owner at a time, tokens and
    /// the fenced register per shard), and each shard an owner lost to a
    /// fault owned again within the shards' bound.
    #[arg(long, value_name = "N")]
    pub shards: Option<u32>,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The lock's name.
    #[arg(long)]
    pub name: String,
    /// Session TTL.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub ttl: Duration,
    /// Seed of this worker's critical-section times.
    #[arg(long)]
    pub seed: u64,
    /// A member of the group NAME with this many shards, instead of a
    /// holder of the lock NAME.
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
}

/// What the run does, by its options and the store: checked before anything
/// starts.
pub(super) struct Plan {
    /// Workers are tasks of this process, for a store that lives in it.
    pub(super) in_process: bool,
    /// The faults that take turns (`clock` is not one: it is worker 0's
    /// setting; `nemesis` is the user's `--nemesis-exec`).
    pub(super) faults: Vec<String>,
    /// SQLite's `clock`: worker 0 runs with its CLOCK_BOOTTIME ahead.
    pub(super) skewed: bool,
    /// Network faults take turns: workers reach the store through proxies.
    pub(super) network: bool,
}

impl Plan {
    /// Reads the faults asked for, and refuses what this store or this build
    /// cannot do.
    pub(super) fn new(store: &dyn Store, args: &TortureArgs) -> Result<Plan, String> {
        // Workers are processes, unless the store lives in this one.
        let in_process = !store.capabilities().multi_process;
        let mut faults: Vec<String> = args
            .faults
            .iter()
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty() && f != "none")
            .collect();
        let skewed = faults.iter().any(|f| f == "clock");
        faults.retain(|f| f != "clock");
        if skewed && store.capabilities().backend != "sqlite" {
            return Err(
                "the clock fault is built in for SQLite only (a worker in a time namespace); a server's clock jump needs the server: use --nemesis-exec with libfaketime (see docs/torture.md)"
                    .into(),
            );
        }
        for f in &faults {
            if !CLIENT_FAULTS.contains(&f.as_str()) && !NETWORK_FAULTS.contains(&f.as_str()) {
                return Err(format!(
                    "unknown or not yet supported fault {f:?}: this build injects {}, {}, clock (SQLite) (or none)",
                    CLIENT_FAULTS.join(", "),
                    NETWORK_FAULTS.join(", ")
                ));
            }
        }
        if in_process && args.mixed_with.is_some() {
            return Err(format!(
                "the {} store lives in this process: --mixed-with needs workers that are processes",
                store.capabilities().backend
            ));
        }
        let network = faults.iter().any(|f| NETWORK_FAULTS.contains(&f.as_str()));
        if in_process && network {
            return Err(format!(
                "the {} store lives in this process: it has no network to fault",
                store.capabilities().backend
            ));
        }
        let min_ttl = store.capabilities().min_ttl;
        if args.ttl < min_ttl {
            return Err(format!(
                "--ttl {:?} is shorter than the {} backend's shortest, {min_ttl:?}",
                args.ttl,
                store.capabilities().backend
            ));
        }
        if args.nemesis_exec.is_some() {
            faults.push("nemesis".into());
        }
        if let Some(n) = args.shards {
            if !(1..=tenure::MAX_SHARDS).contains(&n) {
                return Err(format!("--shards {n}: from 1 to {}", tenure::MAX_SHARDS));
            }
            if args.mixed_with.is_some() {
                return Err("--shards and --mixed-with: builds before shards have none".into());
            }
            if !store.capabilities().shared {
                return Err(format!(
                    "--shards: this {} store keeps no shared entries, and shard groups need \
                     them (etcd with `?layout=etcd` is such a store: use its URL without it)",
                    store.capabilities().backend
                ));
            }
        }
        if args.clients < 2 {
            return Err("--clients must be at least 2: torture needs contention".into());
        }
        Ok(Plan {
            in_process,
            faults,
            skewed,
            network,
        })
    }
}
