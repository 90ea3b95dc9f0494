"""The Lua scripts of `tasks.buffer`, each run by one of its `Buffer` methods.

The keys they touch and what each holds are described in `tasks.buffer`'s docstring;
each script touches the keys of one queue (one cluster slot).
"""

from __future__ import annotations

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
# mark; ARGV[1] how many at most, ARGV[2] rate per second (0: unlimited),
# ARGV[3] max_concurrency (0: unlimited).  Returns {ids, wait_ms, state}:
# wait_ms > 0 when the bucket is empty and tells when the next token is due;
# state 1 when the queue is at its cap, 2 when its running count is unknown
# (nothing taken either way).
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
TAKE = """
if redis.replicate_commands then redis.replicate_commands() end
local want = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local now = nil
if cap > 0 then
  if redis.call('EXISTS', KEYS[4]) == 0 then
    return {{}, 0, 2}
  end
  local allowed = cap - redis.call('ZCARD', KEYS[3])
  if allowed <= 0 then
    return {{}, 0, 1}
  end
  want = math.min(want, allowed)
end
local tokens = nil
if rate > 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
if want >= 1 then
  if cap <= 0 then
    local popped = redis.call('ZPOPMIN', KEYS[1], want)
    for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
  else
    if now == nil then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
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
if rate <= 0 then
  return {ids, 0, 0}
end
tokens = tokens - #ids
redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[2], 3600000)
if #ids == 0 and tokens < 1 then
  return {ids, math.ceil((1 - tokens) * 1000 / rate), 0}
end
return {ids, 0, 0}
"""

# KEYS[1] running set; ARGV[1] the cap (0: none), ARGV[2] the wake channel,
# ARGV[3] the queue id, ARGV[4...] task ids.  Frees the ids' slots; when the
# queue was at its cap, wakes waiting claims (a slot frees as a new task
# would).  Returns how many slots were freed.
RELEASE = """
local cap = tonumber(ARGV[1])
local before = redis.call('ZCARD', KEYS[1])
local freed = 0
for i = 4, #ARGV do
  freed = freed + redis.call('ZREM', KEYS[1], ARGV[i])
end
if freed > 0 and cap > 0 and before >= cap then
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ':' .. freed)
end
return freed
"""

# KEYS[1] running set, KEYS[2] counted mark; ARGV[1] the mark's lifetime in
# ms (0: no end; -1: leave the mark alone), ARGV[2...] ids of executing
# tasks.  Adds the ids that are not there yet (a member keeps its time).
COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'NX', now, ARGV[i])
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  redis.call('SET', KEYS[2], now, 'PX', ttl)
elseif ttl == 0 then
  redis.call('SET', KEYS[2], now)
end
return now
"""

# KEYS[1] running set; ARGV[1] cutoff (ms), ARGV[2...] ids.  Removes each id
# whose time is still before the cutoff: an id taken again since (a retry
# handed out anew) has a later time and stays.  Returns how many went.
PRUNE = """
local cutoff = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  local at = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if at and tonumber(at) < cutoff then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
"""
