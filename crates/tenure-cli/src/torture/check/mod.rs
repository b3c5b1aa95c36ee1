//! The checker of a torture run: a pure function over the history.
//!
//! The harness keeps two registers, each a counter every holder reads and
//! then writes one higher: the *fenced* one accepts a read or a write only
//! with a token at least the highest it has seen, the *unfenced twin* takes
//! the same operations without the check (the control). The history lists
//! every worker's request, grant, read, write, release and loss, and every
//! fault, in the order the harness saw them, on its own monotonic clock.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

mod shards;
pub use shards::check_shards;

/// One event of the history, as the harness saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When, in µs since the run began (the harness's monotonic clock).
    pub at_us: u64,
    /// The worker it concerns (none for a fault on the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    /// The shard it concerns, in a run of shard owners (`--shards`): a
    /// grant, a release, a read or a write of that shard's registers. None
    /// for a lock's run, and for what concerns every shard of a worker (a
    /// lost session, an exit, a fault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// What happened.
    #[serde(flatten)]
    pub op: Op,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The worker asked for the lock.
    Request,
    /// The worker was granted the lock with this token.
    Grant { token: u64 },
    /// A read of both registers with the token: the fenced register's
    /// answer (`None`: refused) and the twin's.
    Read {
        token: u64,
        fenced: Option<u64>,
        twin: u64,
    },
    /// A write of `value` to both registers with the token: whether the
    /// fenced one accepted it, and what each held before.
    Write {
        token: u64,
        value: u64,
        accepted: bool,
        fenced_before: u64,
        twin_before: u64,
    },
    /// The worker released the lock.
    Release,
    /// The worker's session was lost (its critical section, if any, ends):
    /// dated from when the library told it (the lease's local deadline), or
    /// from the worker's last act if that came later.
    Lost,
    /// The worker's process ended (killed, or done).
    Exit,
    /// A fault began.
    FaultStart { fault: String },
    /// A fault ended.
    FaultEnd { fault: String },
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Findings {
    /// Grants.
    pub grants: usize,
    /// Faults injected.
    pub faults: usize,
    /// Must be 0: accepted writes of the fenced register that overwrote a
    /// newer value (an acknowledged increment lost).
    pub fenced_lost_writes: usize,
    /// Must be 0: reads or writes the fenced register accepted with a token
    /// lower than the highest it had seen.
    pub fenced_lower_token_accepted: usize,
    /// Must be 0: a token granted twice.
    pub duplicate_tokens: usize,
    /// Must be 0: a grant whose request was sent after an earlier grant was
    /// acknowledged, with a token not above it.
    pub tokens_backwards: usize,
    /// Must be 0: critical sections that overlapped while no pause was in
    /// force (with no fault, a kill, a partition or a delay, the holder's
    /// local deadline comes before the store's expiry).
    pub overlaps_unpaused: usize,
    /// Measured: critical sections that overlapped while a worker was
    /// paused (expected: fencing is what makes them harmless).
    pub overlaps_paused: usize,
    /// The longest overlap, in ms.
    pub longest_overlap_ms: f64,
    /// Measured: the same lost writes on the unfenced twin.
    pub twin_lost_writes: usize,
    /// Writes the fenced register refused (late writes of paused holders).
    pub fenced_refusals: usize,
    /// Faults after which another worker was granted later than the bound
    /// in force (the stated bound and the run's allowance).
    pub slow_recoveries: usize,
    /// Faults after which another worker was granted later than the
    /// stated bound itself (TTL, one renew interval, 1 % and 10 ms): what
    /// the allowance covered, 0 on a quiet machine.
    pub recoveries_over_stated: usize,
    /// Faults on a holder followed by another fault before anyone else was
    /// granted: their recovery is not held to the one-fault bound.
    pub compound_faults: usize,
    /// The longest time from a fault on a holder to the next grant to
    /// another worker, in ms.
    pub worst_recovery_ms: f64,
    /// What happened around the first few unpaused overlaps, for whoever
    /// reads a failed run: each worker's events and the faults in force.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explained: Vec<String>,
}

impl Findings {
    /// Whether a safety rule was broken.
    pub fn unsafe_run(&self) -> bool {
        self.fenced_lost_writes
            + self.fenced_lower_token_accepted
            + self.duplicate_tokens
            + self.tokens_backwards
            + self.overlaps_unpaused
            > 0
    }

    /// Adds one part's findings (a shard's, in a run of shard owners):
    /// counts summed, the worst figures kept, its explanations under
    /// `label`. Every field is named, so a new one cannot be left out.
    pub fn add_part(&mut self, label: &str, part: Findings) {
        let Findings {
            grants,
            faults,
            fenced_lost_writes,
            fenced_lower_token_accepted,
            duplicate_tokens,
            tokens_backwards,
            overlaps_unpaused,
            overlaps_paused,
            longest_overlap_ms,
            twin_lost_writes,
            fenced_refusals,
            slow_recoveries,
            recoveries_over_stated,
            compound_faults,
            worst_recovery_ms,
            explained,
        } = part;
        self.grants += grants;
        self.faults += faults;
        self.fenced_lost_writes += fenced_lost_writes;
        self.fenced_lower_token_accepted += fenced_lower_token_accepted;
        self.duplicate_tokens += duplicate_tokens;
        self.tokens_backwards += tokens_backwards;
        self.overlaps_unpaused += overlaps_unpaused;
        self.overlaps_paused += overlaps_paused;
        self.longest_overlap_ms = self.longest_overlap_ms.max(longest_overlap_ms);
        self.twin_lost_writes += twin_lost_writes;
        self.fenced_refusals += fenced_refusals;
        self.slow_recoveries += slow_recoveries;
        self.recoveries_over_stated += recoveries_over_stated;
        self.compound_faults += compound_faults;
        self.worst_recovery_ms = self.worst_recovery_ms.max(worst_recovery_ms);
        for e in explained {
            if self.explained.len() < MAX_EXPLAINED {
                self.explained.push(format!("{label}: {e}"));
            }
        }
    }
}

/// [`check_with_allowance`] with no allowance (the unit tests' form).
#[cfg(test)]
pub fn check(history: &[Record], recovery_bound_us: u64) -> Findings {
    check_with_allowance(history, recovery_bound_us, 0)
}

/// Checks a history. `stated_us`: the longest a fault on a holder may keep
/// the lock from everyone else, as the library states it, after the
/// fault's own length for a network hold or delay (a renewal the holder
/// sent before its deadline reaches the store only when the link lets it
/// through, and renews there), and after the end of any other fault still
/// in force when it began (a server paused or restarting, another worker's
/// partition: the recovery waits for those too). `allowance_us`: what a
/// loaded machine is allowed beyond it; a recovery over the stated bound is
/// counted, one over both fails the run.
pub fn check_with_allowance(history: &[Record], stated_us: u64, allowance_us: u64) -> Findings {
    check_one(history, stated_us, allowance_us, Recovery::ToAnother)
}

/// What a recovery is, in a history of one lock or of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// A lock's: from a fault on its holder to its next grant to another
    /// worker (workers contend all the time).
    ToAnother,
    /// A shard's: from a fault on its owner that ended the owner's hold
    /// (a loss or an exit, not a handover's release) to the shard's next
    /// grant to anyone, the owner's next life included (an owner keeps its
    /// shards until the map moves them).
    AfterLoss,
}

fn check_one(
    history: &[Record],
    stated_us: u64,
    allowance_us: u64,
    recovery: Recovery,
) -> Findings {
    let mut f = Findings::default();
    let mut highest = 0u64;
    let mut fenced_value = 0u64;
    let mut twin_value = 0u64;
    let mut granted_tokens: HashMap<u64, u32> = HashMap::new();
    // Per worker: when its last request was sent.
    let mut requested: HashMap<u32, u64> = HashMap::new();
    // Acknowledged grants so far: (when acknowledged, token).
    let mut acked: Vec<(u64, u64)> = Vec::new();
    // Open critical sections: worker -> since.
    let mut inside: HashMap<u32, (u64, u64)> = HashMap::new();
    // Closed critical sections: (worker, from, to, token).
    let mut closed: Vec<(u32, u64, u64, u64)> = Vec::new();
    // Each worker's last read or write applied with each token.
    let mut last_act: HashMap<(u32, u64), u64> = HashMap::new();
    // Pauses: (worker, from, to).
    let mut pauses: Vec<(Option<u32>, u64, u64)> = Vec::new();
    let mut pausing: HashMap<Option<u32>, u64> = HashMap::new();
    // Faults on a holder: (worker, at, fault).
    let mut holder_faults: Vec<(u32, u64, &str)> = Vec::new();
    // Of those, the ones whose hold ended in a handover's release (not
    // counted as a shard's recovery): by index.
    let mut handed_over: std::collections::HashSet<usize> = std::collections::HashSet::new();
    let end = history.last().map_or(0, |r| r.at_us);
    for r in history {
        let w = r.worker;
        match &r.op {
            Op::Request => {
                if let Some(w) = w {
                    requested.insert(w, r.at_us);
                }
            }
            Op::Grant { token } => {
                f.grants += 1;
                let Some(w) = w else { continue };
                if granted_tokens.insert(*token, w).is_some() {
                    f.duplicate_tokens += 1;
                }
                let sent = requested.get(&w).copied().unwrap_or(0);
                // Every grant acknowledged before this request was sent.
                if acked
                    .iter()
                    .any(|(at, earlier)| *at < sent && *earlier >= *token)
                {
                    f.tokens_backwards += 1;
                }
                acked.push((r.at_us, *token));
                inside.insert(w, (r.at_us, *token));
            }
            Op::Read { token, fenced, .. } => {
                if let Some(w) = w {
                    last_act.insert((w, *token), r.at_us);
                }
                if fenced.is_some() {
                    if *token < highest {
                        f.fenced_lower_token_accepted += 1;
                    }
                    highest = highest.max(*token);
                }
            }
            Op::Write {
                token,
                value,
                accepted,
                fenced_before,
                twin_before,
            } => {
                if let Some(w) = w {
                    last_act.insert((w, *token), r.at_us);
                }
                if *accepted {
                    if *token < highest {
                        f.fenced_lower_token_accepted += 1;
                    }
                    highest = highest.max(*token);
                    // An increment that lands on a value it did not read
                    // overwrote a newer one.
                    if *fenced_before >= *value || *fenced_before != fenced_value {
                        f.fenced_lost_writes += 1;
                    }
                    fenced_value = *value;
                } else {
                    f.fenced_refusals += 1;
                }
                if *twin_before >= *value {
                    f.twin_lost_writes += 1;
                }
                twin_value = *value;
            }
            Op::Release | Op::Lost | Op::Exit => {
                if let Some(w) = w {
                    if let Some((since, token)) = inside.remove(&w) {
                        closed.push((w, since, r.at_us, token));
                        if r.op == Op::Release {
                            handed_over.extend(
                                holder_faults
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, (fw, at, _))| *fw == w && *at >= since)
                                    .map(|(i, _)| i),
                            );
                        }
                    }
                }
            }
            Op::FaultStart { fault } => {
                f.faults += 1;
                if fault == "pause" {
                    pausing.insert(w, r.at_us);
                }
                if let Some(w) = w {
                    if inside.contains_key(&w) {
                        holder_faults.push((w, r.at_us, fault.as_str()));
                    }
                }
            }
            Op::FaultEnd { fault } => {
                if fault == "pause" {
                    if let Some(from) = pausing.remove(&w) {
                        pauses.push((w, from, r.at_us));
                    }
                }
            }
        }
    }
    let _ = twin_value;
    for (w, (since, token)) in inside {
        closed.push((w, since, end, token));
    }
    let sections = sections(closed, &last_act);
    for (w, from) in pausing {
        pauses.push((w, from, end));
    }
    count_overlaps(&mut f, history, &sections, &pauses);
    if recovery == Recovery::AfterLoss {
        holder_faults = holder_faults
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !handed_over.contains(i))
            .map(|(_, h)| h)
            .collect();
    }
    count_recoveries(
        &mut f,
        history,
        holder_faults,
        end,
        (stated_us, allowance_us),
        recovery,
    );
    f
}

/// Each critical section as `(worker, from, to)`, in order of its start.
fn sections(
    closed: Vec<(u32, u64, u64, u64)>,
    last_act: &HashMap<(u32, u64), u64>,
) -> Vec<(u32, u64, u64)> {
    // A section lasts at least until the last read or write the harness
    // applied with its token: a write sent before the worker's deadline
    // but applied after it (the writer stopped as it sent it) is an act of
    // that section, however early the worker dates its loss.
    let mut sections: Vec<(u32, u64, u64)> = closed
        .into_iter()
        .map(|(w, since, to, token)| {
            let acted = last_act.get(&(w, token)).copied().unwrap_or(to);
            (w, since, to.max(acted))
        })
        .collect();
    sections.sort_by_key(|s| s.1);
    sections
}

/// Counts the overlaps of sections of two workers, under a pause of one of
/// theirs or not, and explains the first few of the latter.
fn count_overlaps(
    f: &mut Findings,
    history: &[Record],
    sections: &[(u32, u64, u64)],
    pauses: &[(Option<u32>, u64, u64)],
) {
    for (i, a) in sections.iter().enumerate() {
        for b in &sections[i + 1..] {
            if b.1 >= a.2 {
                break;
            }
            if a.0 == b.0 {
                continue;
            }
            let (from, to) = (b.1, a.2.min(b.2));
            // A section that a pause of its own worker cut through: that
            // worker may have lost its lease in the pause and acts on when
            // it wakes, until it finds out (what fencing is for).
            let paused_in = |s: &(u32, u64, u64)| {
                pauses
                    .iter()
                    .any(|(pw, pf, pt)| *pw == Some(s.0) && *pf < s.2 && *pt > s.1)
            };
            let paused = paused_in(a) || paused_in(b);
            if paused {
                f.overlaps_paused += 1;
            } else {
                f.overlaps_unpaused += 1;
                if f.explained.len() < MAX_EXPLAINED {
                    f.explained.push(explain(history, a, b));
                }
            }
            f.longest_overlap_ms = f.longest_overlap_ms.max((to - from) as f64 / 1000.0);
        }
    }
}

/// Measures each recovery from a fault on a holder, and counts those over
/// the bound and those another fault cut into.
fn count_recoveries(
    f: &mut Findings,
    history: &[Record],
    holder_faults: Vec<(u32, u64, &str)>,
    end: u64,
    (stated_us, allowance_us): (u64, u64),
    recovery: Recovery,
) {
    // Recovery: from a fault on a holder to the next grant to another
    // worker, when no other fault came in between (a paused next waiter,
    // say, holds the queue up on its own).
    // Every fault's span: (index of its start, from, to), to the end of the
    // history if it never ended.
    let spans: Vec<(usize, u64, u64)> = history
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match &r.op {
            Op::FaultStart { fault } => {
                let to = history[i + 1..]
                    .iter()
                    .find(|e| {
                        e.worker == r.worker
                            && matches!(&e.op, Op::FaultEnd { fault: ended } if ended == fault)
                    })
                    .map_or(end, |e| e.at_us);
                Some((i, r.at_us, to))
            }
            _ => None,
        })
        .collect();
    for (w, at, fault) in holder_faults {
        // The other faults in force when this one began end first.
        let in_force_until = spans
            .iter()
            .filter(|(_, from, to)| *from < at && *to > at)
            .map(|(_, _, to)| *to)
            .max()
            .unwrap_or(at);
        let next = history.iter().find_map(|r| match r.op {
            Op::Grant { .. }
                if r.at_us > at && (recovery == Recovery::AfterLoss || r.worker != Some(w)) =>
            {
                Some(r.at_us)
            }
            _ => None,
        });
        if let Some(next) = next {
            let compound = history
                .iter()
                .any(|r| matches!(r.op, Op::FaultStart { .. }) && r.at_us > at && r.at_us < next);
            if compound {
                f.compound_faults += 1;
                continue;
            }
            let late_delivery = match fault {
                "hold" | "delay" => history
                    .iter()
                    .find_map(|r| match &r.op {
                        Op::FaultEnd { fault: ended }
                            if r.at_us >= at && r.worker == Some(w) && ended == fault =>
                        {
                            Some(r.at_us - at)
                        }
                        _ => None,
                    })
                    .unwrap_or(0),
                _ => 0,
            };
            let took = next.saturating_sub(in_force_until.max(at));
            f.worst_recovery_ms = f.worst_recovery_ms.max(took as f64 / 1000.0);
            if took > stated_us + late_delivery {
                f.recoveries_over_stated += 1;
            }
            if took > stated_us + allowance_us + late_delivery {
                f.slow_recoveries += 1;
            }
        }
    }
}

/// How many violations a report explains.
pub(super) const MAX_EXPLAINED: usize = 3;

/// An overlap of worker `a.0`'s section with `b.0`'s, told as the events of
/// both workers and every fault from a little before `a` began to the end
/// of the later section, times in ms since the run began.
fn explain(history: &[Record], a: &(u32, u64, u64), b: &(u32, u64, u64)) -> String {
    let from = a.1.saturating_sub(3_000_000);
    let to = a.2.max(b.2);
    let mut told = format!(
        "worker {} held {:.3}..{:.3} ms, worker {} held {:.3}..{:.3} ms:",
        a.0,
        ms(a.1),
        ms(a.2),
        b.0,
        ms(b.1),
        ms(b.2)
    );
    for r in history {
        let ours = r.worker.is_none_or(|w| w == a.0 || w == b.0);
        let fault = matches!(r.op, Op::FaultStart { .. } | Op::FaultEnd { .. });
        if r.at_us < from || r.at_us > to || !(ours || fault) {
            continue;
        }
        let who = r.worker.map_or("server".to_string(), |w| format!("w{w}"));
        let what = match &r.op {
            Op::Request => "request".to_string(),
            Op::Grant { token } => format!("grant {token}"),
            Op::Read { token, fenced, .. } => format!("read {token} fenced {fenced:?}"),
            Op::Write {
                token, accepted, ..
            } => format!("write {token} accepted {accepted}"),
            Op::Release => "release".to_string(),
            Op::Lost => "lost".to_string(),
            Op::Exit => "exit".to_string(),
            Op::FaultStart { fault } => format!("{fault} starts"),
            Op::FaultEnd { fault } => format!("{fault} ends"),
        };
        told.push_str(&format!(" {:.3} {who} {what};", ms(r.at_us)));
    }
    told
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[cfg(test)]
mod tests;
