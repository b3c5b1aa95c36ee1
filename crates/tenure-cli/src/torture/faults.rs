//! The faults: how the harness reaches a worker (a process or a task),
//! and each fault it injects (kill, pause, the network faults, the user's
//! own).

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;

use super::check::Op;
use super::{gate, proxy, workers, Rng, Shared};

/// How the harness reaches a worker to fault it.
#[derive(Clone)]
pub(super) enum Control {
    /// An OS process, by its id (0: none, never signalled: kill(0) would
    /// signal the harness's own process group).
    Process(u32),
    /// A task of this process, for a store that lives in it.
    Task(Arc<gate::TaskControl>),
}

impl Control {
    pub(super) fn kill(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGKILL),
            Control::Task(t) => t.kill(),
        }
    }
    pub(super) fn stop(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGSTOP),
            Control::Task(t) => t.set(gate::Gate::Frozen),
        }
    }
    pub(super) fn cont(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGCONT),
            Control::Task(t) => t.set(gate::Gate::Open),
        }
    }
    pub(super) fn terminate(&self) {
        match self {
            Control::Process(pid) => signal(*pid, libc::SIGTERM),
            Control::Task(t) => t.terminate(),
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid == 0 {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a pid of a child of ours; no memory is touched.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// One fault: on the holder if there is one, else on a random worker.
/// False if it could not be injected now (a network fault in force).
pub(super) async fn inject(
    shared: &Arc<Shared>,
    fault: &str,
    ttl: Duration,
    rng: &mut Rng,
) -> bool {
    let all = workers(shared);
    if all.is_empty() {
        return true;
    }
    let holder = all
        .iter()
        .find(|(_, (_, token))| *token != 0)
        .map(|(id, _)| *id);
    let mut ids: Vec<u32> = all.keys().copied().collect();
    ids.sort_unstable();
    let target = holder.unwrap_or(ids[(rng.next() % ids.len() as u64) as usize]);
    let Some((control, _)) = all.get(&target).cloned() else {
        return true;
    };
    match fault {
        "kill" => {
            shared.record(
                Some(target),
                Op::FaultStart {
                    fault: "kill".into(),
                },
            );
            control.kill();
            // The worker's task records its exit and starts it again.
        }
        "pause" => {
            // One pause at a time per worker: a paused or soon-paused one
            // is passed over for another (none left: the turn is skipped).
            let busy = |id: &u32| {
                shared
                    .paused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(id)
                    || shared
                        .pause_on_write
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(id)
            };
            let (target, control) = if busy(&target) {
                let free: Vec<u32> = ids.iter().copied().filter(|id| !busy(id)).collect();
                let Some(&other) = free.get((rng.next() % free.len().max(1) as u64) as usize)
                else {
                    return true;
                };
                match all.get(&other) {
                    Some((control, _)) => (other, control.clone()),
                    None => return true,
                }
            } else {
                (target, control)
            };
            // Every other pause lands on a holder's write, after its last
            // look at its lease (its late write then meets the fence); the
            // others wherever the worker is (in its critical section, or
            // waiting).
            if rng.next() % 2 == 0 {
                shared
                    .pause_on_write
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(target);
            } else {
                pause(shared.clone(), target, control, ttl, rng.next());
            }
        }
        "partition" | "delay" | "hold" => return network_fault(shared, fault, target, ttl, rng),
        _ => {}
    }
    true
}

/// A network fault for 1.5–3 TTLs, in the background: on every link of
/// `target` (the holder if any), or, for the first, third… partition of a
/// cluster of three or more servers, on the links of every worker to a
/// minority of the servers.
fn network_fault(
    shared: &Arc<Shared>,
    fault: &str,
    target: u32,
    ttl: Duration,
    rng: &mut Rng,
) -> bool {
    if shared.network_busy.swap(true, Ordering::SeqCst) {
        return false;
    }
    let mode = match fault {
        "partition" => proxy::Mode::Cut,
        "hold" => proxy::Mode::Hold,
        _ => proxy::Mode::Delay {
            base: ttl / 8,
            jitter: ttl / 16,
        },
    };
    let servers = shared.links.values().next().map_or(0, Vec::len);
    let minority = fault == "partition"
        && servers >= 3
        && shared.partitions.fetch_add(1, Ordering::Relaxed) % 2 == 0;
    let (worker, links): (Option<u32>, Vec<(u32, usize)>) = if minority {
        // Which servers: a random window of (servers - 1) / 2 of them.
        let count = (servers - 1) / 2;
        let first = (rng.next() % servers as u64) as usize;
        let cut: Vec<usize> = (0..count).map(|k| (first + k) % servers).collect();
        let links = shared
            .links
            .keys()
            .flat_map(|id| cut.iter().map(move |i| (*id, *i)))
            .collect();
        (None, links)
    } else {
        (Some(target), (0..servers).map(|i| (target, i)).collect())
    };
    let name = if minority {
        "partition-minority"
    } else {
        fault
    };
    let length = rng.between(ttl * 3 / 2, ttl * 3);
    shared.record(worker, Op::FaultStart { fault: name.into() });
    set_links(shared, &links, mode);
    let shared = shared.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        set_links(&shared, &links, proxy::Mode::Pass);
        shared.record(worker, Op::FaultEnd { fault: name });
        shared.network_busy.store(false, Ordering::SeqCst);
    });
    true
}

/// Sets the links `(worker, server)` to `mode`.
fn set_links(shared: &Shared, links: &[(u32, usize)], mode: proxy::Mode) {
    for (id, i) in links {
        if let Some(p) = shared.links.get(id).and_then(|ps| ps.get(*i)) {
            p.set(mode);
        }
    }
}

/// The user's fault: `CMD start`, `length`, `CMD stop` (each bounded to
/// 30 s).
pub(super) async fn nemesis(shared: Arc<Shared>, cmd: String, length: Duration) {
    let run = |phase: &'static str| {
        let cmd = format!("{cmd} {phase}");
        async move {
            let child = Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(Duration::from_secs(30), child).await {
                Ok(Ok(status)) if status.success() => {}
                other => eprintln!("torture: nemesis {phase}: {other:?}"),
            }
        }
    };
    shared.record(
        None,
        Op::FaultStart {
            fault: "nemesis".into(),
        },
    );
    run("start").await;
    tokio::time::sleep(length).await;
    run("stop").await;
    shared.record(
        None,
        Op::FaultEnd {
            fault: "nemesis".into(),
        },
    );
}

/// Stops a worker for 1.5–3 TTLs, in the background.
/// Returns how long.
pub(super) fn pause(
    shared: Arc<Shared>,
    id: u32,
    control: Control,
    ttl: Duration,
    seed: u64,
) -> Duration {
    let mut rng = Rng::new(seed);
    let length = rng.between(ttl * 3 / 2, ttl * 3);
    shared
        .paused
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id);
    shared.record(
        Some(id),
        Op::FaultStart {
            fault: "pause".into(),
        },
    );
    control.stop();
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        control.cont();
        // Recorded before the worker may be paused again: its next pause's
        // start must come after this end in the history.
        shared.record(
            Some(id),
            Op::FaultEnd {
                fault: "pause".into(),
            },
        );
        shared
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    });
    length
}
