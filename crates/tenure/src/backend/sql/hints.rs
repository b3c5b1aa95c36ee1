//! When the one-statement take and release are worth a try: hints a store
//! keeps of the names it holds in their row and of the takes that missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::poll;
use crate::store::{Joined, Name};

/// When a one-statement take or release is worth trying: each try that does
/// not apply costs a round trip before the routine's call. Only hints: a
/// wrong one costs that round trip, or a routine's call where a statement
/// would have done; never a different answer. Kept per store (per
/// [`crate::open`]), not shared between stores of one process.
#[derive(Clone)]
pub(crate) struct FastHints {
    inner: Arc<std::sync::Mutex<FastHintsInner>>,
    /// Names on which a one-statement take changed nothing, lately.
    missed: poll::RecentKeys,
}

impl Default for FastHints {
    fn default() -> Self {
        Self {
            inner: Default::default(),
            missed: poll::RecentKeys::new(Self::MISS_HELD),
        }
    }
}

#[derive(Default)]
struct FastHintsInner {
    /// Entries this store holds, as far as it knows, in their name's row,
    /// by name (tokens): only those can be released by the statement (an
    /// entry granted from the queue is never moved into the row). By name,
    /// so that a routine's join forgets a name's holds without a walk over
    /// every name held.
    row_held: HashMap<String, Vec<u64>>,
}

impl FastHints {
    /// At most this many names' holds are kept; past it they are forgotten.
    const KEPT: usize = 4096;
    /// How long a name on which the statement missed goes to the routine
    /// directly: a try-lock of a held name pays one round trip, not two,
    /// and a take of it once free pays a routine's call.
    const MISS_HELD: Duration = Duration::from_secs(1);

    fn inner(&self) -> std::sync::MutexGuard<'_, FastHintsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn take_worth_trying(&self, name: &Name) -> bool {
        !self.missed.is_recent(name.as_str())
    }

    /// The one-statement take of `name` was tried and changed nothing.
    pub(super) fn missed(&self, name: &Name) {
        self.missed.mark(name.as_str());
    }

    /// A join of `name` answered `joined`, by the statement (`by_statement`:
    /// a hold in the name's row) or by the routine. An exclusive hold the
    /// routine granted as the only hold is in the row too (the routine
    /// keeps a lone holder there), and the name was free: no miss to
    /// remember. (A shared or permit hold the routine granted may have
    /// others beside it: not counted as in the row.) A routine's join
    /// moves any row holder into the queue, so this store's other holds of
    /// the name are no longer in the row.
    pub(super) fn joined(&self, name: &Name, kind: i16, joined: &Joined, by_statement: bool) {
        let mut inner = self.inner();
        if !by_statement {
            inner.row_held.remove(name.as_str());
        }
        if by_statement || (kind == 0 && joined.granted && joined.holds == 1) {
            self.missed.take(name.as_str());
            if inner.row_held.len() >= Self::KEPT {
                inner.row_held.clear();
            }
            let seqs = inner.row_held.entry(name.as_str().to_owned()).or_default();
            if !seqs.contains(&joined.seq) {
                seqs.push(joined.seq);
            }
        }
    }

    /// Whether the release of `name`'s entry `seq` is worth a statement
    /// (forgets the entry: a second release of a reentered hold goes to
    /// the routine).
    pub(super) fn release_worth_trying(&self, name: &Name, seq: u64) -> bool {
        let mut inner = self.inner();
        let Some(seqs) = inner.row_held.get_mut(name.as_str()) else {
            return false;
        };
        let held = seqs
            .iter()
            .position(|s| *s == seq)
            .map(|i| seqs.swap_remove(i));
        if seqs.is_empty() {
            inner.row_held.remove(name.as_str());
        }
        held.is_some()
    }
}
