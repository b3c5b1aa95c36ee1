//! A run of shard owners: each shard's history checked as a lock's.

use super::*;

/// Checks the history of a run of shard owners: each shard's own history
/// (its grants, releases, reads and writes, and every worker's losses,
/// exits and faults) as a lock's, with recoveries as [`Recovery::AfterLoss`]
/// says; the findings summed (the worst recovery, the largest).
pub fn check_shards(history: &[Record], stated_us: u64, allowance_us: u64) -> Findings {
    let shards: std::collections::BTreeSet<u32> = history.iter().filter_map(|r| r.shard).collect();
    let mut all = Findings {
        faults: history
            .iter()
            .filter(|r| matches!(r.op, Op::FaultStart { .. }))
            .count(),
        ..Findings::default()
    };
    for shard in shards {
        let own: Vec<Record> = history
            .iter()
            .filter(|r| r.shard.is_none_or(|s| s == shard))
            .cloned()
            .collect();
        let f = check_one(&own, stated_us, allowance_us, Recovery::AfterLoss);
        all.grants += f.grants;
        all.fenced_lost_writes += f.fenced_lost_writes;
        all.fenced_lower_token_accepted += f.fenced_lower_token_accepted;
        all.duplicate_tokens += f.duplicate_tokens;
        all.tokens_backwards += f.tokens_backwards;
        all.overlaps_unpaused += f.overlaps_unpaused;
        all.overlaps_paused += f.overlaps_paused;
        all.longest_overlap_ms = all.longest_overlap_ms.max(f.longest_overlap_ms);
        all.twin_lost_writes += f.twin_lost_writes;
        all.fenced_refusals += f.fenced_refusals;
        all.slow_recoveries += f.slow_recoveries;
        all.recoveries_over_stated += f.recoveries_over_stated;
        all.compound_faults += f.compound_faults;
        all.worst_recovery_ms = all.worst_recovery_ms.max(f.worst_recovery_ms);
        for e in f.explained {
            if all.explained.len() < MAX_EXPLAINED {
                all.explained.push(format!("shard {shard}: {e}"));
            }
        }
    }
    all
}
