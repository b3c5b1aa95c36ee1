//! What the instances of a schedule share through the store: its description
//! and last run (for `tenure status` and the console), and a cluster-wide
//! pause that every instance honours.
//!
//! Three kinds of cells, so a store without cells runs schedules
//! all the same, only without this board:
//! - `tenure.schedules`: the jobs that ever ran here, as a JSON list;
//! - `tenure.schedule:JOB`: the job's expression, zone, mode and last run;
//! - `tenure.pause:JOB`: present while the job is paused.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::board::Paused;
use crate::board::{read, update, PauseCell, Registry};
use crate::cell::Cell;
use crate::error::Result;
use crate::store::{Name, Store};

/// The cell that lists the jobs.
const REGISTRY: &str = "tenure.schedules";

/// A schedule as its instances last described it in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleInfo {
    /// The job's name.
    pub job: String,
    /// The cron expression as given.
    pub expr: String,
    /// The time zone it is read in (`UTC`, `Europe/Berlin`, …).
    pub time_zone: String,
    /// `per-tick` or `leader`.
    pub mode: String,
    /// `skip` or `run-once`.
    pub missed: String,
    /// The last run any instance made, if any.
    pub last_run: Option<LastRun>,
}

impl ScheduleInfo {
    /// The next `n` ticks after `after`, read in the schedule's own zone
    /// (empty if the expression or zone no longer parses).
    pub fn next_ticks(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let (Ok(timetable), Ok(tz)) = (
            super::Timetable::parse(&self.expr),
            self.time_zone.parse::<chrono_tz::Tz>(),
        ) else {
            return Vec::new();
        };
        timetable.ticks_after(after, &tz).take(n).collect()
    }
}

/// One run of a tick, as the instance that ran it recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastRun {
    /// When the tick was due (Unix milliseconds).
    pub tick_ms: i64,
    /// When the run ended, by the runner's clock (Unix milliseconds).
    pub ended_ms: i64,
    /// How long it ran, in seconds.
    pub seconds: f64,
    /// The runner's session label (host and pid by default).
    pub by: String,
    /// The runner's public session tag.
    pub session_tag: String,
    /// The tick claim's fencing token.
    pub token: u64,
    /// The leader's term token, in leader mode.
    pub leader_token: Option<u64>,
    /// `finished`, `failed: MESSAGE` (the job's error, such as `exit 3`),
    /// `stopped: lock_at_most_for`, `stopped: session lost` or `stopped:
    /// term ended` (the bound elector's term ended during the run).
    pub outcome: String,
}

/// A schedule's shared state in the store: description, last run and
/// cluster-wide pause.
///
/// A pause is a cell in the store that every instance reads before it
/// claims a tick, so a paused schedule skips its ticks on every instance
/// (counted as `paused` in `tenure_cron_ticks_total`); one that expires
/// lifts by itself at its time, by each instance's clock. Unlike
/// [`PauseHandle`](super::PauseHandle), which pauses one instance, a
/// cluster-wide pause keeps a leader elected: it only stops the runs.
///
/// Needs a store with cells ([`Capabilities::cells`](crate::Capabilities));
/// on one without, reads find nothing and writes fail with
/// [`Error::Unsupported`](crate::Error::Unsupported).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let board = tenure::ScheduleBoard::new(&store, "nightly")?;
/// board.pause(None, "ops", "database migration").await?;
/// assert!(board.paused().await?.is_some());
/// assert!(board.resume().await?);
/// assert!(board.paused().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ScheduleBoard {
    store: Arc<dyn Store>,
    job: Name,
    info: Cell,
    pause: PauseCell,
}

impl ScheduleBoard {
    /// The board of the job `job`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a name a [`Schedule`](super::Schedule)
    /// would refuse.
    pub fn new(store: &Arc<dyn Store>, job: impl AsRef<str>) -> Result<Self> {
        let job = super::job_name(job.as_ref())?;
        Ok(ScheduleBoard {
            store: store.clone(),
            info: Cell::new(store, format!("tenure.schedule:{job}"))?,
            pause: PauseCell(Cell::new(store, format!("tenure.pause:{job}"))?),
            job,
        })
    }

    /// Checks a job's name as [`ScheduleBoard::new`] would, without a store
    /// (the CLI checks its input before it opens one).
    pub fn check_job(job: &str) -> Result<()> {
        super::job_name(job).map(|_| ())
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        self.job.as_str()
    }

    /// Whether the store keeps cells: without, the board reads nothing and
    /// asks the store nothing (no failed call to count every tick).
    fn has_cells(store: &Arc<dyn Store>) -> bool {
        store.capabilities().cells
    }

    /// The jobs whose instances ever published here, sorted; empty on a
    /// store without cells. A registry that does not hold what tenure
    /// wrote counts as empty (the next instance to start rewrites it).
    pub async fn jobs(store: &Arc<dyn Store>) -> Result<Vec<String>> {
        if !Self::has_cells(store) {
            return Ok(Vec::new());
        }
        Registry(Cell::new(store, REGISTRY)?).names().await
    }

    /// Whether an instance of the job has started on this store: a job is
    /// listed from its start, before its first run. Always false on a store
    /// without cells. A pause may still be set ahead of a job's first start
    /// through [`ScheduleBoard::pause`]; the CLI and the console refuse to,
    /// taking a name nobody runs for a typo.
    pub async fn exists(&self) -> Result<bool> {
        Ok(Self::jobs(&self.store)
            .await?
            .iter()
            .any(|j| j == self.job.as_str()))
    }

    /// What the instances last published: expression, zone, mode, last run.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the cell does not hold what tenure
    /// wrote there; store errors.
    pub async fn info(&self) -> Result<Option<ScheduleInfo>> {
        if !Self::has_cells(&self.store) {
            return Ok(None);
        }
        Ok(read(&self.info).await?.map(|(info, _)| info))
    }

    /// The pause in force now (by this machine's clock), if any.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the pause cell does not hold what
    /// tenure wrote there (a schedule then skips its ticks, and
    /// [`ScheduleBoard::pause`] or [`ScheduleBoard::resume`] overwrite it);
    /// store errors.
    pub async fn paused(&self) -> Result<Option<Paused>> {
        if !Self::has_cells(&self.store) {
            return Ok(None);
        }
        self.pause.paused().await
    }

    /// Pauses the job on every instance, until `until` (by each instance's
    /// clock) or until [`ScheduleBoard::resume`]. A new pause replaces one in
    /// force.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an `until` already past or more than
    /// ten years ahead; [`Error::Unsupported`](crate::Error::Unsupported) on a store without cells.
    pub async fn pause(
        &self,
        until: Option<DateTime<Utc>>,
        by: &str,
        reason: &str,
    ) -> Result<Paused> {
        self.pause.pause(until, by, reason).await
    }

    /// Lifts a pause. Returns whether one was in force.
    pub async fn resume(&self) -> Result<bool> {
        self.pause.resume().await
    }

    /// Lists the job and describes it (keeping the last run), when that
    /// changed. Best effort: a store without cells is left alone.
    pub(crate) async fn publish(&self, mut info: ScheduleInfo) -> Result<()> {
        let registry = Registry(Cell::new(&self.store, REGISTRY)?);
        let job = self.job.to_string();
        if !Self::has_cells(&self.store) {
            return Ok(());
        }
        registry.add(&job).await?;
        let described = update(&self.info, move |old: Option<ScheduleInfo>| {
            info.last_run = old.as_ref().and_then(|o| o.last_run.clone());
            (old.as_ref() != Some(&info)).then(|| info.clone())
        });
        described.await
    }

    /// Records a run as the job's last.
    pub(crate) async fn record(&self, run: LastRun) -> Result<()> {
        if !Self::has_cells(&self.store) {
            return Ok(());
        }
        let recorded = update(&self.info, move |old: Option<ScheduleInfo>| {
            let mut info = old?;
            info.last_run = Some(run.clone());
            Some(info)
        });
        recorded.await
    }
}
