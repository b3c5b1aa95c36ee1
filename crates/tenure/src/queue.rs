//! The pure rules that decide which entries of a queue are granted (and
//! whether a cell is as a write expects).
//!
//! Every backend that computes grants itself uses these functions, so the
//! meaning is the same everywhere: an entry is granted when every entry ahead
//! of it is granted and it is compatible with all of them. That makes every
//! kind first-in-first-out: a waiting writer holds back the readers behind it
//! (no writer starvation), a large semaphore request holds back small ones.

use crate::error::{Error, Result};
use crate::store::{EntryKind, Expect, Name};

pub use crate::acquire::WAKE_LINE_PREFIX;

/// Which entries of a queue (given in order) are granted.
pub fn grants(kinds: &[EntryKind]) -> Vec<bool> {
    let mut rule = GrantWalk::new();
    let mut open = true;
    kinds
        .iter()
        .map(|kind| {
            open = open && rule.admit(*kind);
            open
        })
        .collect()
}

/// The same rule, one entry at a time from the head of a queue: a store that
/// walks its queue stops at the first entry not admitted, so it reads the
/// granted entries and one more, however long the queue.
#[derive(Debug, Clone)]
pub struct GrantWalk {
    admitted: usize,
    all_shared: bool,
    permits: u64,
}

impl Default for GrantWalk {
    fn default() -> Self {
        Self::new()
    }
}

impl GrantWalk {
    /// At the head of a queue.
    pub fn new() -> Self {
        GrantWalk {
            admitted: 0,
            all_shared: true,
            permits: 0,
        }
    }

    /// Whether the next entry is granted, given that every entry before it
    /// was admitted; if so it counts as admitted.
    pub fn admit(&mut self, kind: EntryKind) -> bool {
        let granted = match kind {
            EntryKind::Exclusive => self.admitted == 0,
            EntryKind::Shared => self.all_shared,
            EntryKind::Permits { count, limit } => {
                self.permits + u64::from(count) <= u64::from(limit)
            }
        };
        if granted {
            self.admitted += 1;
            self.all_shared &= kind == EntryKind::Shared;
            if let EntryKind::Permits { count, .. } = kind {
                self.permits += u64::from(count);
            }
        }
        granted
    }
}

/// The error for a session that joins a queue again (reentrantly) asking
/// for another kind than the entry it already has there.
pub fn check_same_kind(name: &Name, held: EntryKind, asked: EntryKind) -> Result<()> {
    if held == asked {
        return Ok(());
    }
    Err(Error::Conflict {
        name: name.to_string(),
        reason: format!("this session already has a {held:?} entry here; asked for {asked:?}"),
    })
}

/// Whether an entry of `kind` may join a queue that holds `existing` kinds:
/// locks (exclusive and shared) and semaphores do not mix on one name, and
/// every client of a semaphore must agree on its limit.
pub fn check_compatible(
    name: &Name,
    kind: EntryKind,
    existing: impl IntoIterator<Item = EntryKind>,
) -> Result<()> {
    if let EntryKind::Permits { count, limit } = kind {
        if count == 0 || count > limit {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!("{count} permits out of a limit of {limit}"),
            });
        }
    }
    for other in existing {
        let clash = match (kind, other) {
            (EntryKind::Permits { limit: a, .. }, EntryKind::Permits { limit: b, .. }) => (a != b)
                .then(|| {
                    format!("semaphore limit {a} disagrees with the limit {b} already in use")
                }),
            (EntryKind::Permits { .. }, _) => {
                Some("a semaphore cannot use a name that a lock or election uses".to_string())
            }
            (_, EntryKind::Permits { .. }) => {
                Some("a lock or election cannot use a name that a semaphore uses".to_string())
            }
            _ => None,
        };
        if let Some(reason) = clash {
            return Err(Error::Conflict {
                name: name.to_string(),
                reason,
            });
        }
    }
    Ok(())
}

/// Whether a cell whose live version is `current` (`None`: no value) is as
/// a write expects.
pub fn cell_expected(current: Option<u64>, expect: Expect) -> bool {
    match expect {
        Expect::Absent => current.is_none(),
        Expect::Version(v) => current == Some(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EntryKind::*;

    #[test]
    fn exclusive_is_first_only() {
        assert_eq!(grants(&[Exclusive, Exclusive]), [true, false]);
        assert_eq!(grants(&[]), Vec::<bool>::new());
    }

    #[test]
    fn readers_share_until_a_writer() {
        assert_eq!(
            grants(&[Shared, Shared, Exclusive, Shared]),
            [true, true, false, false]
        );
        assert_eq!(grants(&[Exclusive, Shared]), [true, false]);
    }

    #[test]
    fn permits_fit_in_order() {
        let p = |count| Permits { count, limit: 3 };
        assert_eq!(grants(&[p(1), p(2), p(1)]), [true, true, false]);
        assert_eq!(grants(&[p(2), p(2), p(1)]), [true, false, false]);
    }

    #[test]
    fn compatibility() {
        let n = Name::new("n").unwrap();
        let p = |count, limit| Permits { count, limit };
        assert!(check_compatible(&n, p(1, 2), [p(1, 2)]).is_ok());
        assert!(check_compatible(&n, p(1, 3), [p(1, 2)]).is_err());
        assert!(check_compatible(&n, p(0, 3), []).is_err());
        assert!(check_compatible(&n, p(4, 3), []).is_err());
        assert!(check_compatible(&n, Exclusive, [p(1, 2)]).is_err());
        assert!(check_compatible(&n, Shared, [Exclusive]).is_ok());
    }
}
