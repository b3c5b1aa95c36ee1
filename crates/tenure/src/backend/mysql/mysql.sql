-- tenure's MySQL/MariaDB store, schema version 10 (1 read the clock and the
-- session before the name's lock; 2 read every entry of a queue on each
-- call; 3 had no fences or cells; 4 judged expiry by the server's clock; 5
-- could not end one session by its tag; 6 ran more statements and nested
-- calls per join and release; 7 kept every entry in @pentries; 8 did not
-- say what a release granted, and locked the name for every look; 9's join
-- did not say what a waiter's first look would). "@p" is the table prefix.
-- Statements are separated by lines of ";;". "@pnow_ms()" stands for the
-- server's clock in milliseconds (replaced when loaded, so no stored
-- function needs SUPER under binary logging). Every operation is one CALL (one
-- round trip, one transaction), but for taking a free name and releasing a
-- lone holder, which are one plain UPDATE each (FAST_JOIN and FAST_LEAVE in
-- mysql.rs). Expiry is never judged by the server's clock
-- (SYSDATE, which anyone can set, and which steps): a session's lease lapses
-- by it only as a hint (expires_ms); its entries go only when the session is
-- closed, evicted, or confirmed expired (expires_ms = 0) by a client that
-- watched its renewal counter unchanged for its TTL on its own monotonic
-- clock (`look` and `expire` with the fingerprint it saw). A name's row in
-- @pnames is locked FOR UPDATE by every change to its queue. Fencing counters
-- are plain columns, not AUTO_INCREMENT, so they never go back on restart.
-- A lone holder (one entry, one hold, granted on a name nobody else was
-- queued on) is kept in its name's row (the h_ columns), not in @pentries,
-- which saves the entry's INSERT and DELETE and the looks for others
-- queued. Every path that locks a name first moves that holder into
-- @pentries (`spill`), so the rest of this file knows only @pentries,
-- except join's and leave's cases of a free name and a lone holder. A row
-- holder whose session is gone or ended is dead. `queued` is true whenever
-- the name may have entries (set with every insert, cleared by `settle`
-- when it finds none): a row holder is only taken while it is false.
CREATE TABLE IF NOT EXISTS @pmeta (
    k VARCHAR(64) NOT NULL PRIMARY KEY,
    v VARCHAR(255) NOT NULL
) ENGINE=InnoDB
;;
CREATE TABLE IF NOT EXISTS @psessions (
    id CHAR(32) CHARACTER SET ascii NOT NULL PRIMARY KEY,
    tag VARCHAR(32) NOT NULL,
    label VARCHAR(255) NOT NULL,
    ttl_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    renewals BIGINT NOT NULL DEFAULT 0,
    KEY by_expiry (expires_ms)
) ENGINE=InnoDB
;;
DROP PROCEDURE IF EXISTS @padd_renewals
;;
-- Tables of schema 4 and before have no renewal counter and no index by
-- expiry (MySQL has no ADD COLUMN IF NOT EXISTS).
CREATE PROCEDURE @padd_renewals()
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_schema = DATABASE() AND table_name = '@psessions'
                      AND column_name = 'renewals') THEN
        ALTER TABLE @psessions ADD COLUMN renewals BIGINT NOT NULL DEFAULT 0;
    END IF;
    -- `open` collects lapsed sessions in lapse order.
    IF NOT EXISTS (SELECT 1 FROM information_schema.statistics
                    WHERE table_schema = DATABASE() AND table_name = '@psessions'
                      AND index_name = 'by_expiry') THEN
        ALTER TABLE @psessions ADD KEY by_expiry (expires_ms);
    END IF;
END
;;
CALL @padd_renewals()
;;
DROP PROCEDURE @padd_renewals
;;
CREATE TABLE IF NOT EXISTS @pnames (
    name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    last_seq BIGINT NOT NULL,
    version BIGINT NOT NULL
) ENGINE=InnoDB
;;
DROP PROCEDURE IF EXISTS @padd_holder
;;
-- Tables of schema 7 and before keep no holder in a name's row.
CREATE PROCEDURE @padd_holder()
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_schema = DATABASE() AND table_name = '@pnames'
                      AND column_name = 'queued') THEN
        ALTER TABLE @pnames
            ADD COLUMN h_seq BIGINT NULL,
            ADD COLUMN h_session CHAR(32) CHARACTER SET ascii NULL,
            ADD COLUMN h_kind SMALLINT NULL,
            ADD COLUMN h_count INT NULL,
            ADD COLUMN h_lim INT NULL,
            ADD COLUMN h_value LONGBLOB NULL,
            ADD COLUMN h_granted_ms BIGINT NULL,
            ADD COLUMN queued BOOLEAN NOT NULL DEFAULT TRUE;
    END IF;
END
;;
CALL @padd_holder()
;;
DROP PROCEDURE @padd_holder
;;
CREATE TABLE IF NOT EXISTS @pentries (
    name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    seq BIGINT NOT NULL,
    session CHAR(32) CHARACTER SET ascii NOT NULL,
    kind SMALLINT NOT NULL,
    count INT NOT NULL,
    lim INT NOT NULL,
    holds INT NOT NULL,
    value LONGBLOB NOT NULL,
    granted_ms BIGINT NULL,
    PRIMARY KEY (name, seq),
    KEY by_session (session),
    CONSTRAINT @pentries_session FOREIGN KEY (session) REFERENCES @psessions(id) ON DELETE CASCADE
) ENGINE=InnoDB
;;
-- Fences and cells. A fence keeps its highest token in version; a cell
-- keeps its version there even when it has no value (deleted, or its owner
-- session ended), so a cell's versions are never reused.
CREATE TABLE IF NOT EXISTS @pregisters (
    name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    kind SMALLINT NOT NULL,
    version BIGINT NOT NULL,
    value MEDIUMBLOB NULL,
    owner CHAR(32) CHARACTER SET ascii NULL
) ENGINE=InnoDB
;;
DROP PROCEDURE IF EXISTS @psettle
;;
-- Walks the name's queue from the head, one row at a time by seq: stamps
-- newly granted entries, stops at the first entry that waits, bumps the
-- version if anything changed. An entry of an ended session met on the way
-- is dropped; entries further back are not read, so the cost follows the
-- granted entries, not the waiters. The caller holds the name's lock inside
-- its transaction.
CREATE PROCEDURE @psettle(IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_changed BOOLEAN)
BEGIN
    DECLARE v_now BIGINT DEFAULT @pnow_ms();
    DECLARE v_after BIGINT DEFAULT 0;
    DECLARE v_seq BIGINT;
    DECLARE v_session CHAR(32) CHARACTER SET ascii;
    DECLARE v_kind SMALLINT;
    DECLARE v_count INT;
    DECLARE v_lim INT;
    DECLARE v_granted BIGINT;
    DECLARE v_expires BIGINT;
    DECLARE v_idx INT DEFAULT 0;
    DECLARE v_shared BOOLEAN DEFAULT TRUE;
    DECLARE v_permits BIGINT DEFAULT 0;
    DECLARE v_ok BOOLEAN;
    DECLARE v_changed BOOLEAN DEFAULT p_changed;
    -- The walk's last read finds no row: handled here, so that it never
    -- reaches a caller's handler (close's cursor loop).
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    walk: LOOP
        SET v_seq = NULL;
        SELECT STRAIGHT_JOIN e.seq, e.session, e.kind, e.count, e.lim, e.granted_ms, s.expires_ms
          INTO v_seq, v_session, v_kind, v_count, v_lim, v_granted, v_expires
          FROM @pentries e JOIN @psessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq > v_after ORDER BY e.seq LIMIT 1;
        IF v_seq IS NULL THEN LEAVE walk; END IF;
        SET v_after = v_seq;
        IF v_expires <= 0 THEN
            DELETE FROM @pentries WHERE name = p_name AND seq = v_seq;
            SET v_changed = TRUE;
            ITERATE walk;
        END IF;
        SET v_idx = v_idx + 1;
        IF v_kind = 0 THEN SET v_ok = (v_idx = 1);
        ELSEIF v_kind = 1 THEN SET v_ok = v_shared;
        ELSE SET v_ok = (v_permits + v_count <= v_lim);
        END IF;
        IF NOT v_ok THEN LEAVE walk; END IF;
        IF v_kind <> 1 THEN SET v_shared = FALSE; END IF;
        IF v_kind = 2 THEN SET v_permits = v_permits + v_count; END IF;
        IF v_granted IS NULL THEN
            UPDATE @pentries SET granted_ms = v_now WHERE name = p_name AND seq = v_seq;
            SET v_changed = TRUE;
            -- What this call granted, for `leave` to answer with, while it
            -- collects (a user variable of the connection: one call runs
            -- on it at a time; NULL when nobody collects).
            IF @tenure_granted IS NOT NULL THEN
                SET @tenure_granted = CONCAT(@tenure_granted, ',', v_seq);
            END IF;
        END IF;
    END LOOP;
    -- No live entry left: a free name again, which a join may take in its row.
    IF v_changed OR v_idx = 0 THEN
        UPDATE @pnames SET version = version + IF(v_changed, 1, 0),
                           queued = IF(v_idx = 0, FALSE, queued)
         WHERE name = p_name;
    END IF;
END
;;
DROP PROCEDURE IF EXISTS @pspill
;;
-- Moves the lone holder kept in the name's row into @pentries, where the
-- rest of this file looks; a dead one (its session gone) just goes. The
-- caller holds the name's lock. (The session's row is share-locked, as the
-- entry's foreign key will: a session being deleted meanwhile is waited
-- for, and then read as gone rather than failing the key.)
CREATE PROCEDURE @pspill(IN p_name VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
    DECLARE v_moved INT DEFAULT 0;
    INSERT INTO @pentries (name, seq, session, kind, count, lim, holds, value, granted_ms)
    SELECT n.name, n.h_seq, n.h_session, n.h_kind, n.h_count, n.h_lim, 1, n.h_value, n.h_granted_ms
      FROM @pnames n JOIN @psessions s ON s.id = n.h_session
     WHERE n.name = p_name
      LOCK IN SHARE MODE;
    SET v_moved = ROW_COUNT();
    -- A dead holder that just goes is a change of the name.
    UPDATE @pnames SET h_seq = NULL, h_session = NULL, h_value = NULL, queued = TRUE,
                       version = version + IF(v_moved > 0, 0, 1)
     WHERE name = p_name;
END
;;
DROP PROCEDURE IF EXISTS @plock_name
;;
CREATE PROCEDURE @plock_name(IN p_name VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_holder CHAR(32) CHARACTER SET ascii DEFAULT NULL;
    SELECT COUNT(*), MAX(h_session) INTO v_found, v_holder FROM @pnames WHERE name = p_name FOR UPDATE;
    IF v_found = 0 THEN
        INSERT IGNORE INTO @pnames (name, last_seq, version) VALUES (p_name, 0, 0);
        -- (Another join may have made the row, and taken the name in it,
        -- while this waited for the INSERT.)
        SELECT COUNT(*), MAX(h_session) INTO v_found, v_holder
          FROM @pnames WHERE name = p_name FOR UPDATE;
    END IF;
    IF v_holder IS NOT NULL THEN CALL @pspill(p_name); END IF;
END
;;
DROP PROCEDURE IF EXISTS @pleave
;;
CREATE PROCEDURE @pleave(IN p_secret CHAR(32) CHARACTER SET ascii, IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_seq BIGINT)
proc: BEGIN
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_alive INT DEFAULT 0;
    DECLARE v_holds INT DEFAULT NULL;
    DECLARE v_first BIGINT DEFAULT NULL;
    DECLARE v_hseq BIGINT DEFAULT NULL;
    DECLARE v_holder CHAR(32) CHARACTER SET ascii DEFAULT NULL;
    DECLARE v_granted LONGTEXT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN SET @tenure_granted = NULL; ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    -- The name's lock, inline (a name without a row holds no entry), with
    -- the holder kept in its row.
    SELECT COUNT(*), MAX(h_seq), MAX(h_session) INTO v_found, v_hseq, v_holder
      FROM @pnames WHERE name = p_name FOR UPDATE;
    IF v_holder = p_secret AND v_hseq = p_seq THEN
        -- A lone holder: nobody else is queued, nothing to settle.
        SELECT COUNT(*) INTO v_alive FROM @psessions WHERE id = p_secret AND expires_ms > 0;
        IF v_alive = 0 THEN
            ROLLBACK;
            SELECT 'lost', NULL;
            LEAVE proc;
        END IF;
        UPDATE @pnames SET h_seq = NULL, h_session = NULL, h_value = NULL, version = version + 1
         WHERE name = p_name;
        COMMIT;
        SELECT 'ok', 0;
        LEAVE proc;
    END IF;
    IF v_holder IS NOT NULL THEN CALL @pspill(p_name); END IF;
    -- Read after the name's lock, like join's: a session that ended while
    -- this waited is reported lost, not released as if it had held. The
    -- entry and its session's life in one read; the rare miss tells which.
    SELECT e.holds INTO v_holds FROM @pentries e JOIN @psessions s ON s.id = e.session
     WHERE e.name = p_name AND e.seq = p_seq AND e.session = p_secret AND s.expires_ms > 0;
    IF v_holds IS NULL THEN
        SELECT COUNT(*) INTO v_alive FROM @psessions WHERE id = p_secret AND expires_ms > 0;
        IF v_alive = 0 THEN
            ROLLBACK;
            SELECT 'lost', NULL;
            LEAVE proc;
        END IF;
        COMMIT;
        SELECT 'notheld', NULL;
        LEAVE proc;
    END IF;
    IF v_holds > 1 THEN
        UPDATE @pentries SET holds = holds - 1 WHERE name = p_name AND seq = p_seq;
        COMMIT;
        SELECT 'ok', v_holds - 1;
        LEAVE proc;
    END IF;
    DELETE FROM @pentries WHERE name = p_name AND seq = p_seq;
    -- A lone holder's release leaves nothing to settle: the change alone.
    SELECT MIN(seq) INTO v_first FROM @pentries WHERE name = p_name;
    IF v_first IS NOT NULL THEN
        SET @tenure_granted = '';
        CALL @psettle(p_name, TRUE);
        SET v_granted = @tenure_granted, @tenure_granted = NULL;
    ELSE
        UPDATE @pnames SET version = version + 1, queued = FALSE WHERE name = p_name;
    END IF;
    COMMIT;
    -- The entries granted, committed and not ended since (nothing after
    -- settle here ends one): the caller takes these grants for its waiters
    -- in this process without their looks.
    SELECT 'ok', 0, v_granted;
END
;;
DROP PROCEDURE IF EXISTS @pjoin
;;
-- (`leave` is replaced before `join`, so that no row holder is made while
-- the old `leave` could be asked to release one.) Once the old `join` is
-- gone (DROP waits for its running calls), the names it queued on while
-- the new `settle` was already in place are marked queued again: the old
-- `join` inserted entries without setting the flag.
UPDATE @pnames n SET queued = TRUE
 WHERE NOT queued AND EXISTS (SELECT 1 FROM @pentries e WHERE e.name = n.name)
;;
CREATE PROCEDURE @pjoin(IN p_secret CHAR(32) CHARACTER SET ascii, IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_kind SMALLINT, IN p_count INT, IN p_lim INT, IN p_value LONGBLOB, IN p_if_granted BOOLEAN)
proc: BEGIN
    DECLARE v_now BIGINT DEFAULT @pnow_ms();
    DECLARE v_alive INT DEFAULT 0;
    DECLARE v_mine_seq BIGINT DEFAULT NULL;
    DECLARE v_mine_kind SMALLINT;
    DECLARE v_mine_count INT;
    DECLARE v_mine_lim INT;
    DECLARE v_mine_granted BIGINT;
    DECLARE v_holds INT;
    DECLARE v_first BIGINT DEFAULT NULL;
    DECLARE v_permits BIGINT DEFAULT 0;
    DECLARE v_head_kind SMALLINT DEFAULT NULL;
    DECLARE v_head_lim INT DEFAULT NULL;
    DECLARE v_tail_kind SMALLINT DEFAULT NULL;
    DECLARE v_tail_granted BIGINT DEFAULT NULL;
    DECLARE v_granted BOOLEAN;
    DECLARE v_seq BIGINT;
    DECLARE v_last BIGINT DEFAULT NULL;
    DECLARE v_holder CHAR(32) CHARACTER SET ascii DEFAULT NULL;
    DECLARE v_queued BOOLEAN DEFAULT TRUE;
    DECLARE v_empty BOOLEAN DEFAULT FALSE;
    DECLARE v_aseq BIGINT DEFAULT NULL;
    DECLARE v_agranted BIGINT;
    DECLARE v_aexpires BIGINT;
    DECLARE v_blockers LONGTEXT DEFAULT NULL;
    DECLARE v_ttl BIGINT DEFAULT NULL;
    DECLARE v_until BIGINT DEFAULT NULL;
    DECLARE v_next BOOLEAN DEFAULT NULL;
    DECLARE v_ended BOOLEAN DEFAULT FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    -- The name's lock (as @plock_name, inline: every statement and call in
    -- a procedure costs MariaDB some 10-20 µs), which also reads the last
    -- token given, the row's holder and whether anyone may be queued.
    SELECT MAX(last_seq), MAX(h_session), MAX(queued) INTO v_last, v_holder, v_queued
      FROM @pnames WHERE name = p_name FOR UPDATE;
    IF v_last IS NULL THEN
        INSERT IGNORE INTO @pnames (name, last_seq, version) VALUES (p_name, 0, 0);
        -- (Another join may have made the row, and taken the name in it,
        -- while this waited for the INSERT.)
        SELECT MAX(last_seq), MAX(h_session), MAX(queued) INTO v_last, v_holder, v_queued
          FROM @pnames WHERE name = p_name FOR UPDATE;
    END IF;
    IF v_holder IS NOT NULL THEN
        CALL @pspill(p_name);
        SET v_queued = TRUE;
    END IF;
    -- The clock and the session are read after the name's lock: the wait
    -- for it may be long, and a session that ended in it gets nothing. The
    -- session's row is share-locked, as an entry's foreign key would be: a
    -- grant kept in the name's row has no key, and `open` must not delete
    -- the session under it.
    SET v_now = @pnow_ms();
    SELECT COUNT(*) INTO v_alive FROM @psessions WHERE id = p_secret AND expires_ms > 0
      LOCK IN SHARE MODE;
    IF v_alive = 0 THEN
        ROLLBACK;
        SELECT 'lost', NULL, NULL, NULL, NULL;
        LEAVE proc;
    END IF;
    -- Fast path: an empty queue has nothing to settle, no entry of ours and
    -- nothing to conflict with; it is granted at once.
    -- MIN over the key's prefix is answered from the index while the
    -- statement is planned: a third of what EXISTS costs MariaDB.
    -- (A name not queued has no entries: not even that read.)
    IF v_queued THEN
        SELECT MIN(seq) INTO v_first FROM @pentries WHERE name = p_name;
    END IF;
    IF v_first IS NULL AND (p_kind <> 2 OR p_count <= p_lim) THEN
        SET v_granted = TRUE, v_empty = TRUE;
    ELSE
        CALL @psettle(p_name, FALSE);
        SELECT seq, kind, count, lim, granted_ms, holds
          INTO v_mine_seq, v_mine_kind, v_mine_count, v_mine_lim, v_mine_granted, v_holds
          FROM @pentries FORCE INDEX (by_session) WHERE name = p_name AND session = p_secret LIMIT 1;
        IF v_mine_seq IS NOT NULL THEN
            IF v_mine_kind <> p_kind OR v_mine_count <> p_count OR v_mine_lim <> p_lim THEN
                COMMIT;
                SELECT 'conflict:this session already has another kind of entry here', NULL, NULL, NULL, NULL;
                LEAVE proc;
            END IF;
            IF p_if_granted AND v_mine_granted IS NULL THEN
                COMMIT;
                SELECT 'none', NULL, NULL, NULL, NULL;
                LEAVE proc;
            END IF;
            UPDATE @pentries SET holds = holds + 1 WHERE name = p_name AND seq = v_mine_seq;
            COMMIT;
            SELECT 'ok', v_mine_seq, v_mine_granted IS NOT NULL, v_holds + 1, FALSE;
            LEAVE proc;
        END IF;
        -- Every entry passed this check against those before it, so the
        -- head stands for them all.
        SELECT kind, lim INTO v_head_kind, v_head_lim FROM @pentries
         WHERE name = p_name ORDER BY seq LIMIT 1;
        IF v_head_kind IS NOT NULL AND ((p_kind = 2) <> (v_head_kind = 2)) THEN
            COMMIT;
            SELECT 'conflict:locks and semaphores cannot share a name', NULL, NULL, NULL, NULL;
            LEAVE proc;
        END IF;
        IF p_kind = 2 AND v_head_lim IS NOT NULL AND v_head_lim <> p_lim THEN
            COMMIT;
            SELECT CONCAT('conflict:semaphore limit ', p_lim, ' disagrees with the limit ', v_head_lim, ' already in use'),
                   NULL, NULL, NULL, NULL;
            LEAVE proc;
        END IF;
        -- Settled, the granted entries are a prefix of the queue: if the
        -- last entry is granted, all are.
        SELECT kind, granted_ms INTO v_tail_kind, v_tail_granted FROM @pentries
         WHERE name = p_name ORDER BY seq DESC LIMIT 1;
        IF v_tail_kind IS NULL THEN SET v_granted = TRUE, v_empty = TRUE;
        ELSEIF v_tail_granted IS NULL THEN SET v_granted = FALSE;
        ELSEIF p_kind = 0 THEN SET v_granted = FALSE;
        ELSEIF p_kind = 1 THEN SET v_granted = (v_tail_kind = 1);
        ELSE
            SELECT COALESCE(SUM(count), 0) INTO v_permits FROM @pentries WHERE name = p_name;
            SET v_granted = (v_permits + p_count <= p_lim);
        END IF;
        IF p_if_granted AND NOT v_granted THEN
            COMMIT;
            -- Nobody in the queue alive by the clock, holders and waiters
            -- alike (a crashed process's waiter watches no one, so such a
            -- queue would stay for ever): what to watch, all of it. The head
            -- is looked at first (live, as a rule: done at once).
            IF NOT EXISTS (SELECT 1 FROM (SELECT session FROM @pentries WHERE name = p_name
                                           ORDER BY seq LIMIT 1) h
                             JOIN @psessions s ON s.id = h.session WHERE s.expires_ms > v_now)
               AND NOT EXISTS (SELECT 1 FROM @pentries e JOIN @psessions s ON s.id = e.session
                                WHERE e.name = p_name AND s.expires_ms > v_now) THEN
                SET SESSION group_concat_max_len = 16777216;
                SELECT 'none', NULL, NULL, NULL, NULL,
                       GROUP_CONCAT(CONCAT(e.seq, ':', s.renewals, ':', s.expires_ms)
                                    ORDER BY e.seq SEPARATOR ','),
                       MAX(s.ttl_ms), MAX(s.expires_ms) <= v_now
                  FROM @pentries e JOIN @psessions s ON s.id = e.session WHERE e.name = p_name;
            ELSE
                SELECT 'none', NULL, NULL, NULL, NULL;
            END IF;
            LEAVE proc;
        END IF;
    END IF;
    -- The name's row is locked since the first read: its last token stands.
    SET v_seq = v_last + 1;
    IF v_empty THEN
        -- Alone on the name: held in its row.
        UPDATE @pnames SET last_seq = v_seq, version = version + 1, h_seq = v_seq,
                           h_session = p_secret, h_kind = p_kind, h_count = p_count, h_lim = p_lim,
                           h_value = p_value, h_granted_ms = v_now, queued = FALSE
         WHERE name = p_name;
    ELSE
        UPDATE @pnames SET last_seq = v_seq, version = version + 1, queued = TRUE WHERE name = p_name;
        INSERT INTO @pentries (name, seq, session, kind, count, lim, holds, value, granted_ms)
        VALUES (p_name, v_seq, p_secret, p_kind, p_count, p_lim, 1, p_value,
                IF(v_granted, v_now, NULL));
    END IF;
    COMMIT;
    -- Queued: also what the waiter's first look would say in the usual
    -- case, a live entry just ahead, read as `look` reads it, after the
    -- commit and without the name's lock (which the other joins and the
    -- releases of the name wait for), so that the waiter need not look
    -- (blockers, TTL, ms until they lapse, next in line). Otherwise v_until
    -- stays NULL and the waiter looks. The entry is committed: a failed
    -- read here must not fail the call (a caller would take the join for
    -- undone, or run it again and count a second hold), so it only leaves
    -- the answer out.
    first_look: BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
        SET v_blockers = NULL, v_ttl = NULL, v_until = NULL, v_next = NULL;
    IF NOT v_granted THEN
        SELECT STRAIGHT_JOIN e.seq, e.granted_ms, s.expires_ms INTO v_aseq, v_agranted, v_aexpires
          FROM @pentries e JOIN @psessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq < v_seq ORDER BY e.seq DESC LIMIT 1;
        IF v_aseq IS NOT NULL AND v_aexpires > 0
           AND (v_agranted IS NOT NULL OR v_aexpires > @pnow_ms()) THEN
            SET v_next = v_agranted IS NOT NULL;
            SET SESSION group_concat_max_len = 16777216;
            SELECT STRAIGHT_JOIN
                   COALESCE(GROUP_CONCAT(CONCAT(e.seq, ':', s.renewals, ':', s.expires_ms)
                                         ORDER BY e.seq SEPARATOR ','), ''),
                   COALESCE(MAX(s.ttl_ms), 0), GREATEST(COALESCE(MIN(s.expires_ms), 0) - @pnow_ms(), 0),
                   COALESCE(MAX(s.expires_ms <= 0), FALSE)
              INTO v_blockers, v_ttl, v_until, v_ended
              FROM @pentries e JOIN @psessions s ON s.id = e.session
             WHERE e.name = p_name AND e.seq < v_seq AND (v_next OR e.seq = v_aseq);
            -- (An ended entry among them is the look's to settle.)
            IF v_ended THEN
                SET v_blockers = NULL, v_ttl = NULL, v_until = NULL, v_next = NULL;
            END IF;
        END IF;
    END IF;
    END first_look;
    SELECT 'ok', v_seq, v_granted, 1, v_seq = 1, v_blockers, v_ttl, NULL, v_until, v_next;
END
;;
DROP PROCEDURE IF EXISTS @plook
;;
CREATE PROCEDURE @plook(IN p_secret CHAR(32) CHARACTER SET ascii, IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_seq BIGINT, IN p_confirm LONGTEXT)
proc: BEGIN
    DECLARE v_alive INT DEFAULT 0;
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_stamped BIGINT DEFAULT NULL;
    DECLARE v_confirm LONGTEXT DEFAULT p_confirm;
    DECLARE v_ended INT DEFAULT 0;
    DECLARE v_until BIGINT DEFAULT 0;
    DECLARE v_next BOOLEAN DEFAULT TRUE;
    DECLARE v_blockers LONGTEXT DEFAULT '';
    DECLARE v_ttl BIGINT DEFAULT 0;
    DECLARE v_aseq BIGINT;
    DECLARE v_agranted BIGINT;
    DECLARE v_aexpires BIGINT;
    DECLARE v_from BIGINT DEFAULT NULL;
    DECLARE v_locked BOOLEAN DEFAULT FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SELECT COUNT(*) INTO v_alive FROM @psessions WHERE id = p_secret AND expires_ms > 0;
    IF v_alive = 0 THEN SELECT 'lost', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
    -- Held in the name's row? (Read first: a row holder may move into
    -- @pentries meanwhile, never the other way.)
    SELECT COUNT(*) INTO v_found FROM @pnames
     WHERE name = p_name AND h_seq = p_seq AND h_session = p_secret;
    IF v_found > 0 THEN SELECT 'granted', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
    SELECT COUNT(*), MAX(granted_ms) INTO v_found, v_stamped FROM @pentries
     WHERE name = p_name AND seq = p_seq AND session = p_secret;
    IF v_found = 0 THEN SELECT 'notheld', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
    IF v_stamped IS NOT NULL THEN SELECT 'granted', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
    SET SESSION group_concat_max_len = 16777216;
    -- The first turn reads without the name's lock (each read its own
    -- autocommit statement), and the usual wait (a live entry just ahead,
    -- nothing to confirm) ends there: every committed change to the queue
    -- settled it, and a grant that commits after these reads wakes the
    -- waiter, which armed its wake-up before it looked (or its next poll
    -- finds it). Anything else (an ended entry ahead, none ahead, blockers
    -- to confirm) turns again under the lock. Each locked turn ends
    -- something (an ended entry just ahead, or confirmed blockers), so
    -- this ends.
    ahead: LOOP
        IF v_locked THEN
            CALL @psettle(p_name, FALSE);
            SELECT COUNT(*), MAX(granted_ms) INTO v_found, v_stamped FROM @pentries
             WHERE name = p_name AND seq = p_seq AND session = p_secret;
            IF v_found = 0 THEN COMMIT; SELECT 'notheld', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
            IF v_stamped IS NOT NULL THEN COMMIT; SELECT 'granted', NULL, NULL, NULL, NULL; LEAVE proc; END IF;
        END IF;
        SET v_aseq = NULL;
        SELECT STRAIGHT_JOIN e.seq, e.granted_ms, s.expires_ms
          INTO v_aseq, v_agranted, v_aexpires
          FROM @pentries e JOIN @psessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq < p_seq ORDER BY e.seq DESC LIMIT 1;
        -- (The next in line waits for every entry ahead, all granted: an
        -- ended one among them, a semaphore's say, needs settling too.)
        IF NOT v_locked AND (v_aseq IS NULL OR v_aexpires <= 0 OR v_confirm IS NOT NULL
                OR (v_agranted IS NOT NULL
                    AND EXISTS (SELECT 1 FROM @pentries e JOIN @psessions s ON s.id = e.session
                                 WHERE e.name = p_name AND e.seq < p_seq AND s.expires_ms <= 0))) THEN
            -- Each read must see what the previous lock holder committed
            -- (not the snapshot REPEATABLE READ would keep from before the
            -- lock wait).
            SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
            START TRANSACTION;
            CALL @plock_name(p_name);
            SET v_locked = TRUE;
            ITERATE ahead;
        END IF;
        IF v_aseq IS NULL THEN
            SET v_until = 0, v_next = TRUE, v_blockers = '', v_ttl = 0;
            LEAVE ahead;
        END IF;
        IF v_aexpires <= 0 THEN
            -- Ended, behind the first waiter (the walk stops there).
            DELETE FROM @pentries WHERE name = p_name AND seq = v_aseq;
            ITERATE ahead;
        END IF;
        -- What blocks: every entry ahead for the next in line (all
        -- granted), else the one just ahead.
        SET v_next = v_agranted IS NOT NULL;
        IF v_confirm IS NOT NULL THEN
            -- The sessions of the entries still exactly as the watcher saw
            -- them for their TTL end; the check is in the UPDATE's own
            -- condition, so a renewal that commits while this waits for the
            -- row is seen, and wins.
            UPDATE @psessions s JOIN @pentries e ON e.session = s.id
               SET s.expires_ms = 0
             WHERE e.name = p_name AND e.seq < p_seq AND s.expires_ms > 0
               AND FIND_IN_SET(CONCAT(e.seq, ':', s.renewals, ':', s.expires_ms), v_confirm) > 0;
            SET v_ended = ROW_COUNT();
            SET v_confirm = NULL;
            IF v_ended > 0 THEN
                CALL @psettle(p_name, TRUE);
                ITERATE ahead;
            END IF;
        END IF;
        SET v_from = NULL;
        IF NOT v_next AND v_aexpires <= @pnow_ms() THEN
            -- The entry just ahead lapsed by the clock: watch the whole run
            -- of lapsed entries ahead, back to the nearest live one, at
            -- once (crashed waiters would otherwise go one per TTL).
            SET v_from = 0;
            SELECT STRAIGHT_JOIN e.seq INTO v_from
              FROM @pentries e JOIN @psessions s ON s.id = e.session
             WHERE e.name = p_name AND e.seq < p_seq AND s.expires_ms > @pnow_ms()
             ORDER BY e.seq DESC LIMIT 1;
        END IF;
        SELECT STRAIGHT_JOIN
               COALESCE(GROUP_CONCAT(CONCAT(e.seq, ':', s.renewals, ':', s.expires_ms)
                                     ORDER BY e.seq SEPARATOR ','), ''),
               COALESCE(MAX(s.ttl_ms), 0), GREATEST(COALESCE(MIN(s.expires_ms), 0) - @pnow_ms(), 0)
          INTO v_blockers, v_ttl, v_until
          FROM @pentries e JOIN @psessions s ON s.id = e.session
         WHERE e.name = p_name AND e.seq < p_seq
           AND (v_next OR e.seq = v_aseq OR (v_from IS NOT NULL AND e.seq > v_from));
        LEAVE ahead;
    END LOOP;
    COMMIT;
    SELECT 'wait', v_until, v_next, v_blockers, v_ttl;
END
;;
DROP PROCEDURE IF EXISTS @pexpire
;;
-- A newcomer's confirmation: of the name's holders (nobody waiting), the
-- sessions of those still exactly as it watched them for their TTL
-- (p_blockers) end. Returns how many.
CREATE PROCEDURE @pexpire(IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_blockers LONGTEXT)
proc: BEGIN
    DECLARE v_n INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    CALL @plock_name(p_name);
    CALL @psettle(p_name, FALSE);
    -- Holders and waiters alike: each only if still exactly as watched.
    UPDATE @psessions s JOIN @pentries e ON e.session = s.id
       SET s.expires_ms = 0
     WHERE e.name = p_name AND s.expires_ms > 0
       AND FIND_IN_SET(CONCAT(e.seq, ':', s.renewals, ':', s.expires_ms), p_blockers) > 0;
    SET v_n = ROW_COUNT();
    IF v_n > 0 THEN CALL @psettle(p_name, TRUE); END IF;
    COMMIT;
    SELECT 'ok', v_n;
END
;;
DROP PROCEDURE IF EXISTS @pset_value
;;
CREATE PROCEDURE @pset_value(IN p_secret CHAR(32) CHARACTER SET ascii, IN p_name VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_seq BIGINT, IN p_value LONGBLOB)
proc: BEGIN
    DECLARE v_alive INT DEFAULT 0;
    DECLARE v_n INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT COUNT(*) INTO v_alive FROM @psessions WHERE id = p_secret AND expires_ms > 0;
    IF v_alive = 0 THEN ROLLBACK; SELECT 'lost'; LEAVE proc; END IF;
    CALL @plock_name(p_name);
    CALL @psettle(p_name, FALSE);
    SELECT COUNT(*) INTO v_n FROM @pentries
     WHERE name = p_name AND seq = p_seq AND session = p_secret AND granted_ms IS NOT NULL;
    IF v_n = 0 THEN COMMIT; SELECT 'notheld'; LEAVE proc; END IF;
    UPDATE @pentries SET value = p_value WHERE name = p_name AND seq = p_seq;
    UPDATE @pnames SET version = version + 1 WHERE name = p_name;
    COMMIT;
    SELECT 'ok';
END
;;
DROP PROCEDURE IF EXISTS @pclose
;;
CREATE PROCEDURE @pclose(IN p_secret CHAR(32) CHARACTER SET ascii)
BEGIN
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_name VARCHAR(255) CHARACTER SET utf8mb4;
    -- Locking a name moves the session's row holder there into @pentries.
    DECLARE cur CURSOR FOR
        SELECT name FROM @pentries WHERE session = p_secret
         UNION SELECT name FROM @pnames WHERE h_session = p_secret ORDER BY name;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    OPEN cur;
    close_loop: LOOP
        FETCH cur INTO v_name;
        IF v_done THEN LEAVE close_loop; END IF;
        CALL @plock_name(v_name);
        DELETE FROM @pentries WHERE name = v_name AND session = p_secret;
        CALL @psettle(v_name, TRUE);
    END LOOP;
    CLOSE cur;
    DELETE FROM @psessions WHERE id = p_secret;
    COMMIT;
    SELECT 'ok';
END
;;
DROP PROCEDURE IF EXISTS @prefresh
;;
CREATE PROCEDURE @prefresh(IN p_name VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
    DECLARE v_dead INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    CALL @plock_name(p_name);
    -- Unlike settle's walk, every ended session's entry here goes, also
    -- behind the first waiter: the reader reads the whole queue anyway and
    -- must not find it again.
    DELETE e FROM @pentries e JOIN @psessions s ON s.id = e.session
     WHERE e.name = p_name AND s.expires_ms <= 0;
    SET v_dead = ROW_COUNT();
    CALL @psettle(p_name, v_dead > 0);
    COMMIT;
    SELECT 'ok';
END
;;
DROP PROCEDURE IF EXISTS @pevict
;;
CREATE PROCEDURE @pevict(IN p_name VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
    DECLARE v_n INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    CALL @plock_name(p_name);
    CALL @psettle(p_name, FALSE);
    SELECT COUNT(DISTINCT session) INTO v_n FROM @pentries
     WHERE name = p_name AND granted_ms IS NOT NULL;
    UPDATE @psessions s JOIN @pentries e ON e.session = s.id
       SET s.expires_ms = 0
     WHERE e.name = p_name AND e.granted_ms IS NOT NULL;
    CALL @psettle(p_name, TRUE);
    COMMIT;
    SELECT 'ok', v_n;
END
;;
DROP PROCEDURE IF EXISTS @pevict_session
;;
-- Ends the one live session whose public tag is p_tag (an administrator's
-- "end this session"): as on close, its entries on every name go at once
-- and each name settles (waiters behind it are granted, its version bumps);
-- unlike close, its row stays, ended (expires_ms = 0), so that its owner's
-- next keep-alive fails, and its bound cells read empty. Answers whether a
-- live session had that tag.
CREATE PROCEDURE @pevict_session(IN p_tag VARCHAR(32) CHARACTER SET utf8mb4)
proc: BEGIN
    DECLARE v_id CHAR(32) CHARACTER SET ascii DEFAULT NULL;
    DECLARE v_ended INT DEFAULT 0;
    DECLARE v_done BOOLEAN DEFAULT FALSE;
    DECLARE v_name VARCHAR(255) CHARACTER SET utf8mb4;
    -- The names locked before the session's row, as a JSON array.
    DECLARE v_locked LONGTEXT CHARACTER SET utf8mb4 DEFAULT '[]';
    DECLARE cur CURSOR FOR
        SELECT name FROM @pentries WHERE session = v_id
         UNION SELECT name FROM @pnames WHERE h_session = v_id ORDER BY name;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- Each read must see what the previous lock holder committed (not the
    -- snapshot REPEATABLE READ would keep from before the lock wait).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    -- Compared as bytes: the column's collation may ignore case and
    -- trailing spaces, and its character set may not be the parameter's.
    SELECT id INTO v_id FROM @psessions
     WHERE CAST(tag AS BINARY) = CAST(p_tag AS BINARY) AND expires_ms > 0 LIMIT 1;
    IF v_id IS NULL THEN
        COMMIT;
        SELECT 'ok', FALSE;
        LEAVE proc;
    END IF;
    -- The names' locks first, in name order, then the session's row: the
    -- order close takes them in, and evict and the watchers' confirmations.
    SET v_done = FALSE;
    OPEN cur;
    lock_loop: LOOP
        FETCH cur INTO v_name;
        IF v_done THEN LEAVE lock_loop; END IF;
        CALL @plock_name(v_name);
        SET v_locked = JSON_ARRAY_APPEND(v_locked, '$', v_name);
    END LOOP;
    CLOSE cur;
    UPDATE @psessions SET expires_ms = 0 WHERE id = v_id AND expires_ms > 0;
    SET v_ended = ROW_COUNT();
    IF v_ended = 0 THEN
        -- Ended meanwhile (closed, evicted, confirmed expired): not by this call.
        COMMIT;
        SELECT 'ok', FALSE;
        LEAVE proc;
    END IF;
    SET v_done = FALSE;
    OPEN cur;
    evict_loop: LOOP
        FETCH cur INTO v_name;
        IF v_done THEN LEAVE evict_loop; END IF;
        -- Only the names locked above: taking another name's lock while
        -- holding the session's row could deadlock with a watcher's
        -- confirmation. An entry joined meanwhile belongs to an ended
        -- session now, which settle and refresh drop.
        IF JSON_CONTAINS(v_locked, JSON_QUOTE(v_name)) THEN
            DELETE FROM @pentries WHERE name = v_name AND session = v_id;
            CALL @psettle(v_name, TRUE);
        END IF;
    END LOOP;
    CLOSE cur;
    COMMIT;
    SELECT 'ok', TRUE;
END
;;
DROP PROCEDURE IF EXISTS @popen
;;
-- Opens a session, and collects a few sessions that lapsed a minute ago by
-- the server's clock and hold no entry (ending one can grant nothing),
-- oldest first, so the table stays small.
CREATE PROCEDURE @popen(IN p_secret CHAR(32) CHARACTER SET ascii, IN p_tag VARCHAR(32),
    IN p_label VARCHAR(255), IN p_ttl_ms BIGINT)
BEGIN
    DECLARE v_now BIGINT DEFAULT @pnow_ms();
    DELETE FROM @psessions
     WHERE expires_ms < v_now - 60000
       AND NOT EXISTS (SELECT 1 FROM @pentries e WHERE e.session = @psessions.id)
       AND NOT EXISTS (SELECT 1 FROM @pnames n WHERE n.h_session = @psessions.id)
     ORDER BY expires_ms LIMIT 16;
    INSERT INTO @psessions (id, tag, label, ttl_ms, expires_ms)
    VALUES (p_secret, p_tag, p_label, p_ttl_ms, v_now + p_ttl_ms);
    SELECT 'ok';
END
;;
DROP PROCEDURE IF EXISTS @pfence
;;
-- A fence: read it (p_token NULL), or admit p_token if it is at least the
-- highest admitted, with p_value (if not NULL) as its new value.
CREATE PROCEDURE @pfence(IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_token BIGINT,
    IN p_value MEDIUMBLOB)
proc: BEGIN
    DECLARE v_kind SMALLINT DEFAULT NULL;
    DECLARE v_version BIGINT DEFAULT 0;
    DECLARE v_value MEDIUMBLOB DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    IF p_token IS NULL THEN
        SELECT kind, version, value INTO v_kind, v_version, v_value
          FROM @pregisters WHERE name = p_name;
        IF v_kind IS NULL THEN SELECT 'ok', 0, NULL; LEAVE proc; END IF;
        IF v_kind <> 0 THEN SELECT 'conflict:it is a cell, not a fence', 0, NULL; LEAVE proc; END IF;
        SELECT 'ok', v_version, v_value;
        LEAVE proc;
    END IF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    INSERT INTO @pregisters (name, kind, version) VALUES (p_name, 0, 0)
        ON DUPLICATE KEY UPDATE name = name;
    SELECT kind, version, value INTO v_kind, v_version, v_value
      FROM @pregisters WHERE name = p_name FOR UPDATE;
    IF v_kind <> 0 THEN
        COMMIT;
        SELECT 'conflict:it is a cell, not a fence', 0, NULL;
    ELSEIF p_token < v_version THEN
        COMMIT;
        SELECT 'stale', v_version, v_value;
    ELSE
        UPDATE @pregisters SET version = p_token, value = COALESCE(p_value, value)
         WHERE name = p_name;
        COMMIT;
        SELECT 'ok', p_token, COALESCE(p_value, v_value);
    END IF;
END
;;
DROP PROCEDURE IF EXISTS @pcell_get
;;
CREATE PROCEDURE @pcell_get(IN p_name VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
    DECLARE v_kind SMALLINT DEFAULT NULL;
    DECLARE v_version BIGINT DEFAULT NULL;
    DECLARE v_value MEDIUMBLOB DEFAULT NULL;
    DECLARE v_live INT DEFAULT 0;
    SELECT kind, version, value,
           owner IS NULL OR EXISTS (SELECT 1 FROM @psessions s
                                     WHERE s.id = owner AND s.expires_ms > @pnow_ms())
      INTO v_kind, v_version, v_value, v_live
      FROM @pregisters WHERE name = p_name;
    IF v_kind IS NOT NULL AND v_kind <> 1 THEN
        SELECT 'conflict:it is a fence, not a cell', NULL, NULL;
    ELSEIF v_value IS NULL OR NOT v_live THEN
        SELECT 'ok', NULL, NULL;
    ELSE
        SELECT 'ok', v_version, v_value;
    END IF;
END
;;
DROP PROCEDURE IF EXISTS @pcell_put
;;
-- Writes p_value if the cell's live version is p_expect (0: no value), bound
-- to the session p_owner if not NULL.
CREATE PROCEDURE @pcell_put(IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_value MEDIUMBLOB,
    IN p_expect BIGINT, IN p_owner CHAR(32) CHARACTER SET ascii)
proc: BEGIN
    DECLARE v_kind SMALLINT DEFAULT NULL;
    DECLARE v_version BIGINT DEFAULT 0;
    DECLARE v_current BIGINT DEFAULT NULL;
    DECLARE v_alive INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    -- A name never used becomes a cell only by a write that will happen: a
    -- refused one leaves nothing behind (ROLLBACK).
    IF p_expect = 0 THEN
        INSERT INTO @pregisters (name, kind, version) VALUES (p_name, 1, 0)
            ON DUPLICATE KEY UPDATE name = name;
    END IF;
    SELECT kind, version,
           IF(value IS NOT NULL AND (owner IS NULL OR EXISTS (SELECT 1 FROM @psessions s
                WHERE s.id = owner AND s.expires_ms > @pnow_ms())), version, NULL)
      INTO v_kind, v_version, v_current
      FROM @pregisters WHERE name = p_name FOR UPDATE;
    IF v_kind IS NOT NULL AND v_kind <> 1 THEN
        ROLLBACK;
        SELECT 'conflict:it is a fence, not a cell', NULL;
        LEAVE proc;
    END IF;
    IF p_owner IS NOT NULL THEN
        -- Locked, so that a close or an eviction cannot commit between this
        -- check and the write.
        SELECT COUNT(*) INTO v_alive FROM @psessions
         WHERE id = p_owner AND expires_ms > @pnow_ms() LOCK IN SHARE MODE;
        IF v_alive = 0 THEN ROLLBACK; SELECT 'lost', NULL; LEAVE proc; END IF;
    END IF;
    IF NOT (v_current <=> NULLIF(p_expect, 0)) THEN
        ROLLBACK;
        SELECT 'mismatch', v_current;
    ELSE
        UPDATE @pregisters SET version = v_version + 1, value = p_value, owner = p_owner
         WHERE name = p_name;
        COMMIT;
        SELECT 'ok', v_version + 1;
    END IF;
END
;;
DROP PROCEDURE IF EXISTS @pcell_delete
;;
-- Deletes the cell's value if its live version is p_version; the version
-- stays, so the next write's is higher.
CREATE PROCEDURE @pcell_delete(IN p_name VARCHAR(255) CHARACTER SET utf8mb4, IN p_version BIGINT)
BEGIN
    DECLARE v_kind SMALLINT DEFAULT NULL;
    DECLARE v_version BIGINT DEFAULT 0;
    DECLARE v_current BIGINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT kind, version,
           IF(value IS NOT NULL AND (owner IS NULL OR EXISTS (SELECT 1 FROM @psessions s
                WHERE s.id = owner AND s.expires_ms > @pnow_ms())), version, NULL)
      INTO v_kind, v_version, v_current
      FROM @pregisters WHERE name = p_name FOR UPDATE;
    IF v_kind IS NOT NULL AND v_kind <> 1 THEN
        ROLLBACK;
        SELECT 'conflict:it is a fence, not a cell', NULL;
    ELSEIF NOT (v_current <=> p_version) THEN
        ROLLBACK;
        SELECT 'mismatch', v_current;
    ELSE
        UPDATE @pregisters SET value = NULL, owner = NULL WHERE name = p_name;
        COMMIT;
        SELECT 'ok', v_version;
    END IF;
END
