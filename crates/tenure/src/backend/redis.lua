-- tenure's Redis store: every operation is one call of this script, so each
-- is atomic and judged by Redis's own clock (TIME).
--
-- All keys start with the prefix P, a hash tag such as "{tenure}", so they
-- share one cluster slot and one script may touch sessions and queues.
--   P:s:<secret>        the session's expiry (ms, Redis clock): what every
--                       check of a session reads (a GET is much cheaper
--                       than a ZSCORE); the key itself outlives it by a
--                       minute, so sessions nobody ends still go away
--   P:sessions          the key layout's number ("2"), set by the first
--                       client; a client of another layout refuses the
--                       prefix (and a client of layout 1, which kept a zset
--                       here, fails on it with WRONGTYPE instead of
--                       granting next to us)
--   P:live              zset  secret -> expiry, the same: the index of
--                       sessions, to find expired ones and list live ones
--   P:sinfo             hash  secret -> "tag\tttl_ms\tlabel"
--   P:se:<secret>       set   names where the session has an entry
--   P:c:<name>          the name's counter: each new entry's seq (its fencing
--                       token) and, bumped on every change, the name's
--                       version. Kept for ever; seeded from TIME in
--                       microseconds when missing, so it never goes back.
--   P:cs:<name>         set while P:c:<name> is a seed no entry used (Redlock)
--   P:e:<name>          hash, the name's queue (queue order = seq order):
--                         <seq>      "secret\tkind\tcount\tlimit\tholds\tgranted_ms"
--                         v<seq>     the entry's value, when not empty
--                         o<secret>  the seq of that session's entry
-- Wake-ups: PUBLISH P:w:<name>:<seq> when an entry is granted (only its
-- waiter listens), PUBLISH P:ch:<name> on any change (observers).
--
-- KEYS[1] = P:sessions (routes the call); ARGV[1] = P; ARGV[2] = operation.
--
-- A redis.call costs about as much as the command itself (a microsecond or
-- so): the common case, a name nobody else is queued on, has fast paths
-- with as few calls as the layout allows.

local P = ARGV[1]
local op = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local SESS = P .. ':live'

if op == 'join' and (ARGV[10] or '') == '' then
  -- Fast path: an empty queue grants at once (a semaphore entry if it fits).
  local secret, name, kind = ARGV[3], ARGV[4], ARGV[5]
  local ekey = P .. ':e:' .. name
  if redis.call('EXISTS', ekey) == 0 and (kind ~= 'P' or tonumber(ARGV[6]) <= tonumber(ARGV[7])) then
    local e = redis.call('GET', P .. ':s:' .. secret)
    if not e or tonumber(e) <= now then return {'lost'} end
    local ckey = P .. ':c:' .. name
    local first = 0
    -- Numbers go to redis.call and back in the reply as they are: Redis
    -- writes them with 17 digits (Lua's own tostring keeps 14, too few for
    -- a seq), which saves the string.format calls of the general path.
    local seq = redis.call('INCR', ckey)
    if seq == 1 then
      first = 1
      seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', ckey, seq)
    end
    local rec = secret .. '\t' .. kind .. '\t' .. ARGV[6] .. '\t' .. ARGV[7] .. '\t1\t' .. now
    if ARGV[8] == '' then
      redis.call('HSET', ekey, seq, rec, 'o' .. secret, seq)
    else
      -- (A concatenated number keeps only 14 digits: format this one.)
      redis.call('HSET', ekey, seq, rec, 'v' .. string.format('%.0f', seq), ARGV[8], 'o' .. secret, seq)
    end
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
  local e = redis.call('GET', P .. ':s:' .. secret)
  if not e or tonumber(e) <= now then return {'lost'} end
  local ekey = P .. ':e:' .. name
  local f = redis.call('HGETALL', ekey)
  if #f == 4 or #f == 6 then
    local fields = {}
    for i = 1, #f, 2 do fields[f[i]] = f[i + 1] end
    local rec = fields[seq]
    if rec and fields['o' .. secret] == seq and (#f == 4 or fields['v' .. seq])
        and string.match(rec, '^[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\t(%d+)') == '1' then
      redis.call('DEL', ekey)
      redis.call('SREM', P .. ':se:' .. secret, name)
      local ckey = P .. ':c:' .. name
      if redis.call('INCR', ckey) == 1 then redis.call('DEL', ckey) end
      redis.call('PUBLISH', P .. ':ch:' .. name, 'changed')
      return 0
    end
  end
end

local SINFO = P .. ':sinfo'

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

local function alive(secret)
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

-- The name's entries in queue order, with their values and liveness.
local function rows(name)
  local f = redis.call('HGETALL', k('e', name))
  local out = {}
  local values = {}
  for i = 1, #f, 2 do
    local b = string.byte(f[i], 1)
    if b and b >= 48 and b <= 57 then
      local r = parse(f[i], f[i + 1])
      r.n = tonumber(f[i])
      out[#out + 1] = r
    elseif b == 118 then
      values[string.sub(f[i], 2)] = f[i + 1]
    end
  end
  table.sort(out, function(a, b) return a.n < b.n end)
  for _, r in ipairs(out) do
    local e = expiry(r.secret)
    r.live = e ~= nil and e > now
    r.exp = e or 0
    r.value = values[r.seq] or ''
  end
  return out
end

-- The same rule as tenure::queue::grants.
local function grants(rs)
  local g = {}
  local all_shared = true
  local permits = 0
  for i, r in ipairs(rs) do
    if i > 1 and not g[i - 1] then
      g[i] = false
    else
      local ok
      if r.kind == 'X' then ok = (i == 1)
      elseif r.kind == 'S' then ok = all_shared
      else ok = (permits + r.count <= r.limit) end
      if ok then
        if r.kind ~= 'S' then all_shared = false end
        if r.kind == 'P' then permits = permits + r.count end
      end
      g[i] = ok
    end
  end
  return g
end

local function remove_entry(name, seq, secret)
  redis.call('HDEL', k('e', name), seq, 'v' .. seq, 'o' .. secret)
  redis.call('SREM', k('se', secret), name)
end

-- Ends a session and drops all its entries; returns the names it was in.
local function end_session(secret)
  local names = redis.call('SMEMBERS', k('se', secret))
  for _, name in ipairs(names) do
    local seq = redis.call('HGET', k('e', name), 'o' .. secret)
    if seq then redis.call('HDEL', k('e', name), seq, 'v' .. seq, 'o' .. secret) end
  end
  redis.call('DEL', k('se', secret))
  redis.call('ZREM', SESS, secret)
  redis.call('DEL', k('s', secret))
  redis.call('HDEL', SINFO, secret)
  return names
end

-- Drops entries of expired sessions (ending those sessions everywhere),
-- stamps and wakes newly granted entries, bumps versions. `changed` says
-- that first_name has changed already. Returns first_name's rows, settled.
local function settle(first_name, changed)
  local work = {first_name}
  local touched = {}
  touched[first_name] = changed or false
  -- Rows read once per name, unless ending a session changed them since.
  local read = {}
  local i = 1
  while i <= #work do
    local name = work[i]
    i = i + 1
    local rs = rows(name)
    read[name] = rs
    for _, r in ipairs(rs) do
      if not r.live then
        read[name] = nil
        for _, other in ipairs(end_session(r.secret)) do
          if touched[other] == nil then work[#work + 1] = other end
          touched[other] = true
          read[other] = nil
        end
      end
    end
  end
  local first_rows
  for _, name in ipairs(work) do
    local rs = read[name] or rows(name)
    local g = grants(rs)
    for j, r in ipairs(rs) do
      if g[j] and r.granted == '' then
        r.granted = fmt(now)
        redis.call('HSET', k('e', name), r.seq, record(r))
        redis.call('PUBLISH', k('w', name) .. ':' .. r.seq, 'granted')
        touched[name] = true
      end
    end
    if touched[name] then
      bump(name)
      redis.call('PUBLISH', k('ch', name), 'changed')
    end
    if name == first_name then first_rows = rs end
  end
  return first_rows
end

-- Ends a few long-expired sessions, so the tables stay small.
local function collect()
  local dead = redis.call('ZRANGEBYSCORE', SESS, '-inf', fmt(now), 'LIMIT', 0, 16)
  for _, secret in ipairs(dead) do
    for _, name in ipairs(end_session(secret)) do settle(name, true) end
  end
end

local function own(secret, name)
  local seq = redis.call('HGET', k('e', name), 'o' .. secret)
  if not seq then return nil end
  local rec = redis.call('HGET', k('e', name), seq)
  if not rec then return nil end
  return parse(seq, rec)
end

if op == 'open' then
  -- ARGV: secret, tag, ttl_ms, label
  collect()
  local ttl = tonumber(ARGV[5])
  redis.call('ZADD', SESS, fmt(now + ttl), ARGV[3])
  redis.call('SET', k('s', ARGV[3]), fmt(now + ttl), 'PX', fmt(ttl + 60000))
  redis.call('HSET', SINFO, ARGV[3], ARGV[4] .. '\t' .. ARGV[5] .. '\t' .. ARGV[6])
  return {'ok'}

elseif op == 'keepalive' then
  -- ARGV: secret
  local secret = ARGV[3]
  if not alive(secret) then return {'lost'} end
  local info = redis.call('HGET', SINFO, secret)
  if not info then return {'lost'} end
  local ttl = tonumber(split(info)[2])
  redis.call('ZADD', SESS, 'XX', fmt(now + ttl), secret)
  redis.call('SET', k('s', secret), fmt(now + ttl), 'PX', fmt(ttl + 60000))
  return {'ok'}

elseif op == 'close' then
  local names = end_session(ARGV[3])
  for _, name in ipairs(names) do settle(name, true) end
  return {'ok'}

elseif op == 'join' then
  -- ARGV: secret, name, kind, count, limit, value, mode ('wait' | 'ifgranted'),
  -- and optionally the seq to use (Redlock)
  local secret, name, kind = ARGV[3], ARGV[4], ARGV[5]
  local count, limit, value, mode = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9]
  if not alive(secret) then return {'lost'} end
  local rs = settle(name, false)
  local mine = nil
  for _, r in ipairs(rs) do
    if r.secret == secret then mine = r break end
  end
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
  for _, r in ipairs(rs) do
    local permits_a, permits_b = kind == 'P', r.kind == 'P'
    if permits_a ~= permits_b then
      return {'conflict', 'locks and semaphores cannot share a name'}
    end
    if permits_a and r.limit ~= limit then
      return {'conflict', 'semaphore limit ' .. fmt(limit) .. ' disagrees with the limit ' .. fmt(r.limit) .. ' already in use'}
    end
  end
  local entry = {secret = secret, kind = kind, count = count, limit = limit, holds = 1, granted = ''}
  rs[#rs + 1] = entry
  local g = grants(rs)
  local granted = g[#rs]
  if mode == 'ifgranted' and not granted then return {'none'} end
  local ckey = k('c', name)
  local first = 0
  local seq
  local proposed = tonumber(ARGV[10] or '')
  if proposed then
    -- Redlock proposes the seq, the same on every node; a node takes it only
    -- if it is above every seq the node has seen for the name, so each
    -- node's queue stays in seq order.
    -- A node without a counter seeds it from its clock (and remembers that
    -- no entry has used it yet, for `first`).
    local current = tonumber(redis.call('GET', ckey) or '')
    if not current then
      current = tonumber(t[1]) * 1000000 + tonumber(t[2])
      redis.call('SET', ckey, fmt(current))
      redis.call('SET', k('cs', name), '1')
    end
    if proposed <= current then return {'behind', fmt(current)} end
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
  if granted then entry.granted = fmt(now) end
  if value ~= '' then
    redis.call('HSET', k('e', name), seq, record(entry), 'v' .. seq, value, 'o' .. secret, seq)
  else
    redis.call('HSET', k('e', name), seq, record(entry), 'o' .. secret, seq)
  end
  redis.call('SADD', k('se', secret), name)
  -- The new seq is also the name's new version.
  redis.call('PUBLISH', k('ch', name), 'changed')
  return {'ok', seq, granted and 1 or 0, 1, first}

elseif op == 'leave' then
  -- ARGV: secret, name, seq
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not alive(secret) then return {'lost'} end
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq then return {'notheld'} end
  mine.holds = mine.holds - 1
  if mine.holds > 0 then
    redis.call('HSET', k('e', name), seq, record(mine))
    return {'ok', mine.holds}
  end
  remove_entry(name, seq, secret)
  settle(name, true)
  return {'ok', 0}

elseif op == 'look' then
  -- ARGV: secret, name, seq. Settles (a grant by expiry needs it), then says
  -- whether the entry is granted, or how long until the next expiry ahead.
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not alive(secret) then return {'lost'} end
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq then return {'notheld'} end
  if mine.granted ~= '' then return {'granted'} end
  settle(name, false)
  mine = own(secret, name)
  if not mine then return {'notheld'} end
  if mine.granted ~= '' then return {'granted'} end
  local next_exp = -1
  for _, r in ipairs(rows(name)) do
    if r.seq == seq then break end
    if next_exp < 0 or r.exp < next_exp then next_exp = r.exp end
  end
  if next_exp >= 0 then next_exp = next_exp - now end
  return {'wait', fmt(next_exp)}

elseif op == 'setvalue' then
  -- ARGV: secret, name, seq, value
  local secret, name, seq = ARGV[3], ARGV[4], ARGV[5]
  if not alive(secret) then return {'lost'} end
  settle(name, false)
  local mine = own(secret, name)
  if not mine or mine.seq ~= seq or mine.granted == '' then return {'notheld'} end
  redis.call('HSET', k('e', name), 'v' .. seq, ARGV[6])
  bump(name)
  redis.call('PUBLISH', k('ch', name), 'changed')
  return {'ok'}

elseif op == 'queue' then
  -- ARGV: name. Returns version, then 10 fields per entry.
  local name = ARGV[3]
  local rs = settle(name, false)
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
    out[#out + 1] = r.value
    out[#out + 1] = r.granted
    out[#out + 1] = fmt(r.exp - now)
    out[#out + 1] = fmt(r.holds)
  end
  return out

elseif op == 'layout' then
  -- ARGV[3]: the layout this script writes. Called once per connection.
  local marker = P .. ':sessions'
  local kind = redis.call('TYPE', marker)['ok']
  if kind == 'none' then
    redis.call('SET', marker, ARGV[3])
    return {'ok'}
  end
  local found = kind == 'string' and redis.call('GET', marker) or '1'
  if found == ARGV[3] then return {'ok'} end
  return {'layout', found}

elseif op == 'version' then
  return {'ok', redis.call('GET', k('c', ARGV[3])) or '0'}

elseif op == 'names' then
  -- ARGV: prefix. The names where a live session has an entry.
  local out = {'ok'}
  local seen = {}
  for _, secret in ipairs(redis.call('ZRANGEBYSCORE', SESS, '(' .. fmt(now), '+inf')) do
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
  local ended = 0
  for _, r in ipairs(rows(name)) do
    if r.granted ~= '' then
      for _, other in ipairs(end_session(r.secret)) do settle(other, true) end
      ended = ended + 1
    end
  end
  settle(name, true)
  return {'ok', ended}
end

return redis.error_reply('tenure: unknown operation ' .. tostring(op))
