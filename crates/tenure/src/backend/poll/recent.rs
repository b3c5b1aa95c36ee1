//! A bounded map of recent keys, each with a value: hints that a store
//! keeps for a while.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

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
