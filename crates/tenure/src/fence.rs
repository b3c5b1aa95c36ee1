//! A fence kept by the store: the check that makes a fencing token protect.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::{check_value, FenceOp, FenceState, Name, Store};

/// A fenced register in the store: it admits a fencing token only if it is at
/// least the highest it has admitted, so once a later holder of a lock has
/// used the fence, a paused earlier holder's token is refused.
///
/// Equal tokens are admitted (one holder writes many times). Each call is one
/// atomic step of the store. A fence may also keep a small value that only an
/// admitted token may write ([`Fence::write`]), so a small resource can live
/// in the store itself, fenced.
///
/// Name a fence after the lock whose tokens it checks: fences and cells share
/// one namespace, apart from the locks'. To check tokens in your own
/// database instead, see [`fencing`](crate::fencing).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let fence = tenure::Fence::new(&store, "printer")?;
/// fence.admit(7).await?;
/// fence.write(7, b"page 1").await?; // the same holder, again
/// let late = fence.admit(5).await; // an older holder, woken up late
/// assert!(matches!(late, Err(tenure::Error::StaleToken { highest: 7, .. })));
/// assert_eq!(fence.read().await?.value.as_deref(), Some(&b"page 1"[..]));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Fence {
    store: Arc<dyn Store>,
    name: Name,
}

impl Fence {
    /// The fence `name` in `store`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty, too long or control-character
    /// name.
    pub fn new(store: &Arc<dyn Store>, name: impl AsRef<str>) -> Result<Self> {
        Ok(Fence {
            store: store.clone(),
            name: Name::new(name)?,
        })
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// Admits `token` if it is at least the highest admitted, and records it.
    /// Returns the highest admitted, which is then `token`.
    ///
    /// # Errors
    ///
    /// [`Error::StaleToken`] (carrying the highest) for a lower token;
    /// [`Error::InvalidArgument`] for token 0; [`Error::Conflict`] if the
    /// name is a cell's; store errors.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have admitted the token.
    pub async fn admit(&self, token: u64) -> Result<u64> {
        self.admit_with(token, None)
            .await
            .map(|state| state.highest)
    }

    /// Admits `token` as [`Fence::admit`] does and, if admitted, replaces the
    /// fence's value with `value` in the same step.
    ///
    /// # Errors
    ///
    /// As [`Fence::admit`]; [`Error::InvalidArgument`] for an empty value or
    /// one longer than [`MAX_VALUE_LEN`](crate::store::MAX_VALUE_LEN) bytes
    /// ([`check_value`]).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`Fence::admit`].
    pub async fn write(&self, token: u64, value: &[u8]) -> Result<()> {
        check_value(value)?;
        self.admit_with(token, Some(value)).await.map(|_| ())
    }

    /// The highest token admitted (0 if none) and the value last written.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn read(&self) -> Result<FenceState> {
        self.store.fence(&self.name, FenceOp::Read).await
    }

    async fn admit_with(&self, token: u64, value: Option<&[u8]>) -> Result<FenceState> {
        check_token(token)?;
        let state = self
            .store
            .fence(&self.name, FenceOp::Admit { token, value })
            .await?;
        if state.admitted {
            Ok(state)
        } else {
            Err(Error::StaleToken {
                fence: self.name.to_string(),
                token,
                highest: state.highest,
            })
        }
    }
}

fn check_token(token: u64) -> Result<()> {
    if token == 0 {
        return Err(Error::InvalidArgument {
            what: "fencing token",
            reason: "a fencing token is a positive integer (tenure's start at 1)".into(),
        });
    }
    // Stores that keep numbers as signed 64-bit integers (SQL columns, a
    // signed transaction id) cannot go higher; no store hands out such a
    // token.
    if i64::try_from(token).is_err() {
        return Err(Error::InvalidArgument {
            what: "fencing token",
            reason: format!(
                "{token} is above the largest token a store hands out ({})",
                i64::MAX
            ),
        });
    }
    Ok(())
}
