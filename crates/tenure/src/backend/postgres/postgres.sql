-- tenure's PostgreSQL store, schema version 10 (1 had no fast paths; 2 read the clock before the name's lock; 3 read every entry of a queue on each call; 4 had no fences or cells; 5 judged expiry by the server's clock; 6 could not end one session by its tag; 7 kept every entry in @s.entries; 8 planned its SQL-language helpers again on every call, and announced no grant; 9's join did not say what a waiter's first look would). "@s" is the schema's name.
-- Every operation is one call of one of these functions: one round trip,
-- one transaction.
--
-- Expiry is never judged by the database's clock (clock_timestamp(), which
-- anyone can set, and which steps). A session's lease lapses by that clock
-- only as a hint (expires_ms); its entries go only when the session is
-- closed, evicted, or confirmed expired (expires_ms = 0): a client that
-- watched it (the waiter it blocks, or a newcomer) saw its renewal counter
-- unchanged for its TTL on the client's own monotonic clock, and `look` or
-- `expire` finds the counters still as it saw them. The clock serves
-- hints, what `status` shows, grant times, collecting sessions that hold
-- nothing, and the life of cells bound to a session.
-- A name's row in @s.names is locked FOR UPDATE by every change to its
-- queue, so changes to one name are serialized.
--
-- A lone holder (one entry, one hold, granted on a name nobody else was
-- queued on) is kept in its name's row (the h_ columns), not in @s.entries:
-- taking and releasing a free name is then one UPDATE each, which the
-- driver sends as a plain statement (postgres.rs: FAST_JOIN, FAST_LEAVE)
-- before it calls a function. Everything else first moves that holder into
-- @s.entries (`lock_name` does, as it locks the row: `spill`), so the rest
-- of this file knows only @s.entries; readers that lock nothing read the
-- view @s.all_entries, which has both. A row holder whose session is gone or
-- ended is dead, as an entry of it would be. `queued` is true whenever the
-- name may have entries (set with every insert, cleared by `settle` when it
-- finds none): a row holder is only taken while it is false.

CREATE TABLE IF NOT EXISTS @s.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS @s.sessions (
    id text PRIMARY KEY,
    tag text NOT NULL,
    label text NOT NULL,
    ttl_ms bigint NOT NULL,
    expires_ms bigint NOT NULL);
CREATE TABLE IF NOT EXISTS @s.names (
    name text PRIMARY KEY,
    last_seq bigint NOT NULL,
    version bigint NOT NULL);
CREATE TABLE IF NOT EXISTS @s.entries (
    name text NOT NULL,
    seq bigint NOT NULL,
    session text NOT NULL REFERENCES @s.sessions(id) ON DELETE CASCADE,
    kind smallint NOT NULL,
    count integer NOT NULL,
    lim integer NOT NULL,
    holds integer NOT NULL,
    value bytea NOT NULL,
    granted_ms bigint,
    PRIMARY KEY (name, seq));
-- A session's entry in a name is found by (session, name), never by
-- scanning the name's queue; the index also serves lookups by session.
DROP INDEX IF EXISTS @s.entries_session;
CREATE INDEX IF NOT EXISTS entries_owner ON @s.entries(session, name);
-- Renewals, counted by keep_alive: what a watcher watches.
ALTER TABLE @s.sessions ADD COLUMN IF NOT EXISTS renewals bigint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS sessions_expiry ON @s.sessions(expires_ms);
-- The lone holder kept in the name's row. No index on h_session: an index
-- on a column every take and release changes would make each of those
-- UPDATEs write the indexes (no HOT update), about 10 % of a cycle; the
-- few readers by session (close, evict_session, open's collection) scan
-- the names instead.
ALTER TABLE @s.names ADD COLUMN IF NOT EXISTS h_seq bigint,
    ADD COLUMN IF NOT EXISTS h_session text,
    ADD COLUMN IF NOT EXISTS h_kind smallint,
    ADD COLUMN IF NOT EXISTS h_count integer,
    ADD COLUMN IF NOT EXISTS h_lim integer,
    ADD COLUMN IF NOT EXISTS h_value bytea,
    ADD COLUMN IF NOT EXISTS h_granted_ms bigint,
    ADD COLUMN IF NOT EXISTS queued boolean NOT NULL DEFAULT true;
-- Every entry, wherever it is kept: what readers that do not lock the name
-- read (status, listings, lookups by session).
CREATE OR REPLACE VIEW @s.all_entries AS
    SELECT name, seq, session, kind, count, lim, holds, value, granted_ms FROM @s.entries
    UNION ALL
    SELECT name, h_seq, h_session, h_kind, h_count, h_lim, 1, h_value, h_granted_ms
      FROM @s.names WHERE h_session IS NOT NULL;

-- Fences and cells. A fence keeps its highest token in version; a cell
-- keeps its version there even when it has no value (deleted, or its owner
-- session ended), so a cell's versions are never reused.
CREATE TABLE IF NOT EXISTS @s.registers (
    name text PRIMARY KEY,
    kind smallint NOT NULL, -- 0: fence, 1: cell
    version bigint NOT NULL,
    value bytea,
    owner text);

CREATE OR REPLACE FUNCTION @s.now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

DROP FUNCTION IF EXISTS @s.end_expired(text, bigint);

-- Walks the name's queue from the head: stamps and announces newly granted
-- entries, stops at the first entry that waits, and bumps the version if
-- anything changed. An entry of an ended session met on the way is
-- dropped; entries further back are not read, so the cost follows the
-- granted entries, not the waiters.
-- The caller holds the name's lock. With p_announce (a release's settle,
-- after which nothing in its transaction can end what it granted), each
-- grant is also announced on @s_grant, with a proof (SHA-256 of the
-- entry's session secret, a tab and its token: any role that can connect
-- may NOTIFY), and a waiter that hears it takes the grant without looking
-- again; every grant still goes out on @s_wake as before (a wake-up
-- only), so clients of schema 8 still hear it.
DROP FUNCTION IF EXISTS @s.settle(text, boolean);
CREATE OR REPLACE FUNCTION @s.settle(p_name text, p_changed boolean,
    p_announce boolean DEFAULT false) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := @s.now_ms();
    r record;
    after bigint := -1;
    idx integer := 0;
    all_shared boolean := true;
    permits bigint := 0;
    ok boolean;
    changed boolean := p_changed;
    empty boolean;
BEGIN
    -- One row at a time by seq (an index lookup each), not a cursor over
    -- the name's whole queue: the planner may not know the walk stops early.
    LOOP
        SELECT e.seq, e.session, e.kind, e.count, e.lim, e.granted_ms, s.expires_ms INTO r
          FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq > after ORDER BY e.seq LIMIT 1;
        EXIT WHEN NOT FOUND;
        after := r.seq;
        IF r.expires_ms <= 0 THEN
            DELETE FROM @s.entries WHERE name = p_name AND seq = r.seq;
            changed := true;
            CONTINUE;
        END IF;
        idx := idx + 1;
        IF r.kind = 0 THEN ok := idx = 1;
        ELSIF r.kind = 1 THEN ok := all_shared;
        ELSE ok := permits + r.count <= r.lim;
        END IF;
        EXIT WHEN NOT ok;
        IF r.kind <> 1 THEN all_shared := false; END IF;
        IF r.kind = 2 THEN permits := permits + r.count; END IF;
        IF r.granted_ms IS NULL THEN
            UPDATE @s.entries SET granted_ms = now_ms WHERE name = p_name AND seq = r.seq;
            -- (The announcement first: the listener that hears it before
            -- the wake-up takes the grant with no look.)
            IF p_announce THEN
                PERFORM pg_notify('@s_grant', p_name || E'\t' || r.seq || E'\t'
                    || encode(sha256(convert_to(r.session || E'\t' || r.seq, 'UTF8')), 'hex'));
            END IF;
            PERFORM pg_notify('@s_wake', p_name || E'\t' || r.seq);
            changed := true;
        END IF;
    END LOOP;
    -- No live entry left (the walk ended without one): a free name again,
    -- which a join may take in its row.
    empty := idx = 0;
    IF changed OR empty THEN
        UPDATE @s.names SET version = version + changed::int, queued = queued AND NOT empty
         WHERE name = p_name AND (changed OR queued);
        IF changed THEN PERFORM pg_notify('@s_change', p_name); END IF;
    END IF;
END $$;

-- Moves the lone holder kept in the name's row into @s.entries, where the
-- rest of this file looks; a dead one (its session gone) just goes. The
-- caller holds the name's lock. (The session's row is locked as the
-- entry's foreign key will: a session being deleted meanwhile is waited
-- for, and then read as gone rather than failing the key.)
CREATE OR REPLACE FUNCTION @s.spill(p_name text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    moved boolean;
BEGIN
    INSERT INTO @s.entries (name, seq, session, kind, count, lim, holds, value, granted_ms)
    SELECT n.name, n.h_seq, n.h_session, n.h_kind, n.h_count, n.h_lim, 1, n.h_value, n.h_granted_ms
      FROM @s.names n JOIN @s.sessions s ON s.id = n.h_session
     WHERE n.name = p_name
       FOR KEY SHARE OF s;
    moved := FOUND;
    -- A dead holder that just goes is a change of the name.
    UPDATE @s.names SET h_seq = NULL, h_session = NULL, h_value = NULL, queued = true,
           version = version + (NOT moved)::int
     WHERE name = p_name;
    IF NOT moved THEN PERFORM pg_notify('@s_change', p_name); END IF;
END $$;

-- Locks the name's row (made if missing), and moves a row holder into
-- @s.entries.
CREATE OR REPLACE FUNCTION @s.lock_name(p_name text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    holder text;
BEGIN
    -- The usual case, a known name, is one locking read.
    SELECT h_session INTO holder FROM @s.names WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @s.names (name, last_seq, version) VALUES (p_name, 0, 0)
            ON CONFLICT (name) DO NOTHING;
        SELECT h_session INTO holder FROM @s.names WHERE name = p_name FOR UPDATE;
    END IF;
    IF holder IS NOT NULL THEN PERFORM @s.spill(p_name); END IF;
END $$;

-- The helpers below are PL/pgSQL, not SQL, though each is one query: a
-- SQL-language function that PostgreSQL cannot inline (before version 18)
-- is parsed and planned again on every call, which cost a waiter's look
-- about half a millisecond; PL/pgSQL keeps its plans for the connection.

-- Not ended (closed, evicted or confirmed expired).
CREATE OR REPLACE FUNCTION @s.alive(p_secret text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM @s.sessions WHERE id = p_secret AND expires_ms > 0);
END $$;

-- Not lapsed by the database's clock either: the life of a bound cell.
CREATE OR REPLACE FUNCTION @s.unlapsed(p_secret text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM @s.sessions WHERE id = p_secret AND expires_ms > @s.now_ms());
END $$;

-- What a watcher watches: the entries of p_name between p_after and
-- p_before (both excluded), each as "seq:renewals:lapse" (any renewal
-- changes it, also one by a client of an older schema, which counts none),
-- comma-separated; their longest TTL; ms until the first lapses by the
-- clock (a hint of when to look); and whether all have lapsed.
CREATE OR REPLACE FUNCTION @s.blockers_after(p_name text, p_after bigint, p_before bigint,
    OUT fingerprint text, OUT ttl_ms bigint, OUT until_ms bigint, OUT all_lapsed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := @s.now_ms();
BEGIN
    SELECT coalesce(string_agg(e.seq || ':' || s.renewals || ':' || s.expires_ms, ','
                               ORDER BY e.seq), ''),
           coalesce(max(s.ttl_ms), 0),
           greatest(coalesce(min(s.expires_ms), 0) - now_ms, 0),
           coalesce(max(s.expires_ms) <= now_ms, false)
      INTO fingerprint, ttl_ms, until_ms, all_lapsed
      FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
     WHERE e.name = p_name AND e.seq > p_after AND e.seq < p_before;
END $$;

-- The same, for the entries before p_before (or only p_only).
DROP FUNCTION IF EXISTS @s.blockers(text, bigint, bigint);
CREATE FUNCTION @s.blockers(p_name text, p_before bigint, p_only bigint,
    OUT fingerprint text, OUT ttl_ms bigint, OUT until_ms bigint, OUT all_lapsed boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT b.fingerprint, b.ttl_ms, b.until_ms, b.all_lapsed
      INTO fingerprint, ttl_ms, until_ms, all_lapsed
      FROM @s.blockers_after(p_name,
        coalesce(p_only - 1, -1),
        CASE WHEN p_only IS NULL THEN p_before ELSE least(p_only + 1, p_before) END) b;
END $$;

-- Ends the sessions of p_name's entries before p_before that are still
-- exactly as a watcher saw them for their TTL (p_confirm: "seq:renewals:
-- lapse,…"). The check is in the UPDATE's own condition, so a renewal that
-- commits while this waits for the session's row is seen, and wins.
-- Returns how many sessions ended.
CREATE OR REPLACE FUNCTION @s.end_confirmed(p_name text, p_before bigint, p_confirm text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE @s.sessions s SET expires_ms = 0
      FROM @s.entries e
     WHERE e.name = p_name AND e.seq < p_before AND e.session = s.id AND s.expires_ms > 0
       AND (e.seq || ':' || s.renewals || ':' || s.expires_ms) = ANY(string_to_array(p_confirm, ','));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

DROP FUNCTION IF EXISTS @s.join(text, text, smallint, integer, integer, bytea, boolean);
CREATE FUNCTION @s.join(p_secret text, p_name text, p_kind smallint, p_count integer,
    p_lim integer, p_value bytea, p_if_granted boolean,
    OUT status text, OUT seq bigint, OUT granted boolean, OUT holds integer, OUT first boolean,
    OUT blockers text, OUT ttl_ms bigint, OUT lapsed boolean, OUT until_ms bigint, OUT next boolean)
LANGUAGE plpgsql AS $$
DECLARE
    mine @s.entries%ROWTYPE;
    r record;
    permits bigint := 0;
    empty boolean := false;
    v_seq bigint;
    lo bigint;
    hi bigint;
    ended boolean;
BEGIN
    -- (A free name is taken by the driver's FAST_JOIN, one UPDATE of the
    -- name's row, before this is called.)
    PERFORM @s.lock_name(p_name);
    -- Checked after the name's lock, and key-share locked as an entry's
    -- foreign key would be: a grant kept in the name's row has no key, and
    -- `open`'s collection must not delete the session under it.
    PERFORM 1 FROM @s.sessions WHERE id = p_secret AND expires_ms > 0 FOR KEY SHARE;
    IF NOT FOUND THEN status := 'lost'; RETURN; END IF;
    PERFORM @s.settle(p_name, false);
    SELECT * INTO mine FROM @s.entries e WHERE e.name = p_name AND e.session = p_secret;
    IF FOUND THEN
        IF mine.kind <> p_kind OR mine.count <> p_count OR mine.lim <> p_lim THEN
            status := 'conflict:this session already has another kind of entry here'; RETURN;
        END IF;
        IF p_if_granted AND mine.granted_ms IS NULL THEN status := 'none'; RETURN; END IF;
        UPDATE @s.entries e SET holds = e.holds + 1
         WHERE e.name = p_name AND e.seq = mine.seq RETURNING e.holds INTO holds;
        status := 'ok'; seq := mine.seq; granted := mine.granted_ms IS NOT NULL; first := false;
        RETURN;
    END IF;
    -- Every entry passed this check against those before it, so the head
    -- stands for them all.
    SELECT e.kind, e.lim INTO r FROM @s.entries e WHERE e.name = p_name ORDER BY e.seq LIMIT 1;
    IF FOUND THEN
        IF (r.kind = 2) <> (p_kind = 2) THEN
            status := 'conflict:locks and semaphores cannot share a name'; RETURN;
        END IF;
        IF r.kind = 2 AND r.lim <> p_lim THEN
            status := 'conflict:semaphore limit ' || p_lim || ' disagrees with the limit '
                      || r.lim || ' already in use';
            RETURN;
        END IF;
    END IF;
    -- Settled, the granted entries are a prefix of the queue: if the last
    -- entry is granted, all are.
    SELECT e.kind, e.granted_ms INTO r FROM @s.entries e
     WHERE e.name = p_name ORDER BY e.seq DESC LIMIT 1;
    IF NOT FOUND THEN granted := true; empty := true;
    ELSIF r.granted_ms IS NULL THEN granted := false;
    ELSIF p_kind = 0 THEN granted := false;
    ELSIF p_kind = 1 THEN granted := r.kind = 1;
    ELSE
        SELECT coalesce(sum(e.count), 0) INTO permits FROM @s.entries e WHERE e.name = p_name;
        granted := permits + p_count <= p_lim;
    END IF;
    IF p_if_granted AND NOT granted THEN
        status := 'none';
        -- Nobody in the queue alive by the clock, holders and waiters alike
        -- (a crashed process's waiter watches no one, so such a queue would
        -- stay for ever): what to watch, all of it. The head is looked at
        -- first (live, as a rule: done at once), then the rest.
        IF NOT EXISTS (SELECT 1 FROM (SELECT e.session FROM @s.entries e WHERE e.name = p_name
                                       ORDER BY e.seq LIMIT 1) h
                         JOIN @s.sessions s ON s.id = h.session
                        WHERE s.expires_ms > @s.now_ms()) THEN
            IF NOT EXISTS (SELECT 1 FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
                            WHERE e.name = p_name AND s.expires_ms > @s.now_ms()) THEN
                SELECT b.fingerprint, b.ttl_ms, b.all_lapsed INTO blockers, ttl_ms, lapsed
                  FROM @s.blockers(p_name, 9223372036854775807, NULL) b;
            END IF;
        END IF;
        RETURN;
    END IF;
    holds := 1;
    status := 'ok';
    IF empty THEN
        -- Alone on the name: held in its row, as FAST_JOIN would.
        UPDATE @s.names n SET last_seq = n.last_seq + 1, version = n.version + 1,
               h_seq = n.last_seq + 1, h_session = p_secret, h_kind = p_kind, h_count = p_count,
               h_lim = p_lim, h_value = p_value, h_granted_ms = @s.now_ms(), queued = false
         WHERE n.name = p_name RETURNING n.last_seq INTO seq;
    ELSE
        UPDATE @s.names n SET last_seq = n.last_seq + 1, version = n.version + 1, queued = true
         WHERE n.name = p_name RETURNING n.last_seq INTO seq;
        INSERT INTO @s.entries (name, seq, session, kind, count, lim, holds, value, granted_ms)
        VALUES (p_name, seq, p_secret, p_kind, p_count, p_lim, 1, p_value,
                CASE WHEN granted THEN @s.now_ms() END);
    END IF;
    first := seq = 1;
    PERFORM pg_notify('@s_change', p_name);
    IF NOT granted THEN
        -- Queued (last, behind a settled queue): also what the waiter's
        -- first look would say in the usual case, a live entry just ahead
        -- (as `look` answers it), so that it need not look once it listens
        -- (blockers, ttl_ms, until_ms, next). Otherwise until_ms stays NULL
        -- and the waiter looks.
        v_seq := seq;
        SELECT e.seq, e.granted_ms, s.expires_ms INTO r
          FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq < v_seq ORDER BY e.seq DESC LIMIT 1;
        IF FOUND AND r.expires_ms > 0
           AND (r.granted_ms IS NOT NULL OR r.expires_ms > @s.now_ms()) THEN
            next := r.granted_ms IS NOT NULL;
            lo := CASE WHEN next THEN -1 ELSE r.seq - 1 END;
            hi := CASE WHEN next THEN v_seq ELSE r.seq + 1 END;
            SELECT coalesce(string_agg(e.seq || ':' || s.renewals || ':' || s.expires_ms, ','
                                       ORDER BY e.seq), ''),
                   coalesce(max(s.ttl_ms), 0),
                   greatest(coalesce(min(s.expires_ms), 0) - @s.now_ms(), 0),
                   coalesce(bool_or(s.expires_ms <= 0), false)
              INTO blockers, ttl_ms, until_ms, ended
              FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
             WHERE e.name = p_name AND e.seq > lo AND e.seq < hi;
            -- (An ended entry among them is the look's to settle.)
            IF ended THEN blockers := NULL; ttl_ms := NULL; until_ms := NULL; next := NULL; END IF;
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION @s.leave(p_secret text, p_name text, p_seq bigint,
    OUT status text, OUT holds integer)
LANGUAGE plpgsql AS $$
BEGIN
    -- (A row holder is released by the driver's FAST_LEAVE, before this is
    -- called.) Fast path, for the last hold of an entry of a live session:
    -- lock the name (bumping its version), delete the entry, and settle only
    -- if others are queued.
    UPDATE @s.names n SET version = n.version + 1 WHERE n.name = p_name;
    DELETE FROM @s.entries e USING @s.sessions s
     WHERE e.name = p_name AND e.seq = p_seq AND e.session = p_secret AND e.holds = 1
       AND s.id = p_secret AND s.expires_ms > 0;
    IF FOUND THEN
        status := 'ok'; holds := 0;
        IF EXISTS (SELECT 1 FROM @s.entries e WHERE e.name = p_name) THEN
            PERFORM @s.settle(p_name, true, true);
        ELSE
            UPDATE @s.names SET queued = false WHERE name = p_name;
            PERFORM pg_notify('@s_change', p_name);
        END IF;
        RETURN;
    END IF;
    -- Not this case: the version stays as it was.
    UPDATE @s.names n SET version = n.version - 1 WHERE n.name = p_name;
    IF NOT @s.alive(p_secret) THEN status := 'lost'; RETURN; END IF;
    PERFORM @s.lock_name(p_name);
    UPDATE @s.entries e SET holds = e.holds - 1
     WHERE e.name = p_name AND e.seq = p_seq AND e.session = p_secret
    RETURNING e.holds INTO holds;
    IF NOT FOUND THEN status := 'notheld'; RETURN; END IF;
    IF holds <= 0 THEN
        DELETE FROM @s.entries WHERE name = p_name AND seq = p_seq;
        PERFORM @s.settle(p_name, true, true);
        holds := 0;
    END IF;
    status := 'ok';
END $$;

-- Whether the entry is granted; if not, ms until its blockers lapse by the
-- clock (a hint), whether it is next in line (a release may grant it), and
-- what blocks it (the granted entries, for the next in line; the entry
-- just ahead, for the others) as a fingerprint and their longest TTL. With
-- p_confirm, the blockers a waiter watched for their TTL: the sessions of
-- those still exactly so are ended first.
DROP FUNCTION IF EXISTS @s.look(text, text, bigint);
DROP FUNCTION IF EXISTS @s.look(text, text, bigint, text);
CREATE FUNCTION @s.look(p_secret text, p_name text, p_seq bigint, p_confirm text,
    OUT status text, OUT until_ms bigint, OUT next boolean, OUT blockers text, OUT ttl_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    stamped bigint;
    ahead record;
    has_ahead boolean;
    b record;
    confirm text := p_confirm;
    locked boolean := false;
    lo bigint;
    hi bigint;
BEGIN
    IF NOT @s.alive(p_secret) THEN status := 'lost'; RETURN; END IF;
    -- Held in the name's row? (Read first: a row holder may move into
    -- @s.entries meanwhile, never the other way.)
    PERFORM 1 FROM @s.names n WHERE n.name = p_name AND n.h_seq = p_seq AND n.h_session = p_secret;
    IF FOUND THEN status := 'granted'; RETURN; END IF;
    -- The first turn reads without the name's lock, and the usual wait (a
    -- live entry just ahead, nothing to confirm) ends there: every
    -- committed change to the queue settled it, and a grant that commits
    -- after these reads is notified to a waiter, which listens before it
    -- looks. Anything else (an ended entry ahead, none ahead, blockers to
    -- confirm) turns again under the lock. Each locked turn ends something
    -- (an ended entry just ahead, or confirmed blockers), so this ends.
    LOOP
        IF locked THEN PERFORM @s.settle(p_name, false); END IF;
        SELECT e.granted_ms INTO stamped FROM @s.entries e
         WHERE e.name = p_name AND e.seq = p_seq AND e.session = p_secret;
        IF NOT FOUND THEN status := 'notheld'; RETURN; END IF;
        IF stamped IS NOT NULL THEN status := 'granted'; RETURN; END IF;
        status := 'wait';
        SELECT e.seq, e.session, e.granted_ms, s.expires_ms INTO ahead
          FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq < p_seq ORDER BY e.seq DESC LIMIT 1;
        has_ahead := FOUND;
        -- (The next in line waits for every entry ahead, all granted: an
        -- ended one among them, a semaphore's say, needs settling too.)
        IF NOT locked AND (NOT has_ahead OR ahead.expires_ms <= 0 OR confirm IS NOT NULL
                OR (ahead.granted_ms IS NOT NULL
                    AND EXISTS (SELECT 1 FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
                                 WHERE e.name = p_name AND e.seq < p_seq AND s.expires_ms <= 0))) THEN
            PERFORM @s.lock_name(p_name);
            locked := true;
            CONTINUE;
        END IF;
        IF NOT has_ahead THEN
            until_ms := 0; next := true; blockers := ''; ttl_ms := 0; RETURN;
        END IF;
        IF ahead.expires_ms <= 0 THEN
            -- Ended, behind the first waiter (the walk stops there).
            DELETE FROM @s.entries WHERE name = p_name AND seq = ahead.seq;
            CONTINUE;
        END IF;
        next := ahead.granted_ms IS NOT NULL;
        IF confirm IS NOT NULL THEN
            -- (An entry not among the blockers now is no matter: seen
            -- unrenewed for its TTL, it is dead all the same.)
            IF @s.end_confirmed(p_name, p_seq, confirm) > 0 THEN
                PERFORM @s.settle(p_name, true);
                confirm := NULL;
                CONTINUE;
            END IF;
            confirm := NULL;
        END IF;
        IF NOT next AND ahead.expires_ms <= @s.now_ms() THEN
            -- The entry just ahead lapsed by the clock: watch the whole run
            -- of lapsed entries ahead, back to the nearest live one, at
            -- once (crashed waiters would otherwise go one per TTL).
            SELECT * INTO b FROM @s.blockers_after(p_name, coalesce(
                (SELECT e.seq FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
                  WHERE e.name = p_name AND e.seq < p_seq AND s.expires_ms > @s.now_ms()
                  ORDER BY e.seq DESC LIMIT 1), 0), p_seq);
            until_ms := b.until_ms; blockers := b.fingerprint; ttl_ms := b.ttl_ms;
            RETURN;
        END IF;
        -- The usual case, as blockers() would answer it, inline: two
        -- nested function calls cost more than the query.
        lo := CASE WHEN next THEN -1 ELSE ahead.seq - 1 END;
        hi := CASE WHEN next THEN p_seq ELSE ahead.seq + 1 END;
        SELECT coalesce(string_agg(e.seq || ':' || s.renewals || ':' || s.expires_ms, ','
                                   ORDER BY e.seq), ''),
               coalesce(max(s.ttl_ms), 0),
               greatest(coalesce(min(s.expires_ms), 0) - @s.now_ms(), 0)
          INTO blockers, ttl_ms, until_ms
          FROM @s.entries e JOIN @s.sessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq > lo AND e.seq < hi;
        RETURN;
    END LOOP;
END $$;

-- A newcomer's confirmation (a try-lock that found nobody in the queue
-- alive): the sessions of the entries still exactly as it watched them for
-- their TTL (p_blockers) end, holders and waiters alike. Returns how many.
CREATE OR REPLACE FUNCTION @s.expire(p_name text, p_blockers text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM @s.lock_name(p_name);
    PERFORM @s.settle(p_name, false);
    -- Holders and waiters alike: each only if still exactly as watched.
    n := @s.end_confirmed(p_name, 9223372036854775807, p_blockers);
    IF n > 0 THEN PERFORM @s.settle(p_name, true); END IF;
    RETURN n;
END $$;

-- Opens a session, and drops a few sessions that ended, or expired a minute
-- ago, and have no entries left, oldest expiry first (a renewal of a dropped
-- session reads "lost" all the same).
CREATE OR REPLACE FUNCTION @s.open(p_secret text, p_tag text, p_label text, p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := @s.now_ms();
    lapsed text[];
BEGIN
    SELECT array_agg(id) INTO lapsed FROM (
        SELECT s.id FROM @s.sessions s
         WHERE s.expires_ms < now_ms - 60000
           AND NOT EXISTS (SELECT 1 FROM @s.all_entries e WHERE e.session = s.id)
         ORDER BY s.expires_ms LIMIT 16
           FOR UPDATE SKIP LOCKED) c;
    -- Checked again by a statement of its own (a newer snapshot): an entry
    -- that a join committed after the one above keeps its session.
    IF lapsed IS NOT NULL THEN
        DELETE FROM @s.sessions s WHERE s.id = ANY(lapsed)
           AND NOT EXISTS (SELECT 1 FROM @s.all_entries e WHERE e.session = s.id);
    END IF;
    INSERT INTO @s.sessions (id, tag, label, ttl_ms, expires_ms)
    VALUES (p_secret, p_tag, p_label, p_ttl_ms, now_ms + p_ttl_ms);
END $$;

CREATE OR REPLACE FUNCTION @s.set_value(p_secret text, p_name text, p_seq bigint, p_value bytea)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF NOT @s.alive(p_secret) THEN RETURN 'lost'; END IF;
    PERFORM @s.lock_name(p_name);
    PERFORM @s.settle(p_name, false);
    UPDATE @s.entries SET value = p_value
     WHERE name = p_name AND seq = p_seq AND session = p_secret AND granted_ms IS NOT NULL;
    IF NOT FOUND THEN RETURN 'notheld'; END IF;
    UPDATE @s.names SET version = version + 1 WHERE name = p_name;
    PERFORM pg_notify('@s_change', p_name);
    RETURN 'ok';
END $$;

CREATE OR REPLACE FUNCTION @s.close(p_secret text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    n text;
BEGIN
    -- Locking a name moves the session's row holder there into @s.entries.
    FOR n IN SELECT DISTINCT name FROM @s.all_entries WHERE session = p_secret ORDER BY name LOOP
        PERFORM @s.lock_name(n);
    END LOOP;
    FOR n IN SELECT DISTINCT name FROM @s.entries WHERE session = p_secret ORDER BY name LOOP
        DELETE FROM @s.entries WHERE name = n AND session = p_secret;
        PERFORM @s.settle(n, true);
    END LOOP;
    DELETE FROM @s.sessions WHERE id = p_secret;
END $$;

-- Settles a name whose queue a reader found stale (an ended session's
-- entry, or an unstamped grant): unlike settle's walk, it drops every
-- ended session's entry here, also behind the first waiter, since the
-- reader reads the whole queue anyway and must not find it again.
CREATE OR REPLACE FUNCTION @s.refresh(p_name text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    dead text[];
BEGIN
    PERFORM @s.lock_name(p_name);
    SELECT array_agg(s.id) INTO dead FROM @s.sessions s
     WHERE s.expires_ms <= 0
       AND s.id IN (SELECT e.session FROM @s.entries e WHERE e.name = p_name);
    IF dead IS NOT NULL THEN
        DELETE FROM @s.entries WHERE name = p_name AND session = ANY(dead);
    END IF;
    PERFORM @s.settle(p_name, dead IS NOT NULL);
END $$;

CREATE OR REPLACE FUNCTION @s.evict(p_name text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    holders text[];
BEGIN
    PERFORM @s.lock_name(p_name);
    PERFORM @s.settle(p_name, false);
    SELECT array_agg(DISTINCT session) INTO holders FROM @s.entries
     WHERE name = p_name AND granted_ms IS NOT NULL;
    IF holders IS NULL THEN RETURN 0; END IF;
    -- Their sessions end for good; their entries elsewhere go as those names settle.
    UPDATE @s.sessions SET expires_ms = 0 WHERE id = ANY(holders);
    PERFORM @s.settle(p_name, true);
    RETURN cardinality(holders);
END $$;

-- Ends the one live session whose public tag is p_tag (an administrator's
-- "end this session"): as on close, its entries on every name go at once
-- and each name settles (waiters behind it are granted and notified, its
-- version bumps); unlike close, its row stays, ended (expires_ms = 0), so
-- that its owner's next keep-alive fails, and its bound cells read empty.
-- Returns whether a live session had that tag.
CREATE OR REPLACE FUNCTION @s.evict_session(p_tag text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    sid text;
    n text;
    locked text[];
    ended integer;
BEGIN
    SELECT id INTO sid FROM @s.sessions WHERE tag = p_tag AND expires_ms > 0 LIMIT 1;
    IF NOT FOUND THEN RETURN false; END IF;
    -- The names' locks first, in name order, then the session's row: the
    -- order close takes them in, and evict and the watchers' confirmations.
    SELECT coalesce(array_agg(d.name ORDER BY d.name), '{}') INTO locked
      FROM (SELECT DISTINCT name FROM @s.all_entries WHERE session = sid) d;
    FOREACH n IN ARRAY locked LOOP
        PERFORM @s.lock_name(n);
    END LOOP;
    UPDATE @s.sessions SET expires_ms = 0 WHERE id = sid AND expires_ms > 0;
    GET DIAGNOSTICS ended = ROW_COUNT;
    -- Ended meanwhile (closed, evicted, confirmed expired): not by this call.
    IF ended = 0 THEN RETURN false; END IF;
    -- Only the names locked above: taking another name's lock while
    -- holding the session's row could deadlock with a watcher's
    -- confirmation. An entry joined meanwhile belongs to an ended session
    -- now, which settle and refresh drop.
    FOREACH n IN ARRAY locked LOOP
        DELETE FROM @s.entries WHERE name = n AND session = sid;
        PERFORM @s.settle(n, true);
    END LOOP;
    RETURN true;
END $$;

-- A fence: read it (p_token NULL), or admit p_token if it is at least the
-- highest admitted, with p_value (if not NULL) as its new value.
CREATE OR REPLACE FUNCTION @s.fence(p_name text, p_token bigint, p_value bytea)
RETURNS TABLE (status text, highest bigint, val bytea) LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF p_token IS NULL THEN
        SELECT g.kind, g.version, g.value INTO r FROM @s.registers g WHERE g.name = p_name;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'ok'::text, 0::bigint, NULL::bytea;
            RETURN;
        END IF;
    ELSE
        INSERT INTO @s.registers (name, kind, version) VALUES (p_name, 0, 0)
            ON CONFLICT (name) DO NOTHING;
        SELECT g.kind, g.version, g.value INTO r FROM @s.registers g WHERE g.name = p_name FOR UPDATE;
    END IF;
    IF r.kind <> 0 THEN
        RETURN QUERY SELECT 'conflict:it is a cell, not a fence'::text, 0::bigint, NULL::bytea;
    ELSIF p_token IS NULL THEN
        RETURN QUERY SELECT 'ok'::text, r.version, r.value;
    ELSIF p_token < r.version THEN
        RETURN QUERY SELECT 'stale'::text, r.version, r.value;
    ELSE
        UPDATE @s.registers g SET version = p_token, value = coalesce(p_value, g.value)
         WHERE g.name = p_name;
        RETURN QUERY SELECT 'ok'::text, p_token, coalesce(p_value, r.value);
    END IF;
END $$;

-- A cell's row: its kind, stored version, value and whether its owner (if
-- any) lives; locked when p_lock.
CREATE OR REPLACE FUNCTION @s.cell_row(p_name text, p_lock boolean,
    OUT present boolean, OUT is_cell boolean, OUT stored bigint, OUT val bytea, OUT cur bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF p_lock THEN
        SELECT g.kind, g.version, g.value, g.owner IS NULL OR @s.unlapsed(g.owner) AS live INTO r
          FROM @s.registers g WHERE g.name = p_name FOR UPDATE;
    ELSE
        SELECT g.kind, g.version, g.value, g.owner IS NULL OR @s.unlapsed(g.owner) AS live INTO r
          FROM @s.registers g WHERE g.name = p_name;
    END IF;
    present := FOUND;
    IF present THEN
        is_cell := r.kind = 1;
        stored := r.version;
        IF r.value IS NOT NULL AND r.live THEN
            val := r.value;
            cur := r.version;
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION @s.cell_get(p_name text)
RETURNS TABLE (status text, ver bigint, val bytea) LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    c := @s.cell_row(p_name, false);
    IF c.present AND NOT c.is_cell THEN
        RETURN QUERY SELECT 'conflict:it is a fence, not a cell'::text, NULL::bigint, NULL::bytea;
    ELSE
        RETURN QUERY SELECT 'ok'::text, c.cur, c.val;
    END IF;
END $$;

-- Writes p_value if the cell's live version is p_expect (0: no value), bound
-- to the session p_owner if not NULL.
CREATE OR REPLACE FUNCTION @s.cell_put(p_name text, p_value bytea, p_expect bigint, p_owner text)
RETURNS TABLE (status text, ver bigint) LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    c := @s.cell_row(p_name, true);
    -- A name never used becomes a cell only by a write that will happen: a
    -- refused one leaves nothing behind.
    IF NOT c.present AND p_expect = 0 THEN
        INSERT INTO @s.registers (name, kind, version) VALUES (p_name, 1, 0)
            ON CONFLICT (name) DO NOTHING;
        c := @s.cell_row(p_name, true);
    END IF;
    IF c.present AND NOT c.is_cell THEN
        RETURN QUERY SELECT 'conflict:it is a fence, not a cell'::text, NULL::bigint;
        RETURN;
    END IF;
    IF p_owner IS NOT NULL THEN
        -- Locked, so that a close or an eviction cannot commit between this
        -- check and the write.
        PERFORM 1 FROM @s.sessions WHERE id = p_owner AND expires_ms > @s.now_ms() FOR SHARE;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'lost'::text, NULL::bigint;
            RETURN;
        END IF;
    END IF;
    IF c.cur IS DISTINCT FROM nullif(p_expect, 0) THEN
        RETURN QUERY SELECT 'mismatch'::text, c.cur;
    ELSE
        UPDATE @s.registers g SET version = c.stored + 1, value = p_value, owner = p_owner
         WHERE g.name = p_name;
        RETURN QUERY SELECT 'ok'::text, c.stored + 1;
    END IF;
END $$;

-- Deletes the cell's value if its live version is p_version; the version
-- stays, so the next write's is higher.
CREATE OR REPLACE FUNCTION @s.cell_delete(p_name text, p_version bigint)
RETURNS TABLE (status text, ver bigint) LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    c := @s.cell_row(p_name, true);
    IF c.present AND NOT c.is_cell THEN
        RETURN QUERY SELECT 'conflict:it is a fence, not a cell'::text, NULL::bigint;
    ELSIF c.cur IS DISTINCT FROM p_version THEN
        RETURN QUERY SELECT 'mismatch'::text, c.cur;
    ELSE
        UPDATE @s.registers g SET value = NULL, owner = NULL WHERE g.name = p_name;
        RETURN QUERY SELECT 'ok'::text, c.stored;
    END IF;
END $$;
