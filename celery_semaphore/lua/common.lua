-- common.lua: prepended to every script of this folder (see celery_semaphore/scripts.py).
--
-- KEYS (the same six, in this order, for every script; one hash tag per semaphore):
--   KEYS[1] holders  ZSET  holder -> lease expiry, ms of server time
--   KEYS[2] hinfo    HASH  holder -> "<fencing token>|<acquired ms>|<info>"
--   KEYS[3] waiters  ZSET  holder -> ticket (place in line; lower goes first)
--   KEYS[4] wexp     ZSET  holder -> waiter lease expiry, ms of server time
--   KEYS[5] winfo    HASH  holder -> "<first ask ms>|<info>"
--   KEYS[6] meta     HASH  limit (declared), override, draining, fence, ticket, hold_ms
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

-- The next fence or ticket after ``last`` (the meta field's value, or nil); the
-- caller stores it (acquire writes all its meta fields in one HSET).
local function next_seq(last)
  return math.max((tonumber(last) or 0) + 1, now_us)
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

local function wake(channel)
  if redis.call('ZCARD', waiters) > 0 then
    redis.call('PUBLISH', channel, '1')
  end
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
