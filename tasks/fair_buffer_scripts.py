"""The Lua of `tasks.fair_buffer` (and FAIR_POP, the keyed hand-out inside
`tasks.buffer_scripts.TAKE`); the keys they touch are described in
`tasks.fair_buffer`'s docstring, all of one queue (one cluster slot).
"""

from __future__ import annotations

# The hand-out by fairness key (inside TAKE; `want`, `ids`, `kcap`, `krate`,
# `counting`, `clock` and `kstate`/`kwait` are TAKE's).  Per priority p a
# ring, `ring:<p>`, of the keys whose most urgent buffered task has priority
# p, scored by virtual time: the ring's least key is served, for as many
# tasks as keep its time at or below the next key's (a key's time grows by
# 1/weight per task), and goes back with its new time; a key joins a ring
# at the ring's least time (JOIN), so an idle key banks no credit.  The
# member '' is the anonymous key (the v1 ready set, KEYS[1]), put in the ring
# of its head's priority at each take (field `a` of the mark says which).
# A key at its key_max_concurrency leaves the ring for `cpark` (RELEASE
# brings it back); one whose own bucket `kb:<key>` is empty leaves it for
# `rpark`, scored by when its next token is due, and comes back then (the
# start of each take).  Each step is O(log K): no scan over keys.
FAIR_POP = r"""
local P = ARGV[8]
local W = 10000000000000
local wver = ARGV[7]
local function zkey(key)
  if key == '' then return KEYS[1] end
  return P .. 'k:' .. key
end
local function ring(p) return P .. 'ring:' .. p end
local function headp(zk)
  local head = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
  if #head == 0 then return nil end
  return math.floor(tonumber(head[2]) / W)
end
local function join(key, p)
  local r = ring(p)
  local first = redis.call('ZRANGE', r, 0, 0, 'WITHSCORES')
  local vt = 0
  if #first > 0 then vt = tonumber(first[2]) end
  redis.call('ZADD', r, vt, key)
end
if wver ~= '' and redis.call('GET', P .. 'kwv') ~= wver then
  kstate = 3
else
  -- The anonymous key's place: the ring of its head's priority.
  local anon = redis.call('HGET', KEYS[5], 'a')
  if anon == false then anon = nil else anon = tonumber(anon) end
  local ap = headp(KEYS[1])
  if anon ~= ap then
    if anon ~= nil then redis.call('ZREM', ring(anon), '') end
    if ap ~= nil then
      join('', ap)
      redis.call('HSET', KEYS[5], 'a', ap)
    else
      redis.call('HDEL', KEYS[5], 'a')
    end
  end
  -- Keys whose own token is due again; keys parked at a cap that is gone.
  local due = redis.call('ZRANGEBYSCORE', P .. 'rpark', '-inf', clock(), 'LIMIT', 0, 100)
  for _, key in ipairs(due) do
    redis.call('ZREM', P .. 'rpark', key)
    local p = headp(zkey(key))
    if p ~= nil then join(key, p) end
  end
  if kcap == 0 and redis.call('SCARD', P .. 'cpark') > 0 then
    for _, key in ipairs(redis.call('SMEMBERS', P .. 'cpark')) do
      local p = headp(zkey(key))
      if p ~= nil then join(key, p) end
    end
    redis.call('DEL', P .. 'cpark')
  end
  local held = {}
  local p = 1
  local steps = 0
  while #ids < want and steps < 1000 do
    steps = steps + 1
    while p <= 10 and redis.call('ZCARD', ring(p)) == 0 do p = p + 1 end
    if p > 10 then break end
    local r = ring(p)
    local top = redis.call('ZRANGE', r, 0, 1, 'WITHSCORES')
    local key, vt = top[1], tonumber(top[2])
    local zk = zkey(key)
    local blocked = false
    local running = 0
    local ktok = nil
    if key ~= '' and kcap > 0 then
      running = tonumber(redis.call('HGET', P .. 'krun', key) or '0')
      if running >= kcap then
        redis.call('ZREM', r, key)
        redis.call('SADD', P .. 'cpark', key)
        blocked = true
      end
    end
    if not blocked and key ~= '' and krate > 0 then
      local burst = math.max(1, math.ceil(krate))
      local tk, ts = burst, clock()
      local st = redis.call('GET', P .. 'kb:' .. key)
      if st then
        local a, b = string.match(st, '^(%S+) (%S+)$')
        tk, ts = tonumber(a), tonumber(b)
        if clock() > ts then tk = math.min(burst, tk + (clock() - ts) * krate / 1000) end
      end
      if tk < 1 then
        redis.call('ZREM', r, key)
        redis.call('ZADD', P .. 'rpark', clock() + math.ceil((1 - tk) * 1000 / krate), key)
        blocked = true
      else
        ktok = tk
      end
    end
    if not blocked then
      local w = 1
      if wver ~= '' and key ~= '' then
        w = tonumber(redis.call('HGET', P .. 'kw', key) or '1')
      end
      local quantum = want - #ids
      if top[3] then
        quantum = math.min(quantum, math.floor((tonumber(top[4]) - vt) * w) + 1)
      end
      if kcap > 0 and key ~= '' then quantum = math.min(quantum, kcap - running) end
      if ktok then quantum = math.min(quantum, math.floor(ktok)) end
      local popped = redis.call('ZPOPMIN', zk, quantum)
      local got = 0
      local back = {}
      local limit = (p + 1) * W
      for i = 1, #popped, 2 do
        local id, sc = popped[i], popped[i + 1]
        if tonumber(sc) >= limit then
          back[#back + 1] = sc
          back[#back + 1] = id
        elseif counting and redis.call('ZSCORE', KEYS[3], id) then
          held[#held + 1] = {zk, sc, id}
        else
          ids[#ids + 1] = id
          got = got + 1
          if counting then redis.call('ZADD', KEYS[3], clock(), id) end
          if kcap > 0 and key ~= '' then
            redis.call('HSET', P .. 'ktask', id, key)
            redis.call('HINCRBY', P .. 'krun', key, 1)
          end
        end
      end
      if #back > 0 then redis.call('ZADD', zk, unpack(back)) end
      if ktok then
        local burst = math.max(1, math.ceil(krate))
        redis.call('SET', P .. 'kb:' .. key, tostring(ktok - got) .. ' ' .. tostring(clock()),
          'PX', math.ceil(burst * 1000 / krate) + 1000)
      end
      if got == 0 then got = 1 end
      vt = vt + got / w
      local hp = headp(zk)
      if hp == nil then
        redis.call('ZREM', r, key)
        if key == '' then redis.call('HDEL', KEYS[5], 'a') end
      elseif hp == p then
        redis.call('ZADD', r, vt, key)
      else
        redis.call('ZREM', r, key)
        join(key, hp)
        if key == '' then redis.call('HSET', KEYS[5], 'a', hp) end
      end
    end
  end
  for _, h in ipairs(held) do redis.call('ZADD', h[1], h[2], h[3]) end
  if #ids == 0 then
    local busy = false
    for q = 1, 10 do
      if redis.call('ZCARD', ring(q)) > 0 then busy = true break end
    end
    local first = redis.call('ZRANGE', P .. 'rpark', 0, 0, 'WITHSCORES')
    if #first > 0 then
      kwait = math.max(1, tonumber(first[2]) - clock())
    elseif redis.call('SCARD', P .. 'cpark') > 0 then
      kstate = 1
    elseif not busy then
      -- No key has buffered tasks: the queue hands out as v1 again.
      redis.call('DEL', KEYS[5])
    end
  end
end
"""
# KEYS[1] the queue's fairness mark; ARGV[1] the queue's key prefix, ARGV[2]
# the wake channel ('' for none) and ARGV[3] its message, ARGV[4...] (task id,
# score, fairness key) triples.  Adds each id to its key's ready set (an id
# already there keeps its place), and puts a key that had none into the ring
# of its head's priority at the ring's least virtual time (or moves it to a
# more urgent ring when a more urgent task arrived), unless it is parked at
# its cap or rate; then wakes waiting claims.  Returns {how many were added,
# then each key's set size, in the order the keys first came}.
PUSH_KEYED = r"""
local P = ARGV[1]
local W = 10000000000000
local groups, order, best = {}, {}, {}
for i = 4, #ARGV, 3 do
  local key = ARGV[i + 2]
  local g = groups[key]
  local sc = tonumber(ARGV[i + 1])
  if g == nil then
    g = {}
    groups[key] = g
    order[#order + 1] = key
    best[key] = sc
  elseif sc < best[key] then
    best[key] = sc
  end
  g[#g + 1] = ARGV[i + 1]
  g[#g + 1] = ARGV[i]
end
local cparked = redis.call('EXISTS', P .. 'cpark') == 1
local rparked = redis.call('EXISTS', P .. 'rpark') == 1
-- Each ring's least time, read once: a key joining at it leaves it the least.
local least = {}
local function join(key, p)
  local r = P .. 'ring:' .. p
  if least[p] == nil then
    local first = redis.call('ZRANGE', r, 0, 0, 'WITHSCORES')
    least[p] = 0
    if #first > 0 then least[p] = tonumber(first[2]) end
  end
  redis.call('ZADD', r, least[p], key)
end
redis.call('HSET', KEYS[1], 'on', '1')
local added = 0
for _, key in ipairs(order) do
  local zk = P .. 'k:' .. key
  local head = redis.call('ZRANGE', zk, 0, 0, 'WITHSCORES')
  added = added + redis.call('ZADD', zk, 'NX', unpack(groups[key]))
  local parked = (cparked and redis.call('SISMEMBER', P .. 'cpark', key) == 1)
    or (rparked and redis.call('ZSCORE', P .. 'rpark', key))
  local new = math.floor(best[key] / W)
  if #head == 0 then
    if not parked then join(key, new) end
  else
    local old = math.floor(tonumber(head[2]) / W)
    if new < old and redis.call('ZSCORE', P .. 'ring:' .. old, key) then
      redis.call('ZREM', P .. 'ring:' .. old, key)
      least[old] = nil
      join(key, new)
    end
  end
end
if ARGV[2] ~= '' then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
local sizes = {added}
for _, key in ipairs(order) do
  sizes[#sizes + 1] = redis.call('ZCARD', P .. 'k:' .. key)
end
return sizes
"""

# KEYS[1] the queue's fairness mark; ARGV[1] the queue's key prefix, ARGV[2]
# how many at most.  Empties the keyed ready sets (a paused queue's drain):
# returns their ids and removes every ring and parking.
DRAIN_KEYED = r"""
local P = ARGV[1]
local keys, seen = {}, {}
local function add(key)
  if key ~= '' and not seen[key] then
    seen[key] = true
    keys[#keys + 1] = key
  end
end
for q = 1, 10 do
  for _, key in ipairs(redis.call('ZRANGE', P .. 'ring:' .. q, 0, -1)) do add(key) end
  redis.call('DEL', P .. 'ring:' .. q)
end
for _, key in ipairs(redis.call('SMEMBERS', P .. 'cpark')) do add(key) end
for _, key in ipairs(redis.call('ZRANGE', P .. 'rpark', 0, -1)) do add(key) end
redis.call('DEL', P .. 'cpark', P .. 'rpark')
redis.call('HDEL', KEYS[1], 'a')
local ids = {}
for _, key in ipairs(keys) do
  local zk = P .. 'k:' .. key
  for _, id in ipairs(redis.call('ZRANGE', zk, 0, -1)) do ids[#ids + 1] = id end
  redis.call('DEL', zk)
end
return ids
"""

# KEYS[1] the queue's fairness mark; ARGV[1] the queue's key prefix.  Deletes
# every key of the queue's fairness structure (a deleted queue).
FORGET_KEYED = r"""
local P = ARGV[1]
local keys = {}
for q = 1, 10 do
  for _, key in ipairs(redis.call('ZRANGE', P .. 'ring:' .. q, 0, -1)) do keys[#keys + 1] = key end
  redis.call('DEL', P .. 'ring:' .. q)
end
for _, key in ipairs(redis.call('SMEMBERS', P .. 'cpark')) do keys[#keys + 1] = key end
for _, key in ipairs(redis.call('ZRANGE', P .. 'rpark', 0, -1)) do keys[#keys + 1] = key end
for _, key in ipairs(keys) do
  if key ~= '' then redis.call('DEL', P .. 'k:' .. key, P .. 'kb:' .. key) end
end
redis.call('DEL', KEYS[1], P .. 'cpark', P .. 'rpark', P .. 'krun', P .. 'ktask', P .. 'kw',
  P .. 'kwv')
return #keys
"""

# KEYS[1] weights hash, KEYS[2] its version; ARGV[1] the version, ARGV[2...]
# (key, weight) pairs.  Replaces the queue's key weights.
WEIGHTS = r"""
redis.call('DEL', KEYS[1])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""

# ARGV[1] the queue's key prefix, ARGV[2] the bound of one key's ready set,
# ARGV[3...] (fairness key, how many due tasks) pairs.  Returns, per pair, 1
# when that key's tasks fit in its ready set, else 0.
ADMIT_KEYED = r"""
local P = ARGV[1]
local size = tonumber(ARGV[2])
local answer = {}
for i = 3, #ARGV, 2 do
  local room = size - redis.call('ZCARD', P .. 'k:' .. ARGV[i])
  if room >= tonumber(ARGV[i + 1]) then answer[#answer + 1] = 1 else answer[#answer + 1] = 0 end
end
return answer
"""


# ARGV[1] the queue's key prefix, ARGV[2] the buckets' lifetime (ms), ARGV[3...]
# (fairness key, tokens) pairs.  Sets each key's bucket to at most that many
# tokens now (a bucket a take made meanwhile keeps fewer, if it has fewer).
KEY_TOKENS = r"""
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 3, #ARGV, 2 do
  local k = P .. 'kb:' .. ARGV[i]
  local tokens = tonumber(ARGV[i + 1])
  local st = redis.call('GET', k)
  if st then
    local a = tonumber(string.match(st, '^(%S+) '))
    if a ~= nil and a < tokens then tokens = a end
  end
  redis.call('SET', k, tostring(tokens) .. ' ' .. tostring(now), 'PX', tonumber(ARGV[2]))
end
return 1
"""
