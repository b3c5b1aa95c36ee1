//! Fencing over the nodes: a token admitted by a majority, and the highest
//! token spread to a majority before it is reported.

use super::{bit, count, Mask, RedlockStore, BACKEND};
use crate::error::{Error, Result};
use crate::store::{FenceOp, FenceState, Name};

impl RedlockStore {
    /// A token is admitted when a majority of nodes admits it, so a later
    /// admission's majority overlaps it in a node that refuses anything
    /// lower. A read, or a refusal, reports the highest token of a
    /// majority's answers only once a majority holds it (the nodes that
    /// answered lower are brought up to it first): so whatever a finished
    /// call reported, every later admission is at least that.
    pub(super) async fn fence_on_majority(
        &self,
        name: &Name,
        op: FenceOp<'_>,
    ) -> Result<FenceState> {
        if let FenceOp::Admit { value: Some(_), .. } = op {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "values written through a fence (independent nodes cannot agree on \
                       the order of writes without consensus; a fence's admission needs none)",
            });
        }
        let (answers, tally) = self
            .tally(self.inner.all, |node| async move {
                node.fence_on_node(name, op).await
            })
            .await;
        self.majority_or_error(&tally)?;
        let highest = answers.iter().map(|(_, s)| s.highest).max().unwrap_or(0);
        let FenceOp::Admit { token, .. } = op else {
            self.spread_fence(name, highest, &answers).await?;
            return Ok(FenceState {
                admitted: true,
                highest,
                value: None,
            });
        };
        let admitted = answers.iter().filter(|(_, s)| s.admitted).count();
        if admitted >= self.inner.majority {
            return Ok(FenceState {
                admitted: true,
                highest: token,
                value: None,
            });
        }
        if admitted == answers.len() {
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "token {token} admitted by {admitted} nodes, a majority needs {}",
                    self.inner.majority
                ),
            ));
        }
        // A node saw a higher token: refusing is the safe side, once that
        // token is on a majority.
        self.spread_fence(name, highest, &answers).await?;
        Ok(FenceState {
            admitted: false,
            highest,
            value: None,
        })
    }

    /// Makes sure a majority of nodes has admitted at least `highest`,
    /// admitting it on the nodes among `answers` that hold less.
    async fn spread_fence(
        &self,
        name: &Name,
        highest: u64,
        answers: &[(usize, FenceState)],
    ) -> Result<()> {
        let mut holding: Mask = answers
            .iter()
            .filter(|(_, s)| s.highest >= highest)
            .fold(0, |m, (i, _)| m | bit(*i));
        let behind: Mask = answers
            .iter()
            .filter(|(_, s)| s.highest < highest)
            .fold(0, |m, (i, _)| m | bit(*i));
        if count(holding) >= self.inner.majority || behind == 0 {
            return if count(holding) >= self.inner.majority {
                Ok(())
            } else {
                Err(Error::unavailable(BACKEND, "too few nodes answered"))
            };
        }
        let op = FenceOp::Admit {
            token: highest,
            value: None,
        };
        let (caught_up, _) = self
            .tally(
                behind,
                |node| async move { node.fence_on_node(name, op).await },
            )
            .await;
        for (i, state) in caught_up {
            if state.highest >= highest {
                holding |= bit(i);
            }
        }
        if count(holding) >= self.inner.majority {
            Ok(())
        } else {
            Err(Error::unavailable(
                BACKEND,
                format!(
                    "token {highest} is held by {} nodes, a majority needs {}",
                    count(holding),
                    self.inner.majority
                ),
            ))
        }
    }
}
