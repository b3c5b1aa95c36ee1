//! A store that counts the calls made to it (the `Store` trait's
//! operations, by everyone who uses it), keep-alives apart: what a grant
//! costs in store operations, beside what it costs in time. The bench's
//! operations per grant and the conformance checks of wake-ups count
//! through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionBuild, SessionKey, SessionSpec, Store, Versioned,
};
use tenure::Result;

/// Passes every call on to the store it wraps, counting them.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn Store>,
    capabilities: Capabilities,
    calls: AtomicU64,
    keep_alives: AtomicU64,
}

impl Counting {
    /// `inner`, counted.
    pub fn wrap(inner: Arc<dyn Store>) -> Arc<Counting> {
        let capabilities = inner.capabilities().clone();
        Arc::new(Counting {
            inner,
            capabilities,
            calls: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
        })
    }

    /// `inner`, counted, stating `bound` as its
    /// [`Capabilities::barging_bound`]: a check of how non-fair waiters
    /// wait in line, before any of them has waited the store's own bound.
    pub fn with_barging_bound(inner: Arc<dyn Store>, bound: Duration) -> Arc<Counting> {
        let mut capabilities = inner.capabilities().clone();
        capabilities.barging_bound = bound;
        Arc::new(Counting {
            inner,
            capabilities,
            calls: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
        })
    }

    /// Calls so far, keep-alives not counted.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for Counting {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }
    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.count();
        self.inner.open_session(spec).await
    }
    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
        self.inner.keep_alive(session).await
    }
    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.count();
        self.inner.close_session(session).await
    }
    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.count();
        self.inner.join(session, request).await
    }
    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.count();
        self.inner.leave(session, name, seq).await
    }
    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.count();
        self.inner.await_grant(session, name, seq).await
    }
    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.count();
        self.inner.set_value(key, name, seq, value).await
    }
    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.count();
        self.inner.queue(name).await
    }
    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.count();
        self.inner.wait_changed(name, version).await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.count();
        self.inner.names(prefix).await
    }
    async fn evict(&self, name: &Name) -> Result<usize> {
        self.count();
        self.inner.evict(name).await
    }
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.count();
        self.inner.evict_session(tag).await
    }
    async fn session_builds(&self) -> Result<Vec<SessionBuild>> {
        self.count();
        self.inner.session_builds().await
    }
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.count();
        self.inner.retire_older_formats().await
    }
    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.count();
        self.inner.fence(name, op).await
    }
    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.count();
        self.inner.cell_get(name).await
    }
    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.count();
        self.inner.cell_put(name, value, expect, owner).await
    }
    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.count();
        self.inner.cell_delete(name, version).await
    }
}
