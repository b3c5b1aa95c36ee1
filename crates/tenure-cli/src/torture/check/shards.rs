//! A run of shard owners: each shard's history checked as a lock's.

use super::*;

/// Checks the history of a run of shard owners: each shard's own history
/// (its grants, releases, reads and writes, and every worker's losses,
/// exits and faults) as a lock's, with recoveries as [`Recovery::AfterLoss`]
/// says; the findings summed ([`Findings::add_part`]).
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
        let mut f = check_one(&own, stated_us, allowance_us, Recovery::AfterLoss);
        // Each shard's history holds every fault: they are counted once,
        // for the whole run, above.
        f.faults = 0;
        all.add_part(&format!("shard {shard}"), f);
    }
    all
}
