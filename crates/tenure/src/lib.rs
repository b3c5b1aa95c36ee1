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

pub mod backend;
mod clock;
mod election;
mod error;
mod guard;
mod mutex;
mod once;
pub mod queue;
mod rwlock;
#[cfg(feature = "schedule")]
mod schedule;
mod semaphore;
mod session;
mod store;

pub use election::{leader, Election, Elector, Leader, Observer, Term};
pub use error::{BoxError, Error, Result};
pub use guard::{Guard, MutexGuard};
pub use mutex::Mutex;
pub use once::{once, JobError, OnceOutcome, WhileRunning};
pub use rwlock::{RwLock, RwLockGuard};
#[cfg(feature = "schedule")]
pub use schedule::{parse_cron, Missed, Mode as ScheduleMode, PauseHandle, Schedule, Tick};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use session::{default_label, LostReason, Session, SessionOptions, DEFAULT_TTL};
pub use store::{
    builtin_backends, mask_password, open, Capabilities, Entry, EntryKind, JoinMode, Joined, Name,
    OpenedSession, Queue, Scheme, SessionKey, SessionSpec, Store, Wake, MAX_NAME_LEN,
};

/// The README's examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
