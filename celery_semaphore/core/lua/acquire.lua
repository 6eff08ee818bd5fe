-- acquire.lua: take a permit, or take/keep a place in line. Never blocks.
--
-- KEYS: the ten of common.lua; the last ARGV: the epoch (common.lua).
-- ARGV[1] holder           id of the contender
-- ARGV[2] declared limit   the caller's (see effective_limit()); recorded in meta.limit
-- ARGV[3] lease ms         lease of a granted permit
-- ARGV[4] waiter lease ms  how long a refused contender keeps its place; 0: don't queue
-- ARGV[5] ticket           a ticket presented again, or ''
-- ARGV[6] info             free text stored with the holder/waiter (shown by status)
-- ARGV[7] idle ms          every key expires after this long without use
-- ARGV[8] wake channel     for after_free(), when reclaiming made room
-- ARGV[9] handover token   the token of the handed-over copy this is, or ''
-- ARGV[10] dispatch        '' or "<max block ms>|<deadline ms>|<rate lead ms>" (common.lua)
-- ARGV[11] in place        '1': the contender, if refused, waits in place (subscribed
--                          to the wake channel): a release may grant it the permit
--                          directly (see grant_in_place()); '': it does not
-- ARGV[12] family          '' or the family of semaphores this one belongs to (recorded
--                          in meta.family for metrics.py)
-- ARGV[13] rate            '' or the caller's rate, "<interval µs>|<burst>" (see "Rates"
--                          in common.lua); recorded in meta.rate
-- ARGV[14] shadow          the caller's limits that only count, never refuse: '', 'l'
--                          (the concurrency limit), 'r' (the rate) or 'lr'. A grant one of
--                          them would have refused counts in m_shadow_limit / m_shadow_rate
--                          (and how late the rate's slot was, in m_shadow_wait_ms); the
--                          rate's schedule moves on as if enforced, so its lateness grows
--                          while tasks start faster than the rate. A drain still refuses.
-- ARGV[15] weight          "<permits>|<grants>" the contender asks for at once, or ''
--                          (1|1; see "Weights" in common.lua)
--
-- Returns {1, fencing token, lease expiry ms, now ms, waited ms, the shadow limits that
-- would have refused it ('', 'l', 'r', 'lr'), ms its slot was ahead by a shadow rate, handovers}
-- when granted, {0, ticket, position, holders, effective limit, draining 0/1,
-- earliest lease expiry ms or 0, now ms, average hold ms or 0, average ms
-- between grants while others wait or 0, when admissions resume after a data
-- loss (ms) or 0, µs until the rate allows this contender a grant (its slot;
-- '' without a rate), when a RateLimited pause of the rate ends (ms) or 0,
-- handovers} when refused (ticket 0:
-- not queued), {2, current handover token} when this is a
-- stale copy of a handed-over waiter (changes nothing). ``handovers``:
-- {holder, token, payload, delay ms, ...} due after reclaiming, or, under a rate,
-- after a grant (the next slots: see dispatch()). A contender the rate alone refuses
-- (a permit was free for it) counts in m_throttled.
-- A holder that already holds a live permit is granted again: same slot, new token;
-- but one restored by id after a data loss (token 0) asks because it held nothing
-- (it was waiting): that entry is dropped and it asks like anyone else.

local holder, declared = ARGV[1], ARGV[2]
local lease_ms, waiter_lease_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local presented, info, idle_ms, channel = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), ARGV[8]
local handover, cfg, in_place = ARGV[9], ARGV[10], ARGV[11] == '1'
local family = ARGV[12]
declared_rate = ARGV[13]
local shadow = ARGV[14]
local weight = ARGV[15] or ''
local want_k, want_j = weight_in(weight)

if handover ~= '' and arrival(holder, handover) == 'stale' then
  return {2, token_of(redis.call('HGET', parked, holder))}
end

redis.call('ZREM', sent, holder)  -- its task has reached a worker
local waiting = redis.call('ZCARD', waiters)
local reclaimed, lapsed = reclaim(nil, waiting)
if lapsed > 0 then waiting = redis.call('ZCARD', waiters) end
local m = load_meta({'limit', 'override', 'draining', 'fence', 'ticket', 'hold_ms', 'grant_at',
  'grant_gap_ms', 'family', 'rate', 'rate_override', 'tat', 'rate_pause', 'released', 'handover',
  'n_weighted'},
  reclaimed > 0)
local limit, draining = effective_limit(m, declared), m.draining == '1'
local meta_writes = {}  -- field, value, ...: one HSET at the end
if m.limit ~= declared then
  meta_writes = {'limit', declared}
end
if family ~= '' and m.family ~= family then
  table.insert(meta_writes, 'family')
  table.insert(meta_writes, family)
end
if declared_rate ~= (m.rate or '') then
  table.insert(meta_writes, 'rate')
  table.insert(meta_writes, declared_rate)
end
local room, next_us = rate_room(m)

local held = redis.call('ZSCORE', holders, holder)
local held_record = held and redis.call('HGET', hinfo, holder)
if held and token_of(held_record) == '0' then
  redis.call('ZREM', holders, holder)
  vacate(holder, held_weight(held_record))
  redis.call('HDEL', hinfo, holder)
  redis.call('HINCRBY', epoch_key, 'restored', -1)
  held = nil
end
local ticket
if waiting > 0 then
  ticket = tonumber(redis.call('ZSCORE', waiters, holder))
end
local in_line = ticket ~= nil
if in_line and handover == '' then
  -- Asking in person: a payload it parked earlier must not bring a second copy.
  local record = redis.call('HGET', parked, holder)
  if state_in(record) == 'p' then forget({holder}, {record}) end
end
if presented and (not ticket or presented < ticket) then
  ticket = presented
end
local ahead = waiting
if ticket and waiting > 0 then
  ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket))
end
local count = redis.call('ZCARD', holders)
local free = limit - count
if paused(m) then free = 0 end
-- The permits and grants this contender needs free: its own and those of the waiters
-- ahead (one each unless weighted; counted only while they could all fit).
local need_k, need_j = ahead, ahead
if ahead > 0 and ahead < math.max(free, room == math.huge and 0 or room) then
  need_k, need_j = weight_ahead(m, ahead)
end
need_k, need_j = need_k + want_k, need_j + want_j

local by_limit, by_rate, would = need_k <= free, need_j <= room, ''
if not held and not paused(m) then
  if not by_limit and string.find(shadow, 'l', 1, true) then by_limit, would = true, 'l' end
  if not by_rate and string.find(shadow, 'r', 1, true) then by_rate, would = true, would .. 'r' end
end

local result
if held or (by_limit and by_rate) then
  local acquired = now_ms
  if held then
    acquired = tonumber(string.match(held_record or '', '^%d+|(%d+)')) or now_ms
  end
  local waited = 0
  if in_line then
    local first = string.match(redis.call('HGET', winfo, holder) or '', '^(%d+)|')
    if first then waited = now_ms - tonumber(first) end
    -- Arrived by a handover: arrival() made its record a tombstone already.
    leave_line({holder}, handover == '' and 'served' or nil, m)
  end
  local token = seq_after(m.fence)
  meta_writes[#meta_writes + 1] = 'fence'
  meta_writes[#meta_writes + 1] = fmt(token)
  -- The pace at which permits change hands while others wait: what a place in
  -- line is worth in time (hold / limit assumes instant hand-overs).
  if waiting > (in_line and 1 or 0) and m.grant_at then
    meta_writes[#meta_writes + 1] = 'grant_gap_ms'
    meta_writes[#meta_writes + 1] = fmt(paced(m.grant_at, m.grant_gap_ms))
  end
  meta_writes[#meta_writes + 1] = 'grant_at'
  meta_writes[#meta_writes + 1] = fmt(now_ms)
  if not held then spend_rate(m, want_j, meta_writes) end
  local expires = now_ms + lease_ms
  local k = held and held_weight(held_record) or want_k
  occupy(holder, expires, k)
  redis.call('HSET', hinfo, holder, holder_record(fmt(token), fmt(acquired), k, info))
  bump('m_granted', 1)
  observe('wait', waited)
  local late_ms = 0
  if would ~= '' then
    if string.find(would, 'l', 1, true) then bump('m_shadow_limit', 1) end
    if string.find(would, 'r', 1, true) then
      late_ms = math.ceil(slot_in(m, room, next_us, need_j) / 1000)
      bump('m_shadow_rate', 1)
      bump('m_shadow_wait_ms', late_ms)
    end
  end
  result = {1, token, expires, now_ms, waited, would, late_ms}
else
  local queued = 0
  if waiter_lease_ms > 0 then
    if not ticket then
      ticket = seq_after(m.ticket)
      meta_writes[#meta_writes + 1] = 'ticket'
      meta_writes[#meta_writes + 1] = fmt(ticket)
    end
    stand_in_line(m, holder, ticket, waiter_lease_ms, info, weight)
    if in_place then
      mark_in_place(holder, lease_ms)
    elseif in_line then
      unmark_in_place(holder, redis.call('HGET', parked, holder))
    end
    queued = ticket
    waiting = waiting + 1
  end
  bump('m_refused', 1)
  if need_k <= free then bump('m_throttled', 1) end
  local slot = ''
  if room ~= math.huge then slot = fmt(slot_in(m, room, next_us, need_j)) end
  local rate_pause = tonumber(m.rate_pause) or 0
  if room == math.huge or rate_pause <= now_ms then rate_pause = 0 end
  result = {0, queued, ahead + 1, count, limit, draining and 1 or 0, earliest_expiry(), now_ms,
    tonumber(m.hold_ms) or 0, tonumber(m.grant_gap_ms) or 0, resumes_ms, slot, rate_pause}
end
if #meta_writes > 0 then
  write_meta(m, meta_writes)
end
local out = {}
if reclaimed > 0 then
  out = after_free(m, declared, channel, cfg)
elseif result[1] == 1 and room ~= math.huge then
  out = dispatch(m, declared, cfg)  -- the next slots' waiters (see dispatch())
end
result[#result + 1] = out
touch(idle_ms, waiting == 0)
return result
