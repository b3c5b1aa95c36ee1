//! The [`Store`] contract over etcd: each operation hands over to the file
//! that does its job (sessions, joining, waiting, leaving, the queue,
//! fences and cells).

use async_trait::async_trait;

use super::EtcdStore;
use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

#[async_trait]
impl Store for EtcdStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.grant_session(spec).await
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.renew_session(session).await
    }

    /// etcd keeps no marker older builds read: this records that the
    /// upgrade was finished (`PREFIX/format`), and older builds started
    /// later are not refused.
    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        let key = self.key("format");
        let txn = super::rpc::Txn::new().and_then(vec![super::rpc::TxnOp::put(
            key.clone(),
            super::FORMAT,
            None,
        )]);
        crate::backend::poll::retrying(|| self.txn(txn.clone())).await?;
        Ok(vec![format!(
            "{} = {} (builds of 0.1.0 do not read it: stop them all before finishing)",
            String::from_utf8_lossy(&key),
            super::FORMAT
        )])
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.list_session_builds().await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.revoke_session(session).await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.join_queue(session, request).await
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.leave_queue(session, name, seq).await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.await_turn(session, name, seq).await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.write_value(key, name, seq, value).await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.queue_at(name).await.map(|(q, _)| q)
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.await_change(name, version).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.list_names(prefix).await
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.evict_granted(name).await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.evict_tagged(tag).await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.fence_op(name, op).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.read_cell(name).await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.write_cell(name, value, expect, owner).await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.delete_cell(name, version).await
    }
}
