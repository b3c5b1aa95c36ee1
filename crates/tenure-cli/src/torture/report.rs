//! What a run tells: the summary, the report (JSON), the history (JSON
//! lines), and a saved history checked again.

use std::time::Duration;

use serde::Serialize;

use super::check::{self, Findings, Op, Record};

/// Checks a saved history again; with `report`, writes the findings there
/// (JSON).
pub(super) fn recheck(
    path: &std::path::Path,
    ttl: Duration,
    strict: bool,
    report: Option<&std::path::Path>,
) -> Result<u8, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut history = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let record: Record = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not a history line: {e}", path.display(), i + 1))?;
        history.push(record);
    }
    history.sort_by_key(|r| r.at_us);
    let mut bound = Bound::lock(ttl, strict);
    if history.iter().any(|r| r.shard.is_some()) {
        // The store is not known here: a watcher's TTL is allowed.
        bound.shards = true;
        bound.stated += ttl + ttl / 100 + Duration::from_millis(110);
    }
    let findings = bound.check(&history);
    let code = if findings.unsafe_run() {
        1
    } else if findings.slow_recoveries > 0 {
        2
    } else {
        0
    };
    let verdict = ["pass", "safety violation", "liveness failure"][code as usize];
    print_summary(&findings, 0, &bound, verdict);
    if let Some(out) = report {
        let kinds: std::collections::BTreeSet<&str> = history
            .iter()
            .filter_map(|r| match &r.op {
                Op::FaultStart { fault } => Some(fault.as_str()),
                _ => None,
            })
            .collect();
        let json = serde_json::json!({
            "checked_history": path.display().to_string(),
            "fault_kinds": kinds,
            "ttl_ms": ttl.as_millis() as u64,
            "recovery_bound_ms": bound.stated.as_millis() as u64,
            "recovery_allowance_ms": allowance(strict).as_millis() as u64,
            "findings": findings,
            "verdict": verdict,
        });
        let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    }
    Ok(code)
}

/// The report, as JSON.
#[derive(Serialize)]
pub(super) struct Report {
    pub(super) store: String,
    pub(super) seed: u64,
    pub(super) clients: u32,
    pub(super) ttl_ms: u64,
    pub(super) faults: Vec<String>,
    /// SQLite's `clock`: how far worker 0's CLOCK_BOOTTIME runs ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) worker_0_boottime_ahead_s: Option<u32>,
    pub(super) fault_interval_ms: u64,
    /// Whether a `--nemesis-exec` fault took turns (its command is not
    /// shown: it may hold secrets).
    pub(super) nemesis: bool,
    /// A run of shard owners: the group's shard count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) shards: Option<u32>,
    /// The stated bound ([`stated_bound`], or [`Bound::of`]'s for shards).
    pub(super) recovery_bound_ms: u64,
    /// Allowed beyond it ([`allowance`]).
    pub(super) recovery_allowance_ms: u64,
    pub(super) findings: Findings,
    pub(super) leaked_names: usize,
    /// What each build's workers did (two with `--mixed-with`).
    pub(super) builds: Vec<super::builds::BuildReport>,
    pub(super) verdict: &'static str,
}

/// Writes the history as JSON lines, to be checked again later.
pub(super) fn write_history(path: &std::path::Path, history: &[Record]) -> Result<(), String> {
    let mut out = String::new();
    for r in history {
        out.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
        out.push('\n');
    }
    std::fs::write(path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The longest a fault on a holder may keep the lock from everyone else,
/// as the library states it: its TTL and one renew interval, and the
/// watchers' 1 % and 10 ms.
pub(super) fn stated_bound(ttl: Duration) -> Duration {
    ttl + ttl / 3 + ttl / 100 + Duration::from_millis(10)
}

/// What a run allows beyond the stated bound, for processes to start and
/// stores to answer on a loaded machine: a second, or none with `--strict`.
pub(super) fn allowance(strict: bool) -> Duration {
    if strict {
        Duration::ZERO
    } else {
        Duration::from_secs(1)
    }
}

/// What a run's history is checked against: the stated bound of a
/// recovery, the allowance beyond it, and how (a lock's run, or a run of
/// shard owners, each shard checked as a lock).
pub(super) struct Bound {
    pub(super) ttl: Duration,
    pub(super) strict: bool,
    /// The stated bound.
    pub(super) stated: Duration,
    /// A run of shard owners.
    pub(super) shards: bool,
    /// What the stated bound is made of, in words.
    what: &'static str,
}

impl Bound {
    /// A lock's run: [`stated_bound`].
    pub(super) fn lock(ttl: Duration, strict: bool) -> Bound {
        Bound {
            ttl,
            strict,
            stated: stated_bound(ttl),
            shards: false,
            what: "TTL, one renew interval, 1 % and 10 ms",
        }
    }

    /// The run `args` asks for on `store`. A shard lost with its owner is
    /// owned again once the owner's lease ends (the lock's bound), the
    /// other members see the group change (the store's change latency: its
    /// longest poll where it polls, else a tenth of a second) and, where a
    /// watcher confirms expiry, once they have watched it for its TTL.
    pub(super) fn of(store: &dyn tenure::Store, args: &super::TortureArgs) -> Bound {
        let mut bound = Bound::lock(args.ttl, args.strict);
        if args.shards.is_some() {
            let caps = store.capabilities();
            let latency = match caps.wake {
                tenure::store::Wake::LocalOrPoll { max, .. } => max,
                _ => Duration::ZERO,
            } + Duration::from_millis(100);
            let confirm = match caps.watched_expiry {
                true => args.ttl + args.ttl / 100 + Duration::from_millis(10),
                false => Duration::ZERO,
            };
            bound.stated += latency + confirm;
            bound.shards = true;
            bound.what = "TTL, one renew interval, 1 % and 10 ms, the change latency, a watcher's TTL where one confirms expiry";
        }
        bound
    }

    /// Checks `history` against the bound and the allowance.
    pub(super) fn check(&self, history: &[Record]) -> Findings {
        let (stated, allowed) = (
            self.stated.as_micros() as u64,
            allowance(self.strict).as_micros() as u64,
        );
        match self.shards {
            true => check::check_shards(history, stated, allowed),
            false => check::check_with_allowance(history, stated, allowed),
        }
    }
}

pub(super) fn violations(f: &Findings) -> usize {
    f.fenced_lost_writes
        + f.fenced_lower_token_accepted
        + f.duplicate_tokens
        + f.tokens_backwards
        + f.overlaps_unpaused
}

pub(super) fn print_summary(f: &Findings, leaked: usize, bound: &Bound, verdict: &str) {
    let (ttl, strict) = (bound.ttl, bound.strict);
    let rows: Vec<(&str, String, &str)> = vec![
        ("grants", f.grants.to_string(), ""),
        ("faults injected", f.faults.to_string(), ""),
        (
            "fenced: lost acknowledged writes",
            f.fenced_lost_writes.to_string(),
            "must be 0",
        ),
        (
            "fenced: lower token accepted",
            f.fenced_lower_token_accepted.to_string(),
            "must be 0",
        ),
        (
            "duplicate tokens",
            f.duplicate_tokens.to_string(),
            "must be 0",
        ),
        (
            "tokens backwards",
            f.tokens_backwards.to_string(),
            "must be 0",
        ),
        (
            "overlaps, no pause in force",
            f.overlaps_unpaused.to_string(),
            "must be 0",
        ),
        (
            "overlaps under a pause",
            f.overlaps_paused.to_string(),
            "expected",
        ),
        (
            "longest overlap (ms)",
            format!("{:.1}", f.longest_overlap_ms),
            "",
        ),
        (
            "fenced: late writes refused",
            f.fenced_refusals.to_string(),
            "",
        ),
        (
            "unfenced twin: lost writes",
            f.twin_lost_writes.to_string(),
            "the control",
        ),
        (
            "worst recovery (ms)",
            format!("{:.0}", f.worst_recovery_ms),
            "",
        ),
        (
            "recoveries over the stated bound",
            f.recoveries_over_stated.to_string(),
            if strict {
                "must be 0"
            } else {
                "allowed (--strict: not)"
            },
        ),
        (
            "recoveries over bound + allowance",
            f.slow_recoveries.to_string(),
            "must be 0",
        ),
        (
            "faults during another's recovery",
            f.compound_faults.to_string(),
            "not bounded",
        ),
        ("names left in the store", leaked.to_string(), "must be 0"),
    ];
    outln!(
        "torture: TTL {}, recovery bound {} ({}), allowance {}",
        humantime::format_duration(ttl),
        humantime::format_duration(Duration::from_millis(bound.stated.as_millis() as u64)),
        bound.what,
        humantime::format_duration(allowance(strict))
    );
    for (what, figure, rule) in rows {
        outln!("  {what:<36} {figure:>8}  {rule}");
    }
    for told in &f.explained {
        outln!("  overlap: {told}");
    }
    outln!("verdict: {verdict}");
}
