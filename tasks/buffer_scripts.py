"""The Lua scripts of `tasks.buffer`, each run by one of its `Buffer` methods.

The keys they touch and what each holds are described in `tasks.buffer`'s docstring;
each script touches the keys of one queue (one cluster slot).
"""

from __future__ import annotations

from tasks.fair_buffer_scripts import FAIR_POP

# KEYS[1] ready set, KEYS[2] watched mark; ARGV[1] how many due tasks, ARGV[2]
# the buffer's size, ARGV[3] the best (lowest) score among them, ARGV[4]
# WATCH_MARGIN_MS.  Returns 1 (they fit), 2 (full and watched, none more urgent
# than the least urgent buffered task) or 0 (anything else: wake the dispatchers).
ADMIT = """
local size = redis.call('ZCARD', KEYS[1])
if size + tonumber(ARGV[1]) <= tonumber(ARGV[2]) then
    return 1
end
if redis.call('PTTL', KEYS[2]) <= tonumber(ARGV[4]) then
    return 0
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] ~= nil and tonumber(ARGV[3]) < tonumber(last[2]) then
    return 0
end
return 2
"""

# KEYS[1] ready set, KEYS[2] bucket, KEYS[3] running set, KEYS[4] counted
# mark, KEYS[5] the queue's fairness mark; ARGV[1] how many at most, ARGV[2]
# rate per second (0: unlimited), ARGV[3] max_concurrency (0: unlimited),
# ARGV[4] '1' for the lane that hands out by fairness key (the queue's own),
# ARGV[5] key_max_concurrency (0: none), ARGV[6] key_rate_limit (0: none),
# ARGV[7] the version of key_weights ('' when empty), ARGV[8] the queue's key
# prefix (`tf:{<queue-id>}:`).  Returns {ids, wait_ms, state}: wait_ms > 0
# when the bucket (or every key's own) is empty and tells when the next token
# is due; state 1 when the queue (or every key with due tasks) is at its cap,
# 2 when its running count is unknown, 3 when the key weights in Redis are not
# of that version (nothing taken in these cases).
#
# A bucket of capacity max(1, ceil(R)) refilled at R/s hands out at most
# R*T + max(1, ceil(R)) tasks over any T seconds (API.md; a fractional R,
# set over the Cloud Tasks API, spaces hand-outs 1/R seconds apart).  Time
# comes from the Redis server, so every API process shares one clock.  The
# cap is checked and the slots taken in the same script, so claims racing in
# any number of processes never take more than `cap - ZCARD(running)`
# between them.
#
# An id still in the running set is a task whose previous attempt's slot has
# not been released yet (a nack with no delay whose release is on its way):
# it goes back into the ready set with its score and the next id is taken
# instead; taking it would count its new attempt in the old attempt's slot,
# which that release then frees while the new attempt runs.
#
# While the fairness mark exists (tasks with a fairness key are buffered, see
# tasks.buffer), the queue's own lane hands out by key: FAIR_POP below.
TAKE = (
    r"""
if redis.replicate_commands then redis.replicate_commands() end
local want = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local keyed = ARGV[4] == '1' and redis.call('EXISTS', KEYS[5]) == 1
local kcap, krate = 0, 0
if keyed then
  kcap = tonumber(ARGV[5])
  krate = tonumber(ARGV[6])
end
local counting = cap > 0 or kcap > 0
local now = nil
local function clock()
  if now == nil then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
if counting then
  if redis.call('EXISTS', KEYS[4]) == 0 then
    return {{}, 0, 2}
  end
end
if cap > 0 then
  local allowed = cap - redis.call('ZCARD', KEYS[3])
  if allowed <= 0 then
    return {{}, 0, 1}
  end
  want = math.min(want, allowed)
end
local tokens = nil
if rate > 0 then
  clock()
  local state = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
  tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  local burst = math.max(1, math.ceil(rate))
  if tokens == nil or ts == nil then
    tokens = burst
    ts = now
  end
  if now > ts then
    tokens = math.min(burst, tokens + (now - ts) * rate / 1000)
  end
  want = math.min(want, math.floor(tokens))
end
local ids = {}
local kstate, kwait = 0, 0
if want >= 1 then
  if keyed then
"""
    + "FAIR_POP"
    + r"""
  elseif not counting then
    local popped = redis.call('ZPOPMIN', KEYS[1], want)
    for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
  else
    clock()
    local held = {}
    for round = 1, 3 do
      local need = want - #ids
      if need < 1 then break end
      local popped = redis.call('ZPOPMIN', KEYS[1], need)
      if #popped == 0 then break end
      for i = 1, #popped, 2 do
        if redis.call('ZSCORE', KEYS[3], popped[i]) then
          held[#held + 1] = popped[i + 1]
          held[#held + 1] = popped[i]
        else
          redis.call('ZADD', KEYS[3], now, popped[i])
          ids[#ids + 1] = popped[i]
        end
      end
    end
    if #held > 0 then
      redis.call('ZADD', KEYS[1], unpack(held))
    end
  end
end
if kstate == 3 then
  return {{}, 0, 3}
end
if rate <= 0 then
  return {ids, kwait, kstate}
end
tokens = tokens - #ids
redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[2], 3600000)
if #ids == 0 and tokens < 1 then
  return {ids, math.ceil((1 - tokens) * 1000 / rate), 0}
end
return {ids, kwait, kstate}
"""
)

TAKE = TAKE.replace("FAIR_POP", FAIR_POP)

# KEYS[1] running set; ARGV[1] the cap (0: none), ARGV[2] the wake channel,
# ARGV[3] the queue id, ARGV[4] key_max_concurrency (0: none), ARGV[5] the
# queue's key prefix, ARGV[6...] task ids.  Frees the ids' slots, and the
# slots of their fairness keys (`ktask` says whose an id holds); a key parked
# at its cap with a slot free again goes back into its ring.  When the queue
# was at its cap, or a key with buffered tasks was at its own, wakes waiting
# claims (a slot frees as a new task would).  Returns how many slots were freed.
RELEASE = r"""
local cap = tonumber(ARGV[1])
local kcap = tonumber(ARGV[4])
local P = ARGV[5]
local W = 10000000000000
local before = redis.call('ZCARD', KEYS[1])
local freed = 0
local back = 0
for i = 6, #ARGV do
  freed = freed + redis.call('ZREM', KEYS[1], ARGV[i])
  local key = redis.call('HGET', P .. 'ktask', ARGV[i])
  if key then
    redis.call('HDEL', P .. 'ktask', ARGV[i])
    local left = redis.call('HINCRBY', P .. 'krun', key, -1)
    if left <= 0 then redis.call('HDEL', P .. 'krun', key) end
    if kcap == 0 or left < kcap then
      local head = redis.call('ZRANGE', P .. 'k:' .. key, 0, 0, 'WITHSCORES')
      if redis.call('SREM', P .. 'cpark', key) == 1 and #head > 0 then
        local r = P .. 'ring:' .. math.floor(tonumber(head[2]) / W)
        local first = redis.call('ZRANGE', r, 0, 0, 'WITHSCORES')
        local vt = 0
        if #first > 0 then vt = tonumber(first[2]) end
        redis.call('ZADD', r, vt, key)
        back = back + 1
      elseif #head > 0 and kcap > 0 and left + 1 >= kcap then
        -- At its cap until now, not parked yet (a count rebuilt meanwhile put
        -- it back in its ring): a claim may be waiting for it all the same.
        back = back + 1
      end
    end
  end
end
if back > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ':' .. back)
elseif freed > 0 and cap > 0 and before >= cap then
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ':' .. freed)
end
return freed
"""

# KEYS[1] running set, KEYS[2] counted mark; ARGV[1] the mark's lifetime in
# ms (0: no end; -1: leave the mark alone), ARGV[2] the queue's key prefix,
# ARGV[3...] (id, fairness key or '') pairs of executing tasks.  Adds the ids
# that are not there yet (a member keeps its time), and each keyed id to its
# key's count.  Setting the mark also lets every key parked at its cap try
# again (the take parks it anew if it still is).
COUNT = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local P = ARGV[2]
local W = 10000000000000
for i = 3, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], 'NX', now, ARGV[i])
  local key = ARGV[i + 1]
  if key ~= '' and redis.call('HSETNX', P .. 'ktask', ARGV[i], key) == 1 then
    redis.call('HINCRBY', P .. 'krun', key, 1)
  end
end
local ttl = tonumber(ARGV[1])
if ttl >= 0 then
  for _, key in ipairs(redis.call('SMEMBERS', P .. 'cpark')) do
    local head = redis.call('ZRANGE', P .. 'k:' .. key, 0, 0, 'WITHSCORES')
    if #head > 0 then
      local r = P .. 'ring:' .. math.floor(tonumber(head[2]) / W)
      local first = redis.call('ZRANGE', r, 0, 0, 'WITHSCORES')
      local vt = 0
      if #first > 0 then vt = tonumber(first[2]) end
      redis.call('ZADD', r, vt, key)
    end
  end
  redis.call('DEL', P .. 'cpark')
end
if ttl > 0 then
  redis.call('SET', KEYS[2], now, 'PX', ttl)
elseif ttl == 0 then
  redis.call('SET', KEYS[2], now)
end
return now
"""

# KEYS[1] running set; ARGV[1] cutoff (ms), ARGV[2] the queue's key prefix,
# ARGV[3...] ids.  Removes each id whose time is still before the cutoff (and
# its key's slot): an id taken again since (a retry handed out anew) has a
# later time and stays.  Returns how many went.
PRUNE = r"""
local cutoff = tonumber(ARGV[1])
local P = ARGV[2]
local removed = 0
for i = 3, #ARGV do
  local at = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if at and tonumber(at) < cutoff then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
    local key = redis.call('HGET', P .. 'ktask', ARGV[i])
    if key then
      redis.call('HDEL', P .. 'ktask', ARGV[i])
      if redis.call('HINCRBY', P .. 'krun', key, -1) <= 0 then
        redis.call('HDEL', P .. 'krun', key)
      end
    end
  end
end
return removed
"""
