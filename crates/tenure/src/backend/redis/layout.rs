//! Where the script keeps things under the prefix's hash tag: the key
//! layout marker, checked at open, and the names of keys and channels.

use redis::Value;

use std::time::Duration;

use super::reply::{number, text};
use super::{RedisStore, BACKEND};
use crate::error::{Error, Result};
use crate::store::Name;

/// The script's key layout (see the top of `redis.lua`); kept in the
/// prefix's `sessions` key, so that clients of different layouts never share
/// a prefix.
pub(super) const KEY_LAYOUT: &str = "4";

/// The prefix's sessions key (the one key the script is called with).
/// Format 5's key, beside format 4's (whose marker stays "4", what builds
/// of 0.1.0 require): hash secret -> the build that opened the session
/// (`RELEASE FORMAT`). A field outlives its session until a listing of
/// this build's prunes it (format 4's script does not know the key).
pub(super) fn builds_key(prefix: &str) -> String {
    format!("{prefix}:sb")
}

pub(super) fn sessions_key(prefix: &str) -> String {
    format!("{prefix}:sessions")
}

impl RedisStore {
    /// Fails unless the prefix holds keys of this build's layout (or none),
    /// and keeps the keyspace's id that grant messages carry. A prefix
    /// found without its marker (new, or its keys lost) is made quiet for
    /// `max_ttl`, unless `new` declares it new (refused while a session
    /// lives). Says how long the keyspace stays quiet.
    pub(super) async fn check_layout(&self, new: bool) -> Result<Duration> {
        // Fail now, not at the first lock, if the server refuses us or the
        // prefix holds another layout's keys. The answer is the keyspace's
        // id, which a release's grant message carries.
        let candidate = crate::store::random_hex(16)?;
        let max_ttl = self.inner.caps.max_ttl.as_millis().to_string();
        let mode: &[u8] = if new { b"new" } else { b"" };
        let reply = match self
            .call(
                "layout",
                &[KEY_LAYOUT.as_bytes(), candidate.as_bytes(), max_ttl.as_bytes(), mode],
            )
            .await
        {
            // (A marker that cannot be read as text, such as layout 1's
            // zset, stays the mismatch it is.)
            Err(Error::SchemaMismatch { .. })
                if self.marker().await.ok().as_deref() == Some(super::FORMAT) =>
            {
                // An upgrade to this build's format was finished: the
                // marker refuses older builds, and this one reads on.
                let mut conn = self.inner.master.conn().await?;
                let id: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(format!("{}:id", self.inner.prefix))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.inner.master.failed(e))?;
                vec![Value::SimpleString("ok".into()), id.map_or(Value::Nil, Value::BulkString)]
            }
            other => other?,
        };
        if reply.first().map(text).transpose()?.as_deref() == Some("inuse") {
            let live = reply.get(1).map(text).transpose()?.unwrap_or_default();
            return Err(Error::InvalidArgument {
                what: "store",
                reason: format!(
                    "{} prefix {}: {live} session(s) live: only a store nobody uses is declared new",
                    self.inner.url, self.inner.prefix
                ),
            });
        }
        if let Some(Value::BulkString(id)) = reply.get(1) {
            // The id travels with the data (a copy of the keys into another
            // database, SWAPDB): a grant message names the database too.
            let mut ours = id.clone();
            ours.push(b':');
            ours.extend_from_slice(self.inner.db.as_bytes());
            let _ = self.inner.wakeups.keyspace.set(ours);
        }
        let quiet = match reply.get(2) {
            Some(v) => Duration::from_millis(number(v)?.try_into().unwrap_or(0)),
            None => Duration::ZERO,
        };
        Ok(quiet)
    }

    /// Says, when a session opens on a quiet keyspace (`reply` is the
    /// script's answer to 'open'), why nothing will be granted for a while.
    pub(super) fn warn_if_quiet(&self, reply: &[Value]) {
        let quiet = reply
            .get(1)
            .and_then(|v| number(v).ok())
            .and_then(|ms| u64::try_from(ms).ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        if !quiet.is_zero() {
            tracing::warn!(
                store = %self.inner.url,
                prefix = %self.inner.prefix,
                "the prefix held no tenure keys: a new store, or one that lost what it held; \
                 nothing is granted for {} more (max_ttl: until every lease it could have held \
                 has lapsed). Declare a new store new once, before its first use: `tenure init`",
                humantime::format_duration(quiet)
            );
        }
    }

    /// Declares the prefix new (see [`crate::Store::declare_new`]).
    pub(crate) async fn declare_new_prefix(&self) -> Result<Vec<String>> {
        let quiet = self.check_layout(true).await?;
        debug_assert!(quiet.is_zero());
        Ok(vec![format!(
            "{} prefix {}: declared new (grants at once)",
            self.inner.url, self.inner.prefix
        )])
    }

    /// The layout marker as it is now.
    async fn marker(&self) -> Result<String> {
        let mut conn = self.inner.master.conn().await?;
        let found: Option<String> = redis::cmd("GET")
            .arg(sessions_key(&self.inner.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.inner.master.failed(e))?;
        Ok(found.unwrap_or_default())
    }

    /// Retires format 4 on this server or node: the marker becomes this
    /// build's format, which builds of 0.1.0 refuse from their next
    /// connection on. Says what changed (nothing when done already).
    pub(crate) async fn retire_older_layouts(&self) -> Result<Vec<String>> {
        let mut conn = self.inner.master.conn().await?;
        let changed: i64 = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0",
        )
        .key(sessions_key(&self.inner.prefix))
        .arg(KEY_LAYOUT)
        .arg(super::FORMAT)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| self.inner.master.failed(e))?;
        Ok(if changed == 1 {
            vec![format!(
                "{} {}: layout marker {KEY_LAYOUT} -> {} (builds of 0.1.0 refuse it from their next connection)",
                self.inner.url,
                sessions_key(&self.inner.prefix),
                super::FORMAT
            )]
        } else {
            Vec::new()
        })
    }

    /// The error for a prefix that holds keys of another layout (named in
    /// `reply[1]`).
    pub(super) fn layout_mismatch(&self, reply: &[Value]) -> Result<Error> {
        Ok(Error::SchemaMismatch {
            backend: BACKEND,
            url: self.inner.url.clone(),
            found: format!(
                "prefix {} holds tenure keys of layout {}",
                self.inner.prefix,
                reply.get(1).map(text).transpose()?.unwrap_or_default()
            ),
            expected: format!(
                "layout {KEY_LAYOUT} (use another prefix=, or stop the other clients and \
                 delete the prefix's keys)"
            ),
        })
    }

    pub(super) fn channel(&self, kind: &str, name: &Name) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    /// The hash of `name`'s entry records (`seq` -> record).
    pub(super) fn entries_key(&self, name: &Name) -> String {
        format!("{}:e:{}", self.inner.prefix, name.as_str())
    }
}
