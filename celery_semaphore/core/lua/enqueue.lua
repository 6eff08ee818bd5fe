-- enqueue.lua: take a place in line without asking for a permit (at publish time).
--
-- KEYS: the eight of common.lua.
-- ARGV[1] holder           id of the future contender (the task id)
-- ARGV[2] waiter lease ms  how long the place holds while nobody asks
-- ARGV[3] info             free text stored with the waiter
-- ARGV[4] idle ms
--
-- Returns the ticket: the one already held by this holder, or a new one.

local holder, waiter_lease_ms, info, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])

reclaim()
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
if not ticket then
  ticket = next_seq('ticket')
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info)
end
redis.call('ZADD', wexp, now_ms + waiter_lease_ms, holder)
touch(idle_ms)
return ticket
