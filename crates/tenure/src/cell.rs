//! A cell: a small value with a version, written by compare-and-set.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{check_value, CellWrite, Expect, Name, Store, Versioned};

/// A small value in the store with a version, the database's optimistic lock
/// (`update … set version = version + 1 where id = ? and version = ?`) on
/// every backend: read it, compute, and write back only if nobody wrote in
/// between, else read again and retry.
///
/// Every write and delete gives the cell a higher version; versions are never
/// reused for a name, so a write that expects an old version can never
/// succeed by accident. A cell may be bound to a session
/// ([`Cell::bound_to`]): its value then lives only as long as that session,
/// like a key on a lease or an ephemeral node on the stores that have them.
///
/// Values are 1 to [`MAX_VALUE_LEN`](crate::store::MAX_VALUE_LEN) bytes.
/// Each call is one atomic step of the store.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// use tenure::Expect;
/// let store = tenure::open("memory://").await?;
/// let cell = tenure::Cell::new(&store, "config")?;
/// let v1 = cell.put(b"a", Expect::Absent).await?;
/// let v2 = cell.put(b"b", Expect::Version(v1)).await?;
/// // A writer that read version v1 is refused, with the current version.
/// let late = cell.put(b"c", Expect::Version(v1)).await;
/// assert!(matches!(late, Err(tenure::Error::VersionMismatch { current: Some(v), .. }) if v == v2));
/// assert_eq!(cell.get().await?.map(|c| c.value), Some(b"b".to_vec()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Cell {
    store: Arc<dyn Store>,
    name: Name,
    owner: Option<Session>,
}

impl Cell {
    /// The cell `name` in `store`; what it writes stays until deleted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty, too long or control-character
    /// name.
    pub fn new(store: &Arc<dyn Store>, name: impl AsRef<str>) -> Result<Self> {
        Ok(Cell {
            store: store.clone(),
            name: Name::new(name)?,
            owner: None,
        })
    }

    /// The cell `name` in the session's store; a value it writes vanishes
    /// when the session ends (closed, expired or evicted).
    ///
    /// # Errors
    ///
    /// As [`Cell::new`].
    pub fn bound_to(session: &Session, name: impl AsRef<str>) -> Result<Self> {
        Ok(Cell {
            store: session.store().clone(),
            name: Name::new(name)?,
            owner: Some(session.clone()),
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The value and its version, or `None` when the cell has no value.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] if the name is a fence's; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(&self) -> Result<Option<Versioned>> {
        self.store.cell_get(&self.name).await
    }

    /// Writes `value` if the cell is as `expect`ed; returns the new version.
    ///
    /// # Errors
    ///
    /// [`Error::VersionMismatch`] (carrying the current version) if it is
    /// not, and nothing is written; [`Error::InvalidArgument`] for an empty
    /// or too long value or version 0; [`Error::SessionLost`] for a bound
    /// cell whose session is gone; [`Error::Conflict`] if the name is a
    /// fence's; store errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have written.
    pub async fn put(&self, value: &[u8], expect: Expect) -> Result<u64> {
        check_value(value)?;
        check_expect(expect)?;
        let owner = match &self.owner {
            Some(session) => {
                session.check_alive()?;
                Some(session.key())
            }
            None => None,
        };
        let written = self
            .store
            .cell_put(&self.name, value, expect, owner)
            .await?;
        self.done(written, expect)
    }

    /// Deletes the value if the cell is at `version`.
    ///
    /// # Errors
    ///
    /// [`Error::VersionMismatch`] if it is not (or has no value), and
    /// nothing changes; [`Error::InvalidArgument`] for version 0; store
    /// errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have deleted.
    pub async fn delete(&self, version: u64) -> Result<()> {
        let expect = Expect::Version(version);
        check_expect(expect)?;
        let written = self.store.cell_delete(&self.name, version).await?;
        self.done(written, expect).map(|_| ())
    }

    fn done(&self, written: CellWrite, expect: Expect) -> Result<u64> {
        match written {
            CellWrite::Done(version) => Ok(version),
            CellWrite::Mismatch(current) => Err(Error::VersionMismatch {
                cell: self.name.to_string(),
                expected: match expect {
                    Expect::Absent => None,
                    Expect::Version(v) => Some(v),
                },
                current,
            }),
        }
    }
}

fn check_expect(expect: Expect) -> Result<()> {
    match expect {
        Expect::Version(0) => Err(Error::InvalidArgument {
            what: "version",
            reason: "versions start at 1; to write a cell that has no value, expect it absent"
                .into(),
        }),
        Expect::Version(v) if i64::try_from(v).is_err() => Err(Error::InvalidArgument {
            what: "version",
            reason: format!("{v} is above the largest version a store hands out"),
        }),
        _ => Ok(()),
    }
}
