//! The tenure contract over ZooKeeper: each call hands over to the file
//! that does that job.

use async_trait::async_trait;

use super::ZkStore;
use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

#[async_trait]
impl Store for ZkStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        self.start_session(spec).await
    }

    async fn keep_alive(&self, key: &SessionKey) -> Result<()> {
        self.renew_session(key).await
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.mark_format().await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.list_session_builds().await
    }

    async fn close_session(&self, key: &SessionKey) -> Result<()> {
        self.end_session(key).await
    }

    async fn join(&self, key: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        self.join_queue(key, request).await
    }

    async fn leave(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.leave_queue(key, name, seq).await
    }

    async fn await_grant(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.wait_for_grant(key, name, seq).await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        self.set_entry_value(key, name, seq, value).await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        self.read_queue(name).await
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        self.wait_for_change(name, version).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.list_names(prefix).await
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        self.evict_holders(name).await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        self.evict_tag(tag).await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.fence_op(name, op).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        self.get_cell(name).await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        self.put_cell(name, value, expect, owner).await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        self.delete_cell(name, version).await
    }
}
