//! The store wrapper that says which servers did not answer: every
//! [`Error::Unavailable`](crate::Error::Unavailable) a call returns names
//! the servers of the store's URL (never its user or password), as the
//! errors of opening it do. [`open`](crate::open) puts it around every
//! store whose URL names servers, so no backend has to.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

/// A store whose unavailable errors name its servers.
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

    async fn named<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        call.await.map_err(|e| e.at_servers(&self.servers))
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
        self.named(self.inner.open_session(spec)).await
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.named(self.inner.keep_alive(session)).await
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.named(self.inner.retire_older_formats()).await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.named(self.inner.session_builds()).await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.named(self.inner.close_session(session)).await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.named(self.inner.join(session, request)).await
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.named(self.inner.leave(session, name, seq)).await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.named(self.inner.await_grant(session, name, seq)).await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.named(self.inner.set_value(key, name, seq, value))
            .await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.named(self.inner.queue(name)).await
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.named(self.inner.wait_changed(name, version)).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.named(self.inner.names(prefix)).await
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.named(self.inner.evict(name)).await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.named(self.inner.evict_session(tag)).await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.named(self.inner.fence(name, op)).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.named(self.inner.cell_get(name)).await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.named(self.inner.cell_put(name, value, expect, owner))
            .await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.named(self.inner.cell_delete(name, version)).await
    }
}
