//! The one store wrapper that records metrics: every contract operation's
//! latency and errors, by backend and operation. [`open`](crate::open) puts
//! it around every store, so no backend records anything itself.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::error::Result;
use crate::metrics::store_op;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

/// A store that records `tenure_store_operation_seconds` (the latency of
/// each operation; `await_grant` and `wait_changed` wait, so they are not
/// timed) and `tenure_store_errors_total` (failed operations by error kind),
/// labelled with the backend's name and the operation, then passes each call
/// on unchanged.
///
/// [`open`](crate::open) wraps every store it opens; wrap a store of your own
/// (a [`Store`] you implement, or a backend opened without `open`) with
/// [`Metered::wrap`]. A store wrapped twice counts every operation twice.
pub struct Metered {
    inner: Arc<dyn Store>,
    backend: &'static str,
}

impl Metered {
    /// Wraps `store`, and describes tenure's metrics to the recorder
    /// installed now ([`describe`](crate::metrics::describe)).
    pub fn wrap(store: Arc<dyn Store>) -> Arc<dyn Store> {
        crate::metrics::describe();
        let backend = store.capabilities().backend;
        Arc::new(Metered {
            inner: store,
            backend,
        })
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    async fn timed<T>(&self, op: &'static str, call: impl Future<Output = Result<T>>) -> Result<T> {
        if !crate::metrics::enabled() {
            return call.await;
        }
        let started = Instant::now();
        let result = call.await;
        store_op(
            self.backend,
            op,
            Some(started.elapsed()),
            result.as_ref().err(),
        );
        result
    }

    async fn waited<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if !crate::metrics::enabled() {
            return call.await;
        }
        let result = call.await;
        store_op(self.backend, op, None, result.as_ref().err());
        result
    }
}

/// Shows the wrapped store only: the wrapper is not part of what a store is.
impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

#[async_trait]
impl Store for Metered {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.timed("open_session", self.inner.open_session(spec))
            .await
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.timed("keep_alive", self.inner.keep_alive(session))
            .await
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.timed("retire_older_formats", self.inner.retire_older_formats())
            .await
    }

    async fn declare_new(&self) -> Result<Vec<String>> {
        self.timed("declare_new", self.inner.declare_new()).await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.timed("session_builds", self.inner.session_builds())
            .await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.timed("close_session", self.inner.close_session(session))
            .await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.timed("join", self.inner.join(session, request)).await
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.timed("leave", self.inner.leave(session, name, seq))
            .await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.waited("await_grant", self.inner.await_grant(session, name, seq))
            .await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.timed("set_value", self.inner.set_value(key, name, seq, value))
            .await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.timed("queue", self.inner.queue(name)).await
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.waited("wait_changed", self.inner.wait_changed(name, version))
            .await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.timed("names", self.inner.names(prefix)).await
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.timed("evict", self.inner.evict(name)).await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.timed("evict_session", self.inner.evict_session(tag))
            .await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.timed("fence", self.inner.fence(name, op)).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.timed("cell_get", self.inner.cell_get(name)).await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.timed("cell_put", self.inner.cell_put(name, value, expect, owner))
            .await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.timed("cell_delete", self.inner.cell_delete(name, version))
            .await
    }
}
