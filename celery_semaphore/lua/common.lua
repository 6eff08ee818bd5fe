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

local holders, hinfo, waiters, wexp, winfo, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)
local BATCH = 1000

local function fmt(n)
  return string.format('%.0f', n)
end

local function next_seq(field)
  local last = tonumber(redis.call('HGET', meta, field) or '0') or 0
  local value = math.max(last + 1, now_us)
  redis.call('HSET', meta, field, fmt(value))
  return value
end

local function token_of(record)
  if not record then return nil end
  return string.match(record, '^(%d+)|')
end

-- Drops holders and waiters whose leases ran out; returns how many went.
local function reclaim()
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms, 'LIMIT', 0, BATCH)
  if #gone > 0 then
    redis.call('ZREM', holders, unpack(gone))
    redis.call('HDEL', hinfo, unpack(gone))
  end
  local lapsed = redis.call('ZRANGEBYSCORE', wexp, '-inf', now_ms, 'LIMIT', 0, BATCH)
  if #lapsed > 0 then
    redis.call('ZREM', waiters, unpack(lapsed))
    redis.call('ZREM', wexp, unpack(lapsed))
    redis.call('HDEL', winfo, unpack(lapsed))
  end
  return #gone + #lapsed
end

-- The runtime override wins over the declared limit; draining admits nobody.
local function effective_limit(declared)
  local m = redis.call('HMGET', meta, 'override', 'draining')
  local limit = tonumber(m[1]) or declared
  return limit, m[2] == '1'
end

local function wake(channel)
  if redis.call('ZCARD', waiters) > 0 then
    redis.call('PUBLISH', channel, '1')
  end
end

local function touch(idle_ms)
  for i = 1, 6 do
    redis.call('PEXPIRE', KEYS[i], idle_ms)
  end
end

local function earliest_expiry()
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end
