//! This process's waiters and observers, registered by key (an entry's
//! grant, a name's changes) and woken by key; who of a name's waiters
//! here polls, and the grants announced to them.

use std::time::Duration;

use tokio::sync::Notify;

use super::RecentKeys;

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
    /// The store made this entry the next in line (a grant or an end ahead
    /// of it), or may have: not a reason to look at once, but to watch the
    /// holders every quarter TTL from now on.
    made_next: Notify,
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

/// How long a grant announced ([`Listeners::granted`]) while nobody
/// listened on its key is kept (the registry's [`RecentKeys`]): a waiter
/// whose join was answered may listen only after a release of this process
/// granted it, and then takes the grant from there (see
/// [`JoinedLook::without_push`](super::JoinedLook::without_push)). One older
/// is never taken (a join's answer that old is not taken for a look either,
/// and a store that lost its data might give a token again).
pub(super) const UNHEARD_FOR: Duration = Duration::from_secs(2);

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

    /// The store says the entry of `key` (a [`grant_key`]) is now the next
    /// in line (Redis's script, on the entry's own channel).
    pub(crate) fn made_next(&self, key: &str) {
        if let Some((slot, _)) = self.registry().get(key) {
            slot.made_next.notify_waiters();
        }
    }

    /// [`Self::made_next`] for a store that only says that `name` changed
    /// (PostgreSQL's `NOTIFY` on every change): the first waiter of the
    /// name in this process (the next in line, if it is in this process)
    /// is told. One look per process and quarter TTL at most, however often
    /// the name changes.
    pub(crate) fn maybe_made_next(&self, name: &str) {
        if let Some(slot) = self.first_slot(&grant_prefix(name)) {
            slot.made_next.notify_waiters();
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
    pub(super) fn hand_over(&self) -> &Notify {
        &self.slot.hand_over
    }

    /// Notified when the store makes this waiter's entry the next in line
    /// ([`Listeners::made_next`]).
    pub(super) fn made_next(&self) -> &Notify {
        &self.slot.made_next
    }


    /// Whether the store announced this entry's grant ([`Listeners::granted`]).
    pub(super) fn announced_granted(&self) -> bool {
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
    pub(super) fn is_first(&self) -> bool {
        match &self.first_of {
            Some(prefix) => self.listeners.is_first(&self.key, prefix),
            None => true,
        }
    }

    pub(super) fn set_pass_on(&self, on: bool) {
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
