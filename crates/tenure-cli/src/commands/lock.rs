//! `tenure lock NAME [-- COMMAND]`: run a command while holding a lock, or
//! hold it until interrupted.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use std::future::Future;

use tenure::{Error, Mutex, RwLock, Semaphore, Session, Store};

use super::lease::{bounded_close, check_ttl, kill_grace, open_and_take, run_held};
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
    pub(super) wait: Option<Duration>,
    /// Give up at once if the lock is held (exit 75).
    #[arg(short = 'n', long)]
    pub(super) no_wait: bool,
    /// Wait without a place in the queue: whoever asks first after a
    /// release wins (the lock is the same as the fair one of its name).
    #[arg(long, conflicts_with_all = ["shared", "permits"])]
    unfair: bool,
    /// Hold the name shared, as a read lock (`flock -s`): any number of
    /// shared holders at once, none while someone holds it exclusively.
    #[arg(short = 's', long, conflicts_with = "permits")]
    shared: bool,
    /// A semaphore of N permits on the name (`consul lock -n N`): at most
    /// N holders at once, each taking one permit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
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

/// What `lock` holds: the name exclusively, shared, or one permit.
enum Held {
    Lock(tenure::MutexGuard),
    Read(tenure::RwLockReadGuard),
    Permit(tenure::SemaphorePermit),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Lock(g) => g.token(),
            Held::Read(g) => g.token(),
            Held::Permit(g) => g.token(),
        }
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn Future<Output = tenure::LostReason> + Send>> {
        match self {
            Held::Lock(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Permit(g) => Box::pin(g.lost()),
        }
    }

    async fn release(self) -> tenure::Result<()> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Permit(g) => g.release().await,
        }
    }
}

/// Takes at once (`--no-wait`), within `--wait`, or whenever granted:
/// `None` when not granted in the time asked for.
async fn decided<G>(
    args: &LockArgs,
    now: impl Future<Output = tenure::Result<Option<G>>>,
    within: impl Future<Output = tenure::Result<G>>,
    whenever: impl Future<Output = tenure::Result<G>>,
) -> tenure::Result<Option<G>> {
    if args.no_wait {
        now.await
    } else if args.wait.is_some() {
        match within.await {
            Err(Error::Timeout(_)) => Ok(None),
            other => other.map(Some),
        }
    } else {
        whenever.await.map(Some)
    }
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

/// Takes the name as the flags ask, through `session`, waiting at most
/// `within` under `--wait`: `None` when not granted in the time asked for.
async fn acquire(
    session: &Session,
    args: &LockArgs,
    within: Duration,
) -> tenure::Result<Option<Held>> {
    match (args.shared, args.permits) {
        (false, None) => {
            let m = Mutex::new(session, &args.name)?.fair(!args.unfair);
            decided(args, m.try_lock(), m.lock_timeout(within), m.lock())
                .await
                .map(|g| g.map(Held::Lock))
        }
        (true, _) => {
            let r = RwLock::new(session, &args.name)?;
            decided(args, r.try_read(), r.read_timeout(within), r.read())
                .await
                .map(|g| g.map(Held::Read))
        }
        (false, Some(n)) => {
            let p = Semaphore::new(session, &args.name, n)?;
            decided(
                args,
                p.try_acquire(),
                p.acquire_many_timeout(1, within),
                p.acquire(),
            )
            .await
            .map(|g| g.map(Held::Permit))
        }
    }
}

pub(super) async fn run(
    store: Arc<dyn Store>,
    args: LockArgs,
    runner: super::Runner,
) -> Result<u8, Failure> {
    let grace = kill_grace(&args.lease)?;
    let mut runner = runner;
    // A lock not granted at once says, with -v, who holds it.
    let announce = tokio::spawn({
        let (store, name) = (store.clone(), args.name.clone());
        async move {
            tokio::time::sleep(WHO_HOLDS_AFTER).await;
            say_who_holds(store.as_ref(), &name).await;
        }
    });
    let announcing = AbortOnDrop(announce);
    let taken = open_and_take(&store, &args.lease, &mut runner, |session, left| {
        let args = &args;
        async move { acquire(&session, args, left).await }
    })
    .await?;
    let (session, guard) = match taken {
        Ok(taken) => taken,
        Err(code) => return Ok(code),
    };
    drop(announcing);
    let hub = runner.hub;
    let guard = match guard {
        Some(guard) => guard,
        None => {
            let _ = session.close().await;
            let when = match args.wait {
                Some(wait) => format!("within {}", humantime::format_duration(wait)),
                None => "at once (--no-wait)".to_string(),
            };
            let held = match args.permits {
                Some(n) => format!("all {n} permits of {:?} are held", args.name),
                None => format!("lock {:?} is held by another session", args.name),
            };
            return Err(Failure::new(
                exit::NOT_ACQUIRED,
                format!("{held}; not acquired {when}"),
            ));
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
            _ = hub.stopped() => {}
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
    let run = child::Run {
        command: &args.command,
        env: &env,
        lease_grace: grace,
        stop_grace: grace,
    };
    let lost = guard.lost();
    run_held(&run, &session, lost, &hub, move || guard.release()).await
}
