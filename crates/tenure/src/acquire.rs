//! Acquisition: joining a name's queue, waiting for the grant, and the hold
//! that leaves the queue again. The recipes take their guards through here.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::metrics::{Acquiring, HeldMetric, Recipe};
use crate::session::Session;
use crate::session::Unsettled;
use crate::store::{EntryKind, JoinMode, JoinRequest, Joined, Name};
use crate::task::{finish_tracked, spawn_detached};

mod barging;

pub use barging::WAKE_LINE_PREFIX;

impl Session {
    /// Joins a queue; cancel safe: if this future is dropped after the store
    /// took the entry, the entry is left again in the background.
    /// `likely_free` is [`JoinRequest::likely_free`].
    pub(crate) async fn join(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        mode: JoinMode,
        likely_free: bool,
    ) -> Result<Option<(Hold, Joined)>> {
        self.check_alive()?;
        // The kind's own sense (permits within the limit) is checked here,
        // once, so no backend has to; its fit with the queue is the store's.
        crate::queue::check_compatible(name, kind, [])?;
        // After this session's own calls on the name that went on in the
        // background (a wait given up, a guard dropped).
        self.settled(name).await;
        let store = self.store().clone();
        let key = self.key().clone();
        let task_name = name.clone();
        let undo = {
            let (store, key, name) = (store.clone(), key.clone(), name.clone());
            move |result: Result<Option<Joined>>, unsettled: Unsettled| {
                // The caller is gone: undo the join.
                if let Ok(Some(joined)) = result {
                    spawn_detached(async move {
                        let _ = store.leave(&key, &name, joined.seq).await;
                        drop(unsettled);
                    });
                }
            }
        };
        let track = {
            let (session, name) = (self.clone(), name.clone());
            move || session.unsettled(&name)
        };
        let joined = finish_tracked(
            async move {
                let request = JoinRequest {
                    name: &task_name,
                    kind,
                    value: &value,
                    mode,
                    likely_free,
                };
                store.join(&key, request).await
            },
            undo,
            track,
        )
        .await;
        let joined = match joined {
            // Unanswered, it may have taken effect: an entry this session
            // does not know of would be granted in its turn and held for as
            // long as the session lives, and a later join would reuse it.
            // As with a release the store did not answer, the session ends.
            Err(e) if e.may_have_taken_effect() => {
                self.end_unconfirmed();
                return Err(e);
            }
            joined => joined?,
        };
        Ok(joined.map(|joined| {
            (
                Hold {
                    session: self.clone(),
                    name: name.clone(),
                    seq: joined.seq,
                    armed: true,
                    metric: None,
                },
                joined,
            )
        }))
    }

    /// Joins and waits for the grant, giving up at `deadline`; `None` when
    /// `wait` is false and the entry is not granted at once.
    ///
    /// With a `recipe`, the acquisition and the hold are recorded in the
    /// metrics under `name`; without (a schedule's per-tick claims, `once`
    /// records), nothing is, so such names never become label values.
    pub(crate) async fn acquire(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        wait: Wait,
        order: Order,
        recipe: Option<Recipe>,
    ) -> Result<Option<(Hold, Joined)>> {
        let Some(recipe) = recipe.filter(|_| crate::metrics::enabled()) else {
            return self.acquire_in(name, kind, value, wait, order, None).await;
        };
        // Dropped before it is told the outcome, it counts a cancelled one.
        let mut probe = Acquiring::start(recipe, name);
        match self
            .acquire_in(name, kind, value, wait, order, Some(&mut probe))
            .await
        {
            Ok(Some((mut hold, joined))) => {
                hold.metric = Some(hold.session.tie(probe.granted(joined.seq)));
                Ok(Some((hold, joined)))
            }
            Ok(None) => {
                probe.failed(None);
                Ok(None)
            }
            Err(e) => {
                probe.failed(Some(&e));
                Err(e)
            }
        }
    }

    async fn acquire_in(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        wait: Wait,
        order: Order,
        probe: Option<&mut Acquiring>,
    ) -> Result<Option<(Hold, Joined)>> {
        match (order, wait) {
            (Order::Barging, Wait::Forever | Wait::Until(..)) => {
                self.acquire_barging(name, kind, value, wait, probe).await
            }
            _ => self.acquire_as(name, kind, value, wait, probe).await,
        }
    }

    pub(super) async fn acquire_as(
        &self,
        name: &Name,
        kind: EntryKind,
        value: Vec<u8>,
        wait: Wait,
        probe: Option<&mut Acquiring>,
    ) -> Result<Option<(Hold, Joined)>> {
        let mode = match wait {
            Wait::No => JoinMode::IfGranted,
            _ => JoinMode::Wait,
        };
        let Some((hold, joined)) = self.join(name, kind, value, mode, false).await? else {
            return Ok(None);
        };
        if joined.granted {
            return self.still_ours(hold, joined);
        }
        if let Some(probe) = probe {
            probe.waiting();
        }
        let store = self.store().clone();
        let granted = store.await_grant(self.key(), name, joined.seq);
        let deadline = wait.expired();
        tokio::select! {
            result = granted => {
                result?;
                self.still_ours(hold, Joined { granted: true, ..joined })
            }
            reason = self.lost() => Err(Error::SessionLost(reason)),
            () = deadline => {
                let waited = wait.length();
                if let Err(e) = hold.release().await {
                    tracing::debug!(error = %e, "leaving the queue after a timeout failed");
                }
                Err(Error::Timeout(waited))
            }
        }
    }
}

/// The order in which waiters are granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// In arrival order: a waiter has a place in the queue.
    Fifo,
    /// Whoever asks first after a release: waiters hold no place in the
    /// name's queue (only in its wake-up line) until they have waited the
    /// store's bound.
    Barging,
}

impl Session {
    /// A grant is handed over only while the lease is sure: a grant that
    /// arrives after the local deadline (a store or a process that stood
    /// still, a scheduler that ran this task before the lease's own timer)
    /// may already be another's, so the caller is told the session is lost
    /// and the entry is left (in the background: the dropped hold).
    pub(super) fn still_ours(&self, hold: Hold, joined: Joined) -> Result<Option<(Hold, Joined)>> {
        match self.lost_reason() {
            Some(reason) => {
                drop(hold);
                Err(Error::SessionLost(reason))
            }
            None => Ok(Some((hold, joined))),
        }
    }
}

/// The error for a waiting acquisition that came back without a grant, which
/// the recipes never expect.
pub(crate) fn no_grant() -> Error {
    Error::backend("tenure", "a waiting acquisition returned without a grant")
}

/// How long `Session::acquire` waits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    Forever,
    Until(Instant, Duration),
}

impl Wait {
    /// Resolves at the wait's deadline; never for a wait without one.
    pub(crate) async fn expired(self) {
        match self {
            Wait::Until(at, _) => tokio::time::sleep_until(at).await,
            _ => std::future::pending().await,
        }
    }

    /// The timeout asked for (zero for a wait without one).
    pub(crate) fn length(self) -> Duration {
        match self {
            Wait::Until(_, d) => d,
            _ => Duration::ZERO,
        }
    }

    pub(crate) fn timeout(d: Duration) -> Wait {
        // A timeout too long to represent is no timeout.
        match Instant::now().checked_add(d) {
            Some(at) => Wait::Until(at, d),
            None => Wait::Forever,
        }
    }
}

/// One hold of a queue entry. Dropped while armed, it leaves the queue in the
/// background.
pub(crate) struct Hold {
    pub(crate) session: Session,
    pub(crate) name: Name,
    pub(crate) seq: u64,
    armed: bool,
    /// The hold's metrics (held gauge, hold time), ended when it is dropped.
    metric: Option<crate::session::Tied<HeldMetric>>,
}

impl Hold {
    /// Keeps the entry when this hold is dropped: it then lives as long as
    /// its session.
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// Leaves the queue once; runs to completion even if the caller's future
    /// is dropped.
    pub(crate) async fn release(mut self) -> Result<u32> {
        self.armed = false;
        // The hold time ends when the release begins.
        drop(self.metric.take());
        let store = self.session.store().clone();
        let key = self.session.key().clone();
        let name = self.name.clone();
        let seq = self.seq;
        // Decided inside the call, so that it holds even if the caller
        // stops waiting: a release the store did not answer ends the session.
        let session = self.session.clone();
        let track = {
            let (session, name) = (session.clone(), name.clone());
            move || session.unsettled(&name)
        };
        finish_tracked(
            async move {
                let result = store.leave(&key, &name, seq).await;
                if matches!(&result, Err(e) if e.is_temporary()) {
                    session.end_unconfirmed();
                }
                result
            },
            |_, _unsettled| {},
            track,
        )
        .await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.armed {
            let session = self.session.clone();
            let (name, seq) = (self.name.clone(), self.seq);
            let unsettled = session.unsettled(&name);
            spawn_detached(async move {
                let _unsettled = unsettled;
                match session.store().leave(session.key(), &name, seq).await {
                    // Unanswered: the session ends (see `release`).
                    Err(e) if e.is_temporary() => session.end_unconfirmed(),
                    Err(e) => tracing::debug!(error = %e, %name, "release on drop failed"),
                    Ok(_) => {}
                }
            });
        }
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("name", &self.name)
            .field("seq", &self.seq)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;

    use crate::error::{Error, Result};
    use crate::store::*;
    use crate::{Mutex, Session};

    /// A memory store whose next `fail` leaves answer "unavailable" without
    /// doing anything (the store did not answer), and whose joins hold the
    /// whole thread for `stall_ms` before they answer (a process that stood
    /// still).
    #[derive(Debug)]
    struct Flaky {
        inner: Arc<dyn Store>,
        fail: AtomicU32,
        /// The next this many joins take effect, then answer "unavailable".
        lose_join_answer: AtomicU32,
        /// The next this many joins are refused, taking no effect.
        refuse_join: AtomicU32,
        /// Closes of sessions never answer.
        hang_close: std::sync::atomic::AtomicBool,
        stall_ms: AtomicU32,
    }

    /// A `Flaky` over a fresh memory store, and the same as a `dyn Store`.
    async fn flaky() -> (Arc<Flaky>, Arc<dyn Store>) {
        let flaky = Arc::new(Flaky {
            inner: crate::open("memory://").await.unwrap(),
            fail: AtomicU32::new(0),
            lose_join_answer: AtomicU32::new(0),
            refuse_join: AtomicU32::new(0),
            hang_close: std::sync::atomic::AtomicBool::new(false),
            stall_ms: AtomicU32::new(0),
        });
        let store: Arc<dyn Store> = flaky.clone();
        (flaky, store)
    }

    #[async_trait]
    impl Store for Flaky {
        fn capabilities(&self) -> &Capabilities {
            self.inner.capabilities()
        }
        async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
            self.inner.open_session(spec).await
        }
        async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
            self.inner.keep_alive(session).await
        }
        async fn close_session(&self, session: &SessionKey) -> Result<()> {
            if self.hang_close.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.inner.close_session(session).await
        }
        async fn join(
            &self,
            session: &SessionKey,
            request: JoinRequest<'_>,
        ) -> Result<Option<Joined>> {
            if self
                .refuse_join
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(Error::refused("flaky", "deadlock detected"));
            }
            let joined = self.inner.join(session, request).await;
            if self
                .lose_join_answer
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(Error::unavailable("flaky", "the answer was lost"));
            }
            let stall = self.stall_ms.load(Ordering::SeqCst);
            if stall > 0 {
                // Blocks the runtime's one thread: the lease's own timer
                // cannot run meanwhile.
                std::thread::sleep(Duration::from_millis(u64::from(stall)));
            }
            joined
        }
        async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
            let failing = self
                .fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Err(Error::unavailable("flaky", "no answer"));
            }
            self.inner.leave(session, name, seq).await
        }
        async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
            self.inner.await_grant(session, name, seq).await
        }
        async fn set_value(
            &self,
            key: &SessionKey,
            name: &Name,
            seq: u64,
            value: &[u8],
        ) -> Result<()> {
            self.inner.set_value(key, name, seq, value).await
        }
        async fn queue(&self, name: &Name) -> Result<Queue> {
            self.inner.queue(name).await
        }
        async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
            self.inner.wait_changed(name, version).await
        }
        async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
            self.inner.names(prefix).await
        }
        async fn evict(&self, name: &Name) -> Result<usize> {
            self.inner.evict(name).await
        }
    }

    /// Takes `name` with a new session within 5 s (`why` says what it
    /// means if it cannot), lets it go, and returns the token it was given.
    async fn taken_by_another(store: &Arc<dyn Store>, name: &str, why: &str) -> u64 {
        let other = Session::new(store).await.unwrap();
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            Mutex::new(&other, name).unwrap().lock(),
        )
        .await
        .expect(why)
        .unwrap();
        let token = got.token();
        got.release().await.unwrap();
        other.close().await.unwrap();
        token
    }

    /// A release the store did not answer ends the session: its holders are
    /// told, its next lock fails instead of taking the old entry again with
    /// its old token, its entries go with its close, and a new session gets
    /// the name with a higher token.
    #[tokio::test]
    async fn a_release_without_an_answer_ends_the_session() {
        let (flaky, store) = flaky().await;
        let s = Session::new(&store).await.unwrap();
        let m = Mutex::new(&s, "flaky").unwrap();
        let first = m.lock().await.unwrap();
        let token = first.token();
        flaky.fail.store(1, Ordering::SeqCst);
        let e = first.release().await.unwrap_err();
        assert!(e.is_temporary(), "{e:?}");
        assert_eq!(s.lost_reason(), Some(crate::LostReason::Unconfirmed));
        let e = m.lock().await.unwrap_err();
        assert!(matches!(e, Error::SessionLost(_)), "{e:?}");
        let again = taken_by_another(&store, "flaky", "locked again in time").await;
        assert!(again > token, "{again} after {token}");
    }

    /// A join the store took but whose answer was lost ends the session
    /// (its entry would be granted in its turn and held for as long as the
    /// session lives): the caller and the session's holders are told, and
    /// another session gets the name once the entry goes with the close.
    #[tokio::test]
    async fn a_join_without_an_answer_ends_the_session() {
        let (flaky, store) = flaky().await;
        let s = Session::new(&store).await.unwrap();
        let held = Mutex::new(&s, "other-name").unwrap().lock().await.unwrap();
        flaky.lose_join_answer.store(1, Ordering::SeqCst);
        let e = Mutex::new(&s, "lost-answer")
            .unwrap()
            .lock()
            .await
            .unwrap_err();
        assert!(e.is_temporary(), "{e:?}");
        assert_eq!(s.lost_reason(), Some(crate::LostReason::Unconfirmed));
        assert!(held.is_lost());
        taken_by_another(
            &store,
            "lost-answer",
            "the entry whose answer was lost stayed behind",
        )
        .await;
    }

    /// A join the store refused (rolled back: a deadlock, a busy database)
    /// took no effect: the caller is told, and the session goes on.
    #[tokio::test]
    async fn a_refused_join_leaves_the_session_alive() {
        let (flaky, store) = flaky().await;
        let s = Session::new(&store).await.unwrap();
        flaky.refuse_join.store(1, Ordering::SeqCst);
        let m = Mutex::new(&s, "refused").unwrap();
        let e = m.lock().await.unwrap_err();
        assert!(e.is_temporary(), "{e:?}");
        assert_eq!(e.to_string(), "flaky store unavailable: deadlock detected");
        assert!(!s.is_lost());
        let guard = m.lock().await.unwrap();
        assert_eq!(guard.hold_count(), 1);
        guard.release().await.unwrap();
        s.close().await.unwrap();
    }

    /// A close the store never answers returns within the session's TTL,
    /// with a temporary error, instead of holding its caller (an elector's
    /// stop, a program's exit) for as long as the store is stuck.
    #[tokio::test]
    async fn a_close_without_an_answer_returns_within_the_ttl() {
        let (flaky, store) = flaky().await;
        let options = crate::SessionOptions::new().ttl(Duration::from_secs(1));
        let s = Session::with_options(&store, options).await.unwrap();
        flaky.hang_close.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.close())
            .await
            .expect("the close held its caller past the TTL");
        let e = closed.unwrap_err();
        assert!(e.is_temporary(), "{e:?}");
        assert!(e.to_string().contains("TTL"), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert!(s.is_lost());
    }

    /// A grant that comes back after the lease's deadline is not handed
    /// over, even when the task that marks the session lost has not run yet
    /// (here: the one thread stood still through the deadline).
    #[tokio::test(flavor = "current_thread")]
    async fn a_grant_after_the_deadline_is_not_handed_over() {
        let (flaky, store) = flaky().await;
        let options = crate::SessionOptions::new().ttl(Duration::from_secs(1));
        let s = Session::with_options(&store, options).await.unwrap();
        flaky.stall_ms.store(1_200, Ordering::SeqCst);
        let e = Mutex::new(&s, "late")
            .unwrap()
            .try_lock()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::SessionLost(_)), "{e:?}");
        assert!(s.is_lost());
        flaky.stall_ms.store(0, Ordering::SeqCst);
        // The entry did not stay behind: another session gets the name.
        taken_by_another(&store, "late", "locked in time").await;
    }
}
