//! Calling the Lua script (`redis.lua`, by `EVALSHA`): one operation, one
//! round trip, and its status word turned into a typed result.

use redis::Value;

use super::reply::{bad_reply, text};
use super::{RedisStore, BACKEND};
use crate::backend::codec;
use crate::error::Result;

pub(super) const SCRIPT: &str = include_str!("redis.lua");

/// The script's operations whose first argument is the name (the others
/// start with the session).
const NAME_FIRST_OPS: &[&str] = &["fence", "cellget", "cellput", "celldel", "expire"];

/// What one call of the script answered.
pub(super) enum Reply {
    /// A fast path's bare integer (its meaning depends on the operation).
    Fast(i64),
    /// A reply table whose status word was a success.
    Table(Vec<Value>),
}

impl RedisStore {
    /// How many script calls (round trips) this store has made so far: what
    /// the no-thundering-herd check counts per handoff, and while waiters
    /// wait.
    pub fn round_trips(&self) -> u64 {
        self.inner
            .round_trips
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs one operation of the script: one round trip. Errors the script
    /// reports (`lost`, `notheld`, `conflict`) become typed errors.
    pub(super) async fn call(&self, op: &str, args: &[&[u8]]) -> Result<Vec<Value>> {
        match self.call_fast(op, args).await? {
            Reply::Table(reply) => Ok(reply),
            Reply::Fast(n) => Err(bad_reply(&format!("{op} answered {n}"))),
        }
    }

    /// [`Self::call`] for the operations whose fast paths answer with a bare
    /// integer (building a reply table costs the script more than the
    /// commands it saves).
    pub(super) async fn call_fast(&self, op: &str, args: &[&[u8]]) -> Result<Reply> {
        let invocation = self.invocation(op, args);
        let mut conn = self.inner.master.conn().await?;
        let value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.inner.master.failed(e))?;
        self.reply(value, op, args)
    }

    /// One call of the script (counted as a round trip).
    fn invocation(&self, op: &str, args: &[&[u8]]) -> redis::ScriptInvocation<'_> {
        self.inner
            .round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The second key is never written: declared by every call, it is a
        // key Redis Cluster finds missing while the slot migrates, so it
        // refuses the call (TRYAGAIN or ASK, waited out) rather than run a
        // script that could meet a key already moved half way through.
        let mut invocation = self.inner.script.key(&self.inner.sessions_key);
        invocation.key(&self.inner.moving_key);
        invocation.arg(&self.inner.prefix).arg(op);
        for a in args {
            invocation.arg(*a);
        }
        invocation
    }

    /// The script's answer: a fast path's bare integer, or a table.
    fn reply(&self, value: Value, op: &str, args: &[&[u8]]) -> Result<Reply> {
        match value {
            Value::Int(n) => Ok(Reply::Fast(n)),
            Value::Array(reply) => self.status(reply, op, args).map(Reply::Table),
            other => Err(bad_reply(&format!("{other:?}"))),
        }
    }

    /// [`Self::call`] followed, in the same round trip on the same
    /// connection, by `WAIT` for the replicas the URL asks for
    /// (`replicas=N`): with whether they all acknowledged every write the
    /// connection made so far, this call's included. Without `replicas`, a
    /// plain call, acknowledged.
    pub(super) async fn call_acked(&self, op: &str, args: &[&[u8]]) -> Result<(Vec<Value>, bool)> {
        match self.call_fast_acked(op, args).await? {
            (Reply::Table(reply), acked) => Ok((reply, acked)),
            (Reply::Fast(n), _) => Err(bad_reply(&format!("{op} answered {n}"))),
        }
    }

    /// [`Self::call_fast`], acknowledged as [`Self::call_acked`] says.
    pub(super) async fn call_fast_acked(&self, op: &str, args: &[&[u8]]) -> Result<(Reply, bool)> {
        let Some(replicas) = self.inner.replicas else {
            return Ok((self.call_fast(op, args).await?, true));
        };
        let invocation = self.invocation(op, args);
        let mut conn = self.inner.master.conn().await?;
        let mut loaded = false;
        loop {
            let answer: redis::RedisResult<(Value, i64)> = redis::pipe()
                .invoke_script(&invocation)
                .cmd("WAIT")
                .arg(replicas.count)
                .arg(u64::try_from(replicas.within.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut conn)
                .await;
            let (reply, acked) = match answer {
                // A new master (after a failover) has not loaded the script.
                Err(e)
                    if !loaded
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    loaded = true;
                    self.inner
                        .script
                        .load_async(&mut conn)
                        .await
                        .map_err(|e| self.inner.master.failed(e))?;
                    continue;
                }
                Err(e) => return Err(self.inner.master.failed(e)),
                Ok(answer) => answer,
            };
            let acked = u32::try_from(acked).unwrap_or(0) >= replicas.count;
            return Ok((self.reply(reply, op, args)?, acked));
        }
    }

    /// What a caller is told when the replicas did not acknowledge in time,
    /// with how many replicas the master has connected now (asked by
    /// `ROLE`, briefly: a master that does not answer is said so).
    pub(super) async fn unacknowledged(&self, what: &str) -> crate::error::Error {
        let (count, within) = self
            .inner
            .replicas
            .map(|r| (r.count, r.within))
            .unwrap_or_default();
        let connected = match self.connected_replicas().await {
            Some(n) => format!("the master has {n} replica(s) connected"),
            None => "the master did not say how many replicas it has connected".to_string(),
        };
        crate::error::Error::unavailable(
            super::BACKEND,
            format!(
                "{what} was not acknowledged by {count} replica(s) within {} (replicas={count}); {connected}",
                humantime::format_duration(within)
            ),
        )
    }

    /// How many replicas the master has connected, by its `ROLE`.
    async fn connected_replicas(&self) -> Option<usize> {
        let asked = async {
            let mut conn = self.inner.master.conn().await.ok()?;
            let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await.ok()?;
            match role.get(2) {
                Some(Value::Array(replicas)) => Some(replicas.len()),
                _ => None,
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(1), asked)
            .await
            .ok()
            .flatten()
    }

    /// Turns the script's status word (`reply[0]`) into a result.
    fn status(&self, reply: Vec<Value>, op: &str, args: &[&[u8]]) -> Result<Vec<Value>> {
        match reply.first().map(text).transpose()?.as_deref() {
            Some("ok") | Some("none") | Some("granted") | Some("wait") | Some("behind")
            | Some("ahead") | Some("stale") | Some("mismatch") | Some("inuse") => Ok(reply),
            Some("layout") => Err(self.layout_mismatch(&reply)?),
            Some(word @ ("lost" | "forgot" | "notheld" | "conflict")) => {
                // The name is the first argument of some operations and the
                // second (after the session) of the others.
                let at = usize::from(!NAME_FIRST_OPS.contains(&op));
                let name = args
                    .get(at)
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_default();
                let detail = reply.get(1).map(text).transpose()?;
                Err(codec::status_error(BACKEND, word, detail, &name))
            }
            _ => Err(bad_reply(&format!("{reply:?}"))),
        }
    }
}
