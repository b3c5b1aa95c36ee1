//! Wake-ups by pub/sub: one dedicated connection, opened on first use and
//! again after it drops, that routes messages to the waiting tasks, and the
//! batched `UNSUBSCRIBE` of channels nobody listens on any more.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::connect::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use super::{Inner, RedisStore};
use crate::backend::poll::{self, Listeners, Listening};

/// A pub/sub connection that failed to open is tried again after this long.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// A channel nobody listens on any more is unsubscribed with others, in one
/// `UNSUBSCRIBE`: when this many wait, or this long after the first of them.
/// (A waiter's grant channel is used once, so one `UNSUBSCRIBE` each was a
/// command per grant.)
const UNSUBSCRIBE_BATCH: usize = 64;
const UNSUBSCRIBE_AFTER: Duration = Duration::from_millis(200);

/// Routes pub/sub messages to the tasks waiting on their channels, over one
/// dedicated connection that is opened on first use and again after it
/// drops.
#[derive(Default)]
pub(super) struct Wakeups {
    sink: tokio::sync::Mutex<Option<redis::aio::PubSubSink>>,
    listeners: Listeners,
    /// Whether the current connection is subscribed and delivering.
    up: Arc<std::sync::atomic::AtomicBool>,
    /// Which connection is current (an old one's end must not mark a new
    /// one down).
    generation: Arc<std::sync::atomic::AtomicU64>,
    /// When connecting last failed: tried again at most once a second.
    failed: poll::ReconnectGate,
    /// The keyspace's id (the script's `P:id`), as read at open, and the
    /// database's number (`id:db`): a grant message that carries it is the
    /// grant itself.
    pub(super) keyspace: Arc<std::sync::OnceLock<Vec<u8>>>,
    /// What the joins of queued entries said a first look would.
    pub(super) joined: poll::JoinedLooks,
    /// Channels whose last listener went, to unsubscribe in one batch.
    unheard: std::sync::Mutex<Unheard>,
    /// The task that reads the current connection's messages: stopped when
    /// the connection is given up, which closes it (the driver runs while
    /// the reader holds its stream).
    reader: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl RedisStore {
    /// Listens on `channel`, subscribing if it is the channel's first
    /// listener. If pub/sub is down, waiters poll.
    pub(super) async fn listen(&self, channel: String) -> Listening {
        let (listening, first) = self.inner.wakeups.listeners.listen(channel.clone());
        let store = self.clone();
        let listening = listening.on_last(move |channel| store.unsubscribe_later(channel));
        if first || !self.pubsub_up() {
            self.subscribe(Some(&channel)).await;
        }
        listening
    }

    /// Queues `channel` to be unsubscribed with others: at once when
    /// [`UNSUBSCRIBE_BATCH`] wait, else at most [`UNSUBSCRIBE_AFTER`] after
    /// the first of them.
    fn unsubscribe_later(&self, channel: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send it from: the next channel queued in one
            // takes this one along.
            self.unheard().channels.push(channel);
            return;
        };
        let (flush_now, arm) = {
            let mut unheard = self.unheard();
            unheard.channels.push(channel);
            let flush_now = unheard.channels.len() >= UNSUBSCRIBE_BATCH && !unheard.flushing;
            let arm = !flush_now && !unheard.timer;
            unheard.flushing |= flush_now;
            unheard.timer |= arm;
            (flush_now, arm)
        };
        // The tasks hold the store weakly: one dropped meanwhile closes its
        // connection, and its subscriptions with it. Each clears its flag
        // when done, or when dropped, run or not (a runtime shutting down
        // drops what is spawned on it), so a channel queued later is sent.
        let inner = Arc::downgrade(&self.inner);
        if flush_now {
            let done = Disarm(inner.clone(), |u| u.flushing = false);
            runtime.spawn(async move {
                let _done = done;
                if let Some(inner) = inner.upgrade() {
                    RedisStore { inner }.unsubscribe_unheard().await;
                }
            });
        } else if arm {
            let disarm = Disarm(inner.clone(), |u| u.timer = false);
            runtime.spawn(async move {
                tokio::time::sleep(UNSUBSCRIBE_AFTER).await;
                // Cleared before sending: a channel queued from now on arms
                // a timer of its own.
                drop(disarm);
                if let Some(inner) = inner.upgrade() {
                    RedisStore { inner }.unsubscribe_unheard().await;
                }
            });
        }
    }

    fn unheard(&self) -> std::sync::MutexGuard<'_, Unheard> {
        let unheard = &self.inner.wakeups.unheard;
        unheard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unsubscribes, in one command, the queued channels that still have no
    /// listener. Under the connection's lock, as every subscribe is: a
    /// channel listened on again before this reads the listeners is kept,
    /// and one listened on after it is subscribed again after this. A
    /// connection that does not answer is dropped, as when a subscribe
    /// fails: its waiters look, and poll until a new one is up.
    async fn unsubscribe_unheard(&self) {
        let w = &self.inner.wakeups;
        let mut sink = w.sink.lock().await;
        let channels: Vec<String> = std::mem::take(&mut self.unheard().channels)
            .into_iter()
            .filter(|channel| !w.listeners.is_listened(channel))
            .collect();
        let (Some(s), false) = (sink.as_mut(), channels.is_empty()) else {
            return;
        };
        match tokio::time::timeout(RESPONSE_TIMEOUT, s.unsubscribe(&channels)).await {
            Ok(Ok(())) => {}
            failed => {
                tracing::debug!(?failed, "unsubscribe failed; waiters poll");
                self.give_up_pubsub(&mut sink);
            }
        }
    }

    /// Closes the pub/sub connection that failed (its sink, held locked by
    /// the caller, and its reader): every waiter looks again, and polls
    /// until a new connection is up.
    fn give_up_pubsub(&self, sink: &mut Option<redis::aio::PubSubSink>) {
        let w = &self.inner.wakeups;
        w.up.store(false, std::sync::atomic::Ordering::Release);
        *sink = None;
        if let Some(reader) = w.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
        w.listeners.wake_all();
    }

    pub(super) fn pubsub_up(&self) -> bool {
        self.inner
            .wakeups
            .up
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes sure the pub/sub connection is up and subscribed to `channel`;
    /// a new connection subscribes to every channel listened on, and then
    /// every listener looks again (what it missed is in the store). Returns
    /// whether notifications arrive.
    pub(super) async fn subscribe(&self, channel: Option<&str>) -> bool {
        use std::sync::atomic::Ordering;
        let w = &self.inner.wakeups;
        let mut sink = w.sink.lock().await;
        if sink.is_some() && self.pubsub_up() {
            if let (Some(s), Some(channel)) = (sink.as_mut(), channel) {
                match tokio::time::timeout(RESPONSE_TIMEOUT, s.subscribe(channel)).await {
                    Ok(Ok(())) => {}
                    failed => {
                        tracing::debug!(?failed, "subscribe failed; waiters poll");
                        self.give_up_pubsub(&mut sink);
                    }
                }
            }
            return self.pubsub_up();
        }
        if w.failed.failed_within(RECONNECT_AFTER) {
            return false;
        }
        let fail = |e: &dyn std::fmt::Debug| {
            tracing::debug!(error = ?e, "no pub/sub connection; waiters poll");
            w.failed.failed();
            false
        };
        // Behind Sentinel, the master of the moment.
        let client = match self.inner.master.client().await {
            Ok(client) => client,
            Err(e) => return fail(&e),
        };
        let pubsub = match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => return fail(&e),
            Err(e) => return fail(&e),
        };
        let (mut new_sink, mut stream) = pubsub.split();
        for key in w.listeners.keys() {
            match tokio::time::timeout(RESPONSE_TIMEOUT, new_sink.subscribe(&key)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return fail(&e),
                Err(e) => return fail(&e),
            }
        }
        let generation = w.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let (listeners, up, current) = (w.listeners.clone(), w.up.clone(), w.generation.clone());
        let keyspace = w.keyspace.clone();
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                // A release's grant, published with this keyspace's id
                // after nothing in its script could end it, is the grant:
                // the waiter takes it without looking again. Anything else
                // only wakes it to look: pub/sub ignores the database
                // number, so a message may come from another database's
                // store with the same prefix, name and token, whose id is
                // another.
                let ours = keyspace
                    .get()
                    .is_some_and(|id| !id.is_empty() && msg.get_payload_bytes() == id.as_slice());
                if ours {
                    listeners.granted(msg.get_channel_name());
                } else if msg.get_payload_bytes() == b"next" {
                    listeners.made_next(msg.get_channel_name());
                } else {
                    listeners.wake(msg.get_channel_name());
                }
            }
            // The connection is gone: waiters look again and poll until a
            // new one is up.
            if current.load(Ordering::Acquire) == generation {
                up.store(false, Ordering::Release);
            }
            listeners.wake_all();
        });
        let old_reader =
            (w.reader.lock().unwrap_or_else(|e| e.into_inner())).replace(reader.abort_handle());
        if let Some(old) = old_reader {
            old.abort();
        }
        *sink = Some(new_sink);
        w.up.store(true, Ordering::Release);
        // Whatever was published while no connection listened.
        w.listeners.wake_all();
        true
    }
}

/// The channels whose last listener went, to unsubscribe in one command,
/// and which task is due to send it.
#[derive(Default)]
struct Unheard {
    channels: Vec<String>,
    /// A task waits [`UNSUBSCRIBE_AFTER`] to send it.
    timer: bool,
    /// A task sends it now ([`UNSUBSCRIBE_BATCH`] waited).
    flushing: bool,
}

/// Clears a flag of [`Unheard`] when dropped (also when its task is), if
/// the store is still there.
struct Disarm(std::sync::Weak<Inner>, fn(&mut Unheard));

impl Drop for Disarm {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            let unheard = &inner.wakeups.unheard;
            (self.1)(&mut unheard.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}
