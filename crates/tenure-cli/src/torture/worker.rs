//! The worker: lock, read, a random critical section, write, release, and
//! tell the harness each step on its own clock.

use std::sync::Arc;
use std::time::Duration;

use tenure::{Error, Mutex, Name, Session, SessionOptions, Store};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use super::options::WorkerArgs;
use super::{gate, mono_ns, Rng};

/// The worker: lock, read, a random critical section, write, release; a
/// new session after a lost one; on SIGTERM, close the session and go.
pub async fn worker(store: Arc<dyn Store>, args: WorkerArgs) -> Result<u8, String> {
    // SIGTERM from the harness: finish cleanly (close the session).
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let (stop, term) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signal.recv().await;
        let _ = stop.send(true);
    });
    worker_loop(
        store,
        args,
        tokio::io::stdin(),
        tokio::io::stdout(),
        term,
        None,
    )
    .await
}

/// The worker's loop, over its input (the harness's answers) and output
/// (its lines), until `term` says stop. `frozen`: an in-process worker's
/// gate, which it waits at before every line it says (a process is stopped
/// by SIGSTOP instead).
pub(super) async fn worker_loop(
    store: Arc<dyn Store>,
    args: WorkerArgs,
    input: impl tokio::io::AsyncRead + Unpin,
    output: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    mut term: tokio::sync::watch::Receiver<bool>,
    frozen: Option<tokio::sync::watch::Receiver<gate::Gate>>,
) -> Result<u8, String> {
    let mut out = Lines {
        out: output,
        frozen,
    };
    if args.shards != 0 {
        return super::shard_worker::shard_loop(store, args, input, out, term).await;
    }
    let name = Name::new(&args.name).map_err(|e| e.to_string())?;
    let mut rng = Rng::new(args.seed);
    let mut answers = BufReader::new(input).lines();
    let mut session: Option<Session> = None;
    loop {
        let s = match &session {
            Some(s) if !s.is_lost() => s.clone(),
            _ => {
                let opened = tokio::select! {
                    s = Session::with_options(&store, SessionOptions::new().ttl(args.ttl)) => s,
                    _ = term.changed() => return Ok(0),
                };
                match opened {
                    Ok(s) => {
                        session = Some(s.clone());
                        s
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        out.say("req").await?;
        let mutex = Mutex::new(&s, name.as_str()).map_err(|e| e.to_string())?;
        let guard = tokio::select! {
            g = mutex.lock() => g,
            _ = term.changed() => {
                let _ = s.close().await;
                return Ok(0);
            }
        };
        let guard = match guard {
            Ok(g) => g,
            Err(Error::SessionLost(_)) => {
                out.say("lost").await?;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.token();
        out.say(&format!("grant {token}")).await?;
        let mut last_act = out.say(&format!("read {token}")).await?;
        let Some(value) = read_answer(&mut answers).await? else {
            return Ok(0);
        };
        let lost = critical_section(&s, &mut rng).await;
        if lost {
            out.say_at(lost_at(&s, last_act), "lost").await?;
            drop(guard);
            continue;
        }
        last_act = out.say(&format!("write {token} {}", value + 1)).await?;
        let _ = answers.next_line().await.map_err(|e| e.to_string())?;
        if s.is_lost() {
            out.say_at(lost_at(&s, last_act), "lost").await?;
            drop(guard);
            continue;
        }
        // The critical section ends here, before the lock is given back
        // (a release the store has not seen yet holds nothing more).
        out.say("release").await?;
        let _ = guard.release().await;
        if *term.borrow() {
            let _ = s.close().await;
            return Ok(0);
        }
    }
}

/// The value a read gives: the fenced register's, or where it refused the
/// token, the twin's (the worker writes one more either way); `None` when
/// the harness is gone.
pub(super) async fn read_answer(
    answers: &mut tokio::io::Lines<BufReader<impl tokio::io::AsyncRead + Unpin>>,
) -> Result<Option<u64>, String> {
    let answer = answers
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let words: Vec<&str> = answer.split_whitespace().collect();
    Ok(match words.as_slice() {
        ["ok", fenced, _] => Some(fenced.parse::<u64>().unwrap_or(0)),
        ["refused", _, twin] => Some(twin.parse::<u64>().unwrap_or(0)),
        _ => None,
    })
}

/// A careful holder's critical section: a short random time, cut short
/// the moment its session is lost (the library tells it before anyone else
/// can be granted); says whether the session is lost by its end (it looks
/// once more just before it writes).
pub(super) async fn critical_section(s: &Session, rng: &mut Rng) -> bool {
    tokio::select! {
        () = tokio::time::sleep(rng.between(Duration::from_millis(2), Duration::from_millis(30))) => s.is_lost(),
        _ = s.lost() => true,
    }
}

/// A worker's output to the harness.
pub(super) struct Lines<W> {
    out: W,
    frozen: Option<tokio::sync::watch::Receiver<gate::Gate>>,
}

impl<W: tokio::io::AsyncWrite + Unpin> Lines<W> {
    /// Tells the harness `line`, stamped now (after a freeze, if one is on);
    /// returns the stamp.
    pub(super) async fn say(&mut self, line: &str) -> Result<u64, String> {
        self.say_at(0, line).await
    }

    /// Tells the harness `line`, stamped `at` (0: now, after a freeze).
    pub(super) async fn say_at(&mut self, at: u64, line: &str) -> Result<u64, String> {
        if let Some(frozen) = &mut self.frozen {
            let _ = frozen.wait_for(|g| *g != gate::Gate::Frozen).await;
        }
        let at = if at == 0 { mono_ns() } else { at };
        self.out
            .write_all(format!("{at} {line}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        self.out.flush().await.map_err(|e| e.to_string())?;
        Ok(at)
    }
}

/// When a holder's hold ended, by the library's word: a loss by the local
/// deadline dates from the deadline (from then on `is_lost` says so, and
/// the worker asks it before each act), or from the worker's last act if
/// that came later (a worker stopped between its check and its write acts
/// on waking, and the checker must see that); any other loss dates from
/// now, when the worker learned it. So a worker slow to notice (a busy
/// scheduler, an answer of the harness it was awaiting) is not counted as
/// holding past the moment the library told it.
pub(super) fn lost_at(s: &Session, last_act: u64) -> u64 {
    let now = mono_ns();
    let told = match s.lost_reason() {
        Some(tenure::LostReason::Unconfirmed) => {
            let since = Instant::now().saturating_duration_since(s.deadline());
            now.saturating_sub(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
        }
        _ => now,
    };
    told.max(last_act).min(now)
}
