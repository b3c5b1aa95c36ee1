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

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::cell::Cell;
use crate::error::{Error, Result};
use crate::store::{Expect, Name, Store, MAX_VALUE_LEN};

/// The cell that lists the jobs.
const REGISTRY: &str = "tenure.schedules";
/// How often a read-modify-write of a board cell is tried before giving up
/// (each miss means another instance wrote in between, so progress is made).
const CAS_TRIES: usize = 8;
/// The longest pause with an end: ten years (longer is "until resumed").
const MAX_PAUSE: chrono::TimeDelta = chrono::TimeDelta::days(3653);

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
        let (Ok(cron), Ok(tz)) = (
            super::parse_cron(&self.expr),
            self.time_zone.parse::<chrono_tz::Tz>(),
        ) else {
            return Vec::new();
        };
        cron.after(&after.with_timezone(&tz))
            .take(n)
            .map(|t| t.with_timezone(&Utc))
            .collect()
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
    /// `finished`, `stopped: lock_at_most_for` or `stopped: session lost`.
    pub outcome: String,
}

/// A cluster-wide pause of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    /// When it was paused (Unix milliseconds).
    pub since_ms: i64,
    /// When it resumes by itself (Unix milliseconds), judged by each
    /// instance's own clock; `None`: until resumed.
    pub until_ms: Option<i64>,
    /// Who paused it (free text: a user, a host).
    pub by: String,
    /// Why.
    pub reason: String,
}

impl Paused {
    /// Whether the pause still holds at `now`.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.until_ms
            .is_none_or(|until| now.timestamp_millis() < until)
    }

    /// When it resumes by itself, if it does.
    pub fn until(&self) -> Option<DateTime<Utc>> {
        self.until_ms
            .and_then(|ms| Utc.timestamp_millis_opt(ms).single())
    }
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
/// [`Error::Unsupported`].
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
    pause: Cell,
}

impl ScheduleBoard {
    /// The board of the job `job`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name a [`Schedule`](super::Schedule)
    /// would refuse.
    pub fn new(store: &Arc<dyn Store>, job: impl AsRef<str>) -> Result<Self> {
        let job = super::job_name(job.as_ref())?;
        Ok(ScheduleBoard {
            store: store.clone(),
            info: Cell::new(store, format!("tenure.schedule:{job}"))?,
            pause: Cell::new(store, format!("tenure.pause:{job}"))?,
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
        let registry = Cell::new(store, REGISTRY)?;
        match read::<Vec<String>>(&registry).await {
            Ok(Some((jobs, _))) => Ok(jobs),
            Ok(None) | Err(Error::InvalidArgument { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// What the instances last published: expression, zone, mode, last run.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the cell does not hold what tenure
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
    /// [`Error::InvalidArgument`] when the pause cell does not hold what
    /// tenure wrote there (a schedule then skips its ticks, and
    /// [`ScheduleBoard::pause`] or [`ScheduleBoard::resume`] overwrite it);
    /// store errors.
    pub async fn paused(&self) -> Result<Option<Paused>> {
        if !Self::has_cells(&self.store) {
            return Ok(None);
        }
        Ok(read::<Paused>(&self.pause)
            .await?
            .map(|(paused, _)| paused)
            .filter(|p| p.holds_at(Utc::now())))
    }

    /// Pauses the job on every instance, until `until` (by each instance's
    /// clock) or until [`ScheduleBoard::resume`]. A new pause replaces one in
    /// force.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an `until` already past or more than
    /// ten years ahead; [`Error::Unsupported`] on a store without cells.
    pub async fn pause(
        &self,
        until: Option<DateTime<Utc>>,
        by: &str,
        reason: &str,
    ) -> Result<Paused> {
        let now = Utc::now();
        if until.is_some_and(|u| u <= now) {
            return Err(Error::InvalidArgument {
                what: "pause until",
                reason: "the time is already past".into(),
            });
        }
        if until.is_some_and(|u| u - now > MAX_PAUSE) {
            return Err(Error::InvalidArgument {
                what: "pause until",
                reason: "more than ten years ahead: pause until resumed instead".into(),
            });
        }
        let paused = Paused {
            since_ms: now.timestamp_millis(),
            until_ms: until.map(|u| u.timestamp_millis()),
            by: by.to_string(),
            reason: reason.to_string(),
        };
        let set = paused.clone();
        // Whatever the cell held (even what tenure did not write), the new
        // pause replaces it.
        update(&self.pause, move |_: Option<Paused>| Some(set.clone())).await?;
        Ok(paused)
    }

    /// Lifts a pause. Returns whether one was in force.
    pub async fn resume(&self) -> Result<bool> {
        let now = Utc::now();
        let mut was = false;
        for _ in 0..CAS_TRIES {
            let Some(current) = self.pause.get().await? else {
                return Ok(was);
            };
            was = decode::<Paused>(&self.pause, &current.value)
                .map(|p| p.holds_at(now))
                .unwrap_or(true);
            match self.pause.delete(current.version).await {
                Ok(()) => return Ok(was),
                Err(Error::VersionMismatch { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(busy(&self.pause))
    }

    /// Lists the job and describes it (keeping the last run), when that
    /// changed. Best effort: a store without cells is left alone.
    pub(crate) async fn publish(&self, mut info: ScheduleInfo) -> Result<()> {
        let registry = Cell::new(&self.store, REGISTRY)?;
        let job = self.job.to_string();
        if !Self::has_cells(&self.store) {
            return Ok(());
        }
        let listed = update(&registry, |jobs: Option<Vec<String>>| {
            let mut jobs = jobs.unwrap_or_default();
            match jobs.binary_search(&job) {
                Ok(_) => None,
                Err(at) => {
                    jobs.insert(at, job.clone());
                    Some(jobs)
                }
            }
        });
        listed.await?;
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

fn busy(cell: &Cell) -> Error {
    Error::Conflict {
        name: cell.name().to_string(),
        reason: format!("written by others {CAS_TRIES} times in a row while updating it"),
    }
}

fn decode<T: for<'de> Deserialize<'de>>(cell: &Cell, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| Error::InvalidArgument {
        what: "schedule board cell",
        reason: format!("{} does not hold what tenure wrote there: {e}", cell.name()),
    })
}

async fn read<T: for<'de> Deserialize<'de>>(cell: &Cell) -> Result<Option<(T, u64)>> {
    match cell.get().await? {
        None => Ok(None),
        Some(v) => Ok(Some((decode(cell, &v.value)?, v.version))),
    }
}

/// Read, change, write back if nobody wrote in between; `change` returning
/// `None` leaves the cell as it is.
async fn update<T, F>(cell: &Cell, mut change: F) -> Result<()>
where
    T: Serialize + for<'de> Deserialize<'de>,
    F: FnMut(Option<T>) -> Option<T>,
{
    for _ in 0..CAS_TRIES {
        // What tenure did not write is overwritten, as if absent (at its
        // version, so a concurrent writer still wins or loses cleanly).
        let (old, expect) = match cell.get().await? {
            Some(v) => (decode::<T>(cell, &v.value).ok(), Expect::Version(v.version)),
            None => (None, Expect::Absent),
        };
        let Some(new) = change(old) else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(&new).map_err(|e| Error::InvalidArgument {
            what: "schedule board cell",
            reason: e.to_string(),
        })?;
        if bytes.len() > MAX_VALUE_LEN {
            return Err(Error::InvalidArgument {
                what: "schedule board cell",
                reason: format!("{} would outgrow a cell", cell.name()),
            });
        }
        match cell.put(&bytes, expect).await {
            Ok(_) => return Ok(()),
            Err(Error::VersionMismatch { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(busy(cell))
}
