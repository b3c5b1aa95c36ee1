//! The elector a service keeps for its life: it campaigns in a loop, calls
//! back once per term, and answers "am I the leader?" from anywhere in the
//! process; it can be asked to resign, and paused across the cluster.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::election::{Election, Term};
use crate::error::{Error, Result};
use crate::session::{Session, SessionOptions};
use crate::store::{Name, Store};

type Callback = Box<dyn FnMut(&Term) + Send>;

/// How often a paused elector, which has no session and so no renew
/// interval of its own, reads whether the pause was lifted.
const PAUSED_POLL: Duration = Duration::from_secs(1);

/// Campaigns in a loop with callbacks once per term: `on_elected` when a term
/// begins and `on_defeated` when it ends — by loss of the lease, a
/// resignation, a pause or shutdown. After a term ends it opens a new
/// session and campaigns again (a new session is always a new term), unless
/// the elector is paused.
///
/// [`Elector::handle`] gives a handle the rest of the service keeps:
/// [`ElectorHandle::is_leader`] without a round trip,
/// [`ElectorHandle::resign`] (from a callback too), and the elector's
/// cluster-wide pause ([`ElectorHandle::board`]). A
/// [`Schedule`](crate::Schedule) bound to the handle runs any number of
/// jobs only while this instance leads.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
/// let mut tx = Some(tx);
/// let elector = tenure::Elector::new(&store, "scheduler", "node-a")?
///     .on_elected(move |term| {
///         println!("leading with token {}", term.token());
///         if let Some(tx) = tx.take() { let _ = tx.send(()); }
///     })
///     .on_defeated(|term| println!("term {} over", term.token()));
/// let handle = elector.handle();
/// // Run until the first term begins, then shut down (which resigns).
/// let check = handle.clone();
/// elector.run(async move {
///     let _ = rx.await;
///     assert!(check.is_leader());
/// }).await?;
/// assert!(!handle.is_leader());
/// # Ok(()) }
/// ```
pub struct Elector {
    shared: Arc<Shared>,
    value: Vec<u8>,
    options: SessionOptions,
    on_elected: Callback,
    on_defeated: Callback,
    stop_grace: Duration,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.shared.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the elector's loop and its handles share.
struct Shared {
    store: Arc<dyn Store>,
    name: Name,
    /// The term this instance holds now, if any.
    leading: watch::Sender<Option<Leading>>,
    /// Wakes the loop to resign the current term.
    resign: Notify,
    /// Whether the elector read itself paused last time it looked.
    paused: std::sync::atomic::AtomicBool,
}

/// The term an elector holds: its token and the session that holds it.
#[derive(Clone)]
pub(crate) struct Leading {
    pub(crate) token: u64,
    pub(crate) session: Session,
    /// Where the term is in its life.
    phase: Phase,
    /// Runs of bound schedules in progress under the term.
    runs: usize,
}

/// A term's phase: runs may start while it leads; while it drains (a
/// resignation) no new run starts and those in progress go on; while it
/// stops (a pause, a shutdown, a drain's grace over) they are asked to stop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Leads,
    Drains,
    Stops,
}

/// A run in progress under a term; the term ends only once none is left
/// (or the elector's stop grace is over).
pub(crate) struct RunSlot {
    shared: Arc<Shared>,
    token: u64,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        self.shared.leading.send_if_modified(|l| match l {
            Some(l) if l.token == self.token => {
                l.runs = l.runs.saturating_sub(1);
                true
            }
            _ => false,
        });
    }
}

/// A handle on a running [`Elector`], cheap to clone: whether this instance
/// leads, the term's token, resigning and pausing.
#[derive(Clone)]
pub struct ElectorHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ElectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorHandle")
            .field("name", &self.shared.name)
            .field("token", &self.token())
            .finish()
    }
}

/// How a term ended.
enum Ended {
    Lost,
    Resigned,
    Paused,
    Shutdown,
}

impl Elector {
    /// An elector for `name` that campaigns with `value`.
    pub fn new(
        store: &Arc<dyn Store>,
        name: impl AsRef<str>,
        value: impl Into<Vec<u8>>,
    ) -> Result<Self> {
        Ok(Elector {
            shared: Arc::new(Shared {
                store: store.clone(),
                name: Name::new(name)?,
                leading: watch::channel(None).0,
                resign: Notify::new(),
                paused: std::sync::atomic::AtomicBool::new(false),
            }),
            value: value.into(),
            options: SessionOptions::default(),
            on_elected: Box::new(|_| {}),
            on_defeated: Box::new(|_| {}),
            stop_grace: Duration::ZERO,
        })
    }

    /// How a term that ends by choice ends its bound schedules' runs
    /// before it resigns (drain, then release). On a resignation
    /// ([`ElectorHandle::resign`]) no new run starts and the runs in
    /// progress go on for up to `grace`; then, as on a pause or a
    /// shutdown, they are told to stop ([`Tick::stopped`](crate::Tick::stopped))
    /// and given up to `grace` more to end. Only then does the elector
    /// resign, so no other instance's term begins while a run of this one
    /// goes on. A term lost with its lease ends at once. Zero (the
    /// default) resigns at once.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Options for the sessions the elector opens.
    pub fn session_options(mut self, options: SessionOptions) -> Self {
        self.options = options;
        self
    }

    /// Called once when a term begins. Start the leader's work here, and stop
    /// it when `term.lost()` resolves or `on_defeated` is called.
    pub fn on_elected(mut self, f: impl FnMut(&Term) + Send + 'static) -> Self {
        self.on_elected = Box::new(f);
        self
    }

    /// Called once when a term ends.
    pub fn on_defeated(mut self, f: impl FnMut(&Term) + Send + 'static) -> Self {
        self.on_defeated = Box::new(f);
        self
    }

    /// A handle for the rest of the service (take it before [`Elector::run`]).
    pub fn handle(&self) -> ElectorHandle {
        ElectorHandle {
            shared: self.shared.clone(),
        }
    }

    /// Campaigns until `shutdown` resolves, then resigns (if leading) and
    /// returns. Temporary store errors are retried with a backoff; invalid
    /// options are returned at once.
    ///
    /// While the elector is paused ([`ElectorBoard::pause`], on any
    /// instance) it does not campaign, and a sitting leader steps down
    /// within one renew interval of the pause. The elector lists itself in
    /// the store as it starts ([`ElectorBoard::electors`]).
    ///
    /// # Stopping
    ///
    /// Once `shutdown` resolves, `run` returns within
    /// [`Elector::stop_grace`] plus the session's TTL, whatever the store
    /// does: the runs of the term get the grace, then the resignation and
    /// the session's close get what is left. If the store has not answered
    /// by then, `run` returns [`Error::Unavailable`]; the session stops
    /// renewing, so its lease (and the term) lapses on the store's side
    /// within its TTL. Either way [`ElectorHandle::is_leader`] is `false`
    /// once `run` has returned.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let bound = self.stop_grace + self.options.lease_ttl();
        let shared = self.shared.clone();
        crate::task::stop_within(
            |own| self.campaign_until(own),
            shutdown,
            bound,
            || {
                shared.leading.send_replace(None);
                Err(Error::unavailable(
                    shared.store.capabilities().backend,
                    format!(
                        "the elector {} did not stop within {bound:?} (its stop grace and its \
                         session's TTL): the store did not answer; its lease lapses on the \
                         store's side",
                        shared.name
                    ),
                ))
            },
        )
        .await
    }

    /// [`Elector::run`]'s loop, which ends when `shutdown` resolves.
    async fn campaign_until(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let Elector {
            shared,
            value,
            options,
            mut on_elected,
            mut on_defeated,
            stop_grace,
        } = self;
        tokio::pin!(shutdown);
        #[cfg(feature = "schedule")]
        let board = tokio::select! {
            board = shared.listed_board() => board,
            () = &mut shutdown => return Ok(()),
        };
        #[cfg(not(feature = "schedule"))]
        let board: Option<()> = None;
        let paused = || shared.read_paused(board.as_ref());
        let mut backoff = Duration::from_millis(100);
        loop {
            if paused().await {
                tokio::select! {
                    () = tokio::time::sleep(PAUSED_POLL) => continue,
                    () = &mut shutdown => return Ok(()),
                }
            }
            let session = tokio::select! {
                s = Session::with_options(&shared.store, options.clone()) => s,
                () = &mut shutdown => return Ok(()),
            };
            let session = match session {
                Ok(s) => s,
                Err(e) if e.is_temporary() => {
                    tracing::warn!(error = %e, "elector cannot open a session; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => return Ok(()),
                    }
                    backoff = (backoff * 2).min(crate::DEFAULT_TTL);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let every = session.renew_interval();
            let election = Election::new(&session, shared.name.as_str())?;
            let campaign = election.campaign(value.clone());
            tokio::pin!(campaign);
            // A candidate withdraws when paused, read once per renew interval.
            let term = loop {
                tokio::select! {
                    t = &mut campaign => break Some(t),
                    () = tokio::time::sleep(every) => {
                        if paused().await {
                            break None;
                        }
                    }
                    () = &mut shutdown => {
                        let _ = session.close().await;
                        return Ok(());
                    }
                }
            };
            let Some(term) = term else {
                let _ = session.close().await;
                continue;
            };
            let term = match term {
                Ok(t) => {
                    backoff = Duration::from_millis(100);
                    t
                }
                Err(e) if e.is_temporary() || matches!(e, Error::SessionLost(_)) => {
                    tracing::warn!(error = %e, "elector's campaign failed; retrying");
                    let _ = session.close().await;
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = &mut shutdown => return Ok(()),
                    }
                    backoff = (backoff * 2).min(crate::DEFAULT_TTL);
                    continue;
                }
                Err(e) => {
                    let _ = session.close().await;
                    return Err(e);
                }
            };
            // Paused while this candidate waited its turn: no term begins.
            if paused().await {
                let _ = term.resign().await;
                let _ = session.close().await;
                continue;
            }
            // Listening before the callback runs: a resignation asked from
            // inside it is not missed.
            let resigned = shared.resign.notified();
            tokio::pin!(resigned);
            resigned.as_mut().enable();
            shared.leading.send_replace(Some(Leading {
                token: term.token(),
                session: session.clone(),
                phase: Phase::Leads,
                runs: 0,
            }));
            on_elected(&term);
            let ended = loop {
                tokio::select! {
                    _ = term.lost() => break Ended::Lost,
                    () = &mut resigned => break Ended::Resigned,
                    () = tokio::time::sleep(every) => {
                        // A store slow to answer does not hold up a shutdown.
                        tokio::select! {
                            p = paused() => if p {
                                break Ended::Paused;
                            },
                            () = &mut shutdown => break Ended::Shutdown,
                        }
                    }
                    () = &mut shutdown => break Ended::Shutdown,
                }
            };
            // Drain, then release: the term's runs end before it does.
            match ended {
                Ended::Lost => {}
                Ended::Resigned => {
                    shared.wind_down(&term, Phase::Drains, stop_grace).await;
                    shared.wind_down(&term, Phase::Stops, stop_grace).await;
                }
                Ended::Paused | Ended::Shutdown => {
                    shared.wind_down(&term, Phase::Stops, stop_grace).await;
                }
            }
            // Not the leader any more from here on, whatever the store says.
            shared.leading.send_replace(None);
            on_defeated(&term);
            match ended {
                Ended::Lost => drop(term),
                Ended::Resigned | Ended::Paused | Ended::Shutdown => {
                    if let Err(e) = term.resign().await {
                        tracing::warn!(error = %e, elector = %shared.name, "resigning failed; the term ends with the session");
                    }
                }
            }
            let _ = session.close().await;
            if let Ended::Shutdown = ended {
                return Ok(());
            }
        }
    }
}

impl Shared {
    /// The elector's board, with the elector listed on it (a store that
    /// cannot list it does not stop the elector).
    #[cfg(feature = "schedule")]
    async fn listed_board(&self) -> Option<ElectorBoard> {
        match ElectorBoard::new(&self.store, self.name.as_str()) {
            Ok(board) => {
                if let Err(e) = board.register().await {
                    tracing::warn!(error = %e, elector = %self.name, "cannot list the elector in the store");
                }
                Some(board)
            }
            Err(e) => {
                tracing::warn!(error = %e, elector = %self.name, "the elector cannot be paused: its name is too long for its board");
                None
            }
        }
    }

    /// Puts the term in `phase` and waits, at most `grace`, until no run
    /// of it is left (or the term is lost).
    async fn wind_down(&self, term: &Term, phase: Phase, grace: Duration) {
        let mut rx = self.leading.subscribe();
        self.leading.send_modify(|l| {
            if let Some(l) = l.as_mut().filter(|l| l.token == term.token()) {
                l.phase = phase;
            }
        });
        let idle = async {
            let _ = rx
                .wait_for(|l| l.as_ref().is_none_or(|l| l.runs == 0))
                .await
                .map(|_| ());
        };
        tokio::select! {
            _ = tokio::time::timeout(grace, idle) => {}
            _ = term.lost() => {}
        }
    }

    /// Whether the elector is paused now: read from the store where it
    /// keeps cells; a temporary error keeps what was last read.
    #[cfg(feature = "schedule")]
    async fn read_paused(&self, board: Option<&ElectorBoard>) -> bool {
        let Some(board) = board else {
            return false;
        };
        let now = match board.paused().await {
            Ok(p) => p.is_some(),
            // What tenure did not write is taken as a pause: an operator's
            // wish is never overridden by a bad cell.
            Err(Error::InvalidArgument { .. }) => true,
            Err(e) => {
                tracing::warn!(error = %e, elector = %self.name, "cannot read whether paused");
                self.paused.load(std::sync::atomic::Ordering::Relaxed)
            }
        };
        self.paused.store(now, std::sync::atomic::Ordering::Relaxed);
        now
    }

    /// Without the `schedule` feature an elector has no board to pause it.
    #[cfg(not(feature = "schedule"))]
    async fn read_paused(&self, _: Option<&()>) -> bool {
        false
    }
}

impl ElectorHandle {
    /// The election's name.
    pub fn name(&self) -> &Name {
        &self.shared.name
    }

    /// Whether this instance leads now, answered here without asking the
    /// store: false from the moment the term's [`Term::lost`] resolves (or
    /// the term ends any other way).
    pub fn is_leader(&self) -> bool {
        self.shared
            .leading
            .borrow()
            .as_ref()
            .is_some_and(|l| !l.session.is_lost())
    }

    /// The current term's fencing token, while this instance leads.
    pub fn token(&self) -> Option<u64> {
        self.shared
            .leading
            .borrow()
            .as_ref()
            .filter(|l| !l.session.is_lost())
            .map(|l| l.token)
    }

    /// Asks the elector to step down now; it campaigns again at once,
    /// behind the candidates already waiting (so one of them leads next if
    /// there is one). Returns whether this instance was leading. Safe to
    /// call from inside [`Elector::on_elected`].
    pub fn resign(&self) -> bool {
        let leading = self.is_leader();
        if leading {
            self.shared.resign.notify_waiters();
        }
        leading
    }

    /// Whether the elector was paused when it last looked (once per renew
    /// interval); [`ElectorBoard::paused`] asks the store.
    pub fn is_paused(&self) -> bool {
        self.shared
            .paused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The elector's board: its cluster-wide pause.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name too long to carry a board.
    #[cfg(feature = "schedule")]
    pub fn board(&self) -> Result<ElectorBoard> {
        ElectorBoard::new(&self.shared.store, self.shared.name.as_str())
    }

    /// Waits until this instance leads, and returns the term.
    pub(crate) async fn leading(&self) -> Leading {
        let mut rx = self.shared.leading.subscribe();
        loop {
            if let Some(l) = rx.borrow_and_update().as_ref() {
                if !l.session.is_lost() && l.phase == Phase::Leads {
                    return l.clone();
                }
            }
            if rx.changed().await.is_err() {
                // The elector is gone: nobody leads through it again.
                std::future::pending::<()>().await;
            }
        }
    }

    /// A run may start under the term numbered `token`: it still leads and
    /// does not drain. The term ends only once the slot is dropped.
    pub(crate) fn run_slot(&self, token: u64) -> Option<RunSlot> {
        let mut granted = false;
        self.shared.leading.send_if_modified(|l| {
            if let Some(l) = l.as_mut() {
                if l.token == token && l.phase == Phase::Leads && !l.session.is_lost() {
                    l.runs += 1;
                    granted = true;
                }
            }
            false
        });
        granted.then(|| RunSlot {
            shared: self.shared.clone(),
            token,
        })
    }

    /// Resolves once the runs of the term numbered `token` must stop: the
    /// term lost, or it stops (paused, shut down, a drain's grace over).
    pub(crate) fn term_over(&self, token: u64) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.leading.subscribe();
        async move {
            loop {
                let lost = match rx.borrow_and_update().as_ref() {
                    Some(l) if l.token == token && l.phase != Phase::Stops => l.session.lost(),
                    _ => return,
                };
                tokio::select! {
                    _ = lost => return,
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(feature = "schedule")]
pub use board::ElectorBoard;

#[cfg(feature = "schedule")]
mod board {
    use std::sync::Arc;

    use chrono::{DateTime, Utc};

    use crate::board::{PauseCell, Paused, Registry};
    use crate::cell::Cell;
    use crate::error::Result;
    use crate::store::{Name, Store};

    /// The cell that lists the electors started on a store.
    const REGISTRY: &str = "tenure.electors";

    /// An elector's shared state in the store: its cluster-wide pause, and
    /// its place in the list of electors started here.
    ///
    /// While paused, no instance of the elector campaigns and a sitting
    /// leader steps down within one renew interval. A pause with an end
    /// lifts by itself at that time, judged by each instance's own clock
    /// (as a schedule's pause). Needs a store with cells
    /// ([`Capabilities::cells`](crate::Capabilities)): on one without, such
    /// as one over independent nodes, reads find no pause and a pause is
    /// refused with [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> tenure::Result<()> {
    /// let store = tenure::open("memory://").await?;
    /// let board = tenure::ElectorBoard::new(&store, "scheduler")?;
    /// board.pause(None, "ops", "failover drill").await?;
    /// assert!(board.paused().await?.is_some());
    /// assert!(board.resume().await?);
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone)]
    pub struct ElectorBoard {
        store: Arc<dyn Store>,
        name: Name,
        pause: PauseCell,
    }

    impl ElectorBoard {
        /// The board of the election `name`.
        ///
        /// # Errors
        ///
        /// [`Error::InvalidName`](crate::Error::InvalidName) for a name
        /// too long to carry a board (more than 234 bytes).
        pub fn new(store: &Arc<dyn Store>, name: impl AsRef<str>) -> Result<Self> {
            let name = Name::new(name)?;
            Ok(ElectorBoard {
                store: store.clone(),
                pause: PauseCell(Cell::new(store, format!("tenure.elector-pause:{name}"))?),
                name,
            })
        }

        /// The election's name.
        pub fn name(&self) -> &str {
            self.name.as_str()
        }

        /// The electors started on this store, sorted; empty on a store
        /// without cells.
        pub async fn electors(store: &Arc<dyn Store>) -> Result<Vec<String>> {
            if !store.capabilities().cells {
                return Ok(Vec::new());
            }
            Registry(Cell::new(store, REGISTRY)?).names().await
        }

        /// Whether an instance of this elector has started on this store.
        pub async fn exists(&self) -> Result<bool> {
            Ok(Self::electors(&self.store)
                .await?
                .iter()
                .any(|n| n == self.name.as_str()))
        }

        /// The pause in force now (by this machine's clock), if any.
        pub async fn paused(&self) -> Result<Option<Paused>> {
            if !self.store.capabilities().cells {
                return Ok(None);
            }
            self.pause.paused().await
        }

        /// Pauses the elector on every instance, until `until` or until
        /// resumed; a new pause replaces one in force.
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

        /// Lists the elector (best effort: nothing on a store without cells).
        pub(crate) async fn register(&self) -> Result<()> {
            if !self.store.capabilities().cells {
                return Ok(());
            }
            Registry(Cell::new(&self.store, REGISTRY)?)
                .add(self.name.as_str())
                .await
        }
    }
}
