//! What the instances of a schedule or an elector share through the store
//! beside their locks: a cluster-wide pause, and the list of the names
//! started here. Both are cells holding JSON, written by compare-and-set.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::cell::Cell;
use crate::error::{Error, Result};
use crate::store::{Expect, MAX_VALUE_LEN};

/// How often a read-modify-write of a board cell is tried before giving up
/// (each miss means another instance wrote in between, so progress is made).
const CAS_TRIES: usize = 8;
/// The longest pause with an end: ten years (longer is "until resumed").
const MAX_PAUSE: chrono::TimeDelta = chrono::TimeDelta::days(3653);

/// A cluster-wide pause of a schedule or an elector.
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

/// A pause kept in one cell: present while paused.
#[derive(Debug, Clone)]
pub(crate) struct PauseCell(pub(crate) Cell);

impl PauseCell {
    /// The pause in force now (by this machine's clock), if any.
    pub(crate) async fn paused(&self) -> Result<Option<Paused>> {
        Ok(read::<Paused>(&self.0)
            .await?
            .map(|(paused, _)| paused)
            .filter(|p| p.holds_at(Utc::now())))
    }

    /// Pauses until `until` (by each instance's clock) or until resumed; a
    /// new pause replaces one in force.
    pub(crate) async fn pause(
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
        update(&self.0, move |_: Option<Paused>| Some(set.clone())).await?;
        Ok(paused)
    }

    /// Lifts a pause. Returns whether one was in force.
    pub(crate) async fn resume(&self) -> Result<bool> {
        let now = Utc::now();
        let mut was = false;
        for _ in 0..CAS_TRIES {
            let Some(current) = self.0.get().await? else {
                return Ok(was);
            };
            was = decode::<Paused>(&self.0, &current.value)
                .map(|p| p.holds_at(now))
                .unwrap_or(true);
            match self.0.delete(current.version).await {
                Ok(()) => return Ok(was),
                Err(Error::VersionMismatch { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(busy(&self.0))
    }
}

/// A sorted list of names in one cell: the jobs, or the electors, started
/// on a store.
#[derive(Debug, Clone)]
pub(crate) struct Registry(pub(crate) Cell);

impl Registry {
    /// The names listed; a cell that does not hold what tenure wrote counts
    /// as empty (the next instance to start rewrites it).
    pub(crate) async fn names(&self) -> Result<Vec<String>> {
        match read::<Vec<String>>(&self.0).await {
            Ok(Some((names, _))) => Ok(names),
            Ok(None) | Err(Error::InvalidArgument { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Lists `name`, if it is not yet.
    pub(crate) async fn add(&self, name: &str) -> Result<()> {
        update(&self.0, |names: Option<Vec<String>>| {
            let mut names = names.unwrap_or_default();
            match names.binary_search_by(|n| n.as_str().cmp(name)) {
                Ok(_) => None,
                Err(at) => {
                    names.insert(at, name.to_string());
                    Some(names)
                }
            }
        })
        .await
    }
}

pub(crate) fn busy(cell: &Cell) -> Error {
    Error::Conflict {
        name: cell.name().to_string(),
        reason: format!("written by others {CAS_TRIES} times in a row while updating it"),
    }
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(cell: &Cell, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| Error::InvalidArgument {
        what: "board cell",
        reason: format!("{} does not hold what tenure wrote there: {e}", cell.name()),
    })
}

pub(crate) async fn read<T: for<'de> Deserialize<'de>>(cell: &Cell) -> Result<Option<(T, u64)>> {
    match cell.get().await? {
        None => Ok(None),
        Some(v) => Ok(Some((decode(cell, &v.value)?, v.version))),
    }
}

/// Read, change, write back if nobody wrote in between; `change` returning
/// `None` leaves the cell as it is.
pub(crate) async fn update<T, F>(cell: &Cell, mut change: F) -> Result<()>
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
            what: "board cell",
            reason: e.to_string(),
        })?;
        if bytes.len() > MAX_VALUE_LEN {
            return Err(Error::InvalidArgument {
                what: "board cell",
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
