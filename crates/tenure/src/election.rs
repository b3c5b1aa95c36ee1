//! Leader election: campaign, resign, proclaim, leader, observe. The
//! elector a service keeps for its life is in [`crate::elector`].
//!
//! An election is a queue of exclusive entries whose head is the leader, as
//! in the usual lease-based election recipes: candidates wait in arrival
//! order, and the leader's fencing token numbers its term.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use crate::acquire::{no_grant, Hold, Order, Wait};
use crate::error::LostReason;
use crate::error::Result;
use crate::metrics::{LeaderMetric, Recipe};
use crate::session::Session;
use crate::store::{Entry, EntryKind, Name, Store};

/// An election on one name.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let session = tenure::Session::new(&store).await?;
/// let election = tenure::Election::new(&session, "scheduler")?;
/// let term = election.campaign("10.0.0.7:8080").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.token, term.token());
/// assert_eq!(leader.value, b"10.0.0.7:8080");
/// term.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    session: Session,
    name: Name,
}

/// The current leader, as anyone may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's fencing token, which numbers its term.
    pub token: u64,
    /// The value the leader campaigned with or last proclaimed.
    pub value: Vec<u8>,
    /// The leader session's public label.
    pub label: String,
    /// The leader session's public tag.
    pub session_tag: String,
    /// When the term began, by the store's clock, if the store knows.
    pub since: Option<SystemTime>,
}

impl Leader {
    /// The value as text (invalid UTF-8 replaced).
    pub fn value_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }

    fn from_queue(entries: &[Entry]) -> Option<Leader> {
        entries.first().filter(|e| e.granted).map(|e| Leader {
            token: e.seq,
            value: e.value.clone(),
            label: e.label.clone(),
            session_tag: e.session_tag.clone(),
            since: e.granted_at,
        })
    }
}

impl Election {
    /// An election on `name`, campaigned through `session`.
    pub fn new(session: &Session, name: impl AsRef<str>) -> Result<Self> {
        Ok(Election {
            session: session.clone(),
            name: Name::new(name)?,
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// Waits until this session leads, then returns its term. Campaigning
    /// again through a session that already campaigns joins the same place in
    /// line.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future withdraws the candidacy.
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Term> {
        let acquired = self
            .session
            .acquire(
                &self.name,
                EntryKind::Exclusive,
                value.into(),
                Wait::Forever,
                Order::Fifo,
                Some(Recipe::Election),
            )
            .await?;
        let (hold, _) = acquired.ok_or_else(no_grant)?;
        Ok(Term::new(hold))
    }

    /// Becomes leader only if nobody leads or waits now.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Election::campaign`].
    pub async fn try_campaign(&self, value: impl Into<Vec<u8>>) -> Result<Option<Term>> {
        let acquired = self
            .session
            .acquire(
                &self.name,
                EntryKind::Exclusive,
                value.into(),
                Wait::No,
                Order::Fifo,
                Some(Recipe::Election),
            )
            .await?;
        Ok(acquired.map(|(hold, _)| Term::new(hold)))
    }

    /// The current leader, if any.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        leader(self.session.store().as_ref(), &self.name).await
    }

    /// A stream of leadership changes, starting with the current state.
    pub fn observe(&self) -> Observer {
        Observer::new(self.session.store().clone(), self.name.clone())
    }
}

/// Reads the current leader of `name` without a session.
pub async fn leader(store: &dyn Store, name: &Name) -> Result<Option<Leader>> {
    Ok(Leader::from_queue(&store.queue(name).await?.entries))
}

/// One term of leadership. Dropping it resigns (best-effort, as a dropped
/// [`MutexGuard`](crate::MutexGuard) releases).
#[must_use = "leadership is resigned when the term is dropped"]
#[derive(Debug)]
pub struct Term {
    hold: Hold,
    /// The leader gauges, while the term lives (metrics on).
    leading: Option<crate::session::Tied<LeaderMetric>>,
}

impl Term {
    fn new(hold: Hold) -> Term {
        let leading =
            crate::metrics::enabled().then(|| hold.session.tie(LeaderMetric::elected(&hold.name)));
        Term { hold, leading }
    }

    /// The term's fencing token.
    pub fn token(&self) -> u64 {
        self.hold.seq
    }

    /// The election's name.
    pub fn name(&self) -> &Name {
        &self.hold.name
    }

    /// Resolves when leadership may be lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.session.lost()
    }

    /// Whether leadership may already be lost.
    pub fn is_lost(&self) -> bool {
        self.hold.session.is_lost()
    }

    /// Publishes a new value for this term; observers see it.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) if this term is over; [`Error::SessionLost`](crate::Error::SessionLost).
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        self.hold.session.check_alive()?;
        let value = value.into();
        self.hold
            .session
            .store()
            .set_value(
                self.hold.session.key(),
                &self.hold.name,
                self.hold.seq,
                &value,
            )
            .await
    }

    /// Steps down; the next candidate in line leads.
    ///
    /// # Cancel safety
    ///
    /// Runs to completion even if this future is dropped.
    pub async fn resign(self) -> Result<()> {
        // Leadership ends as the resignation begins.
        drop(self.leading);
        self.hold.release().await.map(|_| ())
    }
}

/// Leadership changes of one election, in order.
#[derive(Debug)]
pub struct Observer {
    store: Arc<dyn Store>,
    name: Name,
    version: Option<u64>,
    last: Option<Option<(u64, Vec<u8>)>>,
}

impl Observer {
    /// Observes `name` on `store` without a session.
    pub fn new(store: Arc<dyn Store>, name: Name) -> Self {
        Observer {
            store,
            name,
            version: None,
            last: None,
        }
    }

    /// The next state: first the current one, then each change of leader
    /// (a new term) or of its value (a proclaim). `None` means no one leads.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: no change is skipped by dropping the future, though
    /// changes that happen between calls may be merged into the latest state.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            if let Some(version) = self.version {
                self.version = Some(self.store.wait_changed(&self.name, version).await?);
            }
            let queue = self.store.queue(&self.name).await?;
            self.version = Some(queue.version);
            let leader = Leader::from_queue(&queue.entries);
            let key = leader.as_ref().map(|l| (l.token, l.value.clone()));
            if self.last.as_ref() != Some(&key) {
                self.last = Some(key);
                return Ok(leader);
            }
        }
    }
}
