-- release.lua: give a permit back; without a token, also leave the line.
--
-- KEYS: the nine of common.lua.
-- ARGV[1] holder
-- ARGV[2] fencing token, or '' to release whatever this holder holds and drop
--         its place in line (the by-id release of a worker that lost the child)
-- ARGV[3] idle ms
-- ARGV[4] wake channel
-- ARGV[5] dispatch   '' or "<max block ms>|<deadline ms>" (common.lua)
-- ARGV[6] declared limit  of the caller: a permit freed here may go straight to a
--                        waiter in place (grant_in_place()) within this limit
--
-- Keeps meta.hold_ms, a moving average of hold times (acquire reports it to waiters),
-- and counts m_abandoned: places in line given up (timeout, revoke).
-- A freed permit goes straight to the next waiter if it waits in place (see
-- grant_in_place() in common.lua); others are woken on the wake channel.
-- Returns {released 0/1, held ms (0 if nothing released), handovers}: the
-- parked waiters now due (see dispatch()). Idempotent: a second release, an
-- unknown or expired holder, or a stale token releases nothing.

local holder, token, idle_ms, channel, cfg = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local declared = ARGV[6]

local waiting = redis.call('ZCARD', waiters)
local reclaimed, lapsed = reclaim(waiting)
if lapsed > 0 then waiting = redis.call('ZCARD', waiters) end
local released, held_ms = 0, 0
local record = redis.call('HGET', hinfo, holder)
if (token == '' or token_of(record) == token) and redis.call('ZREM', holders, holder) == 1 then
  redis.call('HDEL', hinfo, holder)
  released = 1
  held_ms = now_ms - (tonumber(string.match(record or '', '^%d+|(%d+)|')) or now_ms)
  local average = tonumber(redis.call('HGET', meta, 'hold_ms'))
  average = average and (0.8 * average + 0.2 * held_ms) or held_ms
  redis.call('HSET', meta, 'hold_ms', fmt(average))
  observe('hold', held_ms)
  bump('released', 1)
end
if token == '' then redis.call('ZREM', sent, holder) end  -- revoked before it asked
if token == '' and waiting > 0 then
  bump('m_abandoned', redis.call('ZREM', waiters, holder))
  redis.call('ZREM', wexp, holder)
  redis.call('HDEL', winfo, holder)
  unpark(holder)
end
local out = {}
if (released == 1 or reclaimed > 0) and waiting > 0 then
  grant_in_place(channel, declared)
  wake(channel)
  out = dispatch(cfg)
end
touch(idle_ms, waiting == 0)
return {released, held_ms, out}
