-- admit.lua: how one semaphore weighs a contender, prepended after the prelude (common_*.lua) to
-- acquire.lua (one semaphore) and acquire_all.lua (several: use() first), so both
-- judge a semaphore alike. See acquire.lua's header for what each step does.
--
-- ``g``, a semaphore's arguments: holder, declared, lease_ms, waiter_ms, presented,
-- info, idle_ms, channel, handover, cfg, family, shadow, weight, want_k, want_j (and
-- its rate: declared_rate, set by the caller or use()).
-- ``s``, its state in this call: made by open_gate(), filled in by the others.

local ACQUIRE_FIELDS = {'limit', 'override', 'draining', 'fence', 'ticket', 'hold_ms', 'grant_at',
  'grant_gap_ms', 'family', 'rate', 'rate_override', 'tat', 'rate_pause', 'released', 'handover',
  'n_weighted', 'expiry', 'shadow'}
-- A contender under a shadow concurrency limit also reads the peak it may raise (grant_gate()).
-- (Built by a loop: a Functions library is loaded without unpack.)
local SHADOW_LIMIT_FIELDS = {'m_shadow_peak'}
for i = 1, #ACQUIRE_FIELDS do SHADOW_LIMIT_FIELDS[i + 1] = ACQUIRE_FIELDS[i] end

-- Reclaims, reads meta once (``freeing``: also what after_free() needs, whether or not
-- something was reclaimed), drops a holder restored by id alone, and finds the
-- contender's ticket: its own place, or the one it presents if earlier.
local function open_gate(g, freeing)
  local holder = g.holder
  redis.call('ZREM', sent, holder)  -- its task has reached a worker
  local s = {}
  s.waiting = redis.call('ZCARD', waiters)
  local lapsed
  s.reclaimed, lapsed = reclaim(nil, s.waiting)
  if lapsed > 0 then s.waiting = redis.call('ZCARD', waiters) end
  local shadow_limit = string.find(g.shadow, 'l', 1, true)
  local m = load_meta(shadow_limit and SHADOW_LIMIT_FIELDS or ACQUIRE_FIELDS,
    freeing or s.reclaimed > 0)
  s.m = m
  s.limit, s.draining = effective_limit(m, g.declared), m.draining == '1'
  local meta_writes = {}  -- field, value, ...: one HSET at the end
  if m.limit ~= g.declared then
    meta_writes = {'limit', g.declared}
  end
  if g.family ~= '' and m.family ~= g.family then
    table.insert(meta_writes, 'family')
    table.insert(meta_writes, g.family)
  end
  if declared_rate ~= (m.rate or '') then
    table.insert(meta_writes, 'rate')
    table.insert(meta_writes, declared_rate)
  end
  if g.shadow ~= (m.shadow or '') then
    table.insert(meta_writes, 'shadow')
    table.insert(meta_writes, g.shadow)
  end
  s.meta_writes = meta_writes
  s.room, s.next_us = rate_room(m)

  local held = redis.call('ZSCORE', holders, holder)
  local held_record = held and redis.call('HGET', hinfo, holder)
  if held and token_of(held_record) == '0' then
    redis.call('ZREM', holders, holder)
    vacate(holder, held_weight(held_record))
    redis.call('HDEL', hinfo, holder)
    redis.call('HINCRBY', epoch_key, 'restored', -1)
    held = nil
  end
  s.held, s.held_record = held, held_record
  local ticket
  if s.waiting > 0 then
    ticket = tonumber(redis.call('ZSCORE', waiters, holder))
  end
  s.in_line = ticket ~= nil
  if s.in_line and g.handover == '' then
    -- Asking in person: a payload it parked earlier must not bring a second copy.
    local record = redis.call('HGET', parked, holder)
    if state_in(record) == 'p' then forget({holder}, {record}) end
  end
  if g.presented and (not ticket or g.presented < ticket) then
    ticket = g.presented
  end
  s.ticket = ticket
  return s
end

-- Whether the semaphore admits the contender at ``ticket`` (nil: none, behind everyone).
local function weigh_gate(s, g, ticket)
  local m, waiting, room = s.m, s.waiting, s.room
  local ahead = waiting
  if ticket and waiting > 0 then
    ahead = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket))
  end
  local count = redis.call('ZCARD', holders)
  local free = s.limit - count
  if paused(m) then free = 0 end
  -- The permits and grants this contender needs free: its own and those of the waiters
  -- ahead (one each unless weighted; counted only while they could all fit).
  local need_k, need_j = ahead, ahead
  if ahead > 0 and ahead < math.max(free, room == math.huge and 0 or room) then
    need_k, need_j = weight_ahead(m, ahead)
  end
  need_k, need_j = need_k + g.want_k, need_j + g.want_j

  local by_limit, by_rate, would = need_k <= free, need_j <= room, ''
  if not s.held and not paused(m) then
    if not by_limit and string.find(g.shadow, 'l', 1, true) then by_limit, would = true, 'l' end
    if not by_rate and string.find(g.shadow, 'r', 1, true) then by_rate, would = true, would .. 'r' end
  end
  s.ahead, s.count, s.free, s.need_k, s.need_j, s.would = ahead, count, free, need_k, need_j, would
  return (s.held or (by_limit and by_rate)) and true or false
end

-- Grants the permit (a holder of a live one: the same seats, a new token); the
-- reply's code-1 fields, without the handovers.
local function grant_gate(s, g)
  local m, holder, meta_writes, held, held_record = s.m, g.holder, s.meta_writes, s.held, s.held_record
  local acquired = now_ms
  if held then
    acquired = tonumber(string.match(held_record or '', '^%d+|(%d+)')) or now_ms
  end
  local waited = 0
  if s.in_line then
    if any_weighted(m) then count_fair_grant(records_of({'w|' .. holder})[1]) end
    local first = string.match(redis.call('HGET', winfo, holder) or '', '^(%d+)|')
    if first then waited = now_ms - tonumber(first) end
    -- Arrived by a handover: arrival() made its record a tombstone already.
    leave_line({holder}, g.handover == '' and 'served' or nil, m)
  end
  local token = seq_after(m.fence)
  meta_writes[#meta_writes + 1] = 'fence'
  meta_writes[#meta_writes + 1] = fmt(token)
  -- The pace at which permits change hands while others wait: what a place in
  -- line is worth in time (hold / limit assumes instant hand-overs).
  if s.waiting > (s.in_line and 1 or 0) and m.grant_at then
    meta_writes[#meta_writes + 1] = 'grant_gap_ms'
    meta_writes[#meta_writes + 1] = fmt(paced(m.grant_at, m.grant_gap_ms))
  end
  meta_writes[#meta_writes + 1] = 'grant_at'
  meta_writes[#meta_writes + 1] = fmt(now_ms)
  if not held then spend_rate(m, g.want_j, meta_writes) end
  local expires = now_ms + g.lease_ms
  local k = held and held_weight(held_record) or g.want_k
  occupy(holder, expires, k)
  redis.call('HSET', hinfo, holder, holder_record(fmt(token), fmt(acquired), k, g.info))
  bump('m_granted', 1)
  observe('wait', waited)
  local late_ms = 0
  local would = s.would
  if would ~= '' then
    if string.find(would, 'l', 1, true) then
      bump('m_shadow_limit', 1)
      -- The permits held now, over the limit: the peak the shadow limit would have had to allow.
      local peak = s.count + k
      if peak > (tonumber(m.m_shadow_peak) or 0) then
        meta_writes[#meta_writes + 1] = 'm_shadow_peak'
        meta_writes[#meta_writes + 1] = fmt(peak)
      end
    end
    if string.find(would, 'r', 1, true) then
      late_ms = math.ceil(slot_in(m, s.room, s.next_us, s.need_j) / 1000)
      bump('m_shadow_rate', 1)
      bump('m_shadow_wait_ms', late_ms)
    end
  end
  s.granted = true
  return {token, expires, now_ms, waited, would, late_ms}
end

-- Not granted: with ``lease_ms`` > 0 it stands in line at ``ticket`` for that long
-- (``in_place``: marked waiting in place; else such a mark is cleared). ``counted``:
-- this semaphore refused it (m_refused, and m_throttled if only its rate did). The
-- reply's code-0 fields, without the handovers (ticket 0: not in line here).
local function refuse_gate(s, g, ticket, lease_ms, in_place, counted)
  local m, holder = s.m, g.holder
  local queued = 0
  if lease_ms > 0 then
    stand_in_line(m, holder, ticket, lease_ms, g.info, g.weight, g.channel)
    if in_place then
      mark_in_place(holder, g.lease_ms)
    elseif s.in_line then
      unmark_in_place(holder, redis.call('HGET', parked, holder))
    end
    queued = ticket
    s.waiting = s.waiting + 1
  end
  if counted then
    bump('m_refused', 1)
    if s.need_k <= s.free then bump('m_throttled', 1) end
  end
  local room = s.room
  local slot = ''
  if room ~= math.huge then slot = fmt(slot_in(m, room, s.next_us, s.need_j)) end
  local rate_pause = tonumber(m.rate_pause) or 0
  if room == math.huge or rate_pause <= now_ms then rate_pause = 0 end
  return {queued, s.ahead + 1, s.count, s.limit, s.draining and 1 or 0, earliest_expiry(), now_ms,
    tonumber(m.hold_ms) or 0, tonumber(m.grant_gap_ms) or 0, resumes_ms, slot, rate_pause}
end

-- Takes the contender out of this line, where it had a place (acquire_all.lua: a
-- semaphore that would admit it while another refuses).
local function leave_gate(s, g)
  if not s.in_line then return end
  unmark_in_place(g.holder, redis.call('HGET', parked, g.holder))
  s.left = leave_line({g.holder}, nil, s.m)
  s.waiting = s.waiting - s.left
end

-- Writes meta, hands on what was freed (or, after a grant under a rate, hands over
-- the next slots' waiters: see dispatch()), restarts the idle expiry; the handovers.
-- The touch (see touch_due()) is skipped only by a grant with nobody in line, which
-- creates at most the holder keys (expired here when it does).
local function finish_gate(s, g)
  local freeing = s.reclaimed > 0 or (s.left or 0) > 0
  local lazy = s.granted and s.waiting == 0 and not freeing and not touch_due(s.m, g.idle_ms)
  local out = {}
  if lazy then
    if s.count == 0 then  -- the first holder made the holder keys: they expire with
      -- the rest, at the noted touch (a caller with a longer idle time noted it), or later
      local ttl = fmt(math.max(g.idle_ms, tonumber(s.m.expiry) - now_ms))
      redis.call('PEXPIRE', holders, ttl)
      redis.call('PEXPIRE', hinfo, ttl)
    end
    if #s.meta_writes > 0 then write_meta(s.m, s.meta_writes) end
    if rate_binds(s.m, s.room) then out = dispatch(s.m, g.declared, g.cfg) end
    return out
  end
  note_touch(s.meta_writes, g.idle_ms, s.waiting > 0)
  write_meta(s.m, s.meta_writes)
  if freeing then
    out = after_free(s.m, g.declared, g.channel, g.cfg)
  elseif s.granted and rate_binds(s.m, s.room) then
    out = dispatch(s.m, g.declared, g.cfg)  -- the next slots' waiters (see dispatch())
  end
  touch(g.idle_ms, s.waiting == 0, true)
  return out
end
