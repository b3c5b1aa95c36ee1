//! Cron jobs across a cluster: at most once per tick, or only on the leader.

mod board;
mod timetable;

pub use board::{LastRun, Paused, ScheduleBoard, ScheduleInfo};
pub use timetable::Timetable;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::acquire::{Order, Wait};
use crate::election::{Election, Term};
use crate::elector::ElectorHandle;
use crate::error::{Error, Result};
use crate::metrics::{cron_next_tick, cron_ran, cron_ticks, NameTag, RunOutcome, TickOutcome};
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
    /// Set, with the reason, when the run must stop: its lease lost, the
    /// leader's term over, or `lock_at_most_for` reached.
    stop: watch::Receiver<Option<&'static str>>,
    /// The session whose lease authorises the run (the tick's claim is
    /// held through it).
    session: Session,
}

impl Tick {
    /// Resolves when the run must stop — the session's lease may be lost,
    /// the leader's term has ended, `lock_at_most_for` was reached, or the
    /// schedule is shutting down — or
    /// once the run is over. The run's future is dropped when it must
    /// stop; this tells what it handed work to (a thread, a spawned task)
    /// to stop too. [`Tick::is_stopped`] tells the two apart.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::open("memory://").await?;
    /// let schedule = tenure::Schedule::new(&store, "slow", "@every 1s")?
    ///     .lock_at_most_for(Duration::from_millis(200));
    /// let (tx, rx) = tokio::sync::oneshot::channel();
    /// let mut tx = Some(tx);
    /// // Work the run handed on; it stops with the run (then shuts the schedule down).
    /// let worker = async move {
    ///     let tick: tenure::Tick = rx.await.expect("a run");
    ///     tick.stopped().await;
    ///     assert!(tick.is_stopped());
    /// };
    /// schedule
    ///     .run(
    ///         move |tick| {
    ///             if let Some(tx) = tx.take() {
    ///                 let _ = tx.send(tick);
    ///             }
    ///             std::future::pending::<()>() // outlasts lock_at_most_for
    ///         },
    ///         worker,
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.clone();
        async move {
            // The sender is dropped once the run is over, stopped or not.
            let _ = stop.wait_for(|s| s.is_some()).await;
        }
    }

    /// Whether the run must stop (see [`Tick::stopped`]).
    pub fn is_stopped(&self) -> bool {
        self.stop.borrow().is_some()
    }

    /// Why the run must stop, in words (`"the leader's term ended"`), once
    /// it must.
    pub fn stop_reason(&self) -> Option<&'static str> {
        *self.stop.borrow()
    }

    /// Whether the lease that authorises this run is lost (the session
    /// that claimed the tick, or the term's): a run that must stop for that
    /// must end by [`Tick::deadline`], not after a grace.
    pub fn is_lease_lost(&self) -> bool {
        self.session.is_lost()
    }

    /// The local deadline of the lease that authorises this run: the
    /// session that claimed the tick (in leader mode, the term's). It moves
    /// on with each confirmed renewal; a run that goes on past it may no
    /// longer be the tick's only one (see [`Session::deadline`]). A process
    /// supervisor kills what it runs for the tick by then.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.session.deadline()
    }
}

/// A schedule's shutdown future, awaited from several places: once it has
/// resolved, it stays resolved.
struct Shutdown<S> {
    future: S,
    done: bool,
}

impl<S: Future<Output = ()> + Unpin> Shutdown<S> {
    fn new(future: S) -> Self {
        Shutdown {
            future,
            done: false,
        }
    }

    async fn wait(&mut self) {
        if !self.done {
            (&mut self.future).await;
            self.done = true;
        }
    }
}

/// What a run of a scheduled job returns: `()`, a run that returns having
/// succeeded, or a `Result`, whose `Err` is a failed run — recorded as
/// `failed: MESSAGE` on the board, and not as the job's last success in the
/// metrics.
pub trait RunResult {
    /// The failure, in words, or `None` for a success.
    fn failure(self) -> Option<String>;
}

impl RunResult for () {
    fn failure(self) -> Option<String> {
        None
    }
}

impl<T, E: std::fmt::Display> RunResult for std::result::Result<T, E> {
    fn failure(self) -> Option<String> {
        self.err().map(|e| e.to_string())
    }
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
/// The schedule is a [`Timetable`]: a crontab expression of five fields
/// (run at second 0), six (seconds first) or seven (a year last), a
/// shorthand such as `@hourly`, or `@every D`.
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
    timetable: Timetable,
    tz: chrono_tz::Tz,
    mode: Mode,
    missed: Missed,
    at_most: Option<Duration>,
    at_least: Duration,
    options: SessionOptions,
    paused: Arc<watch::Sender<bool>>,
    board: ScheduleBoard,
    elector: Option<ElectorHandle>,
    resign_on_failure: bool,
    stop_grace: Duration,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("expr", &self.expr)
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

/// What became of a tick here.
enum Ran {
    /// Claimed elsewhere, already run, or skipped (paused).
    NotHere,
    /// Run here (finished, or stopped).
    Here,
    /// Run here, and the job failed.
    Failed,
}

/// What comes next in a schedule's loop.
enum Step {
    Never,
    Skipped,
    RunNow(DateTime<Utc>),
    WaitFor(DateTime<Utc>, Duration),
}

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
            name: name.as_str().escape_debug().take(64).collect(),
            reason: "a job name must be at most 234 bytes",
        });
    }
    Ok(name)
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
            timetable: Timetable::parse(expr)?,
            tz: chrono_tz::UTC,
            mode: Mode::PerTick,
            missed: Missed::Skip,
            at_most: None,
            at_least: Duration::ZERO,
            options: SessionOptions::default(),
            paused: Arc::new(watch::channel(false).0),
            elector: None,
            resign_on_failure: false,
            stop_grace: Duration::ZERO,
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
        if mode != Mode::Leader {
            // Per-tick mode leads nothing: a bound elector no longer applies.
            self.elector = None;
        }
        self
    }

    /// Runs ticks only while this instance leads through `elector` (leader
    /// mode, sharing one election with every other schedule bound to it, so
    /// one leader runs all of a service's jobs). Each tick's claim is made
    /// through the term's session and carries its token
    /// ([`Tick::leader_token`]); a run is stopped when the term ends.
    pub fn leader_of(mut self, elector: &ElectorHandle) -> Self {
        self.mode = Mode::Leader;
        self.elector = Some(elector.clone());
        self
    }

    /// In leader mode, whether a failed run makes the leader resign, so
    /// that another instance leads (and runs the next ticks). Off by
    /// default.
    pub fn resign_on_failure(mut self, resign: bool) -> Self {
        self.resign_on_failure = resign;
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

    /// When a run must stop (`lock_at_most_for` reached, the session lost,
    /// the leader's term over), how long its future is still polled after
    /// [`Tick::stopped`] resolves, so that it can end the work cleanly,
    /// before it is dropped. When the lease is the reason, never past the
    /// lease's local deadline ([`Tick::deadline`]). Zero (the default)
    /// drops it at once.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
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
        self.timetable.next_after(t, &self.tz)
    }

    /// The last tick at or before `t`.
    pub fn last_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.timetable.last_at_or_before(t, &self.tz)
    }

    /// How many ticks fall in `(after, until]` (at most a bound).
    fn ticks_in(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> usize {
        self.timetable
            .ticks_after(after, &self.tz)
            .take_while(|t| *t <= until)
            .take(MAX_TICKS_COUNTED)
            .count()
    }

    /// Runs ticks until `shutdown` resolves. `job` is called once per tick
    /// this instance wins. Temporary store errors are retried. A run in
    /// progress when `shutdown` resolves is told to stop ([`Tick::stopped`])
    /// and given [`Schedule::stop_grace`] to end.
    ///
    /// With the `metrics` feature each tick is counted by what became of it
    /// here (`tenure_cron_ticks_total`: ran, claimed elsewhere, not leader,
    /// missed, paused), and runs are timed, labelled with the job's name —
    /// never with a tick's claim name.
    ///
    /// # Stopping
    ///
    /// Once `shutdown` resolves, `run` returns within
    /// [`Schedule::stop_grace`] plus the session's TTL, whatever the store
    /// does: a run in progress gets the grace, then the resignation and
    /// the session's close get what is left. If the store has not answered
    /// by then, `run` returns [`Error::Unavailable`], and the session,
    /// which no longer renews, lapses on the store's side within its TTL.
    pub async fn run<F, Fut>(self, job: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future,
        Fut::Output: RunResult,
    {
        let bound = self.stop_grace + self.options.lease_ttl();
        let (backend, name) = (self.store.capabilities().backend, self.name.clone());
        crate::task::stop_within(
            |own| self.run_until(job, own),
            shutdown,
            bound,
            || {
                Err(Error::unavailable(
                    backend,
                    format!(
                        "the schedule {name} did not stop within {bound:?} (its stop grace and \
                         its session's TTL): the store did not answer; its lease lapses on the \
                         store's side"
                    ),
                ))
            },
        )
        .await
    }

    /// [`Schedule::run`]'s loop, which ends when `shutdown` resolves.
    async fn run_until<F, Fut>(self, mut job: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future,
        Fut::Output: RunResult,
    {
        if let Some(elector) = self.elector.clone() {
            return self.run_bound(elector, job, shutdown).await;
        }
        tokio::pin!(shutdown);
        let mut shutdown = Shutdown::new(shutdown);
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
                    () = shutdown.wait() => return self.stop(session, term).await,
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
                        () = shutdown.wait() => return Ok(()),
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
                                () = shutdown.wait() => return Ok(()),
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
                    .campaign(&live, &tag, &mut paused, &mut shutdown)
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
            let due = match self.step(&mut cursor, &tag) {
                Step::Never => {
                    // No tick ever again: wait for shutdown.
                    shutdown.wait().await;
                    return self.stop(session, term).await;
                }
                Step::Skipped => continue,
                Step::RunNow(at) => at,
                Step::WaitFor(next, wait) => {
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
                        () = shutdown.wait() => return self.stop(session, term).await,
                    }
                    next
                }
            };
            cursor = due;
            let leader_token = term.as_ref().map(Term::token);
            match self
                .run_tick(
                    &live,
                    (due, leader_token),
                    &mut job,
                    &tag,
                    std::future::pending(),
                    &mut shutdown,
                )
                .await
            {
                Ok(Ran::Failed) if self.resign_on_failure => {
                    if let Some(t) = term.take() {
                        tracing::warn!(job = %self.name, "the run failed: resigning, so that another instance leads");
                        let _ = t.resign().await;
                        // Campaigning again through this session joins
                        // behind the candidates already waiting.
                    }
                }
                Ok(_) => {}
                Err(e) if e.is_temporary() || matches!(e, Error::SessionLost(_)) => {
                    tracing::warn!(error = %e, job = %self.name, "a tick could not be claimed or run");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Schedule::run`] bound to an elector: ticks run only while this
    /// instance leads through it, claimed through the term's session.
    async fn run_bound<F, Fut>(
        self,
        elector: ElectorHandle,
        mut job: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future,
        Fut::Output: RunResult,
    {
        tokio::pin!(shutdown);
        let mut shutdown = Shutdown::new(shutdown);
        let tag = NameTag::of(&self.name);
        let mut paused = self.paused.subscribe();
        let mut cursor = Utc::now();
        let mut led_token = None;
        if let Err(e) = self.board.publish(self.info()).await {
            tracing::warn!(error = %e, job = %self.name, "cannot describe the schedule in the store");
        }
        loop {
            if *paused.borrow() {
                tokio::select! {
                    () = async {
                        let _ = paused.wait_for(|p| !*p).await.map(|_| ());
                    } => {}
                    () = shutdown.wait() => return Ok(()),
                }
                let resumed = Utc::now();
                cron_ticks(&tag, TickOutcome::Paused, self.ticks_in(cursor, resumed));
                cursor = resumed;
                continue;
            }
            let lead = tokio::select! {
                lead = elector.leading() => lead,
                _ = paused.changed() => continue,
                () = shutdown.wait() => return Ok(()),
            };
            if led_token != Some(lead.token) {
                // A new term picks up from the next tick (or the last
                // missed one, with RunOnce); the ticks in between were
                // another leader's, or nobody's.
                let now = Utc::now();
                cron_ticks(&tag, TickOutcome::NotLeader, self.ticks_in(cursor, now));
                cursor = match (self.missed, self.last_at_or_before(now)) {
                    (Missed::RunOnce, Some(last)) => last - chrono::Duration::milliseconds(1),
                    _ => now,
                };
                led_token = Some(lead.token);
            }
            let due = match self.step(&mut cursor, &tag) {
                Step::Never => {
                    shutdown.wait().await;
                    return Ok(());
                }
                Step::Skipped => continue,
                Step::RunNow(at) => at,
                Step::WaitFor(next, wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = elector.term_over(lead.token) => continue,
                        _ = paused.changed() => continue,
                        () = shutdown.wait() => return Ok(()),
                    }
                    next
                }
            };
            cursor = due;
            // A term that drains (a resignation under way) starts no run.
            let Some(slot) = elector.run_slot(lead.token) else {
                cron_ticks(&tag, TickOutcome::NotLeader, 1);
                continue;
            };
            let over = elector.term_over(lead.token);
            let ran = self
                .run_tick(
                    &lead.session,
                    (due, Some(lead.token)),
                    &mut job,
                    &tag,
                    over,
                    &mut shutdown,
                )
                .await;
            drop(slot);
            match ran {
                Ok(Ran::Failed) if self.resign_on_failure => {
                    tracing::warn!(job = %self.name, "the run failed: the elector resigns, so that another instance leads");
                    elector.resign();
                }
                Ok(_) => {}
                Err(e) if e.is_temporary() || matches!(e, Error::SessionLost(_)) => {
                    tracing::warn!(error = %e, job = %self.name, "a tick could not be claimed or run");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What comes after `cursor` now: a tick to wait for, one to run at
    /// once (the latest missed, with [`Missed::RunOnce`]), missed ticks
    /// skipped (the cursor moves to now), or no tick ever again.
    fn step(&self, cursor: &mut DateTime<Utc>, tag: &NameTag) -> Step {
        let now = Utc::now();
        let Some(next) = self.next_after(*cursor) else {
            return Step::Never;
        };
        if next > now {
            cron_next_tick(tag, unix_secs(next));
            return Step::WaitFor(next, (next - now).to_std().unwrap_or_default());
        }
        // Ticks were missed: skip them all, or run the latest once.
        let latest = self.last_at_or_before(now).unwrap_or(next);
        let passed = self.ticks_in(*cursor, now);
        match self.missed {
            Missed::Skip => {
                cron_ticks(tag, TickOutcome::Missed, passed);
                *cursor = now;
                Step::Skipped
            }
            Missed::RunOnce => {
                cron_ticks(tag, TickOutcome::Missed, passed.saturating_sub(1));
                Step::RunNow(latest)
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
        shutdown: &mut Shutdown<impl Future<Output = ()> + Unpin>,
    ) -> Result<Campaigned> {
        let election = Election::new(live, self.name.as_str())?;
        // The leader says who it is as `tenure elect` does: host:pid, or
        // the session's own label.
        let campaign = election.campaign(live.label().as_bytes().to_vec());
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
                () = shutdown.wait() => return Ok(Campaigned::Shutdown),
            }
        }
    }

    /// Claims one tick and, if this is its first claim ever, runs it.
    async fn run_tick<F, Fut>(
        &self,
        session: &Session,
        (at, leader_token): (DateTime<Utc>, Option<u64>),
        job: &mut F,
        tag: &NameTag,
        term_over: impl Future<Output = ()>,
        shutdown: &mut Shutdown<impl Future<Output = ()> + Unpin>,
    ) -> Result<Ran>
    where
        F: FnMut(Tick) -> Fut,
        Fut: Future,
        Fut::Output: RunResult,
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
            return Ok(Ran::NotHere);
        };
        if !joined.first {
            // This tick already ran.
            cron_ticks(tag, TickOutcome::ClaimedElsewhere, 1);
            hold.release().await?;
            return Ok(Ran::NotHere);
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
            return Ok(Ran::NotHere);
        }
        let started = std::time::Instant::now();
        let (stop, stopped) = watch::channel(None);
        let run = job(Tick {
            at,
            leader_token,
            stop: stopped,
            session: session.clone(),
        });
        let (outcome, ran) = self
            .supervise_run(run, session, term_over, shutdown, &stop)
            .await;
        if let Some(why) = outcome.strip_prefix("failed: ") {
            tracing::warn!(job = %self.name, %at, error = %why, "run failed");
        }
        let took = started.elapsed();
        let ended = Utc::now();
        // Only a run that finished well is the job's last success.
        let succeeded = (ran == RunOutcome::Succeeded).then(|| unix_secs(ended));
        cron_ran(tag, ran, took, succeeded);
        let run = LastRun {
            tick_ms: at.timestamp_millis(),
            ended_ms: ended.timestamp_millis(),
            seconds: took.as_secs_f64(),
            by: session.label().to_string(),
            session_tag: session.tag().to_string(),
            token: hold.seq,
            leader_token,
            outcome,
        };
        if let Err(e) = self.board.record(run).await {
            tracing::warn!(error = %e, job = %self.name, %at, "cannot record the run in the store");
        }
        let hold_until = at + chrono::Duration::from_std(self.at_least).unwrap_or_default();
        if let Ok(left) = (hold_until - Utc::now()).to_std() {
            tokio::time::sleep(left).await;
        }
        hold.release().await?;
        Ok(if ran == RunOutcome::Failed {
            Ran::Failed
        } else {
            Ran::Here
        })
    }

    /// Polls a run until it ends or must stop; a run that must stop is told
    /// so (through its tick) and polled for the stop grace more, never past
    /// the lease's local deadline when the lease is the reason, then
    /// dropped. Returns what the board records, and the outcome.
    async fn supervise_run<Fut>(
        &self,
        run: Fut,
        session: &Session,
        term_over: impl Future<Output = ()>,
        shutdown: &mut Shutdown<impl Future<Output = ()> + Unpin>,
        stop: &watch::Sender<Option<&'static str>>,
    ) -> (String, RunOutcome)
    where
        Fut: Future,
        Fut::Output: RunResult,
    {
        tokio::pin!(run);
        let at_most = async {
            match self.at_most {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let ended = |result: Fut::Output| match result.failure() {
            None => ("finished".to_string(), RunOutcome::Succeeded),
            Some(why) => (format!("failed: {why}"), RunOutcome::Failed),
        };
        let (why, lease): (&'static str, bool) = tokio::select! {
            // A run that has ended is never reported stopped.
            biased;
            result = &mut run => return ended(result),
            () = at_most => ("lock_at_most_for reached", false),
            _ = session.lost() => ("the session was lost", true),
            // A term ended by choice (a pause, a resignation) keeps its
            // session: the grace is not cut to the lease's deadline then.
            () = term_over => ("the leader's term ended", session.is_lost()),
            () = shutdown.wait() => ("the schedule is shutting down", false),
        };
        tracing::warn!(job = %self.name, "stopping the run: {why}");
        stop.send_replace(Some(why));
        let mut until = tokio::time::Instant::now() + self.stop_grace;
        if lease {
            until = until.min(session.deadline());
        }
        let outcome = match tokio::time::timeout_at(until, &mut run).await {
            Ok(result) => match result.failure() {
                None => format!("stopped: {why}"),
                Some(failure) => format!("stopped: {why} ({failure})"),
            },
            Err(_) => format!("stopped: {why} (dropped after the grace)"),
        };
        (outcome, RunOutcome::Stopped)
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
