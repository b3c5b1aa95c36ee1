//! Waiting, shared by the backends that cannot push every change: a local
//! or pushed notification wakes a waiter at once, a backoff poll catches the
//! rest (such as a holder that expires silently).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::store::{Entry, EntryKind, Name, Store};

/// What a waiter learns from one look at its entry.
#[derive(Debug, Clone)]
pub(crate) enum Look {
    /// Granted.
    Granted,
    /// Not yet.
    Wait {
        /// How long until the expiry that could grant the entry, or move it
        /// up, without a release: the holders' first expiry for the next in
        /// line, the expiry of the entry just ahead for the others. With a
        /// `watch`, only a hint.
        until: Option<Duration>,
        /// Whether the entry is next in line: a release may grant it.
        next: bool,
        /// On stores whose clock is not trusted with expiry: what blocks the
        /// entry, for the waiter to watch (see [`until_granted`]).
        watch: Option<Watch>,
    },
}

/// What blocks a waiter, on a store whose clock is not trusted with expiry
/// (a server's wall clock, which anyone can set and which steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The blocking entries as the store writes them, comma-separated:
    /// `seq:renewals:lapse`, which any renewal of one changes.
    pub blockers: String,
    /// Their longest TTL.
    pub ttl: Duration,
}

/// How long a watcher must see blockers of TTL `ttl` unchanged before it
/// may call them expired: their TTL, plus 1 % and 10 ms for the difference
/// in clock rates (a holder gives up at its TTL less 1 % and 2 ms).
pub(crate) fn confirm_after(ttl: Duration) -> Duration {
    ttl + ttl / 100 + Duration::from_millis(10)
}

/// A newcomer's confirmation (a try-lock that found nobody in the queue
/// alive by the store's clock, holders and waiters): watches them for [`confirm_after`] their TTL, then
/// runs `expire`, which ends those still as in `watch`; says whether any
/// ended. A TTL of 0 would be a store that lost a session's record: never
/// confirmed by.
pub(crate) async fn confirm_lapsed<F, Fut>(watch: &Watch, expire: F) -> Result<bool>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    if watch.ttl.is_zero() {
        return Ok(false);
    }
    tokio::time::sleep(confirm_after(watch.ttl)).await;
    expire().await
}

/// How old a join's answer may be, at most, when a waiter takes it for its
/// first look (see [`JoinedLook::fresh`]).
pub(crate) const JOINED_FRESH: Duration = Duration::from_secs(1);

/// What the joins of queued entries said a waiter's first look would, by
/// [`grant_key`], kept for the waiter ([`until_granted`]'s `first`): one
/// older than [`JOINED_FRESH`] is no use ([`RecentKeys`]).
#[derive(Clone)]
pub(crate) struct JoinedLooks(RecentKeys<Look>);

impl Default for JoinedLooks {
    fn default() -> Self {
        Self(RecentKeys::new(JOINED_FRESH))
    }
}

impl JoinedLooks {
    /// Keeps a join's answer for the waiter of `name`'s entry `seq`.
    pub(crate) fn keep(&self, name: &Name, seq: u64, wait: Look) {
        self.0.keep(grant_key(name.as_str(), seq), wait);
    }

    /// Takes the answer kept for the waiter of `name`'s entry `seq` (also
    /// on every release: free while nothing is kept).
    pub(crate) fn take(&self, name: &Name, seq: u64) -> Option<JoinedLook> {
        self.0
            .take_kept(&grant_key(name.as_str(), seq))
            .map(|(at, look)| JoinedLook {
                at,
                look,
                without_push: false,
            })
    }
}

/// One join's answer, taken by its waiter.
pub(crate) struct JoinedLook {
    at: Instant,
    look: Look,
    without_push: bool,
}

impl JoinedLook {
    /// Marks the answer as one to take for the first look without pushed
    /// notifications and without a check, on a store that pushes nothing
    /// (MySQL): a release of this process announces what it granted
    /// ([`Listeners::granted`]), which keeps the announcement for a waiter
    /// that listens late. Anything else is found by polling, as after a
    /// look: a grant by another process, or one after a session ended here
    /// (whose wake-up goes to the first waiter of the name in this process,
    /// and is lost before it listens). Such a waiter is next in line, or
    /// the first of its name here, or is handed polling on by the one
    /// ahead, so it polls, from the shortest interval.
    pub(crate) fn without_push(mut self) -> Self {
        self.without_push = true;
        self
    }

    /// The answer, if it is still fresh enough to stand in for a look: a
    /// blocker's renewal after the join read it goes unseen until the
    /// waiter's next look, as one after any look's read does. The next in
    /// line looks every renew interval (a third of the TTL) anyway; for the
    /// others the gap is kept under a tenth of the blockers' TTL (and
    /// [`JOINED_FRESH`]): a few round trips as a rule, more only when the
    /// waiter had to open its notification connection first.
    fn is_fresh(&self) -> bool {
        let limit = match &self.look {
            Look::Wait { watch: Some(w), .. } => (w.ttl / 10).min(JOINED_FRESH),
            _ => JOINED_FRESH,
        };
        self.at.elapsed() <= limit
    }
}

/// [`until_granted`]'s `first` for a store without a stand-in first look.
pub(crate) type NoStandIn = (JoinedLook, fn() -> std::future::Ready<Result<bool>>);

/// Looks until granted, and between looks sleeps until one of:
/// - `listening` is notified (a grant the store pushed, or a local change),
/// - the expiry the look named (so a holder that dies silently is noticed),
/// - while `pushed` says the store's notifications are not arriving, and
///   only for the waiter a release may grant or the first waiter of the name
///   in this process: a backoff poll from `min`, doubling to `max`.
///
/// So with notifications working no waiter polls, and without them the
/// polls of a process on a name do not grow with its number of waiters.
/// `listening` is armed before each look, so a wake-up that comes during
/// the look is not lost. `pushed` is asked before each look (and may
/// restore the notification path).
///
/// `first`, when given, is a join's answer ([`JoinedLooks`]) and a check
/// that the entry still waits: while notifications arrive and the answer
/// is fresh, the check (a plain read) stands in for the first look, so
/// that a waiter need not look once it listens; it answers `false` (a
/// grant came in between, or the entry is gone) to have the waiter look.
///
/// When a look names a [`Watch`] (the store's clock is not trusted with
/// expiry), expiry is judged by this client's monotonic clock instead: the
/// waiter remembers when it first saw each blocker as it is
/// (`seq:renewals:lapse`), and passes those it has seen unchanged for
/// [`confirm_after`] the TTL to the next look, which ends the sessions of
/// those still exactly so (none renewed), in the same atomic step. Each
/// blocker is watched on its own: a live co-holder that renews does not
/// keep a dead one in place. Every holder's own deadline passed by then: its
/// last renewal came before the waiter first saw the fingerprint. The next
/// in line looks at least every third of the TTL (a holder's renew
/// interval), so a crashed holder is released within its TTL and one renew
/// interval (and 1 % and 10 ms) of its last renewal; a waiter further back
/// looks once per TTL of the entry ahead.
pub(crate) async fn until_granted<F, Fut, H, HF, C, CF>(
    listening: &Listening,
    min: Duration,
    max: Duration,
    mut pushed: H,
    mut look: F,
    mut first: Option<(JoinedLook, C)>,
) -> Result<()>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<Look>>,
    H: FnMut() -> HF,
    HF: Future<Output = bool>,
    C: FnOnce() -> CF,
    CF: Future<Output = Result<bool>>,
{
    let mut backoff = min;
    // Each blocker as the store wrote it ("seq:renewals:lapse"), and when
    // this waiter first saw it so (after the look that showed it returned);
    // and the blockers' longest TTL.
    let mut watched: HashMap<String, Instant> = HashMap::new();
    let mut ttl = Duration::ZERO;
    // Whether this waiter polled after its last look: one that starts to
    // (handed polling on, or next in line now) polls from the shortest
    // interval, whatever its sleeps doubled the backoff to meanwhile.
    let mut polling = false;
    loop {
        let notified = listening.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Armed with `notified`, so that a hand-over during the look is
        // not lost either.
        let handed_over = listening.hand_over().notified();
        tokio::pin!(handed_over);
        handed_over.as_mut().enable();
        // Announced with the grant itself: a look would only say so again
        // (one round trip more on every handoff).
        if listening.announced_granted() {
            return Ok(());
        }
        let mut pushed_now = pushed().await;
        // A TTL of 0 would be a store that lost a session's record: never
        // confirm by it.
        let due: Vec<&str> = watched
            .iter()
            .filter(|(_, since)| !ttl.is_zero() && since.elapsed() >= confirm_after(ttl))
            .map(|(blocker, _)| blocker.as_str())
            .collect();
        let confirm = (!due.is_empty()).then(|| due.join(","));
        // Only after `pushed` said notifications arrive (and so this
        // waiter's are subscribed): a grant from then on is announced, and
        // one before shows in the check. So the wake-ups until now (a
        // notification connection just opened wakes every waiter, for what
        // it missed) are the check's: listen afresh, and ask `pushed`
        // again, in case the connection dropped in between (its wake-up
        // went to the listener just replaced).
        let stand_in = match first.take() {
            // (A grant announced before this waiter listened was kept for
            // it, and shows above.)
            Some((joined, _)) if joined.without_push && joined.is_fresh() => Some(joined.look),
            Some((joined, still_queued)) if pushed_now && joined.is_fresh() => {
                notified.set(listening.notify().notified());
                notified.as_mut().enable();
                if listening.announced_granted() {
                    return Ok(());
                }
                pushed_now = pushed().await;
                // (Fresh still once checked: the check took its time.)
                (pushed_now && still_queued().await? && joined.is_fresh()).then_some(joined.look)
            }
            _ => None,
        };
        let answer = match stand_in {
            Some(answer) => answer,
            None => look(confirm).await?,
        };
        let (until, next, watch) = match answer {
            Look::Granted => return Ok(()),
            Look::Wait { until, next, watch } => (until, next, watch),
        };
        let seen = Instant::now();
        match &watch {
            Some(w) => {
                let now: HashMap<String, Instant> = w
                    .blockers
                    .split(',')
                    .filter(|b| !b.is_empty())
                    .map(|b| (b.to_string(), watched.get(b).copied().unwrap_or(seen)))
                    .collect();
                watched = now;
                ttl = w.ttl;
            }
            None => watched.clear(),
        }
        let mut polls = !pushed_now && (next || listening.is_first());
        if polls && !polling {
            backoff = min;
        }
        listening.set_pass_on(!pushed_now);
        // With a watch, the store's expiry is only a hint: look when the
        // first blocker is due, and (the next in line) every renew interval.
        let expiry = match (&watch, watched.values().min()) {
            (Some(_), Some(first)) if !ttl.is_zero() => {
                let due = (*first + confirm_after(ttl)).saturating_duration_since(Instant::now());
                Some(if next { due.min(ttl / 3) } else { due })
            }
            (Some(_), _) => None,
            (None, _) => until.map(|d| d + Duration::from_millis(1)),
        };
        let sleep = match (polls, expiry) {
            (true, Some(e)) => backoff.min(e),
            (true, None) => backoff,
            (false, Some(e)) => e,
            // The store named no expiry to wait for (it always does when it
            // can): look again after the longest poll.
            (false, None) => max,
        };
        let wake_at = tokio::time::sleep(sleep);
        tokio::pin!(wake_at);
        loop {
            tokio::select! {
                () = &mut notified => {
                    backoff = min;
                    break;
                }
                () = &mut handed_over => {
                    // The waiter that polled went (granted, most often;
                    // on MySQL by a release of this process, which will
                    // announce what it grants next in turn): poll from now
                    // on, from the shortest interval, but not with a look
                    // at once (one round trip per handoff, for nothing new).
                    if !polls && !pushed_now {
                        polls = true;
                        backoff = min;
                        let poll_at = Instant::now() + min;
                        if poll_at < wake_at.deadline() {
                            wake_at.as_mut().reset(poll_at);
                        }
                    }
                    handed_over.set(listening.hand_over().notified());
                    handed_over.as_mut().enable();
                }
                () = &mut wake_at => {
                    backoff = (backoff * 2).min(max);
                    break;
                }
            }
        }
        polling = polls;
    }
}

/// Reads the queue until its version differs from `version`. The backends'
/// `queue` settles expired entries, which bumps the version, so expiry counts
/// as a change. While `pushed` says the store's notifications arrive, it
/// reads again only when notified or when the queue's first expiry comes
/// (an expiry is a change nobody announces); otherwise it polls with a
/// backoff from `min` to `max`.
pub(crate) async fn until_changed<H, HF>(
    store: &dyn Store,
    name: &Name,
    version: u64,
    notify: &Notify,
    min: Duration,
    max: Duration,
    mut pushed: H,
) -> Result<u64>
where
    H: FnMut() -> HF,
    HF: Future<Output = bool>,
{
    let mut backoff = min;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let pushed_now = pushed().await;
        let queue = store.queue(name).await?;
        if queue.version != version {
            return Ok(queue.version);
        }
        // Where a watcher confirms expiry, an entry already lapsed by the
        // store's clock changes only when one does, and that is announced.
        let watched = store.capabilities().watched_expiry;
        let sleep = if pushed_now {
            queue
                .entries
                .iter()
                .filter(|e| !(watched && e.expires_in.is_zero()))
                .map(|e| e.expires_in + Duration::from_millis(1))
                .min()
                .unwrap_or(OBSERVE_AT_LEAST_EVERY)
                .min(OBSERVE_AT_LEAST_EVERY)
        } else {
            backoff
        };
        tokio::select! {
            () = notified => backoff = min,
            () = tokio::time::sleep(sleep) => backoff = (backoff * 2).min(max),
        }
    }
}

/// With notifications working, an observer still reads its queue this often
/// (a safety net, not a poll: one read per observer and half minute).
const OBSERVE_AT_LEAST_EVERY: Duration = Duration::from_secs(30);

/// Milliseconds from a store (which may say -1 for "none") as a duration.
pub(crate) fn next_expiry(ms: Option<i64>) -> Option<Duration> {
    ms.and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

/// Whether a queue read shows an entry the rules grant but the store has not
/// stamped yet (its predecessor expired silently): the name needs settling.
pub(crate) fn has_unstamped_grant(entries: &[Entry]) -> bool {
    let kinds: Vec<EntryKind> = entries.iter().map(|e| e.kind).collect();
    crate::queue::grants(&kinds)
        .iter()
        .zip(entries)
        .any(|(granted, e)| *granted && !e.granted)
}

/// Remembers when connecting last failed, so that a connection is tried
/// again at most once per interval (a notification connection, a Redlock
/// node) instead of by every caller that needs it.
#[derive(Default)]
pub(crate) struct ReconnectGate(std::sync::Mutex<Option<std::time::Instant>>);

impl ReconnectGate {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether connecting failed less than `interval` ago.
    pub(crate) fn failed_within(&self, interval: Duration) -> bool {
        self.slot().is_some_and(|at| at.elapsed() < interval)
    }

    /// Connecting failed now.
    pub(crate) fn failed(&self) {
        *self.slot() = Some(std::time::Instant::now());
    }

    /// Connecting worked.
    pub(crate) fn succeeded(&self) {
        *self.slot() = None;
    }
}

/// Key -> (its listeners' slot, how many registrations).
type Registry = std::collections::BTreeMap<String, (std::sync::Arc<Slot>, usize)>;

/// What the listeners of one key share.
#[derive(Default)]
struct Slot {
    notify: Notify,
    /// The waiter ahead of this one in this process went, and hands polling
    /// on ([`Listening`]'s drop): not a change, so no reason to look at
    /// once, only to start polling.
    hand_over: Notify,
    /// The store announced the grant of the entry of this [`grant_key`].
    granted: std::sync::atomic::AtomicBool,
    /// What an announcement must carry to be taken
    /// ([`Listeners::announced`]), set by the waiter.
    proof: std::sync::OnceLock<String>,
}

/// The tasks of this process waiting on keys (an entry's grant, a name's
/// changes), woken by key. One registry per store; cheap to clone.
#[derive(Clone)]
pub(crate) struct Listeners(std::sync::Arc<std::sync::Mutex<Registry>>, RecentKeys);

impl Default for Listeners {
    fn default() -> Self {
        Self(Default::default(), RecentKeys::new(UNHEARD_FOR))
    }
}

/// Keys kept within the last `within`, each with a value (none for a plain
/// mark), at most [`RecentKeys::KEPT`]: a store of hints, where a key
/// forgotten early costs a round trip, never a different answer. Cheap to
/// clone (shared).
pub(crate) struct RecentKeys<T = ()> {
    kept: std::sync::Arc<std::sync::Mutex<HashMap<String, (Instant, T)>>>,
    within: Duration,
}

impl<T> Clone for RecentKeys<T> {
    fn clone(&self) -> Self {
        Self {
            kept: self.kept.clone(),
            within: self.within,
        }
    }
}

impl<T> RecentKeys<T> {
    const KEPT: usize = 4096;

    pub(crate) fn new(within: Duration) -> Self {
        Self {
            kept: Default::default(),
            within,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, T)>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `value` for `key`, from now.
    pub(crate) fn keep(&self, key: String, value: T) {
        let mut map = self.map();
        if map.len() >= Self::KEPT {
            map.retain(|_, (at, _)| at.elapsed() <= self.within);
            // Still half full of recent ones: start afresh rather than
            // sweep on every keep.
            if map.len() >= Self::KEPT / 2 {
                map.clear();
            }
        }
        map.insert(key, (Instant::now(), value));
    }

    /// Whether `key` was kept within `within` (a stale one goes).
    pub(crate) fn is_recent(&self, key: &str) -> bool {
        let mut map = self.map();
        match map.get(key) {
            Some((at, _)) if at.elapsed() <= self.within => true,
            Some(_) => {
                map.remove(key);
                false
            }
            None => false,
        }
    }

    /// Takes what was kept for `key` within `within`, with when (and
    /// forgets the key either way).
    pub(crate) fn take_kept(&self, key: &str) -> Option<(Instant, T)> {
        let mut map = self.map();
        if map.is_empty() {
            return None;
        }
        map.remove(key)
            .filter(|(at, _)| at.elapsed() <= self.within)
    }
}

impl RecentKeys {
    /// Marks `key` now.
    pub(crate) fn mark(&self, key: &str) {
        self.keep(key.to_string(), ());
    }

    /// Whether `key` was marked within `within`; forgets it.
    pub(crate) fn take(&self, key: &str) -> bool {
        self.take_kept(key).is_some()
    }
}

/// How long a grant announced ([`Listeners::granted`]) while nobody
/// listened on its key is kept (the registry's [`RecentKeys`]): a waiter
/// whose join was answered may listen only after a release of this process
/// granted it, and then takes the grant from there (see
/// [`JoinedLook::without_push`]). One older is never taken (a join's answer
/// that old is not taken for a look either, and a store that lost its data
/// might give a token again).
const UNHEARD_FOR: Duration = Duration::from_secs(2);

/// The key a waiter for `name`'s entry `seq` listens on. Tokens are padded,
/// so the key order within a name is the queue order.
pub(crate) fn grant_key(name: &str, seq: u64) -> String {
    format!("{}{seq:020}", grant_prefix(name))
}

/// What every [`grant_key`] of `name` starts with.
pub(crate) fn grant_prefix(name: &str) -> String {
    format!("w:{name}\t")
}

/// The key observers of `name` listen on.
pub(crate) fn change_key(name: &str) -> String {
    format!("ch:{name}")
}

impl Listeners {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers on `key`; also says whether this is the key's first listener
    /// (a backend that subscribes per key subscribes then).
    pub(crate) fn listen(&self, key: String) -> (Listening, bool) {
        let mut registry = self.registry();
        let slot = registry.entry(key.clone()).or_insert_with(|| {
            let slot = Slot::default();
            if self.1.take(&key) {
                slot.granted
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            (std::sync::Arc::new(slot), 0)
        });
        slot.1 += 1;
        let listening = Listening {
            listeners: self.clone(),
            slot: slot.0.clone(),
            key,
            on_last: None,
            first_of: None,
            // Until a look says notifications arrive, a waiter that goes
            // (granted at its first look, or cancelled) hands polling on.
            pass_on: std::sync::atomic::AtomicBool::new(true),
        };
        (listening, slot.1 == 1)
    }

    /// Wakes every task listening on `key` now.
    pub(crate) fn wake(&self, key: &str) {
        if let Some((slot, _)) = self.registry().get(key) {
            slot.notify.notify_waiters();
        }
    }

    /// The store announces that the entry of `key` (a [`grant_key`]) is
    /// granted: its waiter returns without looking again. Only for an
    /// announcement made after the grant has committed, only to this store,
    /// and only of an entry still granted when the transaction ends
    /// (SQLite's wake-up in this process after the commit, for the entries
    /// its settling granted; MySQL's release, which answers with the
    /// entries it granted): the grant is then in the store when the
    /// waiter hears of it, as a look would have found it. Tokens are never
    /// reused for a name, so the key names one entry. Redis's pub/sub only
    /// for a release's grant that carries the keyspace's own id (pub/sub
    /// ignores the database number: a store of another database with the
    /// same prefix could announce the same name and token, with its own
    /// id). PostgreSQL's `NOTIFY` only on the channel a release announces
    /// on: another transaction may send a wake-up for an entry it grants
    /// and end that entry again before it commits (`evict`).
    /// With nobody listening on `key`, the announcement is kept a while
    /// for a waiter that listens late ([`UNHEARD_FOR`]).
    pub(crate) fn granted(&self, key: &str) {
        let registry = self.registry();
        match registry.get(key) {
            Some((slot, _)) => {
                slot.granted
                    .store(true, std::sync::atomic::Ordering::Release);
                slot.notify.notify_waiters();
            }
            // (Under the registry's lock, so that no listener comes between.)
            None => self.1.mark(key),
        }
    }

    /// [`Self::granted`] for an announcement that anyone who can reach the
    /// channel could send (PostgreSQL's `NOTIFY` needs no privilege): taken
    /// only with the proof its waiter expects ([`Listening::expect_proof`]),
    /// which only the store could compute; anything else only wakes.
    pub(crate) fn announced(&self, key: &str, proof: &str) {
        if let Some((slot, _)) = self.registry().get(key) {
            if slot.proof.get().is_some_and(|p| p == proof) {
                slot.granted
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            slot.notify.notify_waiters();
        }
    }

    /// Wakes the listeners of the first key (in key order) that starts with
    /// `prefix`: with [`grant_key`], the first waiter of a name in this process.
    pub(crate) fn wake_first(&self, prefix: &str) {
        if let Some(slot) = self.first_slot(prefix) {
            slot.notify.notify_waiters();
        }
    }

    /// The slot of the first key (in key order) that starts with `prefix`.
    fn first_slot(&self, prefix: &str) -> Option<std::sync::Arc<Slot>> {
        self.registry()
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, (slot, _))| slot.clone())
    }

    /// Hands polling on to the first waiter (in key order) on a key that
    /// starts with `prefix`: it starts polling, without a look at once.
    fn hand_over_first(&self, prefix: &str) {
        if let Some(slot) = self.first_slot(prefix) {
            slot.hand_over.notify_waiters();
        }
    }

    /// Whether a task of this process waits on a key that starts with
    /// `prefix`: with [`grant_prefix`], whether the name has a waiter here
    /// (so its holder is not alone).
    pub(crate) fn any_with_prefix(&self, prefix: &str) -> bool {
        self.registry()
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// Whether a task of this process listens on `key` now.
    pub(crate) fn is_listened(&self, key: &str) -> bool {
        self.registry().contains_key(key)
    }

    /// Every key listened on now (to subscribe them all again).
    pub(crate) fn keys(&self) -> Vec<String> {
        self.registry().keys().cloned().collect()
    }

    /// Wakes every listener (the store's notifications stopped: each waiter
    /// looks again, and polls until they are back).
    pub(crate) fn wake_all(&self) {
        for (slot, _) in self.registry().values() {
            slot.notify.notify_waiters();
        }
    }

    /// Whether `key` is the first key (in key order) that starts with `prefix`.
    fn is_first(&self, key: &str, prefix: &str) -> bool {
        self.registry()
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_none_or(|(k, _)| k == key)
    }
}

/// One registration; gone when dropped.
pub(crate) struct Listening {
    listeners: Listeners,
    key: String,
    slot: std::sync::Arc<Slot>,
    on_last: Option<Box<dyn FnOnce(String) + Send + Sync>>,
    /// For a waiter on a [`grant_key`]: the name's prefix, so that only the
    /// first waiter of the name in this process polls, and hands that on.
    first_of: Option<String>,
    /// Whether dropping this hands polling on to the name's next waiter in
    /// this process ([`Listeners::hand_over_first`]): unless its last look found the store's
    /// notifications working.
    pass_on: std::sync::atomic::AtomicBool,
}

impl Listening {
    /// The notifier to arm before looking.
    pub(crate) fn notify(&self) -> &Notify {
        &self.slot.notify
    }

    /// Notified when this waiter becomes the one of its name in this
    /// process that polls ([`Listeners::hand_over_first`]).
    fn hand_over(&self) -> &Notify {
        &self.slot.hand_over
    }

    /// Whether the store announced this entry's grant ([`Listeners::granted`]).
    fn announced_granted(&self) -> bool {
        self.slot.granted.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The proof an announcement of this entry's grant must carry
    /// ([`Listeners::announced`]). Every listener of a key waits for the
    /// same entry, so the first proof set stands.
    pub(crate) fn expect_proof(&self, proof: String) {
        let _ = self.slot.proof.set(proof);
    }

    /// Runs `f` with the key when the key's last listener goes (to
    /// unsubscribe, say).
    pub(crate) fn on_last(mut self, f: impl FnOnce(String) + Send + Sync + 'static) -> Self {
        self.on_last = Some(Box::new(f));
        self
    }

    /// Marks this as a waiter among others of its name in this process,
    /// ordered by key (see [`grant_key`]): without pushed notifications only
    /// the first of them polls.
    pub(crate) fn in_line(mut self, prefix: String) -> Self {
        self.first_of = Some(prefix);
        self
    }

    /// Whether this is the first waiter of its name in this process (always,
    /// for a listener that is not [`Self::in_line`]).
    fn is_first(&self) -> bool {
        match &self.first_of {
            Some(prefix) => self.listeners.is_first(&self.key, prefix),
            None => true,
        }
    }

    fn set_pass_on(&self, on: bool) {
        self.pass_on.store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let last = {
            let mut registry = self.listeners.registry();
            match registry.get_mut(&self.key) {
                Some((_, n)) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    registry.remove(&self.key);
                    true
                }
            }
        };
        if let Some(prefix) = &self.first_of {
            if self.pass_on.load(std::sync::atomic::Ordering::Relaxed) {
                self.listeners.hand_over_first(prefix);
            }
        }
        if let (true, Some(f)) = (last, self.on_last.take()) {
            f(std::mem::take(&mut self.key));
        }
    }
}

/// Runs `op` again at once while its driver's error is one `again` accepts
/// (a deadlock or a serialization failure: the database rolled the call
/// back), up to `times` more times; other errors, and the outer `Err` of
/// `op` (such as no connection), end it. For calls that may run twice.
pub(crate) async fn retry_at_once<T, E, F, Fut>(
    times: usize,
    again: impl Fn(&E) -> bool,
    into: impl Fn(E) -> Error,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<std::result::Result<T, E>>>,
{
    let mut attempt = 0;
    loop {
        match op().await? {
            Ok(v) => return Ok(v),
            Err(e) if again(&e) && attempt < times => attempt += 1,
            Err(e) => return Err(into(e)),
        }
    }
}

/// How long a call that failed for a passing reason (a leader change, a
/// server or member down, a lost connection) is tried again.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(5);

/// Runs `op` until it succeeds, fails for good, or [`RETRY_FOR`] passed.
/// Only for operations that may safely run twice.
pub(crate) async fn retrying<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        match op().await {
            Err(e) if e.is_temporary() && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "store call failed; trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// A version for a queue whose store keeps none: a hash (FNV-1a) of what
/// can change in it, so it differs whenever the queue does.
pub(crate) fn fingerprint(parts: impl IntoIterator<Item = u64>) -> u64 {
    let mut f = Fingerprint::default();
    for part in parts {
        f.bytes(&part.to_le_bytes());
    }
    f.0
}

/// The hasher behind [`fingerprint`], for fields that are bytes.
pub(crate) struct Fingerprint(pub(crate) u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A session label as a store keeps it: control characters (which separate
/// fields in some stores' records) become spaces.
pub(crate) fn printable(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whose leaving can grant the waiting entry at `i` of a queue of `kinds`:
/// for a mutex the entry just ahead, for a reader the last writer ahead; a
/// semaphore waiter depends on every entry ahead (`None`: watch them all).
/// Watching only this one is what keeps a release from waking every waiter.
pub(crate) fn blocker(kinds: &[EntryKind], i: usize) -> Option<usize> {
    match kinds[i] {
        EntryKind::Permits { .. } => None,
        EntryKind::Shared => kinds[..i]
            .iter()
            .rposition(|k| *k != EntryKind::Shared)
            .or_else(|| i.checked_sub(1)),
        EntryKind::Exclusive => i.checked_sub(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Looks = std::sync::Arc<std::sync::Mutex<Vec<Duration>>>;

    fn waiting(next: bool) -> Look {
        Look::Wait {
            until: None,
            next,
            watch: None,
        }
    }

    fn still_queued() -> std::future::Ready<Result<bool>> {
        std::future::ready(Ok(true))
    }

    /// Waits on `listening` with nothing pushed; each look is recorded (by
    /// when, from `start`) and answers from `answers` in turn, then granted.
    async fn wait(
        listening: &Listening,
        first: Option<NoStandIn>,
        answers: Vec<Look>,
        start: Instant,
        looks: &Looks,
    ) {
        let answers = std::sync::Mutex::new(answers.into_iter());
        until_granted(
            listening,
            Duration::from_millis(5),
            Duration::from_millis(100),
            || async { false },
            |_| {
                looks.lock().unwrap().push(start.elapsed());
                let answer = answers.lock().unwrap().next().unwrap_or(Look::Granted);
                async move { Ok(answer) }
            },
            first,
        )
        .await
        .unwrap();
    }

    fn joined(without_push: bool) -> NoStandIn {
        let look = JoinedLook {
            at: Instant::now(),
            look: waiting(true),
            without_push: false,
        };
        let look = if without_push {
            look.without_push()
        } else {
            look
        };
        (
            look,
            still_queued as fn() -> std::future::Ready<Result<bool>>,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_joins_answer_stands_in_for_the_first_look_where_grants_are_heard_here() {
        for (without_push, first_look) in
            [(true, Duration::from_millis(5)), (false, Duration::ZERO)]
        {
            let listeners = Listeners::default();
            let (listening, _) = listeners.listen(grant_key("n", 7));
            let looks = Looks::default();
            let start = Instant::now();
            wait(
                &listening,
                Some(joined(without_push)),
                vec![],
                start,
                &looks,
            )
            .await;
            // Without push, only a store that hears every grant here takes
            // the answer: its waiter's first look is its first poll.
            assert_eq!(
                *looks.lock().unwrap(),
                vec![first_look],
                "without push: {without_push}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_announced_before_its_waiter_listens_is_kept_for_it() {
        let listeners = Listeners::default();
        listeners.granted(&grant_key("n", 7));
        let looks = Looks::default();
        let (other, _) = listeners.listen(grant_key("n", 8));
        let (listening, _) = listeners.listen(grant_key("n", 7));
        wait(
            &listening,
            Some(joined(true)),
            vec![],
            Instant::now(),
            &looks,
        )
        .await;
        assert!(looks.lock().unwrap().is_empty(), "looked: {looks:?}");
        // Only for its own key, and only once.
        assert!(!other.announced_granted());
        drop(listening);
        let (again, _) = listeners.listen(grant_key("n", 7));
        assert!(!again.announced_granted());
        // Nor once it is older than a join's answer may be.
        listeners.granted(&grant_key("n", 9));
        tokio::time::sleep(UNHEARD_FOR + Duration::from_millis(1)).await;
        let (late, _) = listeners.listen(grant_key("n", 9));
        assert!(!late.announced_granted());
    }

    /// Two waiters of one name in this process, in line (ahead, behind).
    fn two_in_line() -> (Listening, Listening) {
        let listeners = Listeners::default();
        let prefix = grant_prefix("n");
        let (ahead, _) = listeners.listen(grant_key("n", 7));
        let (behind, _) = listeners.listen(grant_key("n", 8));
        (ahead.in_line(prefix.clone()), behind.in_line(prefix))
    }

    /// The looks of a waiter behind another of its name in this process,
    /// not next, answered `waits` times "wait", when the one ahead goes at
    /// `handed_over`.
    async fn looks_when_handed_over(waits: usize, handed_over: Duration) -> Vec<Duration> {
        let (ahead, behind) = two_in_line();
        let looks = Looks::default();
        let start = Instant::now();
        let waiter = wait(&behind, None, vec![waiting(false); waits], start, &looks);
        let handing = async {
            tokio::time::sleep(handed_over).await;
            drop(ahead);
        };
        tokio::join!(waiter, handing);
        let looks = looks.lock().unwrap().clone();
        looks
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_comes_next_in_line_polls_from_the_shortest_interval() {
        let (_ahead, behind) = two_in_line();
        let looks = Looks::default();
        let mut answers = vec![waiting(false); 5];
        answers.extend([waiting(true), waiting(true)]);
        wait(&behind, None, answers, Instant::now(), &looks).await;
        let ms = Duration::from_millis;
        // Behind another, not polling: a look after each longest sleep.
        // Next in line at its sixth look: polls 5 ms later, then 10.
        assert_eq!(
            *looks.lock().unwrap(),
            vec![
                ms(0),
                ms(100),
                ms(200),
                ms(300),
                ms(400),
                ms(500),
                ms(505),
                ms(515)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_handed_polling_on_polls_without_a_look_at_once() {
        let ms = Duration::from_millis;
        // Looked when it came, then not at the hand-over (10 ms) but at its
        // first poll after it (10 + 5 ms), not the longest sleep (100 ms).
        assert_eq!(looks_when_handed_over(1, ms(10)).await, vec![ms(0), ms(15)]);
        // After long sleeps (not next, not first: a look after each longest
        // sleep, 100 ms, the backoff doubling up to the longest meanwhile),
        // handed polling on, it polls 5 ms later, then 10 ms after that.
        assert_eq!(
            looks_when_handed_over(6, ms(450)).await,
            vec![ms(0), ms(100), ms(200), ms(300), ms(400), ms(455), ms(465)]
        );
    }
}
