//! Cron jobs across a cluster: at most once per tick, or only on the leader.

mod board;

pub use board::{LastRun, Paused, ScheduleBoard, ScheduleInfo};

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::acquire::{Order, Wait};
use crate::election::{Election, Term};
use crate::error::{Error, Result};
use crate::metrics::{cron_next_tick, cron_ran, cron_ticks, NameTag, TickOutcome};
use crate::session::{Session, SessionOptions};
use crate::store::{EntryKind, Name, Store};

/// Which instances may run a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Any instance may claim a tick; each tick runs at most once across the
    /// cluster.
    PerTick,
    /// Only the elected leader runs ticks (still at most once per tick); a new
    /// leader picks up from the next tick.
    Leader,
}

/// What to do about ticks that passed while nobody could run them (this
/// instance was down, busy with a long run, or just became leader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Skip them; wait for the next tick.
    Skip,
    /// Run the most recent missed tick once, if nobody ran it.
    RunOnce,
}

/// One tick to run.
#[derive(Debug, Clone)]
pub struct Tick {
    /// When the tick was due.
    pub at: DateTime<Utc>,
    /// The leader's fencing token, in [`Mode::Leader`].
    pub leader_token: Option<u64>,
}

/// Pauses and resumes a running [`Schedule`] (seed 002's elector): a paused
/// schedule runs no ticks, and in leader mode it resigns and stops
/// campaigning, so another instance takes over.
#[derive(Debug, Clone)]
pub struct PauseHandle(Arc<watch::Sender<bool>>);

impl PauseHandle {
    /// Stops running ticks.
    pub fn pause(&self) {
        self.0.send_replace(true);
    }
    /// Runs ticks again.
    pub fn resume(&self) {
        self.0.send_replace(false);
    }
    /// Whether paused.
    pub fn is_paused(&self) -> bool {
        *self.0.borrow()
    }
}

/// A job on a cron schedule, run by a cluster of instances.
///
/// Each tick is claimed in the store under the name `JOB@UNIX_SECONDS`; only a
/// claim that is the first the store has ever seen for that name runs, so a
/// tick runs at most once whatever the instances' clocks say — judged by the
/// store, not by comparing clocks. Instances decide *when* a tick is due by
/// their own clock, so a skewed instance may run a tick early or late, never
/// twice.
///
/// The expression has six fields (`sec min hour day month weekday`, with an
/// optional seventh for the year) or the classic five, which run at second 0.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::open("memory://").await?;
/// let schedule = tenure::Schedule::new(&store, "report", "*/1 * * * * *")?
///     .mode(tenure::ScheduleMode::PerTick)
///     .time_zone("Europe/Berlin")?;
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// let run = schedule.run(
///     move |tick| {
///         let tx = tx.clone();
///         async move { let _ = tx.send(tick.at); }
///     },
///     tokio::time::sleep(Duration::from_millis(2100)),
/// );
/// run.await?;
/// assert!(rx.recv().await.is_some());
/// # Ok(()) }
/// ```
pub struct Schedule {
    store: Arc<dyn Store>,
    name: Name,
    expr: String,
    cron: cron::Schedule,
    tz: chrono_tz::Tz,
    mode: Mode,
    missed: Missed,
    at_most: Option<Duration>,
    at_least: Duration,
    options: SessionOptions,
    paused: Arc<watch::Sender<bool>>,
    board: ScheduleBoard,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("cron", &self.cron.to_string())
            .field("tz", &self.tz)
            .field("mode", &self.mode)
            .field("missed", &self.missed)
            .finish_non_exhaustive()
    }
}

/// The longest job name: a tick's claim adds `@` and up to 20 digits.
const MAX_JOB_NAME: usize = crate::store::MAX_NAME_LEN - 21;

/// The most ticks counted at once as missed, paused or not led (a
/// one-second schedule paused for a day would otherwise walk 86 400 ticks).
const MAX_TICKS_COUNTED: usize = 10_000;

/// How a campaign between ticks ended.
enum Campaigned {
    Elected(Result<Term>),
    PauseChanged,
    Shutdown,
}

/// A time as Unix seconds, for a timestamp gauge.
fn unix_secs(t: DateTime<Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// Checks a job's name: a name short enough for its tick claims.
pub(crate) fn job_name(name: &str) -> Result<Name> {
    let name = Name::new(name)?;
    if name.as_str().len() > MAX_JOB_NAME {
        return Err(Error::InvalidName {
            name: name.to_string().chars().take(64).collect(),
            reason: "a job name must be at most 234 bytes",
        });
    }
    Ok(name)
}

/// Parses a cron expression of 5, 6 or 7 fields.
pub fn parse_cron(expr: &str) -> Result<cron::Schedule> {
    let fields = expr.split_whitespace().count();
    let full = if fields == 5 {
        format!("0 {expr}")
    } else {
        expr.to_string()
    };
    cron::Schedule::from_str(&full).map_err(|e| Error::InvalidArgument {
        what: "cron expression",
        reason: format!("{expr:?}: {e}"),
    })
}

impl Schedule {
    /// A job named `name` on the cron schedule `expr`, in UTC, per-tick mode,
    /// skipping missed ticks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad expression; [`Error::InvalidName`].
    pub fn new(store: &Arc<dyn Store>, name: impl AsRef<str>, expr: &str) -> Result<Self> {
        let name = job_name(name.as_ref())?;
        Ok(Schedule {
            store: store.clone(),
            board: ScheduleBoard::new(store, name.as_str())?,
            name,
            expr: expr.trim().to_string(),
            cron: parse_cron(expr)?,
            tz: chrono_tz::UTC,
            mode: Mode::PerTick,
            missed: Missed::Skip,
            at_most: None,
            at_least: Duration::ZERO,
            options: SessionOptions::default(),
            paused: Arc::new(watch::channel(false).0),
        })
    }

    /// The time zone the expression is read in, such as `Europe/Berlin`.
    pub fn time_zone(mut self, tz: &str) -> Result<Self> {
        self.tz = tz.parse().map_err(|e| Error::InvalidArgument {
            what: "time zone",
            reason: format!("{tz:?}: {e}"),
        })?;
        Ok(self)
    }

    /// Which instances run ticks.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The missed-tick policy.
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// A run is stopped (its future dropped) after this long (ShedLock's
    /// `lockAtMostFor`).
    pub fn lock_at_most_for(mut self, d: Duration) -> Self {
        self.at_most = Some(d);
        self
    }

    /// A tick's claim is held at least this long after the tick was due, even
    /// if the run ends sooner (ShedLock's `lockAtLeastFor`).
    pub fn lock_at_least_for(mut self, d: Duration) -> Self {
        self.at_least = d;
        self
    }

    /// Options for the sessions the schedule opens.
    pub fn session_options(mut self, options: SessionOptions) -> Self {
        self.options = options;
        self
    }

    /// The job's shared state in the store: description, last run, and the
    /// cluster-wide pause every instance honours.
    pub fn board(&self) -> &ScheduleBoard {
        &self.board
    }

    /// What this instance publishes about the job.
    fn info(&self) -> ScheduleInfo {
        ScheduleInfo {
            job: self.name.to_string(),
            expr: self.expr.clone(),
            time_zone: self.tz.name().to_string(),
            mode: match self.mode {
                Mode::PerTick => "per-tick",
                Mode::Leader => "leader",
            }
            .into(),
            missed: match self.missed {
                Missed::Skip => "skip",
                Missed::RunOnce => "run-once",
            }
            .into(),
            last_run: None,
        }
    }

    /// A handle to pause and resume this instance of the running schedule
    /// (see [`ScheduleBoard::pause`] for all instances at once).
    pub fn pause_handle(&self) -> PauseHandle {
        PauseHandle(self.paused.clone())
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .after(&t.with_timezone(&self.tz))
            .next()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The last tick at or before `t`.
    pub fn last_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = t.with_timezone(&self.tz);
        // `after(t).rev()` walks back from t; t itself may be a tick.
        let just_after = t + chrono::Duration::milliseconds(1);
        self.cron
            .after(&just_after)
            .next_back()
            .map(|d| d.with_timezone(&Utc))
    }

    /// How many ticks fall in `(after, until]` (at most a bound).
    fn ticks_in(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> usize {
        self.cron
            .after(&after.with_timezone(&self.tz))
            .take_while(|t| t.with_timezone(&Utc) <= until)
            .take(MAX_TICKS_COUNTED)
            .count()
    }

    /// Runs ticks until `shutdown` resolves. `job` is called once per tick
    /// this instance wins. Temporary store errors are retried.
    ///
    /// With the `metrics` feature each tick is counted by what became of it
    /// here (`tenure_cron_ticks_total`: ran, claimed elsewhere, not leader,
    /// missed, paused), and runs are timed, labelled with the job's name —
    /// never with a tick's claim name.
    pub async fn run<F, Fut>(self, mut job: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future<Output = ()>,
    {
        tokio::pin!(shutdown);
        let tag = NameTag::of(&self.name);
        let mut paused = self.paused.subscribe();
        let mut session: Option<Session> = None;
        let mut term: Option<Term> = None;
        // Ticks after `cursor` are still to come. With RunOnce, start just
        // before the most recent tick, so that it counts as missed.
        let mut cursor = Utc::now();
        if self.missed == Missed::RunOnce {
            if let Some(last) = self.last_at_or_before(cursor) {
                cursor = last - chrono::Duration::milliseconds(1);
            }
        }
        let mut backoff = Duration::from_millis(100);
        // Listed and described for the console; a store that cannot keep
        // it must not stop the job.
        if let Err(e) = self.board.publish(self.info()).await {
            tracing::warn!(error = %e, job = %self.name, "cannot describe the schedule in the store");
        }
        loop {
            if *paused.borrow() {
                if let Some(t) = term.take() {
                    let _ = t.resign().await;
                }
                tokio::select! {
                    () = async {
                        // The guard `wait_for` returns is not Send: drop it here.
                        let _ = paused.wait_for(|p| !*p).await.map(|_| ());
                    } => {}
                    () = &mut shutdown => return self.stop(session, term).await,
                }
                // A resumed leader picks up from the next tick.
                let resumed = Utc::now();
                cron_ticks(&tag, TickOutcome::Paused, self.ticks_in(cursor, resumed));
                cursor = resumed;
                continue;
            }
            let live = match &session {
                Some(s) if !s.is_lost() => s.clone(),
                _ => {
                    term = None;
                    let opened = tokio::select! {
                        s = Session::with_options(&self.store, self.options.clone()) => s,
                        () = &mut shutdown => return Ok(()),
                    };
                    match opened {
                        Ok(s) => {
                            session = Some(s.clone());
                            s
                        }
                        Err(e) if e.is_temporary() => {
                            tracing::warn!(error = %e, job = %self.name, "cannot open a session; retrying");
                            tokio::select! {
                                () = tokio::time::sleep(backoff) => {}
                                () = &mut shutdown => return Ok(()),
                            }
                            backoff = (backoff * 2).min(crate::DEFAULT_TTL);
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            backoff = Duration::from_millis(100);
            if self.mode == Mode::Leader && term.as_ref().is_none_or(|t| t.is_lost()) {
                let elected = match self
                    .campaign(&live, &tag, &mut paused, shutdown.as_mut())
                    .await?
                {
                    Campaigned::Elected(result) => Some(result),
                    Campaigned::PauseChanged => None,
                    Campaigned::Shutdown => return self.stop(session, term).await,
                };
                match elected {
                    Some(Ok(t)) => {
                        term = Some(t);
                        // A new leader picks up from the next tick (or
                        // the last missed one, with RunOnce).
                        cursor = match (self.missed, self.last_at_or_before(Utc::now())) {
                            (Missed::RunOnce, Some(last)) => {
                                last - chrono::Duration::milliseconds(1)
                            }
                            _ => Utc::now(),
                        };
                    }
                    Some(Err(e)) if e.is_temporary() || matches!(e, Error::SessionLost(_)) => {
                        continue
                    }
                    Some(Err(e)) => return Err(e),
                    None => continue,
                }
            }
            let now = Utc::now();
            let Some(next) = self.next_after(cursor) else {
                // No tick ever again: wait for shutdown.
                shutdown.await;
                return self.stop(session, term).await;
            };
            let due = if next <= now {
                // Ticks were missed: skip them all, or run the latest once.
                let latest = self.last_at_or_before(now).unwrap_or(next);
                let passed = self.ticks_in(cursor, now);
                match self.missed {
                    Missed::Skip => {
                        cron_ticks(&tag, TickOutcome::Missed, passed);
                        cursor = now;
                        continue;
                    }
                    Missed::RunOnce => {
                        cron_ticks(&tag, TickOutcome::Missed, passed.saturating_sub(1));
                        latest
                    }
                }
            } else {
                cron_next_tick(&tag, unix_secs(next));
                let wait = (next - now).to_std().unwrap_or_default();
                let lost = async {
                    match &term {
                        Some(t) => {
                            t.lost().await;
                        }
                        None => {
                            live.lost().await;
                        }
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = lost => continue,
                    _ = paused.changed() => continue,
                    () = &mut shutdown => return self.stop(session, term).await,
                }
                next
            };
            cursor = due;
            let leader_token = term.as_ref().map(Term::token);
            if let Err(e) = self
                .run_tick(&live, due, leader_token, &mut job, &tag)
                .await
            {
                if !(e.is_temporary() || matches!(e, Error::SessionLost(_))) {
                    return Err(e);
                }
                tracing::warn!(error = %e, job = %self.name, "a tick could not be claimed or run");
            }
        }
    }

    /// Campaigns for the job's election until elected, paused or resumed,
    /// or shut down. The ticks due meanwhile are the leader's (or nobody's):
    /// counted as not led here.
    async fn campaign(
        &self,
        live: &Session,
        tag: &NameTag,
        paused: &mut watch::Receiver<bool>,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Campaigned> {
        let election = Election::new(live, self.name.as_str())?;
        let campaign = election.campaign(live.tag().as_bytes().to_vec());
        tokio::pin!(campaign);
        let mut seen = Utc::now();
        loop {
            let next = self.next_after(seen);
            if let Some(next) = next {
                cron_next_tick(tag, unix_secs(next));
            }
            let tick = async {
                match next {
                    Some(next) => {
                        let wait = (next - Utc::now()).to_std().unwrap_or_default();
                        tokio::time::sleep(wait).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                t = &mut campaign => return Ok(Campaigned::Elected(t)),
                () = tick => {
                    if let Some(next) = next {
                        cron_ticks(tag, TickOutcome::NotLeader, 1);
                        seen = next;
                    }
                }
                _ = paused.changed() => return Ok(Campaigned::PauseChanged),
                () = &mut shutdown => return Ok(Campaigned::Shutdown),
            }
        }
    }

    /// Claims one tick and, if this is its first claim ever, runs it.
    async fn run_tick<F, Fut>(
        &self,
        session: &Session,
        at: DateTime<Utc>,
        leader_token: Option<u64>,
        job: &mut F,
        tag: &NameTag,
    ) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future<Output = ()>,
    {
        let claim = Name::new(format!("{}@{}", self.name, at.timestamp()))?;
        let label = session.tag().as_bytes().to_vec();
        // A claim name, one per tick, is never a metric label: untracked.
        let Some((hold, joined)) = session
            .acquire(
                &claim,
                EntryKind::Exclusive,
                label,
                Wait::No,
                Order::Fifo,
                None,
            )
            .await?
        else {
            // Another instance holds this tick.
            cron_ticks(tag, TickOutcome::ClaimedElsewhere, 1);
            return Ok(());
        };
        if !joined.first {
            // This tick already ran.
            cron_ticks(tag, TickOutcome::ClaimedElsewhere, 1);
            hold.release().await?;
            return Ok(());
        }
        // Paused cluster-wide: the tick is skipped. Read after the claim, so
        // a tick claimed after a pause was written never runs (the claim is
        // used up either way). A pause that cannot be read is taken as one:
        // a tick may be skipped, never run against an operator's wish.
        let skip = match self.board.paused().await {
            Ok(None) => None,
            Ok(Some(p)) => {
                tracing::info!(job = %self.name, %at, by = %p.by, reason = %p.reason, "tick skipped: paused");
                Some(TickOutcome::Paused)
            }
            Err(e) => {
                tracing::warn!(error = %e, job = %self.name, %at, "tick skipped: cannot read whether paused");
                Some(TickOutcome::Error)
            }
        };
        if let Some(outcome) = skip {
            cron_ticks(tag, outcome, 1);
            hold.release().await?;
            return Ok(());
        }
        let started = std::time::Instant::now();
        let run = job(Tick { at, leader_token });
        let at_most = async {
            match self.at_most {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            () = run => "finished",
            () = at_most => {
                tracing::warn!(job = %self.name, %at, "run stopped: lock_at_most_for reached");
                "stopped: lock_at_most_for"
            }
            _ = session.lost() => {
                tracing::warn!(job = %self.name, %at, "run stopped: the session was lost");
                "stopped: session lost"
            }
        };
        let took = started.elapsed();
        let ended = Utc::now();
        cron_ran(tag, took, (outcome == "finished").then(|| unix_secs(ended)));
        let run = LastRun {
            tick_ms: at.timestamp_millis(),
            ended_ms: ended.timestamp_millis(),
            seconds: took.as_secs_f64(),
            by: session.label().to_string(),
            session_tag: session.tag().to_string(),
            token: hold.seq,
            leader_token,
            outcome: outcome.into(),
        };
        if let Err(e) = self.board.record(run).await {
            tracing::warn!(error = %e, job = %self.name, %at, "cannot record the run in the store");
        }
        let hold_until = at + chrono::Duration::from_std(self.at_least).unwrap_or_default();
        if let Ok(left) = (hold_until - Utc::now()).to_std() {
            tokio::time::sleep(left).await;
        }
        hold.release().await.map(|_| ())
    }

    async fn stop(&self, session: Option<Session>, term: Option<Term>) -> Result<()> {
        if let Some(t) = term {
            let _ = t.resign().await;
        }
        if let Some(s) = session {
            let _ = s.close().await;
        }
        Ok(())
    }
}
