-- enqueue.lua: take a place in line without asking for a permit (at publish time).
--
-- KEYS: the nine of common.lua.
-- ARGV[1] holder           id of the future contender (the task id)
-- ARGV[2] waiter lease ms  how long the place holds while nobody asks
-- ARGV[3] info             free text stored with the waiter
-- ARGV[4] idle ms
-- ARGV[5] declared limit   recorded where no limit is (status() then knows the semaphore);
--                          the position is measured against the recorded one (what the
--                          contenders declared), else this one
-- ARGV[7] sent horizon ms  how long the task is counted as sent while it has not
--                          reached a worker (see KEYS[9] in common.lua)
-- ARGV[6] family           '' or the family recorded with the limit (metrics.py)
--
-- Returns {ticket, position, holders, effective limit, draining 0/1}: the
-- ticket already held by this holder, or a new one, and where it stands.

local holder, waiter_lease_ms, info, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local declared = ARGV[5]

local waiting = redis.call('ZCARD', waiters)
local _, lapsed = reclaim(waiting)
if lapsed > 0 then waiting = redis.call('ZCARD', waiters) end
local m = redis.call('HMGET', meta, 'limit', 'override', 'draining')
if not m[1] then
  redis.call('HSET', meta, 'limit', declared)
  if ARGV[6] ~= '' then redis.call('HSET', meta, 'family', ARGV[6]) end
end
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
local ahead = waiting
if ticket then
  ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket))
else
  ticket = next_seq('ticket')
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info)
  local horizon_ms = tonumber(ARGV[7])
  redis.call('ZREMRANGEBYSCORE', sent, '-inf', now_ms - horizon_ms)
  redis.call('ZADD', sent, 'NX', now_ms, holder)
  redis.call('PEXPIRE', sent, horizon_ms)
end
redis.call('ZADD', wexp, now_ms + waiter_lease_ms, holder)
touch(idle_ms)
local limit = tonumber(m[2]) or tonumber(m[1]) or tonumber(declared)
return {ticket, ahead + 1, redis.call('ZCARD', holders), limit, m[3] == '1' and 1 or 0}
