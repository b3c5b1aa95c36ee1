//! The statements the driver prepares on each connection: the calls of
//! tenure's functions, the one-statement take and release, and the plain
//! reads.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::connect::pg_err;
use super::BACKEND;
use crate::error::{Error, Result};

/// Takes a name nobody holds or waits for (`queued` false) for a live
/// session: the lone holder goes into the name's row, with the next token.
/// One statement; no row when that case does not apply, and the `join`
/// function decides. It never waits for a lock (SKIP LOCKED), so its
/// snapshot is not older than the locks it takes: a join that would have
/// waited for the name goes to the function, which judges the session
/// after the wait. The session's row is key-share locked, as the foreign
/// key of an entry would (nothing deletes the session before this
/// commits: `open`'s collection skips it), and both rows are read again at
/// their newest version as they are locked, so two of these never both
/// take a name. Answers as `join` does, plus the notification.
const FAST_JOIN: &str = "WITH live AS (
    SELECT 1 FROM @s.sessions s WHERE s.id = $1 AND s.expires_ms > 0 FOR KEY SHARE SKIP LOCKED
), free AS (
    SELECT f.name FROM @s.names f
     WHERE f.name = $2 AND f.h_session IS NULL AND NOT f.queued AND EXISTS (SELECT 1 FROM live)
       FOR UPDATE SKIP LOCKED
)
UPDATE @s.names n
   SET last_seq = n.last_seq + 1, version = n.version + 1, h_seq = n.last_seq + 1,
       h_session = $1, h_kind = $3, h_count = $4, h_lim = $5, h_value = $6,
       h_granted_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
  FROM free WHERE n.name = free.name
RETURNING 'ok'::text, n.last_seq, true, 1, n.last_seq = 1, pg_notify('@s_change', n.name)";
/// Releases the row holder `$3` of a live session; no row when that is not
/// the case (an entry in `entries`, a lost session, a name's row someone
/// has locked), and the `leave` function decides, so that a session ended
/// while this would have waited reads "lost". Answers as `leave` does.
const FAST_LEAVE: &str = "WITH held AS (
    SELECT f.name FROM @s.names f
     WHERE f.name = $2 AND f.h_seq = $3 AND f.h_session = $1
       AND EXISTS (SELECT 1 FROM @s.sessions s WHERE s.id = $1 AND s.expires_ms > 0)
       FOR UPDATE SKIP LOCKED
)
UPDATE @s.names n SET version = n.version + 1, h_seq = NULL, h_session = NULL, h_value = NULL
  FROM held WHERE n.name = held.name
RETURNING 'ok'::text, 0, pg_notify('@s_change', n.name)";
/// The take of a free name and the release of a lone holder, with the
/// schema `schema` filled in, as the driver prepares them; public only for
/// the bench's shapes (`bench/benches/shapes.rs`), which run them raw and
/// strip them down. Not an API.
#[doc(hidden)]
pub fn fast_statements(schema: &str) -> (String, String) {
    (
        FAST_JOIN.replace("@s", schema),
        FAST_LEAVE.replace("@s", schema),
    )
}

pub(super) struct Statements {
    pub(super) open: Statement,
    pub(super) keep_alive: Statement,
    close: Statement,
    join: Statement,
    leave: Statement,
    pub(super) fast_join: Statement,
    pub(super) fast_leave: Statement,
    pub(super) still_queued: Statement,
    look: Statement,
    set_value: Statement,
    pub(super) version: Statement,
    pub(super) rows: Statement,
    refresh: Statement,
    pub(super) names: Statement,
    pub(super) names_of: Statement,
    pub(super) names_of_tag: Statement,
    evict: Statement,
    evict_session: Statement,
    fence: Statement,
    cell_get: Statement,
    cell_put: Statement,
    cell_delete: Statement,
    expire: Statement,
    pub(super) session_builds: Statement,
}

impl Statements {
    /// The statement that calls one of tenure's functions.
    pub(super) fn routine(&self, routine: &str) -> Result<&Statement> {
        Ok(match routine {
            "close" => &self.close,
            "join" => &self.join,
            "leave" => &self.leave,
            "look" => &self.look,
            "set_value" => &self.set_value,
            "refresh" => &self.refresh,
            "evict" => &self.evict,
            "evict_session" => &self.evict_session,
            "fence" => &self.fence,
            "cell_get" => &self.cell_get,
            "cell_put" => &self.cell_put,
            "cell_delete" => &self.cell_delete,
            "expire" => &self.expire,
            other => return Err(Error::backend(BACKEND, format!("no routine {other}"))),
        })
    }

    /// Prepares them all on `client`, for the schema `s`.
    pub(super) async fn prepare(client: &Client, s: &str) -> Result<Statements> {
        let prep = |sql: String| {
            let client = &client;
            async move { client.prepare(&sql).await.map_err(pg_err) }
        };
        let prep_typed = |sql: String, types: &'static [Type]| {
            let client = &client;
            async move { client.prepare_typed(&sql, types).await.map_err(pg_err) }
        };
        let (fast_join, fast_leave) = fast_statements(s);
        Ok(Statements {
            // One statement, so one transaction: the session and its
            // build's record, both or neither.
            open: prep(format!(
                "WITH opened AS (SELECT {s}.open($1, $2, $3, $4))
                 INSERT INTO {s}.session_builds (session, build)
                 SELECT $1, $5 FROM opened
                 ON CONFLICT (session) DO UPDATE SET build = EXCLUDED.build"
            ))
            .await?,
            keep_alive: prep(format!(
                "UPDATE {s}.sessions SET expires_ms = {s}.now_ms() + ttl_ms, renewals = renewals + 1 WHERE id = $1 AND expires_ms > 0"
            ))
            .await?,
            close: prep(format!("SELECT {s}.close($1)")).await?,
            join: prep(format!("SELECT * FROM {s}.join($1, $2, $3, $4, $5, $6, $7)")).await?,
            leave: prep(format!("SELECT * FROM {s}.leave($1, $2, $3)")).await?,
            // Typed here: `$3` is compared with a bigint, and the answer's
            // columns are what `to_row` reads.
            fast_join: prep_typed(
                fast_join,
                &[Type::TEXT, Type::TEXT, Type::INT2, Type::INT4, Type::INT4, Type::BYTEA],
            )
            .await?,
            fast_leave: prep_typed(fast_leave, &[Type::TEXT, Type::TEXT, Type::INT8])
                .await?,
            // A plain read, not a function: whether a queued entry still
            // waits, for a live session (the check behind a waiter's first
            // look skipped; otherwise the waiter looks, and learns why).
            still_queued: prep_typed(
                format!("SELECT 'ok'::text FROM {s}.entries e JOIN {s}.sessions s ON s.id = e.session
                          WHERE e.session = $1 AND e.name = $2 AND e.seq = $3 AND e.granted_ms IS NULL
                            AND s.expires_ms > 0"),
                &[Type::TEXT, Type::TEXT, Type::INT8],
            )
            .await?,
            look: prep(format!("SELECT * FROM {s}.look($1, $2, $3, $4)")).await?,
            set_value: prep(format!("SELECT {s}.set_value($1, $2, $3, $4)")).await?,
            version: prep(format!("SELECT coalesce((SELECT version FROM {s}.names WHERE name = $1), 0)")).await?,
            rows: prep(format!(
                "SELECT e.seq, e.kind, e.count, e.lim, s.tag, s.label, e.value, e.granted_ms,
                        CASE WHEN s.expires_ms <= 0 THEN -1 ELSE greatest(s.expires_ms - {s}.now_ms(), 0) END, e.holds,
                        (SELECT version FROM {s}.names WHERE name = $1)
                   FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE e.name = $1 ORDER BY e.seq"
            ))
            .await?,
            refresh: prep(format!("SELECT {s}.refresh($1)")).await?,
            names: prep(format!(
                "SELECT DISTINCT e.name FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE s.expires_ms > 0 AND left(e.name, length($1)) = $1 ORDER BY 1"
            ))
            .await?,
            names_of: prep(format!("SELECT DISTINCT name FROM {s}.all_entries WHERE session = $1")).await?,
            names_of_tag: prep(format!(
                "SELECT DISTINCT e.name FROM {s}.all_entries e JOIN {s}.sessions s ON s.id = e.session
                  WHERE s.tag = $1 AND s.expires_ms > 0"
            ))
            .await?,
            // A status first, as every routine answers.
            evict: prep(format!("SELECT 'ok', {s}.evict($1)")).await?,
            evict_session: prep(format!("SELECT 'ok', {s}.evict_session($1)")).await?,
            fence: prep(format!("SELECT * FROM {s}.fence($1, $2, $3)")).await?,
            cell_get: prep(format!("SELECT * FROM {s}.cell_get($1)")).await?,
            cell_put: prep(format!("SELECT * FROM {s}.cell_put($1, $2, $3, $4)")).await?,
            cell_delete: prep(format!("SELECT * FROM {s}.cell_delete($1, $2)")).await?,
            expire: prep(format!("SELECT 'ok', {s}.expire($1, $2)")).await?,
            // Format 11's, beside format 10's.
            session_builds: prep(format!(
                "SELECT s.tag, s.label, b.build FROM {s}.sessions s
                   LEFT JOIN {s}.session_builds b ON b.session = s.id
                  WHERE s.expires_ms > 0 ORDER BY s.tag"
            ))
            .await?,
        })
    }
}
