//! The conformance suite: the specification every backend meets, as plain
//! async check functions over a store, split by topic. Any `Store` — one of
//! tenure's or your own — runs it with one line:
//!
//! ```text
//! tenure_testkit::conformance_tests!(async { Some(Target::new(url).await) });
//! ```
//!
//! which makes one `#[tokio::test]` per check (the calling crate needs
//! `tokio` with the `macros` and `rt-multi-thread` features). A target of
//! `None` means the server is missing and this is not CI (said on stderr).
//! With a server of the test kit, `conformance_tests!(target; server: …;
//! down: …)` adds the fault checks (server killed and restarted, paused, down
//! at start).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cancel;
mod election;
mod expiry;
mod faults;
mod input;
mod locks;
mod metrics;
mod once;
mod paused;
mod registers;
mod schedule;
mod semaphore;
mod shards;
mod unfair;
mod upgrade;

pub use cancel::*;
pub use election::*;
pub use expiry::*;
pub use faults::*;
pub use input::*;
pub use locks::*;
pub use metrics::*;
pub use once::*;
pub use paused::*;
pub use registers::*;
pub use schedule::*;
pub use semaphore::*;
pub use shards::*;
pub use unfair::*;
pub use upgrade::*;

use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;

use std::time::Duration;

use tenure::store::{JoinMode, JoinRequest, Joined, OpenedSession, SessionKey, SessionSpec};
use tenure::{
    Election, Elector, EntryKind, Error, Mutex, MutexGuard, Name, Session, SessionOptions, Store,
};

use tokio::time::Instant;

/// A store under test and how to open it again.
pub struct Target {
    pub url: String,
    pub store: Arc<dyn Store>,
}

impl Target {
    pub async fn new(url: String) -> Target {
        let store = tenure::open(&url).await.expect("open store");
        Target { url, store }
    }

    /// For backends that may be skipped (a server that is not installed).
    pub async fn some(url: String) -> Option<Target> {
        Some(Self::new(url).await)
    }
}

/// A waiting join of `kind` on `name` with `value`.
pub(crate) fn request<'a>(name: &'a Name, kind: EntryKind, value: &'a [u8]) -> JoinRequest<'a> {
    JoinRequest {
        name,
        kind,
        value,
        mode: JoinMode::Wait,
        likely_free: false,
    }
}

/// A fresh name per check so checks sharing a store do not meet.
pub fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) async fn session(store: &Arc<dyn Store>) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(Duration::from_secs(10)))
        .await
        .expect("open session")
}

/// A session that never renews: it stands for a crashed or paused client.
pub(crate) async fn crashing_session(store: &Arc<dyn Store>, ttl: Duration) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(ttl).auto_renew(false))
        .await
        .expect("open session")
}

/// `wanted`, or the backend's shortest TTL if that is longer (a store whose
/// leases count whole seconds, or whose servers set a minimum session
/// timeout).
pub(crate) fn short_ttl(t: &Target, wanted: Duration) -> Duration {
    wanted.max(t.store.capabilities().min_ttl)
}

/// A session of the raw contract (no `Session` renews or closes it), TTL
/// 10 s: longer than any check that uses one.
pub(crate) async fn raw_session(store: &Arc<dyn Store>) -> OpenedSession {
    let spec = SessionSpec {
        ttl: Duration::from_secs(10),
        label: "test".into(),
    };
    store.open_session(&spec).await.unwrap()
}

/// A client that joins `name` (exclusive) and then dies: it never renews,
/// leaves or closes (the raw contract: no `Session` cleans up after it).
pub(crate) async fn dying_join(store: &Arc<dyn Store>, name: &str, ttl: Duration) -> Joined {
    let spec = SessionSpec {
        ttl,
        label: "dies".into(),
    };
    let dead = store.open_session(&spec).await.unwrap();
    let name = Name::new(name).unwrap();
    store
        .join(&dead.key, request(&name, EntryKind::Exclusive, b""))
        .await
        .unwrap()
        .unwrap()
}

/// Waits (bounded) until the queue of `name` has `len` entries.
pub(crate) async fn wait_queue_len(store: &Arc<dyn Store>, name: &str, len: usize) {
    let name = Name::new(name).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let q = store.queue(&name).await.expect("queue");
        if q.entries.len() == len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue of {name} never reached {len}: {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded, 10 s) until a store's call count (`calls`) has grown by
/// at least `at_least` since `since` and then stayed put for 200 ms: a
/// waiter that has made its calls and sleeps.
pub async fn wait_calls_settled(calls: impl Fn() -> u64, since: u64, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = calls();
    let mut still_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = calls();
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if now >= since + at_least && still_since.elapsed() >= Duration::from_millis(200) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "calls never settled: {now} (from {since}, at least {at_least} more)"
        );
    }
}

/// The one list of the conformance checks that run on a target, which
/// [`CHECKS`] and [`conformance_tests!`](crate::conformance_tests) both read:
/// `(@with MODE [ARGS])` expands `(@MODE [ARGS] check, check, …)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_checks {
    (@with $mode:ident [$($args:tt)*]) => {
        $crate::__conformance_checks! {@$mode [$($args)*]
            check_exclusion, check_concurrent_first_use, check_try_lock_while_held, check_hinted_try, check_timeout, check_fifo,
            check_reentrancy, check_non_reentrant_mutex, check_reentrant_waiters, check_non_holder_cannot_act, check_close_releases_everything,
            check_crashed_holder_released, check_crashed_holder_released_to_a_late_waiter, check_made_next_by_a_grant_passes_a_dead_holder_in_bound, check_crashed_queue_cleared_by_try,
            check_unfair_mutex, check_unfair_waiters_wake_one_at_a_time, check_unfair_starvation_bound, check_unfair_crashed_holder_released,
            check_unfair_dead_holder_released, check_evicted_holder_is_told,
            check_evicted_session_is_told,
            check_waiter_session_expiry,
            check_grant_before_the_wait, check_cancelled_wait_leaves_queue, check_ask_again_at_once, check_dropped_anywhere_leaves_nothing, check_dead_waiter_behind_a_waiter, check_fencing_monotonic,
            check_election_failover, check_observe_order, check_proclaim_only_by_leader,
            check_elector_callbacks, check_elector_resign_and_recampaign, check_elector_pause, check_shared_and_permits, check_bad_input, check_names_byte_for_byte,
            check_rwlock, check_semaphore, check_once, check_schedule_per_tick,
            check_schedule_leader, check_schedule_paused_cluster_wide, check_fence, check_fence_values, check_fence_interleaved, check_cell,
            check_cell_bound_to_session, check_cell_increments, check_crashed_co_holder_released,
            check_metrics_same_as_memory, check_session_builds, check_upgrade_finish,
            check_upgrade_finish_while_sessions_open,
            check_shards_group_membership, check_shards_group_dead_member_seen, check_shards_refuse_another_count, check_shards_balanced_and_sticky,
            check_shards_one_owner_under_churn, check_shards_dead_member_reassigned_in_bound,
            check_shards_paused_member_loses_first}
    };
    (@table [] $($check:ident),*) => {
        &[$($crate::conformance::Check {
            name: stringify!($check),
            run: |t| Box::pin($crate::conformance::$check(t)),
        }),*]
    };
    (@tests [$target:expr] $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $target.await else { return };
                $crate::conformance::$check(&target).await;
            }
        )*
    };
}

/// A check's future.
pub type CheckFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// One conformance check, by name.
#[derive(Clone, Copy)]
pub struct Check {
    /// The check function's name (`check_fifo`).
    pub name: &'static str,
    /// Runs it on a target; it panics when the target fails it.
    pub run: for<'a> fn(&'a Target) -> CheckFuture<'a>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Every conformance check that runs on a target, in the suite's order.
pub static CHECKS: &[Check] = __conformance_checks!(@with table []);

/// One `#[tokio::test]` per conformance check for a target, and with
/// `server:` and `down:` the fault checks on a server of the test kit.
///
/// tenure's own stores run the suite from the table of stores
/// (`tests/conformance.rs`); this macro is for a store of your own, or a
/// variant of one (a TLS server, another key layout).
#[macro_export]
macro_rules! conformance_tests {
    ($target:expr) => {
        $crate::__conformance_checks!(@with tests [$target]);
    };
    ($target:expr; server: $start:expr; down: $down_url:expr) => {
        $crate::conformance_tests!($target);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_killed_and_restarted() {
            let Some(mut server) = $start else { return };
            $crate::conformance::check_server_killed_and_restarted(&mut server).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_paused_while_held() {
            let Some(mut server) = $start else { return };
            $crate::conformance::check_server_paused(&mut server).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_call_fails_in_time_on_a_paused_server() {
            let Some(mut server) = $start else { return };
            $crate::conformance::check_every_call_fails_in_time_on_a_paused_server(&mut server)
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stops_end_on_a_paused_server() {
            let Some(mut server) = $start else { return };
            $crate::conformance::check_stops_end_on_a_paused_server(&mut server).await;
        }

        #[tokio::test]
        async fn server_down_at_start_is_unavailable_in_time() {
            let port = $crate::free_port();
            let url: String = ($down_url)(port);
            $crate::conformance::check_down_at_start(&url).await;
        }
    };
}
