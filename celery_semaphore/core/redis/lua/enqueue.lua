-- enqueue.lua: take a place in line without asking for a permit (at publish time).
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's EnqueueArgs (then its Far, or not), read as ARGV[ARG.<name>]:
-- ARG.holder       id of the future contender (the task id)
-- ARG.waiter_ms    how long the place holds while nobody asks
-- ARG.info         free text stored with the waiter
-- ARG.idle_ms
-- ARG.declared     the caller's limit (see effective_limit()); recorded only where
--                  none is (status() then knows the semaphore)
-- ARG.family       '' or the family recorded with the limit (metrics.py)
-- ARG.horizon_ms   the sent horizon: how long the task is counted as sent while it has
--                  not reached a worker (see KEYS[9] in common_keys.lua)
-- ARG.channel      the wake channel, for after_free() (handing over nothing), when
--                  reclaiming made room
-- ARG.rate         '' or the caller's rate (see "Rates" in common_rates.lua)
-- ARG.weight       "<permits>|<grants>" it will ask for, or '' (1|1; see
--                  "Weights" in common_weights.lua), with its priority and fair key if
--                  it has them (see "The order of the line" there)
-- ARG.shadow       as acquire.lua's ARG.shadow; recorded in meta.shadow only
--                  where no limit is recorded (see "Shadow limits" in common_rates.lua)
-- Only to park the waiter at once when its turn is far (a publisher that would park the
-- task's message: one call instead of this and park.lua; all six, or none):
-- ARG.window_us    far: draining, or the rate's slot further than this, or at
--                  least (free permits + limit) waiters ahead of it, counting
--                  only the limits that bind (line_limit(), line_room())
--                  (publish.turn_is_near() decides the same from the reply)
-- ARG.head         the payload parked is head .. ticket .. tail (a task's
-- ARG.tail         message names its own ticket)
-- ARG.park_ms      ARG.dispatch, ARG.due_ms: as park.lua's
-- ARG.dispatch
-- ARG.due_ms
--
-- Returns {ticket, position, holders, effective limit, draining 0/1, µs until the
-- rate allows it a grant ('' without a rate)}: the ticket already held by this
-- holder, or a new one, and where it stands; with Far's six, also {..., parked 0/1,
-- {holder, handover token, payload, delay ms, ...}}: whether it parked (then as
-- park.lua: its message no longer counts as sent), and the waiters now due (only
-- when it parked: as park.lua hands over).

local holder, waiter_lease_ms = ARGV[ARG.holder], tonumber(ARGV[ARG.waiter_ms])
local info, idle_ms, declared = ARGV[ARG.info], tonumber(ARGV[ARG.idle_ms]), ARGV[ARG.declared]
local family, horizon_ms = ARGV[ARG.family], tonumber(ARGV[ARG.horizon_ms])
local channel = ARGV[ARG.channel]
declared_rate = ARGV[ARG.rate]
local weight, shadow = ARGV[ARG.weight] or '', ARGV[ARG.shadow] or ''
declared_shadow = shadow
local may_park = EPOCH_ARG > ARG.window_us  -- the six of Far, then the epoch

local waiting = redis.call('ZCARD', waiters)
local reclaimed = reclaim(nil, waiting)
local m = load_meta({'limit', 'override', 'draining', 'ticket', 'rate', 'rate_override', 'tat',
  'rate_pause', 'n_weighted', 'shadow'}, reclaimed > 0 or may_park)
if not m.limit then
  local recorded = family ~= '' and {'limit', declared, 'family', family} or {'limit', declared}
  if shadow ~= '' then
    recorded[#recorded + 1] = 'shadow'
    recorded[#recorded + 1] = shadow
  end
  write_meta(m, recorded)
end
if reclaimed > 0 then
  after_free(m, declared, channel, '')
  waiting = redis.call('ZCARD', waiters)
end
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
local new = not ticket
if new then
  local writes = {}
  ticket = new_ticket(m, weight, writes)
  write_meta(m, writes)
  if redis.call('ZCARD', waiters) == 0 then redis.call('PUBLISH', channel, 'k') end
  redis.call('ZADD', waiters, fmt(ticket), holder)
  redis.call('HSETNX', winfo, holder, fmt(now_ms) .. '|' .. info)
end
local ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket))
weigh_waiter(m, holder, weight)
local room, next_us = rate_room(m)
local slot = ''
if room ~= math.huge then
  local _, need_j = weight_ahead(m, ahead)
  slot = fmt(slot_in(m, room, next_us, need_j + select(2, weight_in(weight))))
end
local n_holders, limit = redis.call('ZCARD', holders), effective_limit(m, declared)
local reply = {ticket, ahead + 1, n_holders, limit, m.draining == '1' and 1 or 0, slot}
local binding, bound_rate = line_limit(m, declared), rate_binds(m, room)
local far = may_park and (m.draining == '1'
  or (bound_rate and slot ~= '' and tonumber(slot) > tonumber(ARGV[ARG.window_us]))
  or ahead >= math.max(0, binding - n_holders) + binding)
if far then
  redis.call('ZADD', wexp, now_ms + tonumber(ARGV[ARG.park_ms]), holder)
  local payload = ARGV[ARG.head] .. fmt(ticket) .. ARGV[ARG.tail]
  leave_payload(m, holder, payload, tonumber(ARGV[ARG.due_ms]))
  touch(idle_ms, false)
  reply[7], reply[8] = 1, dispatch(m, '', ARGV[ARG.dispatch])  -- as park.lua (it declares no limit)
  return reply
end
if new then
  redis.call('ZREMRANGEBYSCORE', sent, '-inf', now_ms - horizon_ms)
  redis.call('ZADD', sent, 'NX', now_ms, holder)
  redis.call('PEXPIRE', sent, horizon_ms)
end
redis.call('ZADD', wexp, now_ms + waiter_lease_ms, holder)
touch(idle_ms)
if may_park then reply[7], reply[8] = 0, {} end
return reply
