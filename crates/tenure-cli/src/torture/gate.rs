//! Faults for workers that are tasks of the harness (a store that lives in
//! this process, `memory://`): each sees the store through a [`Gated`]
//! view that the harness can freeze (a pause: calls wait, answers wait) or
//! close for good (a kill: every call fails, so the worker's session is
//! never closed and expires as a crashed process's would).

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::watch;

use tenure::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Versioned,
};
use tenure::{Error, Result, Store};

/// What a gated view lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// Calls wait until the gate opens again (and so do their answers).
    Frozen,
    /// Every call fails, for good.
    Dead,
}

/// A worker task's view of the store.
#[derive(Debug)]
pub struct Gated {
    inner: Arc<dyn Store>,
    gate: watch::Receiver<Gate>,
}

impl Gated {
    /// A view of `store`, open, and its gate.
    pub fn wrap(store: Arc<dyn Store>) -> (Arc<dyn Store>, watch::Sender<Gate>) {
        let (tx, gate) = watch::channel(Gate::Open);
        (Arc::new(Gated { inner: store, gate }), tx)
    }

    /// Waits while frozen; fails once dead.
    async fn pass(&self) -> Result<()> {
        let mut gate = self.gate.clone();
        match gate.wait_for(|g| *g != Gate::Frozen).await.map(|g| *g) {
            Ok(Gate::Open) => Ok(()),
            _ => Err(killed()),
        }
    }

    /// `call`, through the gate both ways; a kill while it waits ends it.
    async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        self.pass().await?;
        let mut gate = self.gate.clone();
        let out = tokio::select! {
            out = call => out,
            _ = gate.wait_for(|g| *g == Gate::Dead) => return Err(killed()),
        };
        self.pass().await?;
        out
    }
}

fn killed() -> Error {
    Error::Unavailable {
        backend: "torture",
        source: "this worker was killed".into(),
    }
}

#[async_trait]
impl Store for Gated {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.call(self.inner.open_session(spec)).await
    }
    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.call(self.inner.keep_alive(session)).await
    }
    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.call(self.inner.close_session(session)).await
    }
    async fn session_builds(&self) -> Result<Vec<tenure::store::SessionBuild>> {
        self.call(self.inner.session_builds()).await
    }
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.call(self.inner.retire_older_formats()).await
    }
    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.call(self.inner.join(session, request)).await
    }
    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.call(self.inner.leave(session, name, seq)).await
    }
    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.call(self.inner.await_grant(session, name, seq)).await
    }
    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.call(self.inner.set_value(key, name, seq, value)).await
    }
    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.call(self.inner.queue(name)).await
    }
    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.call(self.inner.wait_changed(name, version)).await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.call(self.inner.names(prefix)).await
    }
    async fn evict(&self, name: &Name) -> Result<usize> {
        self.call(self.inner.evict(name)).await
    }
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.call(self.inner.evict_session(tag)).await
    }
    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.call(self.inner.fence(name, op)).await
    }
    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.call(self.inner.cell_get(name)).await
    }
    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.call(self.inner.cell_put(name, value, expect, owner))
            .await
    }
    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.call(self.inner.cell_delete(name, version)).await
    }
}

/// The harness's hold on a worker task: its gate, its stop, its abort.
pub struct TaskControl {
    gate: watch::Sender<Gate>,
    term: watch::Sender<bool>,
    abort: tokio::task::AbortHandle,
}

impl TaskControl {
    pub fn new(
        gate: watch::Sender<Gate>,
        term: watch::Sender<bool>,
        abort: tokio::task::AbortHandle,
    ) -> Self {
        TaskControl { gate, term, abort }
    }

    /// A kill: the task ends where it is, and nothing it left behind (a
    /// close, a release) reaches the store.
    pub fn kill(&self) {
        self.gate.send_replace(Gate::Dead);
        self.abort.abort();
    }

    /// Freezes or opens the gate (never reopens a dead one).
    pub fn set(&self, to: Gate) {
        self.gate.send_if_modified(|g| {
            let change = *g != Gate::Dead && *g != to;
            if change {
                *g = to;
            }
            change
        });
    }

    /// Asks the worker to finish cleanly.
    pub fn terminate(&self) {
        self.term.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_frozen_view_waits_and_a_dead_one_fails_for_good() {
        let store: Arc<dyn Store> = Arc::new(tenure::backend::memory::MemoryStore::new());
        let (view, gate) = Gated::wrap(store.clone());
        let name = Name::new("g").expect("a name");
        assert!(view.names("").await.is_ok());
        gate.send_replace(Gate::Frozen);
        let waiting = tokio::spawn({
            let view = view.clone();
            async move { view.queue(&name).await.map(|q| q.entries.len()) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "a frozen view answered");
        gate.send_replace(Gate::Open);
        let answered = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("answered once open")
            .expect("task");
        assert_eq!(answered.ok(), Some(0));
        gate.send_replace(Gate::Dead);
        let e = view.names("").await.expect_err("dead");
        assert!(e.is_temporary(), "{e:?}");
        // The store itself is untouched.
        assert!(store.names("").await.is_ok());
    }
}
