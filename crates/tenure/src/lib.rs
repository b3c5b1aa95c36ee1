//! Distributed locks, leader election and fencing tokens on the stores you
//! already run — one API, one meaning, on every backend.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> tenure::Result<()> {
//! let store = tenure::open("memory://").await?;
//! let session = tenure::Session::new(&store).await?;
//! let guard = tenure::Mutex::new(&session, "migrations")?.lock().await?;
//! println!("holding with fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

// The layers, from the bottom up (a module imports only those below it):
// - contract: `error`, `store` (the backend trait and its types), `queue`
//   (the pure grant rules), `task` (background calls), `clock`;
// - backends: `backend::*`, each importing the contract and the shared
//   backend helpers only;
// - `registry`: URL → backend, one table;
// - session and acquisition: `session` (the lease), `acquire`;
// - recipes: `guard`, `mutex`, `rwlock`, `semaphore`, `election`, `once`,
//   `schedule`, `group` and `shards`, and the registers `fence` and `cell`;
// - `fencing`: the token check in the user's own database (drivers only);
// - `metrics`: what the sessions and recipes record, and `metered`, the one
//   store wrapper that records store operations (no backend records).
mod acquire;
mod addressed;
pub mod backend;
#[cfg(feature = "schedule")]
mod board;
mod cell;
mod clock;
mod election;
mod elector;
mod error;
mod fence;
pub mod fencing;
mod group;
mod guard;
#[cfg(feature = "metrics")]
mod metered;
pub mod metrics;
mod mutex;
mod once;
pub mod queue;
mod registry;
mod rwlock;
#[cfg(feature = "schedule")]
mod schedule;
mod semaphore;
mod session;
mod shards;
pub mod store;
mod task;
pub mod upgrade;

pub use backend::url::mask_password;
pub use cell::Cell;
pub use election::{leader, Election, Leader, Observer, Term};
#[cfg(feature = "schedule")]
pub use elector::ElectorBoard;
pub use elector::{Elector, ElectorHandle};
pub use error::{BoxError, Error, LostReason, Result};
pub use fence::Fence;
pub use group::{Group, Member, MembersWatch, Membership, GROUP_PREFIX};
pub use guard::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, SemaphorePermit};
#[cfg(feature = "metrics")]
pub use metered::Metered;
pub use mutex::Mutex;
pub use once::{once, JobError, OnceOutcome, WhileRunning};
pub use registry::{backend_for, backends, builtin_backends, open, Backend};
pub use rwlock::RwLock;
#[cfg(feature = "schedule")]
pub use schedule::{
    LastRun, Missed, Mode as ScheduleMode, PauseHandle, Paused, RunResult, Schedule, ScheduleBoard,
    ScheduleInfo, Tick, Timetable,
};
pub use semaphore::Semaphore;
pub use session::{default_label, Session, SessionOptions, DEFAULT_TTL};
pub use shards::{
    shard_map, Shard, ShardOwner, ShardState, ShardStatus, ShardView, Shards, DEFAULT_SHARD_GRACE,
    MAX_SHARDS, SHARD_PREFIX,
};
pub use store::{Capabilities, EntryKind, Expect, FenceState, Name, Store, Versioned};

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The library page's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../guides/library.md")]
pub struct LibraryDocDoctests;

/// The fencing page's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../guides/fencing.md")]
pub struct FencingDocDoctests;

/// The shards page's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../guides/shards.md")]
pub struct ShardsDocDoctests;

/// The schedules and elections page's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../guides/schedules-and-elections.md")]
pub struct SchedulesDocDoctests;
