//! The one-statement take and release, and the prefix and clock every
//! statement is written with.

pub(super) const NOW_MS: &str = "CAST(ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)";
/// Takes a name nobody holds or waits for (`queued` false) for a live
/// session: the lone holder goes into the name's row, with the next token.
/// One plain statement instead of `join`'s `CALL`, which costs MariaDB a
/// dozen statements; it changes no row when that case does not apply (a
/// name never used, held, queued on, or a session ended), and the `CALL`
/// decides. The token comes back in the answer's last-insert id
/// (`LAST_INSERT_ID(expr)`), so no second read is needed; `h_seq` takes it
/// from there: the server evaluates the SET list left to right, and
/// `LAST_INSERT_ID()` reads the value just set whether a later assignment
/// sees the row's new values or its old ones (MariaDB's
/// `SIMULTANEOUS_ASSIGNMENT`). The session's row is read with a shared
/// lock (at any isolation level: the clause is explicit), held until the
/// statement commits: an ending of the session (a close, an eviction, a
/// confirmed expiry, a collection: all write that row) waits for this
/// grant, or commits first and is read here. A grant to a session ended
/// while this waited for the name's row cannot happen. (An ending that
/// listed the session's names before this committed misses the new row
/// holder, which is then dead: the next join of the name drops it, as it
/// drops any holder of an ended session.) MariaDB takes that lock while
/// it plans the statement, before the name's row: the reverse of the
/// procedures' order, so a procedure that ends the session, or a renewal
/// queued behind a join, can deadlock with this; the server rolls one
/// back at once, a `CALL` is retried, this falls back to the `CALL`, a
/// renewal is retried by the session. The name's row is read at its
/// newest version once locked, as every `UPDATE` reads, so two of these
/// never both take a name. It commits on its own (autocommit): every
/// procedure ends the transaction it starts, so a pooled connection never
/// has one open (see `parse_url`). Parameters: secret, kind, count, limit,
/// value, name, secret.
pub(super) const FAST_JOIN: &str = "UPDATE @pnames
    SET last_seq = LAST_INSERT_ID(last_seq + 1), h_seq = LAST_INSERT_ID(), version = version + 1,
        h_session = ?, h_kind = ?, h_count = ?, h_lim = ?, h_value = ?, h_granted_ms = @pnow_ms()
  WHERE name = ? AND h_session IS NULL AND NOT queued
    AND (SELECT s.expires_ms FROM @psessions s WHERE s.id = ? LOCK IN SHARE MODE) > 0";
/// Releases the row holder of a live session, one plain statement; no row
/// changed when that is not the case (an entry in `entries`, a session
/// ended or gone), and `leave`'s `CALL` decides, so that an ended
/// session's release reads "lost". Parameters: name, seq, secret, secret.
pub(super) const FAST_LEAVE: &str = "UPDATE @pnames
    SET h_seq = NULL, h_session = NULL, h_value = NULL, version = version + 1
  WHERE name = ? AND h_seq = ? AND h_session = ?
    AND (SELECT s.expires_ms FROM @psessions s WHERE s.id = ? LOCK IN SHARE MODE) > 0";
/// The take of a free name and the release of a lone holder, with the
/// prefix `prefix` and the clock filled in, as the driver prepares them;
/// public only for the bench's shapes (`bench/benches/shapes.rs`), which
/// run them raw and strip them down. Not an API.
#[doc(hidden)]
pub fn fast_statements(prefix: &str) -> (String, String) {
    (
        with_prefix(FAST_JOIN, prefix),
        with_prefix(FAST_LEAVE, prefix),
    )
}

/// A statement of this file's with its prefix and clock filled in.
pub(super) fn with_prefix(sql: &str, prefix: &str) -> String {
    sql.replace("@pnow_ms()", NOW_MS).replace("@p", prefix)
}
