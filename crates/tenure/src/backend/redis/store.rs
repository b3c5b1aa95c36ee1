//! The `Store` impl: each operation one call of the script (see
//! `script.rs`), decoded by `reply.rs`.

use async_trait::async_trait;

use super::node::NodeJoin;
use super::reply::{self, bad_reply, bytes, cell_write, number, text, unsigned, watch_at};
use super::script::Reply;
use super::{RedisStore, POLL_MAX, POLL_MIN};
use crate::backend::poll::{self, Look};
use crate::error::Result;
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinRequest, Joined, Name, OpenedSession,
    Queue, SessionKey, SessionSpec, Store, Versioned,
};

#[async_trait]
impl Store for RedisStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        self.open_session_as(&opened, spec).await?;
        if let Err(e) = self.record_build(&opened.key).await {
            // A session without its build would be taken for an older
            // build's (and refuse `upgrade finish`): it is closed again.
            let _ = self.close_session(&opened.key).await;
            return Err(e);
        }
        Ok(opened)
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.retire_older_layouts().await
    }

    async fn declare_new(&self) -> Result<Vec<String>> {
        self.declare_new_prefix().await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        Ok(crate::store::SessionBuild::listed(
            self.session_builds_by_secret().await?.into_values(),
        ))
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        // With `replicas=N`, a renewal the replicas did not acknowledge is
        // not one: the session's local deadline is not extended.
        let (_, acked) = self
            .call_acked("keepalive", &[session.secret().as_bytes()])
            .await?;
        if acked {
            Ok(())
        } else {
            Err(self.unacknowledged("a renewal").await)
        }
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.call("close", &[session.secret().as_bytes()])
            .await
            .map(|_| ())
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let mut confirmed = false;
        loop {
            match self.join_at(session, name, kind, value, mode, None).await? {
                NodeJoin::Placed(joined) => return Ok(Some(joined)),
                // A try-lock held only by holders that lapsed by the
                // server's clock: that clock alone is not trusted, so watch
                // them for their TTL, then end them if none renewed, and try
                // once more.
                NodeJoin::NotGranted(Some(watch)) if !confirmed => {
                    confirmed = true;
                    if !self.confirm_expired(name, &watch).await? {
                        return Ok(None);
                    }
                }
                NodeJoin::NotGranted(_) => return Ok(None),
                NodeJoin::Behind(_) | NodeJoin::Ahead(_) => {
                    return Err(bad_reply("a seq was refused that was not proposed"))
                }
            }
        }
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.inner.wakeups.joined.take(name, seq);
        let reply = self
            .call_fast(
                "leave",
                &[
                    session.secret().as_bytes(),
                    name.as_str().as_bytes(),
                    seq.to_string().as_bytes(),
                    self.inner.db.as_bytes(),
                ],
            )
            .await?;
        // The fast path answers 0: the last hold was given back.
        let Reply::Table(reply) = reply else {
            return Ok(0);
        };
        let holds = reply.get(1).ok_or_else(|| bad_reply("short leave reply"))?;
        u32::try_from(number(holds)?).map_err(|_| bad_reply("holds"))
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        // The script publishes to `P:w:NAME<TAB>SEQ` (20 digits), so a
        // name's channels sort in queue order: without pub/sub only the
        // first waiter of the name in this process polls.
        let channels = format!("{}\t", self.channel("w", name));
        let listening = self
            .listen(format!("{channels}{seq:020}"))
            .await
            .in_line(channels);
        // The join said what a first look would: once this waiter is
        // subscribed, only check that its entry was not granted before.
        let first = (self.inner.wakeups.joined.take(name, seq))
            .map(|joined| (joined, || self.still_queued(name, seq)));
        let seq = &seq.to_string();
        let pushed = || self.subscribe(None);
        poll::until_granted(
            &listening,
            POLL_MIN,
            POLL_MAX,
            pushed,
            |confirm| async move {
                let confirm = confirm.unwrap_or_default();
                let reply = self
                    .call(
                        "look",
                        &[
                            session.secret().as_bytes(),
                            name.as_str().as_bytes(),
                            seq.as_bytes(),
                            confirm.as_bytes(),
                        ],
                    )
                    .await?;
                match reply.first().map(text).transpose()?.as_deref() {
                    Some("granted") => Ok(Look::Granted),
                    Some("wait") => Ok(Look::Wait {
                        until: poll::next_expiry(reply.get(1).map(number).transpose()?),
                        next: reply.get(2).map(number).transpose()? == Some(1),
                        watch: watch_at(&reply, 3)?,
                    }),
                    _ => Err(bad_reply(&format!("{reply:?}"))),
                }
            },
            first,
        )
        .await?;
        // With `replicas=N`, a grant (by a release's announcement or a
        // look) is acted on once a write of this client after it — a
        // renewal — is acknowledged: replication keeps the master's order,
        // so the grant is on the replicas too.
        if self.inner.replicas.is_some() {
            self.keep_alive(session).await?;
        }
        Ok(())
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let seq = seq.to_string();
        self.call(
            "setvalue",
            &[
                key.secret().as_bytes(),
                name.as_str().as_bytes(),
                seq.as_bytes(),
                value,
            ],
        )
        .await
        .map(|_| ())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let reply = self.call("queue", &[name.as_str().as_bytes()]).await?;
        reply::queue(&reply)
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let listening = self.listen(self.channel("ch", name)).await;
        let pushed = || self.subscribe(None);
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
        let reply = self.call("names", &[prefix.as_bytes()]).await?;
        let mut names = reply[1..]
            .iter()
            .map(|v| text(v).and_then(|t| Name::stored(&t)))
            .collect::<Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let reply = self.call("evict", &[name.as_str().as_bytes()]).await?;
        let n = number(reply.get(1).ok_or_else(|| bad_reply("short evict reply"))?)?;
        usize::try_from(n).map_err(|_| bad_reply("count"))
    }

    /// No key maps a tag to its session (that would need a layout change,
    /// or miss older clients' sessions): the script reads the session
    /// records one bounded HSCAN step per call (see `evictsession` in
    /// `redis.lua`), so a full look costs one round trip per 256 or so
    /// sessions, each call short; the session found is ended atomically in
    /// the call that finds it.
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let mut cursor = String::from("0");
        loop {
            let reply = self
                .call("evictsession", &[tag.as_bytes(), cursor.as_bytes()])
                .await?;
            let short = || bad_reply("short evictsession reply");
            if number(reply.get(1).ok_or_else(short)?)? == 1 {
                return Ok(true);
            }
            cursor = text(reply.get(2).ok_or_else(short)?)?;
            if cursor == "0" {
                return Ok(false);
            }
        }
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.fence_on_node(name, op).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let reply = self.call("cellget", &[name.as_str().as_bytes()]).await?;
        match (reply.get(1), reply.get(2)) {
            (Some(version), Some(value)) => Ok(Some(Versioned {
                value: bytes(value)?,
                version: unsigned(version)?,
            })),
            _ => Ok(None),
        }
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let expected = match expect {
            Expect::Absent => "0".to_string(),
            Expect::Version(v) => v.to_string(),
        };
        let owner = owner.map_or("", SessionKey::secret);
        let args: [&[u8]; 4] = [
            name.as_str().as_bytes(),
            value,
            expected.as_bytes(),
            owner.as_bytes(),
        ];
        cell_write(self.call("cellput", &args).await?)
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let version = version.to_string();
        let args: [&[u8]; 2] = [name.as_str().as_bytes(), version.as_bytes()];
        cell_write(self.call("celldel", &args).await?)
    }
}
