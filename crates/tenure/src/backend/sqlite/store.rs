//! The [`Store`] contract over the file: each operation is one call (a
//! transaction or a read) of the files beside this one.

use async_trait::async_trait;

use super::registers::{self, to_i64, Register};
use super::{entries, read, sessions, SqliteStore, POLL_MAX, POLL_MIN};
use crate::backend::poll;
use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

#[async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let label = spec.label.clone();
        let ttl_ms = spec.ttl_ms();
        let (k, t) = (opened.key.secret().to_string(), opened.tag.clone());
        self.write(move |tx| sessions::open(tx, &k, &t, &label, ttl_ms))
            .await?;
        Ok(opened)
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        let changed = self
            .run(|conn| {
                conn.execute(
                    "UPDATE tenure_meta SET value = ?1 WHERE key = 'schema' AND value = ?2",
                    [super::layout::FINISHED_VERSION, super::layout::SCHEMA_VERSION],
                )
                .map_err(super::calls::db_err)
            })
            .await?;
        Ok(if changed > 0 {
            vec![format!(
                "schema marker {} -> {} (builds of 0.1.0 refuse the file from their next start)",
                super::layout::SCHEMA_VERSION,
                super::layout::FINISHED_VERSION
            )]
        } else {
            Vec::new()
        })
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        self.run(|conn| sessions::builds(conn)).await
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        let key = session.clone();
        self.run(move |conn| sessions::renew(conn, &key)).await
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let key = session.clone();
        self.write(move |tx| sessions::close(tx, &key)).await
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let key = session.clone();
        let name = name.clone();
        let value = value.to_vec();
        let joining = name.clone();
        let (joined, newly_ahead) = self
            .run(move |conn| entries::join(conn, &key, &joining, kind, &value, mode))
            .await?;
        self.notify(&[(name, newly_ahead)]);
        Ok(joined)
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        let key = session.clone();
        let name = name.clone();
        self.write(move |tx| entries::leave(tx, &key, &name, seq))
            .await
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        self.wait_granted(session, name, seq).await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let key = key.clone();
        let name = name.clone();
        let value = value.to_vec();
        self.write(move |tx| entries::set_value(tx, &key, &name, seq, &value))
            .await
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        loop {
            let n = name.clone();
            let (queue, stale) = self.run(move |conn| read::queue_rows(conn, &n)).await?;
            if !stale {
                return Ok(queue);
            }
            // Unlike settling's walk, end every expired session with an
            // entry here, also behind the first waiter: this reads the whole
            // queue anyway and must not find the same dead entry again.
            let name = name.clone();
            self.write(move |tx| read::end_expired(tx, &name)).await?;
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let (listening, _) = self.inner.listeners.listen(poll::change_key(name.as_str()));
        // Other processes' changes are not pushed: poll.
        let pushed = || async { false };
        poll::until_changed(
            self,
            name,
            version,
            listening.notify(),
            POLL_MIN,
            POLL_MAX,
            pushed,
        )
        .await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let prefix = prefix.to_string();
        let names: Vec<String> = self.run(move |conn| read::names(conn, &prefix)).await?;
        names.into_iter().map(|n| Name::stored(&n)).collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let name = name.clone();
        self.write(move |tx| sessions::evict_holders(tx, &name))
            .await
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let tag = tag.to_string();
        self.write(move |tx| sessions::evict_tag(tx, &tag)).await
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let name = name.clone();
        let (token, value) = match op {
            FenceOp::Read => (None, None),
            FenceOp::Admit { token, value } => (Some(to_i64(token)?), value.map(<[u8]>::to_vec)),
        };
        self.run(move |conn| registers::fence(conn, &name, token, &value))
            .await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let name = name.clone();
        self.run(move |conn| Register::cell(conn, &name).map(|(_, value)| value))
            .await
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let (name, value, owner) = (name.clone(), value.to_vec(), owner.cloned());
        self.run(move |conn| registers::cell_put(conn, &name, &value, expect, &owner))
            .await
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let name = name.clone();
        self.run(move |conn| registers::cell_delete(conn, &name, version))
            .await
    }
}
