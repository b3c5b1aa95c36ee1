//! The store wrapper that says which servers did not answer and when to
//! stop asking: every [`Error::Unavailable`](crate::Error::Unavailable) a
//! call returns names the servers of the store's URL (never its user or
//! password), as the errors of opening it do, and every call but the two
//! that wait for others ([`Store::await_grant`], [`Store::wait_changed`])
//! fails with it once the store's
//! [`call_deadline`](crate::Capabilities::call_deadline) has passed, retries
//! included. [`open`](crate::open) puts it around every store whose URL
//! names servers, so no backend has to.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

/// A store whose unavailable errors name its servers, and whose calls end
/// by its call deadline.
pub(crate) struct Addressed {
    inner: Arc<dyn Store>,
    /// The URL's servers, as `host:port[,host:port…]`.
    servers: String,
}

impl Addressed {
    /// Wraps `store`, whose URL names `servers`; a store with none (a file,
    /// memory) is returned as it is.
    pub(crate) fn wrap(store: Arc<dyn Store>, servers: &str) -> Arc<dyn Store> {
        if servers.is_empty() {
            return store;
        }
        Arc::new(Addressed {
            inner: store,
            servers: servers.to_string(),
        })
    }

    /// A call that waits for others: its errors named.
    async fn named<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        call.await.map_err(|e| e.at_servers(&self.servers))
    }

    /// One call: its errors named, and ended by the call deadline. The
    /// call is dropped there, and may or may not have taken effect (an
    /// `Unavailable` the recipes treat so).
    async fn bounded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let deadline = self.inner.capabilities().call_deadline;
        match tokio::time::timeout(deadline, call).await {
            Ok(answer) => answer.map_err(|e| e.at_servers(&self.servers)),
            Err(_) => Err(crate::Error::unavailable(
                self.inner.capabilities().backend,
                format!("no answer within the store's call deadline ({deadline:?})"),
            )
            .at_servers(&self.servers)),
        }
    }
}

/// Shows the wrapped store only: the wrapper is not part of what a store is.
impl fmt::Debug for Addressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

#[async_trait]
impl Store for Addressed {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.bounded(self.inner.open_session(spec)).await
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.bounded(self.inner.keep_alive(session)).await
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.bounded(self.inner.retire_older_formats()).await
    }

    async fn declare_new(&self) -> Result<Vec<String>> {
        self.bounded(self.inner.declare_new()).await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.bounded(self.inner.session_builds()).await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.bounded(self.inner.close_session(session)).await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.bounded(self.inner.join(session, request)).await
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.bounded(self.inner.leave(session, name, seq)).await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.named(self.inner.await_grant(session, name, seq)).await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.bounded(self.inner.set_value(key, name, seq, value))
            .await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.bounded(self.inner.queue(name)).await
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.named(self.inner.wait_changed(name, version)).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.bounded(self.inner.names(prefix)).await
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.bounded(self.inner.evict(name)).await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.bounded(self.inner.evict_session(tag)).await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.bounded(self.inner.fence(name, op)).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.bounded(self.inner.cell_get(name)).await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.bounded(self.inner.cell_put(name, value, expect, owner))
            .await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.bounded(self.inner.cell_delete(name, version)).await
    }
}
