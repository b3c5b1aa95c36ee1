//! `tenure lock NAME [-- COMMAND]`: run a command while holding a lock, or
//! hold it until interrupted.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::{Error, Mutex, Store};

use super::lease::{bounded_close, check_ttl, finish, open_session};
use crate::child;
use crate::cli::{parse_duration, LeaseArgs, MetricsArg};
use crate::exit::{self, Failure};
use crate::output::escape_line;

#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    /// The lock's name.
    name: String,
    #[command(flatten)]
    lease: LeaseArgs,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// Give up after waiting this long (exit 75).
    #[arg(short = 'w', long, value_parser = parse_duration, allow_hyphen_values = true, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is held (exit 75).
    #[arg(short = 'n', long)]
    no_wait: bool,
    /// Wait without a place in the queue: whoever asks first after a
    /// release wins (the lock is the same as the fair one of its name).
    #[arg(long)]
    unfair: bool,
    /// The command and its arguments; without one, hold the lock until
    /// SIGINT or SIGTERM (as `etcdctl lock`).
    #[arg(last = true, num_args = 0..)]
    command: Vec<String>,
}

/// Checks the TTL and the command, if any, before the store is opened.
pub(super) fn validate(args: &LockArgs) -> Result<(), Failure> {
    check_ttl(args.lease.ttl)?;
    if args.command.is_empty() {
        return Ok(());
    }
    child::check_command(&args.command)
}

/// Stops a background task once the lock is decided either way.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a lock waits before it says (at INFO, `-v`) who holds it.
const WHO_HOLDS_AFTER: Duration = Duration::from_millis(300);

/// Logs who holds `name` now, and since when, if anyone does.
async fn say_who_holds(store: &dyn Store, name: &str) {
    let Ok(name) = tenure::Name::new(name) else {
        return;
    };
    let Ok(queue) = store.queue(&name).await else {
        return;
    };
    let waiting = queue.entries.iter().filter(|e| !e.granted).count();
    for holder in queue.entries.iter().filter(|e| e.granted) {
        let since = holder
            .granted_at
            .map(|t| format!(" since {}", humantime::format_rfc3339_seconds(t)))
            .unwrap_or_default();
        tracing::info!(
            "waiting for {}: held by {} (session {}, token {}){since}; {} waiting",
            escape_line(name.as_str()),
            escape_line(&holder.label),
            holder.session_tag,
            holder.seq,
            waiting
        );
    }
}

pub(super) async fn run(store: Arc<dyn Store>, args: LockArgs) -> Result<u8, Failure> {
    let (session, grace) = open_session(&store, &args.lease).await?;
    let mutex = Mutex::new(&session, &args.name)?.fair(!args.unfair);
    let mut signals = child::Signals::new()?;
    let acquire = async {
        if args.no_wait {
            mutex.try_lock().await
        } else if let Some(wait) = args.wait {
            match mutex.lock_timeout(wait).await {
                Err(Error::Timeout(_)) => Ok(None),
                other => other.map(Some),
            }
        } else {
            mutex.lock().await.map(Some)
        }
    };
    // A lock not granted at once says, with -v, who holds it.
    let announce = tokio::spawn({
        let (store, name) = (store.clone(), args.name.clone());
        async move {
            tokio::time::sleep(WHO_HOLDS_AFTER).await;
            say_who_holds(store.as_ref(), &name).await;
        }
    });
    let announcing = AbortOnDrop(announce);
    let guard = tokio::select! {
        acquired = acquire => acquired,
        signal = signals.recv() => {
            let _ = session.close().await;
            return Ok(128 + signal as u8);
        }
    };
    drop(announcing);
    let guard = match guard {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            let _ = session.close().await;
            let when = match args.wait {
                Some(wait) => format!("within {}", humantime::format_duration(wait)),
                None => "at once (--no-wait)".to_string(),
            };
            return Err(Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} is held by another session; not acquired {when}",
                    args.name
                ),
            ));
        }
        Err(e) => {
            let _ = bounded_close(&session).await;
            return Err(e.into());
        }
    };
    tracing::info!(name = %args.name, token = guard.token(), "lock acquired");
    if args.command.is_empty() {
        // Held until a signal; the lease's loss is said and exits 79.
        outln!("locked {} {}", escape_line(&args.name), guard.token());
        let lost = guard.lost();
        tokio::select! {
            reason = lost => {
                let _ = bounded_close(&session).await;
                return Err(Failure::new(exit::LEASE_LOST, format!("lock lost: {reason}")));
            }
            _ = signals.recv() => {}
        }
        let released = guard.release().await;
        let _ = bounded_close(&session).await;
        released?;
        return Ok(0);
    }
    let env = [
        ("TENURE_LOCK", args.name.clone()),
        ("TENURE_FENCE", guard.token().to_string()),
    ];
    let outcome =
        match child::run_while_held(&args.command, &env, &session, grace, &mut signals).await {
            Ok(outcome) => outcome,
            Err(f) => {
                // Release now: a runtime shutting down would not run a drop's release.
                let _ = guard.release().await;
                let _ = bounded_close(&session).await;
                return Err(f);
            }
        };
    finish(outcome, guard.release(), &session).await
}
