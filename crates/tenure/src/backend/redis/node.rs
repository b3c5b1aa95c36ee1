//! The operations a Redlock node runs too (a session opened as chosen, a
//! join at a proposed seq, a fence vote, confirming lapsed holders,
//! listening for changes), and the waiter's check of its own record.

use redis::Value;

use super::connect::redis_err;
use super::reply::{bad_reply, bytes, number, text, unsigned, watch_at};
use super::script::Reply;
use super::RedisStore;
use crate::backend::codec;
use crate::backend::poll::{self, Listening, Look, Watch};
use crate::error::{Error, LostReason, Result};
use crate::store::{
    EntryKind, FenceOp, FenceState, JoinMode, Joined, Name, OpenedSession, SessionKey, SessionSpec,
};

/// What one node answered to a join (see [`RedisStore::join_at`]).
#[derive(Debug, Clone)]
pub(crate) enum NodeJoin {
    /// The entry is in the node's queue.
    Placed(Joined),
    /// `JoinMode::IfGranted` and it would not be granted: nothing changed.
    /// With what to watch when only holders that lapsed by the server's
    /// clock stand in the way.
    NotGranted(Option<Watch>),
    /// The proposed seq is not above this one, which the node has already
    /// seen for the name: nothing changed.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    Behind(u64),
    /// The proposed seq is further ahead of the node's clock than it takes;
    /// this is the highest it would take now: nothing changed.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    Ahead(u64),
}

impl RedisStore {
    /// One fence operation on this node (Redis's `fence`, and each node's
    /// vote of Redlock's).
    pub(crate) async fn fence_on_node(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let token = match op {
            FenceOp::Read => String::new(),
            FenceOp::Admit { token, .. } => format!("{token:020}"),
        };
        let value = match op {
            FenceOp::Admit { value: Some(v), .. } => v,
            _ => &[],
        };
        let write: &[u8] = if value.is_empty() { b"" } else { b"1" };
        let args: [&[u8]; 4] = [name.as_str().as_bytes(), token.as_bytes(), write, value];
        // An admission raises the fence: with `replicas=N` it counts once
        // acknowledged, or a failover could lower it again.
        let (reply, acked) = match op {
            FenceOp::Read => (self.call("fence", &args).await?, true),
            FenceOp::Admit { .. } => self.call_acked("fence", &args).await?,
        };
        let highest = text(reply.get(1).ok_or_else(|| bad_reply("short fence reply"))?)?;
        let admitted = reply.first().map(text).transpose()?.as_deref() == Some("ok");
        if admitted && !acked {
            return Err(self
                .unacknowledged(&format!("the fence admission on {name:?}"))
                .await);
        }
        Ok(FenceState {
            admitted,
            highest: highest
                .parse()
                .map_err(|_| bad_reply(&format!("fence highest {highest:?}")))?,
            value: match reply.get(2) {
                None | Some(Value::Nil) => None,
                Some(v) => Some(bytes(v)?),
            },
        })
    }

    /// Opens a session whose secret and tag the caller chose (Redlock opens
    /// the same session on every node).
    pub(crate) async fn open_session_as(
        &self,
        opened: &OpenedSession,
        spec: &SessionSpec,
    ) -> Result<()> {
        let ttl = spec.ttl.as_millis().to_string();
        // Tabs and newlines separate fields in the script's records.
        let label = poll::printable(&spec.label);
        let args: [&[u8]; 4] = [
            opened.key.secret().as_bytes(),
            opened.tag.as_bytes(),
            ttl.as_bytes(),
            label.as_bytes(),
        ];
        let reply = match self.call("open", &args).await {
            // The prefix lost its marker since this client looked: look
            // again (which makes the keyspace quiet), then open.
            Err(Error::SessionLost(LostReason::Forgotten)) => {
                self.check_layout(false).await?;
                self.call("open", &args).await?
            }
            other => other?,
        };
        self.warn_if_quiet(&reply);
        Ok(())
    }

    /// Records the build that opened `session` on this node (format 5).
    pub(crate) async fn record_build(&self, session: &SessionKey) -> Result<()> {
        let build = crate::store::Build::this(super::FORMAT).encode();
        let mut conn = self.inner.master.conn().await?;
        redis::cmd("HSET")
            .arg(super::layout::builds_key(&self.inner.prefix))
            .arg(session.secret())
            .arg(build)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.inner.master.failed(e))
    }

    /// This node's sessions not yet ended, by secret: (tag, label, build).
    /// Builds recorded for sessions that have ended are pruned.
    pub(crate) async fn session_builds_by_secret(
        &self,
    ) -> Result<std::collections::HashMap<String, (String, String, Option<String>)>> {
        let mut conn = self.inner.master.conn().await?;
        let (info, builds): (
            std::collections::HashMap<String, String>,
            std::collections::HashMap<String, String>,
        ) = redis::pipe()
            // One moment (MULTI/EXEC): a session opened between two plain
            // reads would have its build pruned as if it had ended.
            .atomic()
            .cmd("HGETALL")
            .arg(format!("{}:sinfo", self.inner.prefix))
            .cmd("HGETALL")
            .arg(super::layout::builds_key(&self.inner.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.master.failed(e))?;
        let ended: Vec<&String> = builds.keys().filter(|s| !info.contains_key(*s)).collect();
        if !ended.is_empty() {
            redis::cmd("HDEL")
                .arg(super::layout::builds_key(&self.inner.prefix))
                .arg(ended)
                .query_async::<()>(&mut conn)
                .await
                .map_err(redis_err)?;
        }
        Ok(info
            .into_iter()
            .map(|(secret, record)| {
                // "tag\tttl_ms\tlabel", as format 4 keeps it.
                let mut fields = record.splitn(3, '\t');
                let tag = fields.next().unwrap_or_default().to_string();
                let label = fields.nth(1).unwrap_or_default().to_string();
                let build = builds.get(&secret).cloned();
                (secret, (tag, label, build))
            })
            .collect())
    }

    /// Joins with the seq the node picks (`proposed` = `None`) or with
    /// `proposed`, which the node takes only if it is above every seq it has
    /// seen for the name.
    pub(crate) async fn join_at(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
        proposed: Option<u64>,
    ) -> Result<NodeJoin> {
        let (_, count, limit) = codec::kind_code(kind);
        let (count, limit) = (count.to_string(), limit.to_string());
        let k = codec::kind_letter(kind);
        let mode = match mode {
            JoinMode::Wait => "wait",
            JoinMode::IfGranted => "ifgranted",
        };
        let proposed = proposed.map(|p| p.to_string()).unwrap_or_default();
        let (reply, acked) = self
            .call_fast_acked(
                "join",
                &[
                    session.secret().as_bytes(),
                    name.as_str().as_bytes(),
                    k.as_bytes(),
                    count.as_bytes(),
                    limit.as_bytes(),
                    value,
                    mode.as_bytes(),
                    proposed.as_bytes(),
                ],
            )
            .await?;
        let reply = match reply {
            Reply::Table(reply) => reply,
            // The fast path's answer: granted, one hold; negative if the
            // name's counter was new.
            Reply::Fast(n) => {
                let joined = Joined {
                    seq: n.unsigned_abs(),
                    granted: true,
                    holds: 1,
                    first: n < 0,
                };
                return self.placed(session, name, joined, acked).await;
            }
        };
        let field = |i: usize| reply.get(i).ok_or_else(|| bad_reply("short join reply"));
        match text(field(0)?)?.as_str() {
            "none" => Ok(NodeJoin::NotGranted(
                match reply.get(3).map(number).transpose()? {
                    // Every holder lapsed by the server's clock: worth watching.
                    Some(1) => watch_at(&reply, 1)?,
                    _ => None,
                },
            )),
            "behind" => Ok(NodeJoin::Behind(unsigned(field(1)?)?)),
            "ahead" => Ok(NodeJoin::Ahead(unsigned(field(1)?)?)),
            _ => {
                let joined = Joined {
                    seq: unsigned(field(1)?)?,
                    granted: number(field(2)?)? == 1,
                    holds: u32::try_from(number(field(3)?)?).map_err(|_| bad_reply("holds"))?,
                    first: number(field(4)?)? == 1,
                };
                // A queued entry's join also says what a first look would
                // (not a Redlock node's: Redlock waits its own way).
                if reply.len() > 5 && proposed.is_empty() {
                    let wait = Look::Wait {
                        until: poll::next_expiry(Some(number(field(5)?)?)),
                        next: number(field(6)?)? == 1,
                        watch: watch_at(&reply, 7)?,
                    };
                    self.inner.wakeups.joined.keep(name, joined.seq, wait);
                }
                self.placed(session, name, joined, acked).await
            }
        }
    }

    /// A join placed in the queue. With `replicas=N`, a grant the replicas
    /// did not acknowledge is not kept: the entry is left again and the
    /// caller told (a failover to a replica without it could grant the
    /// name to another). A waiting entry needs no acknowledgement: its
    /// grant will be acknowledged when it comes.
    async fn placed(
        &self,
        session: &SessionKey,
        name: &Name,
        joined: Joined,
        acked: bool,
    ) -> Result<NodeJoin> {
        if joined.granted && !acked {
            self.inner.wakeups.joined.take(name, joined.seq);
            if let Err(e) = crate::store::Store::leave(self, session, name, joined.seq).await {
                tracing::debug!(error = %e, %name, "leaving an unacknowledged grant failed");
            }
            return Err(self
                .unacknowledged(&format!("the grant of {name:?}"))
                .await);
        }
        Ok(NodeJoin::Placed(joined))
    }

    /// Whether the entry `seq` of `name` is still queued and not granted,
    /// read with one plain `HGET` of its record (the last field is when it
    /// was granted, empty while it waits): the check behind a waiter's
    /// first look skipped ([`Self::await_grant`](crate::store::Store::await_grant)).
    pub(super) async fn still_queued(&self, name: &Name, seq: u64) -> Result<bool> {
        self.inner
            .round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.entries_key(name);
        let mut conn = self.inner.master.conn().await?;
        let record: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&key)
            .arg(seq.to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.master.failed(e))?;
        Ok(record.is_some_and(|r| r.ends_with(b"\t")))
    }

    /// Watches `name`'s entries named in `watch` (a queue where nobody was
    /// alive by Redis's clock) for [`poll::confirm_after`] their TTL, then
    /// ends those still exactly so (not renewed); says whether it ended any.
    pub(crate) async fn confirm_expired(&self, name: &Name, watch: &Watch) -> Result<bool> {
        poll::confirm_lapsed(watch, || async {
            let args = [name.as_str().as_bytes(), watch.blockers.as_bytes()];
            let reply = self.call("expire", &args).await?;
            Ok(reply.get(1).map(number).transpose()?.unwrap_or(0) > 0)
        })
        .await
    }

    /// Listens for any change of `name`'s queue on this node (Redlock's).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn listen_changes(&self, name: &Name) -> Listening {
        self.listen(self.channel("ch", name)).await
    }
}
