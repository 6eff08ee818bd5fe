-- common.lua: prepended to every script of this folder (see celery_semaphore/core/scripts.py).
--
-- KEYS (the same six, in this order, for every script; one hash tag per semaphore):
--   KEYS[1] holders  ZSET  holder -> lease expiry, ms of server time
--   KEYS[2] hinfo    HASH  holder -> "<fencing token>|<acquired ms>|<info>"
--   KEYS[3] waiters  ZSET  holder -> ticket (place in line; lower goes first)
--   KEYS[4] wexp     ZSET  holder -> waiter lease expiry, ms of server time
--   KEYS[5] winfo    HASH  holder -> "<first ask ms>|<info>"
--   KEYS[6] meta     HASH  limit (declared), override, draining, fence, ticket, hold_ms,
--                          and the m_* counters metrics.py exports
--
-- Tickets and fencing tokens are max(last + 1, server time in µs): strictly
-- increasing even after the meta hash expired or Redis lost its data.
--
-- holders and hinfo hold the same members, and so do waiters, wexp and winfo:
-- each group is written and deleted together by one script, and touch() gives
-- all six keys the same expiry. So ZCARD waiters == 0 means that wexp and winfo
-- are absent too, which lets the hot paths skip the waiter keys entirely.

local holders, hinfo, waiters, wexp, winfo, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)
local BATCH = 1000

local function fmt(n)
  return string.format('%.0f', n)
end

-- The next fence or ticket after ``last`` (a meta field's value, or nil); the
-- caller stores it (acquire batches its meta writes into one HSET).
local function seq_after(last)
  return math.max((tonumber(last) or 0) + 1, now_us)
end

local function next_seq(field)
  local value = seq_after(redis.call('HGET', meta, field))
  redis.call('HSET', meta, field, fmt(value))
  return value
end

-- Histogram bucket bounds in ms; celery_semaphore/metrics.py has the same in seconds.
local BUCKETS = {5, 25, 100, 250, 1000, 2500, 10000, 30000, 60000, 300000, 1800000}

local function bump(field, n)
  if n > 0 then redis.call('HINCRBY', meta, field, n) end
end

-- One observation of ``ms`` in histogram ``kind`` ('wait' or 'hold'): buckets
-- m_<kind>_b<i> are not cumulative; metrics.py adds them up.
local function observe(kind, ms)
  local index = #BUCKETS
  for i, bound in ipairs(BUCKETS) do
    if ms <= bound then
      index = i - 1
      break
    end
  end
  redis.call('HINCRBY', meta, 'm_' .. kind .. '_b' .. index, 1)
  redis.call('HINCRBY', meta, 'm_' .. kind .. '_sum', math.floor(ms))
end

local function token_of(record)
  if not record then return nil end
  return string.match(record, '^(%d+)|')
end

-- Drops holders and waiters whose leases ran out; returns how many went, and
-- how many of those were waiters. ``waiting``: ZCARD waiters if the caller read
-- it, else nil; 0 skips the scan of wexp (no waiters, so none lapsed).
local function reclaim(waiting)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms, 'LIMIT', 0, BATCH)
  if #gone > 0 then
    redis.call('ZREM', holders, unpack(gone))
    redis.call('HDEL', hinfo, unpack(gone))
    bump('m_expired', #gone)
  end
  local lapsed = 0
  if waiting ~= 0 then
    local list = redis.call('ZRANGEBYSCORE', wexp, '-inf', now_ms, 'LIMIT', 0, BATCH)
    if #list > 0 then
      redis.call('ZREM', waiters, unpack(list))
      redis.call('ZREM', wexp, unpack(list))
      redis.call('HDEL', winfo, unpack(list))
    end
    lapsed = #list
  end
  return #gone + lapsed, lapsed
end

-- Tells blocked waiters that permits are free, with the highest ticket that
-- may now be admitted ('inf': any), so waiters further back sleep on.
-- Publishes nothing when nobody waits or no permit is free.
local function wake(channel)
  if redis.call('ZCARD', waiters) == 0 then return end
  local m = redis.call('HMGET', meta, 'limit', 'override', 'draining')
  if m[3] == '1' then return end
  local free = (tonumber(m[2]) or tonumber(m[1]) or 0) - redis.call('ZCARD', holders)
  if free <= 0 then return end
  local last = redis.call('ZRANGE', waiters, free - 1, free - 1, 'WITHSCORES')
  redis.call('PUBLISH', channel, last[2] or 'inf')
end

-- Restarts the idle expiry of every key. ``no_waiters``: the caller knows the
-- waiter keys are absent (PEXPIRE would do nothing on them), so it skips them.
local function touch(idle_ms, no_waiters)
  for i = 1, 6 do
    if not (no_waiters and i >= 3 and i <= 5) then
      redis.call('PEXPIRE', KEYS[i], idle_ms)
    end
  end
end

local function earliest_expiry()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end
