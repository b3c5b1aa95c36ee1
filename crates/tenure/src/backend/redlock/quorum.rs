//! Asking the nodes: one call on each node at once, each bounded by the
//! node timeout, the answers tallied, and what a majority of them says.

use std::future::Future;
use std::time::Duration;

use super::{bit, count, Mask, RedlockStore, BACKEND};
use crate::backend::redis::RedisStore;
use crate::error::{Error, Result};

/// How the nodes answered one operation.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) ok: Mask,
    pub(super) lost: Mask,
    pub(super) not_held: Mask,
    pub(super) failed: Mask,
    pub(super) conflict: Option<Error>,
    pub(super) failure: Option<Error>,
}

impl Tally {
    pub(super) fn note<T>(&mut self, i: usize, result: Result<T>) -> Option<T> {
        match result {
            Ok(v) => {
                self.ok |= bit(i);
                return Some(v);
            }
            Err(Error::SessionLost(_)) => self.lost |= bit(i),
            Err(Error::NotHeld(_)) => self.not_held |= bit(i),
            Err(e @ Error::Conflict { .. }) => self.conflict = Some(e),
            Err(e) => {
                self.failed |= bit(i);
                // An auth error says more than a timeout: keep it.
                if self.failure.is_none() || matches!(e, Error::Auth { .. }) {
                    self.failure = Some(e);
                }
            }
        }
        None
    }
}

impl RedlockStore {
    /// Runs `op` on every node in `mask` at once, each bounded by the node
    /// timeout, and collects the answers by node.
    pub(super) async fn each<T, F, Fut>(&self, mask: Mask, op: F) -> Vec<(usize, Result<T>)>
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.each_within(mask, self.inner.node_timeout, op).await
    }

    /// [`Self::each`] with each node's call bounded by `timeout`.
    pub(super) async fn each_within<T, F, Fut>(
        &self,
        mask: Mask,
        timeout: Duration,
        op: F,
    ) -> Vec<(usize, Result<T>)>
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let node_timeout = self.inner.node_timeout;
        let calls = (0..self.inner.nodes.len())
            .filter(|i| mask & bit(*i) != 0)
            .map(|i| {
                let op = &op;
                async move {
                    let call = async {
                        let node = self.inner.nodes[i].get(node_timeout).await?;
                        op(node).await
                    };
                    let result = tokio::time::timeout(timeout, call)
                        .await
                        .unwrap_or_else(|_| {
                            Err(Error::unavailable(
                                BACKEND,
                                format!(
                                    "node {} did not answer within {timeout:?}",
                                    self.inner.nodes[i].shown
                                ),
                            ))
                        });
                    (i, result)
                }
            });
        futures_util::future::join_all(calls).await
    }

    /// Like [`Self::each`], with the answers tallied; the values of the
    /// nodes that answered come first.
    pub(super) async fn tally<T, F, Fut>(&self, mask: Mask, op: F) -> (Vec<(usize, T)>, Tally)
    where
        F: Fn(RedisStore) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut tally = Tally::default();
        let mut values = Vec::new();
        for (i, result) in self.each(mask, op).await {
            if let Some(v) = tally.note(i, result) {
                values.push((i, v));
            }
        }
        (values, tally)
    }

    /// `Ok` when a majority answered; else the error that says why not.
    pub(super) fn majority_or_error(&self, tally: &Tally) -> Result<()> {
        let (n, majority) = (self.inner.nodes.len(), self.inner.majority);
        if let Some(conflict) = &tally.conflict {
            return Err(match conflict {
                Error::Conflict { name, reason } => Error::Conflict {
                    name: name.clone(),
                    reason: reason.clone(),
                },
                _ => Error::backend(BACKEND, "conflict"),
            });
        }
        if count(tally.ok) >= majority {
            return Ok(());
        }
        // Could a majority still have said yes, had the failed nodes answered?
        if count(tally.ok | tally.failed) >= majority {
            if let Some(Error::Auth { reason, .. }) = &tally.failure {
                return Err(Error::Auth {
                    backend: BACKEND,
                    reason: reason.clone(),
                });
            }
            let why = tally
                .failure
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            return Err(Error::unavailable(
                BACKEND,
                format!(
                    "{} of {n} nodes answered, a majority needs {majority}{why}",
                    count(tally.ok)
                ),
            ));
        }
        if count(tally.lost) >= count(tally.not_held) {
            Err(Error::SessionLost(crate::error::LostReason::Expired))
        } else {
            Err(Error::NotHeld(
                "a majority of nodes holds no such entry for this session",
            ))
        }
    }

    /// On how many of `answered` nodes an entry must show to count: every
    /// entry on a majority shows on at least this many of them.
    pub(super) fn threshold(&self, answered: usize) -> usize {
        let n = self.inner.nodes.len();
        (self.inner.majority + answered).saturating_sub(n).max(1)
    }
}

/// Whether ending a session by its tag ended a live one, from the nodes
/// that `answered` and those of them that `ended` it. A session lives while
/// a majority keeps it (its renewals need one), so: ended on a majority, it
/// was live and is over; kept by fewer than a majority even counting every
/// node that did not answer, it was not live (what a node ended was left
/// over, as by a close that missed it); in between, the nodes that did not
/// answer decide, and nobody can say yet.
pub(super) fn ended_live_session(
    n: usize,
    majority: usize,
    ended: Mask,
    answered: Mask,
) -> Result<bool> {
    let unanswered = n.saturating_sub(count(answered));
    if count(ended) >= majority {
        Ok(true)
    } else if count(ended) + unanswered < majority {
        Ok(false)
    } else {
        Err(Error::unavailable(
            BACKEND,
            format!(
                "the session was ended on {} of {n} nodes, a majority needs {majority}, and \
                 {unanswered} did not answer: it may have been live (it cannot renew now)",
                count(ended)
            ),
        ))
    }
}
