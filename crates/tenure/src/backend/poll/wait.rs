//! The waiting loops: a waiter's until its entry is granted, an
//! observer's until its queue changes.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{confirm_after, JoinedLook, Listening, Look, Watch};
use crate::error::Result;
use crate::store::{Name, Store};

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
/// `first`, when given, is a join's answer
/// ([`JoinedLooks`](super::JoinedLooks)) and a check that the entry still
/// waits: while notifications arrive and the answer is fresh, the check (a
/// plain read) stands in for the first look, so that a waiter need not look
/// once it listens; it answers `false` (a grant came in between, or the
/// entry is gone) to have the waiter look.
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
/// in line looks at least every [`NEXT_LOOKS_EVERY`] of the TTL (a
/// quarter: under a holder's renew interval, a third, by enough to cover
/// the waiter's own round trips), so a crashed holder is released within
/// its TTL and one renew interval (and 1 % and 10 ms) of its last renewal;
/// a waiter further back looks once per TTL of the entry ahead, and when
/// the store tells it that it became the next in line
/// ([`Listeners::made_next`](super::Listeners::made_next)), a quarter of
/// the TTL of the holders it then waits on later.
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
    let mut watched = Watched::default();
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
        let made_next = listening.made_next().notified();
        tokio::pin!(made_next);
        made_next.as_mut().enable();
        // Announced with the grant itself: a look would only say so again
        // (one round trip more on every handoff).
        if listening.announced_granted() {
            return Ok(());
        }
        let mut pushed_now = pushed().await;
        let confirm = watched.due();
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
        watched.saw(watch.as_ref(), Instant::now());
        let watching = watch.is_some();
        let mut polls = !pushed_now && (next || listening.is_first());
        if polls && !polling {
            backoff = min;
        }
        listening.set_pass_on(!pushed_now);
        let expiry = watched.expiry(watch.is_some(), next, until);
        let sleep = sleep_for(polls, expiry, backoff, max);
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
                () = &mut made_next => {
                    // Now next in line (a grant or an end ahead): whoever
                    // holds is watched every renew interval from now on,
                    // as a look that said "next" would have, so a holder
                    // that dies is noticed within a renew interval of its
                    // last renewal, not a TTL later. No look at once: a
                    // handoff costs no round trip more.
                    // (By the TTL of what it watched: its first look then
                    // names the holders and their TTL.)
                    if watching && !watched.ttl.is_zero() {
                        let look_at = Instant::now() + watched.ttl / NEXT_LOOKS_EVERY;
                        if look_at < wake_at.deadline() {
                            wake_at.as_mut().reset(look_at);
                        }
                    }
                    made_next.set(listening.made_next().notified());
                    made_next.as_mut().enable();
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

/// The blockers a waiter watches, on a store whose clock is not trusted
/// with expiry: each as the store wrote it ("seq:renewals:lapse"), and when
/// this waiter first saw it so (after the look that showed it returned);
/// and the blockers' longest TTL.
#[derive(Default)]
struct Watched {
    since: HashMap<String, Instant>,
    ttl: Duration,
}

impl Watched {
    /// The blockers seen unchanged for [`confirm_after`] their TTL,
    /// comma-separated, for the next look to end: `None` if none is due.
    fn due(&self) -> Option<String> {
        // A TTL of 0 would be a store that lost a session's record: never
        // confirm by it.
        let due: Vec<&str> = self
            .since
            .iter()
            .filter(|(_, since)| !self.ttl.is_zero() && since.elapsed() >= confirm_after(self.ttl))
            .map(|(blocker, _)| blocker.as_str())
            .collect();
        (!due.is_empty()).then(|| due.join(","))
    }

    /// What a look that returned at `seen` showed: the blockers it names
    /// (each still dated from when first seen as it is), or, without a
    /// watch, none.
    fn saw(&mut self, watch: Option<&Watch>, seen: Instant) {
        match watch {
            Some(w) => {
                let now: HashMap<String, Instant> = w
                    .blockers
                    .split(',')
                    .filter(|b| !b.is_empty())
                    .map(|b| (b.to_string(), self.since.get(b).copied().unwrap_or(seen)))
                    .collect();
                self.since = now;
                self.ttl = w.ttl;
            }
            None => self.since.clear(),
        }
    }

    /// How long until the next look for an expiry: with a `watch`, when
    /// the first blocker is due; otherwise the store's `until`.
    fn expiry(&self, watch: bool, next: bool, until: Option<Duration>) -> Option<Duration> {
        // With a watch, the store's expiry is only a hint: look when the
        // first blocker is due, and (the next in line) every renew interval.
        match (watch, self.since.values().min()) {
            (true, Some(first)) if !self.ttl.is_zero() => {
                let due =
                    (*first + confirm_after(self.ttl)).saturating_duration_since(Instant::now());
                Some(if next { due.min(self.ttl / NEXT_LOOKS_EVERY) } else { due })
            }
            (true, _) => None,
            (false, _) => until.map(|d| d + Duration::from_millis(1)),
        }
    }
}

/// The next in line looks at least every TTL / this while it watches the
/// holders (see [`until_granted`]).
const NEXT_LOOKS_EVERY: u32 = 4;

/// How long a waiter sleeps before it looks again, unless woken: a poll's
/// `backoff` (when it `polls`), the `expiry`, whichever comes first.
fn sleep_for(polls: bool, expiry: Option<Duration>, backoff: Duration, max: Duration) -> Duration {
    match (polls, expiry) {
        (true, Some(e)) => backoff.min(e),
        (true, None) => backoff,
        (false, Some(e)) => e,
        // The store named no expiry to wait for (it always does when it
        // can): look again after the longest poll.
        (false, None) => max,
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
