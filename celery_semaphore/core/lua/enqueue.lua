-- enqueue.lua: take a place in line without asking for a permit (at publish time).
--
-- KEYS: the ten of common.lua; the last ARGV: the epoch (common.lua).
-- ARGV[1] holder           id of the future contender (the task id)
-- ARGV[2] waiter lease ms  how long the place holds while nobody asks
-- ARGV[3] info             free text stored with the waiter
-- ARGV[4] idle ms
-- ARGV[5] declared limit   the caller's (see effective_limit()); recorded only where
--                          none is (status() then knows the semaphore)
-- ARGV[6] family           '' or the family recorded with the limit (metrics.py)
-- ARGV[7] sent horizon ms  how long the task is counted as sent while it has not
--                          reached a worker (see KEYS[9] in common.lua)
-- ARGV[8] wake channel     for after_free() (handing over nothing), when reclaiming
--                          made room
-- ARGV[9] rate             '' or the caller's rate (see "Rates" in common.lua)
-- ARGV[10] weight          "<permits>|<grants>" it will ask for, or '' (1|1; see
--                          "Weights" in common.lua), with its priority and fair key if
--                          it has them (see "The order of the line" there)
--
-- Returns {ticket, position, holders, effective limit, draining 0/1, µs until the
-- rate allows it a grant ('' without a rate)}: the ticket already held by this
-- holder, or a new one, and where it stands.

local holder, waiter_lease_ms, info, idle_ms = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local declared, family, horizon_ms, channel = ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8]
declared_rate = ARGV[9]
local weight = ARGV[10] or ''

local waiting = redis.call('ZCARD', waiters)
local reclaimed = reclaim(nil, waiting)
local m = load_meta({'limit', 'override', 'draining', 'ticket', 'rate', 'rate_override', 'tat',
  'rate_pause', 'n_weighted'}, reclaimed > 0)
if reclaimed > 0 then
  after_free(m, declared, channel, '')
  waiting = redis.call('ZCARD', waiters)
end
if not m.limit then
  write_meta(m, family ~= '' and {'limit', declared, 'family', family} or {'limit', declared})
end
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
if not ticket then
  local writes = {}
  ticket = new_ticket(m, weight, writes)
  write_meta(m, writes)
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info)
  redis.call('ZREMRANGEBYSCORE', sent, '-inf', now_ms - horizon_ms)
  redis.call('ZADD', sent, 'NX', now_ms, holder)
  redis.call('PEXPIRE', sent, horizon_ms)
end
local ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket))
weigh_waiter(m, holder, weight)
redis.call('ZADD', wexp, now_ms + waiter_lease_ms, holder)
touch(idle_ms)
local room, next_us = rate_room(m)
local slot = ''
if room ~= math.huge then
  local _, need_j = weight_ahead(m, ahead)
  slot = fmt(slot_in(m, room, next_us, need_j + select(2, weight_in(weight))))
end
return {ticket, ahead + 1, redis.call('ZCARD', holders), effective_limit(m, declared),
  m.draining == '1' and 1 or 0, slot}
