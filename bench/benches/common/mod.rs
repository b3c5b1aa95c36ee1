//! What the benches share: the CPU time of the servers they start.

// Each bench compiles this on its own and uses part of it.
#![allow(dead_code)]

/// The process's pid and parent pid and name from `/proc/PID/stat`.
fn proc_stat(pid: u32) -> Option<(u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let ppid = stat
        .get(close + 2..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((ppid, comm))
}

/// The CPU time (ns) run so far by every thread of a process.
pub fn process_cpu_ns(pid: &str) -> u64 {
    let mut sum = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        sum += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    sum
}

/// CPU time (ns) run so far by the servers this bench started: processes
/// named `comm` that descend from this process (so a neighbour's server of
/// the same name on a shared machine is not counted). `None` without a
/// server or off Linux.
pub fn server_cpu_ns(comm: Option<&str>) -> Option<u64> {
    let comm = comm?;
    let me = std::process::id();
    let mut parents = std::collections::HashMap::new();
    let mut names = Vec::new();
    for dir in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = dir.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, name)) = proc_stat(pid) {
            parents.insert(pid, ppid);
            if name == comm {
                names.push(pid);
            }
        }
    }
    let descends = |mut pid: u32| {
        for _ in 0..64 {
            match parents.get(&pid) {
                Some(&ppid) if ppid == me => return true,
                Some(&ppid) if ppid > 1 => pid = ppid,
                _ => return false,
            }
        }
        false
    };
    Some(
        names
            .into_iter()
            .filter(|&pid| descends(pid))
            .map(|pid| process_cpu_ns(&pid.to_string()))
            .sum(),
    )
}
