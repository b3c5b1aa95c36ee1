//! The harness's side of its workers: start each (a process, or a task
//! for a store in this process), again whenever it dies, and serve its
//! lines (record them, answer its reads and writes of the registers).

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tenure::Store;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

use super::check::Op;
use super::faults::{pause, Control};
use super::options::WorkerArgs;
use super::worker::worker_loop;
use super::{gate, mono_ns, Rng, Shared};

/// Runs worker `id`, and again whenever its process dies, until the harness
/// stops, each life with the build [`super::builds::Builds`] picks; with
/// `skew`, in a time namespace whose CLOCK_BOOTTIME is that many seconds
/// ahead.
pub(super) async fn keep_worker(
    shared: Arc<Shared>,
    url: String,
    name: String,
    ttl: Duration,
    seed: u64,
    id: u32,
    skew: Option<u32>,
) {
    let mut life = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        life += 1;
        let exe = shared.builds.start_life(id, life);
        let mut command = match skew {
            Some(s) => {
                // `unshare` forks the worker into the new namespace (and
                // kills it if it dies itself); faults go to the worker.
                let mut c = Command::new("unshare");
                c.args(["-rT", "--kill-child", "--boottime", &s.to_string()])
                    .arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let child = command
            .arg("--store")
            .arg(&url)
            .arg("torture-worker")
            .arg("--name")
            .arg(&name)
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .arg("--seed")
            .arg((seed ^ (u64::from(id) << 32) ^ life).to_string())
            // Only in a run of shard owners: an older build (--mixed-with)
            // knows no such option.
            .args(
                (shared.shards != 0)
                    .then(|| ["--shards".to_string(), shared.shards.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let Ok(mut child) = child else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut pid = child.id().unwrap_or(0);
        if skew.is_some() {
            match forked_child(pid).await {
                Some(worker) => pid = worker,
                None => {
                    eprintln!("torture: the worker in a time namespace did not start (is `unshare -rT` allowed here?)");
                    let _ = child.kill().await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        shared
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (Control::Process(pid), 0));
        if let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) {
            serve(&shared, id, Control::Process(pid), ttl, stdout, stdin).await;
        }
        let status = child.wait().await;
        // Exited on its own (a kill fault ends it by a signal; the harness
        // stopping it is not counted).
        if let Ok(Some(code)) = status.map(|s| s.code()) {
            if !shared.stopping.load(Ordering::SeqCst) {
                shared.builds.exited(id, code);
            }
        }
        worker_gone(&shared, id);
    }
}

/// Records a worker's end; one the harness did not stop was killed, and
/// its kill ends here.
fn worker_gone(shared: &Shared, id: u32) {
    shared.record(Some(id), Op::Exit);
    let was = shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    if was.is_some() && !shared.stopping.load(Ordering::SeqCst) {
        shared.record(
            Some(id),
            Op::FaultEnd {
                fault: "kill".into(),
            },
        );
    }
}

/// Runs worker `id` as a task of this process (for a store that lives in
/// it), over its own gated view of the store, and again whenever it is
/// killed, until the harness stops.
pub(super) async fn keep_task_worker(
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    name: String,
    ttl: Duration,
    seed: u64,
    id: u32,
) {
    let mut life = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        life += 1;
        let (gated, gate) = gate::Gated::wrap(store.clone());
        let (term_tx, term) = tokio::sync::watch::channel(false);
        // The worker's stdin and stdout.
        let (harness_end, worker_end) = tokio::io::duplex(64 * 1024);
        let (worker_read, worker_write) = tokio::io::split(worker_end);
        let args = WorkerArgs {
            name: name.clone(),
            ttl,
            seed: seed ^ (u64::from(id) << 32) ^ life,
            shards: shared.shards,
        };
        let frozen = gate.subscribe();
        let task = tokio::spawn(async move {
            let _ = worker_loop(gated, args, worker_read, worker_write, term, Some(frozen)).await;
        });
        let control = Arc::new(gate::TaskControl::new(gate, term_tx, task.abort_handle()));
        shared
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (Control::Task(control.clone()), 0));
        let (harness_read, harness_write) = tokio::io::split(harness_end);
        serve(
            &shared,
            id,
            Control::Task(control),
            ttl,
            harness_read,
            harness_write,
        )
        .await;
        let _ = task.await;
        worker_gone(&shared, id);
    }
}

/// The one child process of `pid` (bounded: 5 s).
async fn forked_child(pid: u32) -> Option<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Some(child) = text.split_whitespace().next().and_then(|c| c.parse().ok()) {
                return Some(child);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Reads a worker's lines until it exits, recording them and answering its
/// reads and writes.
async fn serve(
    shared: &Arc<Shared>,
    id: u32,
    control: Control,
    ttl: Duration,
    output: impl tokio::io::AsyncRead + Unpin,
    mut stdin: impl tokio::io::AsyncWrite + Unpin,
) {
    let mut lines = BufReader::new(output).lines();
    let mut rng = Rng::new(u64::from(id) ^ mono_ns());
    while let Ok(Some(line)) = lines.next_line().await {
        // "<the worker's stamp, ns> <what> [SHARD] <numbers…>"; reads and
        // writes are stamped by the harness as it applies them, in their
        // order. A run of shard owners names the shard first.
        let all: Vec<&str> = line.split_whitespace().collect();
        let Some((stamp, words)) = all.split_first() else {
            continue;
        };
        let stamp = stamp.parse::<u64>().unwrap_or_else(|_| mono_ns());
        let (verb, words) = match words.split_first() {
            Some((verb, rest)) => (*verb, rest),
            None => continue,
        };
        let (shard, words) = match (shared.shards != 0, verb) {
            (true, "grant" | "release" | "read" | "write") => match words.split_first() {
                Some((s, rest)) => (s.parse::<u32>().ok(), rest),
                None => continue,
            },
            _ => (None, words),
        };
        let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        match (verb, number(0), number(1)) {
            ("req", _, _) => shared.record_at(stamp, Some(id), Op::Request),
            ("grant", Some(token), _) => {
                shared.grants.fetch_add(1, Ordering::Relaxed);
                shared.builds.granted(id);
                set_token(shared, id, token);
                shared.record_shard_at(stamp, Some(id), shard, Op::Grant { token });
            }
            ("release", _, _) => {
                if shared.shards == 0 {
                    set_token(shared, id, 0);
                }
                shared.record_shard_at(stamp, Some(id), shard, Op::Release);
            }
            ("lost", _, _) => {
                set_token(shared, id, 0);
                shared.record_at(stamp, Some(id), Op::Lost);
            }
            ("read", Some(token), _) => {
                let answer = read(shared, id, shard, token);
                if reply(&mut stdin, &answer).await.is_err() {
                    return;
                }
            }
            ("write", Some(token), Some(value)) => {
                let paused = {
                    let mut queue = shared
                        .pause_on_write
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    let at = queue.iter().position(|w| *w == id);
                    let found = at.map(|i| queue.remove(i)).is_some();
                    if found {
                        // Marked paused before it leaves this queue, so no
                        // other pause picks it in between.
                        shared
                            .paused
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id);
                    }
                    found
                };
                if paused {
                    // The write is in flight while its writer is stopped.
                    let length = pause(shared.clone(), id, control.clone(), ttl, rng.next());
                    tokio::time::sleep(length).await;
                }
                let answer = write(shared, id, shard, token, value);
                if reply(&mut stdin, answer).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Applies a read of the registers (the lock's, or one shard's) with
/// `token`, records it, and says the answer.
fn read(shared: &Shared, id: u32, shard: Option<u32>, token: u64) -> String {
    let mut all = shared.registers.lock().unwrap_or_else(|e| e.into_inner());
    let regs = all.entry(shard).or_default();
    let fenced = (token >= regs.highest).then(|| {
        regs.highest = token;
        regs.fenced
    });
    let twin = regs.twin;
    let answer = match fenced {
        Some(v) => format!("ok {v} {twin}\n"),
        None => format!("refused {} {twin}\n", regs.highest),
    };
    shared.record_shard_at(
        mono_ns(),
        Some(id),
        shard,
        Op::Read {
            token,
            fenced,
            twin,
        },
    );
    answer
}

/// Applies a write of `value` with `token`, records it, and says the answer.
fn write(shared: &Shared, id: u32, shard: Option<u32>, token: u64, value: u64) -> &'static str {
    let mut all = shared.registers.lock().unwrap_or_else(|e| e.into_inner());
    let regs = all.entry(shard).or_default();
    let accepted = token >= regs.highest;
    let (fenced_before, twin_before) = (regs.fenced, regs.twin);
    if accepted {
        regs.highest = token;
        regs.fenced = value;
    }
    regs.twin = value;
    shared.record_shard_at(
        mono_ns(),
        Some(id),
        shard,
        Op::Write {
            token,
            value,
            accepted,
            fenced_before,
            twin_before,
        },
    );
    if accepted {
        "ok\n"
    } else {
        "refused\n"
    }
}

fn set_token(shared: &Shared, id: u32, token: u64) {
    if let Some(entry) = shared
        .workers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&id)
    {
        entry.1 = token;
    }
}

async fn reply(
    stdin: &mut (impl tokio::io::AsyncWrite + Unpin),
    line: &str,
) -> std::io::Result<()> {
    stdin.write_all(line.as_bytes()).await?;
    stdin.flush().await
}
