//! What a SQL database must do for the core ([`SqlDriver`]).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::row::{Arg, SqlRow};
use crate::error::Result;

/// What a SQL database must do for the core: run tenure's routines and a few
/// plain statements, one round trip each, and say how it wakes waiters.
#[async_trait]
pub trait SqlDriver: Send + Sync + fmt::Debug + 'static {
    /// The backend's name.
    fn backend(&self) -> &'static str;

    /// Records a new session of `ttl_ms`, by the server's clock, and the
    /// build that opens it (`RELEASE FORMAT`, beside what older builds
    /// read), in one step: both or neither, so that no session is ever
    /// without its build (which `tenure upgrade finish` would have to
    /// take for an older build's).
    async fn open(
        &self,
        secret: &str,
        tag: &str,
        label: &str,
        ttl_ms: i64,
        build: &str,
    ) -> Result<()>;

    /// The version of what this build keeps in the database.
    fn format(&self) -> &'static str {
        ""
    }

    /// Every session not yet ended (a lapsed one whose end no watcher has
    /// confirmed counts): its tag, label and recorded build, if any.
    async fn session_builds(&self) -> Result<Vec<(String, String, Option<String>)>> {
        Err(crate::error::Error::Unsupported {
            backend: self.backend(),
            what: "listing the builds of its sessions",
        })
    }

    /// Retires the formats older than this build's: the schema marker
    /// becomes this build's format, which older builds refuse. Returns
    /// what changed, in words (nothing when it was done already).
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        Err(crate::error::Error::Unsupported {
            backend: self.backend(),
            what: "finishing an upgrade",
        })
    }

    /// Extends a live session by its TTL; `false` when there is none.
    async fn keep_alive(&self, secret: &str) -> Result<bool>;

    /// Calls one of tenure's routines; its first row. Deadlocks and
    /// serialization failures are retried.
    async fn call(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<SqlRow>;

    /// A one-statement answer to `routine` ("join" or "leave") for the
    /// common case — taking a name nobody holds or waits for, releasing a
    /// lone holder — or `None` when that case does not apply, and
    /// [`SqlDriver::call`] decides. Called only when
    /// [`SqlDriver::has_fast_paths`]. Also "still_queued" (secret, name,
    /// seq): a row when that entry waits, not granted, none otherwise; for
    /// a driver whose `join` says what a waiter's first look would.
    async fn fast(&self, routine: &'static str, args: &[Arg<'_>]) -> Result<Option<SqlRow>> {
        let _ = (routine, args);
        Ok(None)
    }

    /// Whether [`SqlDriver::fast`] may answer (one more round trip when
    /// it does not).
    fn has_fast_paths(&self) -> bool {
        false
    }

    /// A name's entries in queue order — seq, kind, count, limit, tag,
    /// label, value, granted_ms, ms left, holds — and its version.
    async fn rows(&self, name: &str) -> Result<(Vec<SqlRow>, i64)>;

    /// The names with live entries that start with `prefix`, sorted.
    async fn names(&self, prefix: &str) -> Result<Vec<String>>;

    /// The names a session has entries in (to wake them after it ends).
    async fn names_of(&self, secret: &str) -> Result<Vec<String>>;

    /// The names the live session with the public tag `tag` has entries
    /// in (to wake them after it is evicted).
    async fn names_of_tag(&self, tag: &str) -> Result<Vec<String>>;

    /// What the server's announcement of the grant of `secret`'s entry
    /// `seq` carries as its proof, for a driver whose announcements anyone
    /// could send (`Listeners::announced` in the shared waiting module);
    /// `None` for one that
    /// announces no grant.
    fn grant_proof(&self, secret: &str, seq: u64) -> Option<String> {
        let _ = (secret, seq);
        None
    }

    /// Before a wait, and before each look: make sure the server's
    /// notifications arrive, where it sends any (PostgreSQL's `LISTEN`).
    /// Returns whether they do; if not, waiters poll.
    async fn listen(&self) -> bool {
        false
    }

    /// Whether changes made here must wake this process's waiters by hand
    /// (a server that sends no notifications).
    fn wakes_by_hand(&self) -> bool;

    /// The shortest and longest poll, for a change no notification tells.
    fn poll_bounds(&self) -> (Duration, Duration);
}
