-- tenure's Redis store: every operation is one call of this script, so each
-- is atomic.
--
-- Expiry is never judged by Redis's clock (TIME, which anyone can set, and
-- which steps). A session's lease lapses by that clock only as a hint; its
-- entries go only when the session is closed or evicted, or when a client
-- that watched it (the waiter it blocks, or a newcomer) saw its renewal
-- counter unchanged for its TTL on the client's own monotonic clock, and
-- this script confirms the counter is still the one it saw ('look' and
-- 'expire' with the fingerprint of what blocks). TIME serves hints (when to
-- look), what `status` shows, seeds of counters, collecting sessions that
-- hold nothing, and the life of cells bound to a session.
--
-- All keys start with the prefix P, a hash tag such as "{tenure}", so they
-- share one cluster slot and one script may touch sessions and queues.
--   P:s:<secret>        the session's lapse time by Redis's clock (ms), a
--                       hint; the key exists while the session is not
--                       ended (no Redis expiry on it: Redis expires keys
--                       by its own clock)
--   P:rn                hash  secret -> renewals, counted by keepalive: what
--                       a waiter watches
--   P:sessions          the key layout's number ("4"), set by the first
--                       client; a client of another layout refuses the
--                       prefix (layout 3, which judged expiry by TIME, is
--                       upgraded in place; a client of layout 1, which
--                       kept a zset here, fails on it with WRONGTYPE
--                       instead of granting next to us)
--   P:live              zset  secret -> expiry, the same: the index of
--                       sessions, to find expired ones (in expiry order, a
--                       few per call) and list live ones
--   P:sinfo             hash  secret -> "tag\tttl_ms\tlabel"
--   P:se:<secret>       set   names where the session has an entry
--   P:c:<name>          the name's counter: each new entry's seq (its fencing
--                       token) and, bumped on every change, the name's
--                       version. Kept for ever; seeded from TIME in
--                       microseconds when missing, so it never goes back.
--   P:cs:<name>         set while P:c:<name> is a seed no entry used (Redlock)
--   P:q:<name>          zset  seq -> seq: the name's queue order, so that an
--                       operation reads the head of the queue and the entries
--                       it affects, never the whole queue
--   P:e:<name>          hash, the name's entries:
--                         <seq>      "secret\tkind\tcount\tlimit\tholds\tgranted_ms"
--                         v<seq>     the entry's value, when not empty
--                         o<secret>  the seq of that session's entry
--   P:r:<name>          hash, a fence or a cell (a namespace apart from the
--                       queues'): k = "f" or "c"; v = a fence's highest
--                       token (20 digits, so string order is number order)
--                       or a cell's version (kept when the cell loses its
--                       value, so versions are never reused; a cell with no
--                       record starts from TIME in µs, so not even a loss of
--                       Redis's data reuses one); d = the value;
--                       o = a cell's owner session, if bound to one
-- Granted entries are always a prefix of the queue. An entry whose session
-- ended is removed when an operation walks past it; `open` collects a few
-- sessions that lapsed a minute ago and hold no entry, in lapse order.
-- Wake-ups: PUBLISH P:w:<name>\t<seq, 20 digits> when an entry is granted
-- (only its waiter listens; a tab never occurs in a name, and the padding
-- keeps a name's channels in queue order), PUBLISH P:ch:<name> on any
-- change (observers).
--   P:quiet             set, with a Redis expiry of the store's max_ttl, by
--                       the client that finds the prefix without its marker
--                       (P:sessions): a keyspace that lost what it held (a
--                       restart without persistence, a failover to a
--                       replica that had none of it) looks the same as a
--                       new one, and while this key lives nothing is
--                       granted, so every lease the lost keyspace could
--                       have held has lapsed before anyone is granted
--                       again (a new store is declared new instead:
--                       'layout' with 'new'). A session found gone while it
--                       lives, or without the marker, was forgotten.
--   P:id                this keyspace's random id, set by the first client
--                       (SET NX at 'layout'). A release's grant is
--                       published as "<id>:<database number>" (the number
--                       from the releasing client's URL: the id travels
--                       with the data, into another database by a copy or
--                       SWAPDB), and a waiter whose client read the same id
--                       and uses the same database takes the grant without
--                       looking again; any other message ('granted', or
--                       another keyspace's: pub/sub ignores the database
--                       number) only wakes it to look. Only a
--                       release announces: nothing in a release can end the
--                       entry it grants before the script ends, whereas
--                       'evict', 'expire' and a waiter's confirming 'look'
--                       grant and may then end what they granted.
--
-- KEYS[1] = P:sessions (routes the call); KEYS[2] = P:moving, a key never
-- written, declared so that Redis Cluster refuses the call while the slot
-- migrates (a declared key it cannot find then); ARGV[1] = P; ARGV[2] =
-- operation.
--
-- A redis.call costs about as much as the command itself (a microsecond or
-- so): the common case, a name nobody else is queued on, has fast paths
-- with as few calls as the layout allows.

local P = ARGV[1]
local op = ARGV[2]
-- Redis's clock, read once per call; not by a release's fast path, which
-- needs no time.
local t, now
local function read_clock()
  t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if op ~= 'leave' then read_clock() end
local SESS = P .. ':live'

-- How long the keyspace stays quiet (see P:quiet), in ms; read once.
local quiet_ms = nil
local function quiet_left()
  if not quiet_ms then quiet_ms = math.max(redis.call('PTTL', P .. ':quiet'), 0) end
  return quiet_ms
end

-- The answer for a session the store no longer has: 'forgot' when the
-- keyspace lost its data (no marker, or quiet since it was found so),
-- 'lost' otherwise.
local function gone()
  if quiet_left() > 0 or redis.call('EXISTS', P .. ':sessions') == 0 then return {'forgot'} end
  return {'lost'}
end

-- Redlock's nodes take a proposed seq no more than this many µs past their
-- own clock (see the general join).
local AHEAD = 2000000

if op == 'join' then
  -- Fast path: an empty queue grants at once (a semaphore entry if it fits).
  local secret, name, kind = ARGV[3], ARGV[4], ARGV[5]
  local ekey = P .. ':e:' .. name
  local ckey = P .. ':c:' .. name
  local seq, first = nil, 0
  if redis.call('EXISTS', ekey) == 0 and (kind ~= 'P' or tonumber(ARGV[6]) <= tonumber(ARGV[7]))
      and redis.call('EXISTS', P .. ':quiet') == 0 then
    local proposed = ARGV[10] or ''
    if proposed == '' then
      if not redis.call('GET', P .. ':s:' .. secret) then return gone() end
      -- Numbers go to redis.call and back in the reply as they are: Redis
      -- writes them with 17 digits (Lua's own tostring keeps 14, too few for
      -- a seq), which saves the string.format calls of the general path.
      seq = redis.call('INCR', ckey)
      if seq == 1 then
        first = 1
        seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', ckey, seq)
      end
    else
      -- Redlock's proposal, taken here when it is above the node's counter
      -- and within AHEAD of its clock; a missing counter, a seq behind or
      -- ahead go the general way, which seeds the counter and says why.
      local p = tonumber(proposed)
      local current = tonumber(redis.call('GET', ckey) or '')
      if p and current and p > current and p <= tonumber(t[1]) * 1000000 + tonumber(t[2]) + AHEAD then
        if not redis.call('GET', P .. ':s:' .. secret) then return gone() end
        if redis.call('DEL', P .. ':cs:' .. name) == 1 then first = 1 end
        seq = p
        redis.call('SET', ckey, p)
      end
    end
  end
  if seq then
    local rec = secret .. '\t' .. kind .. '\t' .. ARGV[6] .. '\t' .. ARGV[7] .. '\t1\t' .. now
    if ARGV[8] == '' then
      redis.call('HSET', ekey, seq, rec, 'o' .. secret, seq)
    else
      -- (A concatenated number keeps only 14 digits: format this one.)
      redis.call('HSET', ekey, seq, rec, 'v' .. string.format('%.0f', seq), ARGV[8], 'o' .. secret, seq)
    end
    redis.call('ZADD', P .. ':q:' .. name, seq, seq)
    redis.call('SADD', P .. ':se:' .. secret, name)
    redis.call('PUBLISH', P .. ':ch:' .. name, 'changed')
    -- A bare integer (a reply table costs more than a command): the seq,
    -- granted with one hold; negated when the counter was new (`first`).
    if first == 1 then return -seq end
    return seq
  end
elseif op == 'leave' then
  -- Fast path: the last hold of the only entry; the queue empties and there
  -- is nobody to grant.
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not redis.call('GET', P .. ':s:' .. secret) then return gone() end
  local ekey = P .. ':e:' .. name
  local qkey = P .. ':q:' .. name
  if redis.call('ZCARD', qkey) == 1 then
    local mine = redis.call('HMGET', ekey, 'o' .. secret, seq)
    local rec = mine[1] == seq and mine[2]
    if rec and string.match(rec, '^[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\t(%d+)') == '1' then
      redis.call('DEL', ekey, qkey)
      redis.call('SREM', P .. ':se:' .. secret, name)
      local ckey = P .. ':c:' .. name
      if redis.call('INCR', ckey) == 1 then redis.call('DEL', ckey) end
      redis.call('PUBLISH', P .. ':ch:' .. name, 'changed')
      return 0
    end
  end
end
if not t then read_clock() end

local SINFO = P .. ':sinfo'
local RENEWALS = P .. ':rn'

local function k(kind, name) return P .. ':' .. kind .. ':' .. name end
local function fmt(n) return string.format('%.0f', n) end

local function split(s)
  local out = {}
  local start = 1
  while true do
    local i = string.find(s, '\t', start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

local function expiry(secret)
  local e = redis.call('GET', k('s', secret))
  if e then return tonumber(e) end
  return nil
end

-- Not ended (closed, evicted, or confirmed expired by a watcher).
local function alive(secret)
  return expiry(secret) ~= nil
end

-- Not lapsed by Redis's clock either: the life of a cell bound to it.
local function unlapsed(secret)
  local e = expiry(secret)
  return e ~= nil and e > now
end

local function record(r)
  return table.concat({r.secret, r.kind, fmt(r.count), fmt(r.limit), fmt(r.holds), r.granted}, '\t')
end

local function parse(seq, rec)
  local f = split(rec)
  return {seq = seq, secret = f[1], kind = f[2], count = tonumber(f[3]),
          limit = tonumber(f[4]), holds = tonumber(f[5]), granted = f[6] or ''}
end

-- Bumps the name's version. A missing counter stays missing: the name has
-- had no entry since Redis lost its data, and a join must still seed it.
local function bump(name)
  if redis.call('INCR', k('c', name)) == 1 then redis.call('DEL', k('c', name)) end
end

-- Ends a session and drops all its entries; returns the names it was in.
local function end_session(secret)
  local names = redis.call('SMEMBERS', k('se', secret))
  for _, name in ipairs(names) do
    local seq = redis.call('HGET', k('e', name), 'o' .. secret)
    if seq then
      redis.call('HDEL', k('e', name), seq, 'v' .. seq, 'o' .. secret)
      redis.call('ZREM', k('q', name), seq)
    end
  end
  redis.call('DEL', k('se', secret))
  redis.call('ZREM', SESS, secret)
  redis.call('DEL', k('s', secret))
  redis.call('HDEL', SINFO, secret)
  redis.call('HDEL', RENEWALS, secret)
  return names
end

-- Names whose queues changed in this call and still need settling, in the
-- order they were found.
local pending = {}
local pending_set = {}
local function touch(name)
  if not pending_set[name] then
    pending_set[name] = true
    pending[#pending + 1] = name
  end
end

-- The entry with this seq, with its session's lapse time; nil if it is
-- gone. An entry whose session ended is removed on the spot (the rest of
-- the session cleaned up, the names it was in marked for settling).
local function entry(name, seq)
  local rec = redis.call('HGET', k('e', name), seq)
  if not rec then
    redis.call('ZREM', k('q', name), seq)
    return nil
  end
  local r = parse(seq, rec)
  local e = expiry(r.secret)
  if e == nil then
    for _, other in ipairs(end_session(r.secret)) do touch(other) end
    return nil
  end
  r.exp = e
  return r
end

-- Visits the live entries of the name's queue from the head, in order,
-- removing dead ones on the way, until `visit` returns false. A cursor by
-- seq, read a few at a time: removals behind it do not disturb it.
local function walk(name, visit)
  local after = '-inf'
  while true do
    local batch = redis.call('ZRANGEBYSCORE', k('q', name), after, '+inf', 'LIMIT', 0, 8)
    if #batch == 0 then return end
    for _, seq in ipairs(batch) do
      after = '(' .. seq
      local r = entry(name, seq)
      if r and not visit(r) then return end
    end
  end
end

-- What a grant's message says: set to this keyspace's id by a release (see
-- P:id), else a bare wake-up.
local announce_as = nil

-- Grants what the rules grant from the head of the name's queue (the same
-- rule as tenure::queue::grants), stamping and waking newly granted entries,
-- and bumps the version if anything changed. Reads the granted entries and
-- the first one that waits, no more. Returns what the walk saw.
local function settle_one(name, changed)
  local seen = {count = 0, all_shared = true, permits = 0, blocked = nil, head = nil, min_exp = nil,
                granted = {}}
  walk(name, function(r)
    if not seen.head then seen.head = r end
    local ok
    if r.kind == 'X' then ok = (seen.count == 0)
    elseif r.kind == 'S' then ok = seen.all_shared
    else ok = (seen.permits + r.count <= r.limit) end
    -- A quiet keyspace grants nothing new.
    if ok and r.granted == '' and quiet_left() > 0 then ok = false end
    if not ok then
      seen.blocked = r
      return false
    end
    seen.count = seen.count + 1
    if r.kind ~= 'S' then seen.all_shared = false end
    if r.kind == 'P' then seen.permits = seen.permits + r.count end
    if not seen.min_exp or r.exp < seen.min_exp then seen.min_exp = r.exp end
    seen.granted[#seen.granted + 1] = r
    if r.granted == '' then
      r.granted = fmt(now)
      redis.call('HSET', k('e', name), r.seq, record(r))
      redis.call('PUBLISH', k('w', name) .. '\t' .. string.rep('0', 20 - #r.seq) .. r.seq,
                 announce_as or 'granted')
      changed = true
    end
    return true
  end)
  if pending_set[name] then
    pending_set[name] = nil
    changed = true
  end
  if changed then
    bump(name)
    redis.call('PUBLISH', k('ch', name), 'changed')
    -- The first waiting entry may have just become the next in line: told
    -- so, it watches the holders from now on, without a look at once.
    local w = seen.blocked
    if w and #seen.granted > 0 then
      redis.call('PUBLISH', k('w', name) .. '\t' .. string.rep('0', 20 - #w.seq) .. w.seq, 'next')
    end
  end
  return seen
end

-- Settles every name an ended session left behind; says whether `name`
-- was one of them.
local function settle_pending(name)
  local again = false
  while #pending > 0 do
    local other = table.remove(pending, 1)
    if pending_set[other] then
      if other == name then again = true end
      settle_one(other, false)
    end
  end
  return again
end

-- Settles `name` (and whatever ending expired sessions touched); returns
-- what the last walk over `name` saw.
local function settle(name, changed)
  local seen = settle_one(name, changed)
  while settle_pending(name) do seen = settle_one(name, false) end
  return seen
end

-- Ends a few sessions that lapsed a minute ago by Redis's clock and hold
-- no entry (ending one can grant nothing), in lapse order, so the tables
-- stay small. A session with entries stays until a watcher confirms it.
local function collect()
  local lapsed = redis.call('ZRANGEBYSCORE', SESS, '-inf', fmt(now - 60000), 'LIMIT', 0, 64)
  local ended = 0
  for _, secret in ipairs(lapsed) do
    if ended == 16 then break end
    if redis.call('SCARD', k('se', secret)) == 0 then
      end_session(secret)
      ended = ended + 1
    end
  end
end

-- A blocking entry as a watcher sees it: "seq:renewals:lapse", which any
-- renewal changes (the lapse time too, also a renewal by a client of an
-- older layout, which counts none).
local function seen_as(r)
  return r.seq .. ':' .. (redis.call('HGET', RENEWALS, r.secret) or '0') .. ':' .. fmt(r.exp)
end

-- What a waiter watches: the blocking entries, comma-separated, their
-- longest TTL, their first and last lapse times by Redis's clock (hints).
local function watch(list)
  local parts, ttl, first, last = {}, 0, nil, nil
  for _, r in ipairs(list) do
    parts[#parts + 1] = seen_as(r)
    local info = redis.call('HGET', SINFO, r.secret)
    if info then ttl = math.max(ttl, tonumber(split(info)[2]) or 0) end
    if not first or r.exp < first then first = r.exp end
    if not last or r.exp > last then last = r.exp end
  end
  return table.concat(parts, ','), ttl, first, last
end

-- Ends the sessions of the entries of `list` that are still exactly as a
-- watcher saw them for their TTL (`confirm`, comma-separated); returns how
-- many.
local function end_confirmed(list, confirm)
  local due = {}
  for blocker in string.gmatch(confirm, '[^,]+') do due[blocker] = true end
  local ended = 0
  for _, r in ipairs(list) do
    if due[seen_as(r)] then
      for _, other in ipairs(end_session(r.secret)) do touch(other) end
      ended = ended + 1
    end
  end
  return ended
end

local function own(secret, name)
  local seq = redis.call('HGET', k('e', name), 'o' .. secret)
  if not seq then return nil end
  local rec = redis.call('HGET', k('e', name), seq)
  if not rec then return nil end
  return parse(seq, rec)
end

local function remove_entry(name, seq, secret)
  redis.call('HDEL', k('e', name), seq, 'v' .. seq, 'o' .. secret)
  redis.call('ZREM', k('q', name), seq)
  redis.call('SREM', k('se', secret), name)
end

-- What blocks the waiting entry `seq` of `name`, given what the settle
-- just before saw: for the next in line the granted entries (and 1), for
-- the others the entry just ahead (and 0), with the run of entries ahead
-- that lapsed by Redis's clock back to the nearest live one, to be watched
-- at once (crashed waiters would otherwise go one per TTL). NOBODY_AHEAD
-- when the queue has no entry before it; nil when the entry ahead was found
-- ended (removed: settle and ask again).
local NOBODY_AHEAD = {}
local function blocking(name, seq, seen)
  if not seen.blocked or seen.blocked.seq == seq then return seen.granted, 1 end
  local ahead = redis.call('ZREVRANGEBYSCORE', k('q', name), '(' .. seq, '-inf', 'LIMIT', 0, 1)
  if #ahead == 0 then return NOBODY_AHEAD, 1 end
  local r = entry(name, ahead[1])
  if not r then return nil, 0 end
  local list = {r}
  if r.exp <= now then
    local before = '(' .. ahead[1]
    local live = false
    while not live do
      local batch = redis.call('ZREVRANGEBYSCORE', k('q', name), before, '-inf', 'LIMIT', 0, 8)
      if #batch == 0 then break end
      for _, other in ipairs(batch) do
        before = '(' .. other
        local e = entry(name, other)
        if e then
          if e.exp > now then live = true break end
          list[#list + 1] = e
        end
      end
    end
  end
  return list, 0
end

if op == 'open' then
  -- ARGV: secret, tag, ttl_ms, label
  -- A prefix without its marker lost its keys since this client looked:
  -- the client looks again ('layout'), which makes the keyspace quiet.
  if redis.call('EXISTS', P .. ':sessions') == 0 then return {'forgot'} end
  collect()
  local ttl = tonumber(ARGV[5])
  redis.call('ZADD', SESS, fmt(now + ttl), ARGV[3])
  redis.call('SET', k('s', ARGV[3]), fmt(now + ttl))
  redis.call('HSET', SINFO, ARGV[3], ARGV[4] .. '\t' .. ARGV[5] .. '\t' .. ARGV[6])
  redis.call('HSET', RENEWALS, ARGV[3], '0')
  -- How long the keyspace stays quiet (the client says so: nothing will
  -- be granted to this session until then).
  return {'ok', fmt(quiet_left())}

elseif op == 'keepalive' then
  -- ARGV: secret
  local secret = ARGV[3]
  if not alive(secret) then return gone() end
  local info = redis.call('HGET', SINFO, secret)
  if not info then return gone() end
  local ttl = tonumber(split(info)[2])
  redis.call('ZADD', SESS, 'XX', fmt(now + ttl), secret)
  redis.call('SET', k('s', secret), fmt(now + ttl))
  redis.call('HINCRBY', RENEWALS, secret, 1)
  return {'ok'}

elseif op == 'close' then
  for _, name in ipairs(end_session(ARGV[3])) do touch(name) end
  settle_pending(nil)
  return {'ok'}

elseif op == 'join' then
  -- ARGV: secret, name, kind, count, limit, value, mode ('wait' | 'ifgranted'),
  -- and optionally the seq to use (Redlock)
  local secret, name, kind = ARGV[3], ARGV[4], ARGV[5]
  local count, limit, value, mode = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9]
  if not alive(secret) then return gone() end
  local seen = settle(name, false)
  local mine = own(secret, name)
  if mine then
    if mine.kind ~= kind or mine.count ~= count or mine.limit ~= limit then
      return {'conflict', 'this session already has another kind of entry here'}
    end
    local granted = mine.granted ~= ''
    if mode == 'ifgranted' and not granted then return {'none'} end
    mine.holds = mine.holds + 1
    redis.call('HSET', k('e', name), mine.seq, record(mine))
    return {'ok', mine.seq, granted and 1 or 0, mine.holds, 0}
  end
  -- Every entry of a queue passed this check against those before it, so
  -- the head stands for them all.
  local head = seen.head
  if head then
    local permits_a, permits_b = kind == 'P', head.kind == 'P'
    if permits_a ~= permits_b then
      return {'conflict', 'locks and semaphores cannot share a name'}
    end
    if permits_a and head.limit ~= limit then
      return {'conflict', 'semaphore limit ' .. fmt(limit) .. ' disagrees with the limit ' .. fmt(head.limit) .. ' already in use'}
    end
  end
  -- Behind a waiting entry nothing is granted; otherwise every live entry
  -- is granted and the walk counted them.
  local granted
  if seen.blocked then granted = false
  elseif kind == 'X' then granted = seen.count == 0
  elseif kind == 'S' then granted = seen.all_shared
  else granted = seen.permits + count <= limit end
  if granted and quiet_left() > 0 then granted = false end
  if mode == 'ifgranted' and not granted then
    if quiet_left() > 0 then return {'none'} end
    -- Nobody in the queue alive by Redis's clock, holders and waiters
    -- alike (a crashed process's waiter watches no one, so such a queue
    -- would stay for ever): say what to watch, all of it. A live holder
    -- (the rule) or the first live waiter ends the look at once.
    for _, r in ipairs(seen.granted) do
      if r.exp > now then return {'none'} end
    end
    local all = seen.granted
    if seen.blocked then
      all = {}
      local live = false
      walk(name, function(r)
        if r.exp > now then live = true return false end
        all[#all + 1] = r
        return true
      end)
      -- (The walk may have ended sessions found ended: settle after them.)
      settle_pending(name)
      if live then return {'none'} end
    end
    local fp, ttl, _, last = watch(all)
    return {'none', fp, fmt(ttl), (last and last <= now) and 1 or 0}
  end
  local ckey = k('c', name)
  local first = 0
  local seq
  local proposed = tonumber(ARGV[10] or '')
  if proposed then
    -- Redlock proposes the seq, the same on every node; a node takes it only
    -- if it is above every seq it has seen for the name, so each
    -- node's queue stays in seq order.
    -- A node without a counter seeds it from its clock (and remembers that
    -- no entry has used it yet, for `first`).
    -- A node takes no seq more than AHEAD µs past its own clock, and seeds
    -- a missing counter at its clock plus AHEAD: so a counter this node
    -- lost (restarted empty, after the delayed-restart wait) starts above
    -- every seq any node took before, whatever the proposing clients'
    -- clocks said (the argument is in the README).
    local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local current = tonumber(redis.call('GET', ckey) or '')
    if not current then
      current = clock + AHEAD
      redis.call('SET', ckey, fmt(current))
      redis.call('SET', k('cs', name), '1')
    end
    if proposed <= current then return {'behind', fmt(current)} end
    if proposed > clock + AHEAD then return {'ahead', fmt(clock + AHEAD)} end
    if redis.call('DEL', k('cs', name)) == 1 then first = 1 end
    seq = proposed
    redis.call('SET', ckey, fmt(seq))
  else
    seq = redis.call('INCR', ckey)
    if seq == 1 then
      first = 1
      seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', ckey, fmt(seq))
    end
  end
  seq = fmt(seq)
  local entry_rec = {secret = secret, kind = kind, count = count, limit = limit, holds = 1, granted = ''}
  if granted then entry_rec.granted = fmt(now) end
  if value ~= '' then
    redis.call('HSET', k('e', name), seq, record(entry_rec), 'v' .. seq, value, 'o' .. secret, seq)
  else
    redis.call('HSET', k('e', name), seq, record(entry_rec), 'o' .. secret, seq)
  end
  redis.call('ZADD', k('q', name), seq, seq)
  redis.call('SADD', k('se', secret), name)
  -- The new seq is also the name's new version.
  redis.call('PUBLISH', k('ch', name), 'changed')
  if granted or mode ~= 'wait' or proposed then return {'ok', seq, granted and 1 or 0, 1, first} end
  -- Quiet: look again when it ends (or at a release).
  if quiet_left() > 0 then return {'ok', seq, 0, 1, first, fmt(quiet_left()), 1, '', '0'} end
  -- Queued: also what a first look would say (as 'look' answers 'wait'),
  -- so that the waiter need not look once it listens. `seen` is the queue
  -- before this entry, which is last. Not when the walk ahead found an
  -- ended entry: then the queue is settled again and the waiter looks.
  local list, next = blocking(name, seq, seen)
  if list == NOBODY_AHEAD then return {'ok', seq, 0, 1, first, '0', 1, '', '0'} end
  if list and #pending == 0 then
    local fp, ttl, soonest = watch(list)
    return {'ok', seq, 0, 1, first, fmt(math.max((soonest or now) - now, 0)), next, fp, fmt(ttl)}
  end
  settle_pending(name)
  return {'ok', seq, 0, 1, first}

elseif op == 'leave' then
  -- ARGV: secret, name, seq, the client's database number
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not alive(secret) then return gone() end
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq then return {'notheld'} end
  mine.holds = mine.holds - 1
  if mine.holds > 0 then
    redis.call('HSET', k('e', name), seq, record(mine))
    return {'ok', mine.holds}
  end
  remove_entry(name, seq, secret)
  local id = redis.call('GET', P .. ':id')
  if id and ARGV[6] then announce_as = id .. ':' .. ARGV[6] end
  settle(name, true)
  return {'ok', 0}

elseif op == 'look' then
  -- ARGV: secret, name, seq, and optionally the blockers the waiter watched
  -- for their TTL ("seq:renewals:lapse,…"): those still exactly so are
  -- ended. Settles, then says whether the entry is granted; if not:
  -- how long until the blockers lapse by Redis's clock (a hint), whether
  -- the entry is next in line (a release may grant it), and what it is
  -- blocked by (the granted entries, for the next in line; the entry just
  -- ahead, for the others) as a fingerprint and their longest TTL.
  local secret, name, seq, expire = ARGV[3], ARGV[4], ARGV[5], ARGV[6] or ''
  if not alive(secret) then return gone() end
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq then return {'notheld'} end
  if mine.granted ~= '' then return {'granted'} end
  if quiet_left() > 0 then return {'wait', fmt(quiet_left()), 1, '', '0'} end
  -- Each turn ends something (a confirmed blocker, an ended entry), so
  -- this ends.
  while true do
    local seen = settle(name, false)
    mine = own(secret, name)
    if not mine or mine.seq ~= seq then return {'notheld'} end
    if mine.granted ~= '' then return {'granted'} end
    local list, next = blocking(name, seq, seen)
    if list == NOBODY_AHEAD then return {'wait', '0', 1, '', '0'} end
    if list then
      local ended = 0
      if expire ~= '' then ended = end_confirmed(list, expire) end
      expire = ''
      if ended == 0 then
        local fp, ttl, first = watch(list)
        return {'wait', fmt(math.max((first or now) - now, 0)), next, fp, fmt(ttl)}
      end
    end
  end

elseif op == 'expire' then
  -- ARGV: name, the entries a newcomer watched for their TTL (all of the
  -- queue, none of them alive). Those still exactly so are ended.
  -- Returns how many.
  local name, expire = ARGV[3], ARGV[4]
  settle(name, false)
  local all = {}
  walk(name, function(r) all[#all + 1] = r return true end)
  if #all == 0 then return {'ok', 0} end
  local ended = end_confirmed(all, expire)
  if ended > 0 then settle(name, true) end
  return {'ok', ended}

elseif op == 'setvalue' then
  -- ARGV: secret, name, seq, value
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not alive(secret) then return gone() end
  settle(name, false)
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq or mine.granted == '' then return {'notheld'} end
  redis.call('HSET', k('e', name), 'v' .. seq, ARGV[6])
  bump(name)
  redis.call('PUBLISH', k('ch', name), 'changed')
  return {'ok'}

elseif op == 'queue' then
  -- ARGV: name. Returns version, then 10 fields per entry. A read of the
  -- whole queue: here every ended entry is removed, not only those ahead.
  -- A lapsed one stays (its TTL left reads 0) until a watcher confirms it.
  local name = ARGV[3]
  walk(name, function() return true end)
  settle(name, false)
  local rs = {}
  walk(name, function(r)
    rs[#rs + 1] = r
    return true
  end)
  local out = {'ok', redis.call('GET', k('c', name)) or '0'}
  for _, r in ipairs(rs) do
    local info = split(redis.call('HGET', SINFO, r.secret) or '\t0\t')
    local label = info[3] or ''
    for j = 4, #info do label = label .. '\t' .. info[j] end
    out[#out + 1] = r.seq
    out[#out + 1] = r.kind
    out[#out + 1] = fmt(r.count)
    out[#out + 1] = fmt(r.limit)
    out[#out + 1] = info[1]
    out[#out + 1] = label
    out[#out + 1] = redis.call('HGET', k('e', name), 'v' .. r.seq) or ''
    out[#out + 1] = r.granted
    out[#out + 1] = fmt(math.max(r.exp - now, 0))
    out[#out + 1] = fmt(r.holds)
  end
  return out

elseif op == 'layout' then
  -- ARGV[3]: the layout this script writes; ARGV[4]: a random id, this
  -- keyspace's if it has none yet; ARGV[5]: the store's max_ttl in ms;
  -- ARGV[6]: 'new' when an operator declares the prefix new. Called once
  -- per connection, and again when 'open' finds no marker. Answers the
  -- keyspace's id and how long it stays quiet (ms).
  local marker = P .. ':sessions'
  local kind = redis.call('TYPE', marker)['ok']
  local found = kind == 'string' and redis.call('GET', marker) or '1'
  if kind == 'none' then
    redis.call('SET', marker, ARGV[3])
    -- No marker: a new prefix, or one whose keys were lost. Until every
    -- lease it could have held has lapsed, nothing is granted.
    if ARGV[6] ~= 'new' then
      redis.call('SET', P .. ':quiet', '1', 'PX', ARGV[5])
      quiet_ms = tonumber(ARGV[5])
    end
  elseif found == '3' and ARGV[3] == '4' then
    -- Layout 3 differs only in judging expiry by TIME: upgraded in place
    -- (its renewal counters start at 0; its clients refuse the prefix from
    -- their next connection on).
    redis.call('SET', marker, '4')
  elseif found ~= ARGV[3] then
    return {'layout', found}
  end
  if ARGV[6] == 'new' then
    -- An operator declares the prefix new: only where no session lives.
    local live = redis.call('ZCARD', SESS)
    if live > 0 then return {'inuse', fmt(live)} end
    redis.call('DEL', P .. ':quiet')
    quiet_ms = 0
  end
  -- Read first: a replica that only reads, or a full server, still opens.
  local id = redis.call('GET', P .. ':id')
  if not id then
    redis.call('SET', P .. ':id', ARGV[4])
    id = ARGV[4]
  end
  return {'ok', id, fmt(quiet_left())}

elseif op == 'version' then
  return {'ok', redis.call('GET', k('c', ARGV[3])) or '0'}

elseif op == 'names' then
  -- ARGV: prefix. The names where a session not ended has an entry.
  local out = {'ok'}
  local seen = {}
  for _, secret in ipairs(redis.call('ZRANGE', SESS, 0, -1)) do
    for _, name in ipairs(redis.call('SMEMBERS', k('se', secret))) do
      if not seen[name] and string.sub(name, 1, #ARGV[3]) == ARGV[3]
          and redis.call('HEXISTS', k('e', name), 'o' .. secret) == 1 then
        seen[name] = true
        out[#out + 1] = name
      end
    end
  end
  return out

elseif op == 'evict' then
  local name = ARGV[3]
  settle(name, false)
  local holders = {}
  walk(name, function(r)
    if r.granted == '' then return false end
    holders[#holders + 1] = r.secret
    return true
  end)
  for _, secret in ipairs(holders) do
    for _, other in ipairs(end_session(secret)) do touch(other) end
  end
  settle(name, true)
  return {'ok', #holders}

elseif op == 'evictsession' then
  -- ARGV: tag, cursor ('0' to start). Ends the first session not ended
  -- whose public tag is `tag`, as 'close' does, and says 1; else says 0 and
  -- the cursor to go on from ('0': every record seen). No key maps a tag to
  -- its session (one would cost every 'open' a write, and sessions opened
  -- by older clients would lack it), so each call reads one HSCAN step of
  -- P:sinfo, about SCAN_STEP records: a call stays short however many
  -- sessions there are, and a full look costs one call per SCAN_STEP
  -- sessions. HSCAN returns every record present for the whole look.
  local SCAN_STEP = 256
  local tag, cursor = ARGV[3], ARGV[4]
  local step = redis.call('HSCAN', SINFO, cursor, 'COUNT', SCAN_STEP)
  local found = step[2]
  for i = 1, #found - 1, 2 do
    local secret, info = found[i], found[i + 1]
    -- The tag is the record's first field, compared whole (a `tag` with a
    -- tab in it must not match a tag and the TTL after it).
    local tab = string.find(info, '\t', 1, true)
    if tab == #tag + 1 and string.sub(info, 1, #tag) == tag and alive(secret) then
      for _, name in ipairs(end_session(secret)) do touch(name) end
      settle_pending(nil)
      return {'ok', 1}
    end
  end
  return {'ok', 0, step[1]}

elseif op == 'fence' then
  -- ARGV: name, token (20 digits; '' reads), '1' and a value to write.
  -- Tokens are compared as strings of equal length: exact where Lua's
  -- numbers (doubles) are not.
  local key = k('r', ARGV[3])
  local reg = redis.call('HMGET', key, 'k', 'v', 'd')
  if reg[1] and reg[1] ~= 'f' then return {'conflict', 'it is a cell, not a fence'} end
  local highest = reg[2] or '00000000000000000000'
  local token = ARGV[4]
  if token == '' then return {'ok', highest, reg[3]} end
  if token < highest then return {'stale', highest, reg[3]} end
  if ARGV[5] == '1' then
    redis.call('HSET', key, 'k', 'f', 'v', token, 'd', ARGV[6])
    return {'ok', token, ARGV[6]}
  end
  redis.call('HSET', key, 'k', 'f', 'v', token)
  return {'ok', token, reg[3]}

elseif op == 'cellget' or op == 'cellput' or op == 'celldel' then
  -- ARGV: name; cellput: value, expected version ('0': no value), owner
  -- secret ('' for none); celldel: version.
  local key = k('r', ARGV[3])
  local reg = redis.call('HMGET', key, 'k', 'v', 'd', 'o')
  if reg[1] and reg[1] ~= 'c' then return {'conflict', 'it is a fence, not a cell'} end
  -- A cell Redis has no record of (never used, or its data was lost) counts
  -- from TIME in microseconds, as the lock counters do: a version from
  -- before a loss is never handed out again.
  local stored = tonumber(reg[2] or fmt(tonumber(t[1]) * 1000000 + tonumber(t[2])))
  local current = false
  if reg[3] and (not reg[4] or unlapsed(reg[4])) then current = stored end
  if op == 'cellget' then
    if current then return {'ok', current, reg[3]} end
    return {'ok'}
  end
  local owner = ARGV[6]
  if op == 'cellput' and owner ~= '' and not unlapsed(owner) then return {'lost'} end
  local expected = tonumber(op == 'cellput' and ARGV[5] or ARGV[4])
  if (current or 0) ~= expected then return {'mismatch', current} end
  if op == 'celldel' then
    redis.call('HDEL', key, 'd', 'o')
    return {'ok', stored}
  end
  local version = stored + 1
  if owner == '' then
    redis.call('HSET', key, 'k', 'c', 'v', fmt(version), 'd', ARGV[4])
    redis.call('HDEL', key, 'o')
  else
    redis.call('HSET', key, 'k', 'c', 'v', fmt(version), 'd', ARGV[4], 'o', owner)
  end
  return {'ok', version}
end

return redis.error_reply('tenure: unknown operation ' .. tostring(op))
