-- status.lua: read the state of one semaphore; changes nothing.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's StatusArgs, read as ARGV[ARG.<name>]:
-- ARG.most         at most this many holders and waiters are listed
-- ARG.horizon_ms   entries of ``sent`` older than this are not counted
-- ARG.declared     the caller's (see effective_limit())
-- ARG.rate         the caller's, or '' for none declared (see "Rates" in common_rates.lua)
-- ARG.fair_top     at most this many fair keys are listed (see below)
--
-- Returns {now ms, recorded limit or '', override or '', effective limit, draining 0/1,
-- live holders, live waiters,
-- {holder, lease expiry ms, hinfo record, ...} earliest lease expiry first (live
-- holders counts permits: a weighted holder's seats too),
-- {holder, ticket, waiter lease expiry ms, winfo record, parked state, weight text, ...}
-- in line order}; parked state: 'p' parked, 'h' handed over, 'w' waiting in place,
-- '' asking itself; weight text: its meta "w|<waiter>" record while fair keys wait
-- (see "The order of the line" in common_order.lua), else '';
-- then how many waiters are parked and how many handed over, how many tasks
-- published with a place have not reached a worker yet (sent, places lapsed or
-- not), {holder, published ms, ...} of the first ``most`` of them whose place
-- lapsed (their message waits in the broker, outside the line), oldest first,
-- and how many of them lapsed among the oldest 10 x ``most`` (a count that
-- stops there; the newer ones most likely still hold their places), when
-- admissions resume after a data loss (ms; 0: not paused); then the rate (see
-- "Rates" in common_rates.lua): the effective one, the override (each "<interval µs>|<burst>"
-- or ''), how many grants it allows now, when the next one after those is
-- allowed (ms), and until when a RateLimited pause lasts (ms; 0: none);
-- then the fair keys with waiters in line (see "The order of the line" in common_order.lua):
-- how many (n_fair_keys), the grants to fair waiters in this minute and the minute
-- before (all keys'), how many key records were read, and {key, waiting, grants in
-- this minute and the minute before, ...} of the ``fair top`` with the most waiting
-- among those read (ties: more grants first, then by key); then what its shadow limits
-- counted (see acquire.lua's ARG.shadow): m_shadow_limit, m_shadow_rate, m_shadow_wait_ms
-- and m_shadow_peak (0 where absent), and the shadow limits recorded (meta.shadow, the
-- last acquirer's declaration: '', 'l', 'r' or 'lr'). The fair key records are read by
-- HSCAN of meta, at most FAIR_SCAN_CALLS calls of FAIR_SCAN_COUNT: a line of more
-- fair keys than that reads a sample (fewer records read than n_fair_keys). With no
-- fair key (n_fair_keys 0) none of this reads anything more, and a waiter's fair key
-- (in its row, below) is ''.
-- Entries whose lease ran out (not yet reclaimed) are left out.

local FAIR_SCAN_CALLS, FAIR_SCAN_COUNT = 4, 1000

local most, horizon_ms = tonumber(ARGV[ARG.most]), tonumber(ARGV[ARG.horizon_ms])
local declared = ARGV[ARG.declared]
if ARGV[ARG.rate] ~= '' then declared_rate = ARGV[ARG.rate] end
local fair_top = tonumber(ARGV[ARG.fair_top])
local m = load_meta({'limit', 'override', 'draining', 'n_parked', 'n_handed', 'rate',
  'rate_override', 'tat', 'rate_pause', 'n_fair_keys', 'fair_grants', 'm_shadow_limit',
  'm_shadow_rate', 'm_shadow_wait_ms', 'm_shadow_peak', 'shadow'})
local n_fair_keys = math.max(0, tonumber(m.n_fair_keys) or 0)

local rate, room, next_us = effective_rate(m), rate_room(m)

local listed_holders = {}
local h = redis.call('ZRANGEBYSCORE', holders, '(' .. now_ms, '+inf', 'WITHSCORES', 'LIMIT', 0, most)
for i = 1, #h, 2 do
  if not string.find(h[i], SEAT, 1, true) then  -- a weighted holder's seat: not listed
    listed_holders[#listed_holders + 1] = h[i]
    listed_holders[#listed_holders + 1] = h[i + 1]
    listed_holders[#listed_holders + 1] = redis.call('HGET', hinfo, h[i]) or ''
  end
end

local listed_waiters = {}
local w = redis.call('ZRANGE', waiters, 0, most * 2 - 1, 'WITHSCORES')
for i = 1, #w, 2 do
  if #listed_waiters >= most * 6 then break end
  local lease = tonumber(redis.call('ZSCORE', wexp, w[i]))
  if lease and lease > now_ms then
    listed_waiters[#listed_waiters + 1] = w[i]
    listed_waiters[#listed_waiters + 1] = w[i + 1]
    listed_waiters[#listed_waiters + 1] = fmt(lease)
    listed_waiters[#listed_waiters + 1] = redis.call('HGET', winfo, w[i]) or ''
    local state = state_in(redis.call('HGET', parked, w[i]))
    if state ~= 'p' and state ~= 'h' and state ~= 'w' then state = '' end
    listed_waiters[#listed_waiters + 1] = state
    listed_waiters[#listed_waiters + 1] = ''
  end
end
if n_fair_keys > 0 and #listed_waiters > 0 then
  local fields = {}
  for i = 1, #listed_waiters, 6 do fields[#fields + 1] = 'w|' .. listed_waiters[i] end
  local records = records_of(fields)
  for i = 1, #fields do listed_waiters[6 * i] = records[i] or '' end
end

local fair_grants, fair_read, listed_fair = 0, 0, {}
if n_fair_keys > 0 then
  local all = fair_grants_in(m.fair_grants)
  fair_grants = recent_grants(all.grants, all.minute, all.grants_before)
  local keys, seen = {}, {}
  local found = scan_records('f|*', FAIR_SCAN_CALLS, FAIR_SCAN_COUNT)
  for i = 1, #found, 2 do
    if not seen[found[i]] then  -- HSCAN may return a field twice
      seen[found[i]] = true
      local fair = fair_in(found[i + 1])
      keys[#keys + 1] = {key = string.sub(found[i], 3), waiting = fair.waiting,
        grants = recent_grants(fair.grants, fair.minute, fair.grants_before)}
    end
  end
  fair_read = #keys
  table.sort(keys, function(a, b)
    if a.waiting ~= b.waiting then return a.waiting > b.waiting end
    if a.grants ~= b.grants then return a.grants > b.grants end
    return a.key < b.key
  end)
  for i = 1, math.min(fair_top, #keys) do
    listed_fair[#listed_fair + 1] = keys[i].key
    listed_fair[#listed_fair + 1] = fmt(keys[i].waiting)
    listed_fair[#listed_fair + 1] = fmt(keys[i].grants)
  end
end

local sent_count = redis.call('ZCOUNT', sent, now_ms - horizon_ms, '+inf')
local listed_sent, lapsed_count = {}, 0
if sent_count > 0 then
  local s = redis.call('ZRANGEBYSCORE', sent, now_ms - horizon_ms, '+inf', 'WITHSCORES',
    'LIMIT', 0, most * 10)
  for i = 1, #s, 2 do
    local lease = tonumber(redis.call('ZSCORE', wexp, s[i]))
    if not lease or lease <= now_ms then
      lapsed_count = lapsed_count + 1
      if lapsed_count <= most then
        listed_sent[#listed_sent + 1] = s[i]
        listed_sent[#listed_sent + 1] = s[i + 1]
      end
    end
  end
end

return {
  now_ms, m.limit or '', m.override or '', effective_limit(m, declared),
  m.draining == '1' and 1 or 0,
  redis.call('ZCOUNT', holders, '(' .. now_ms, '+inf'),
  redis.call('ZCOUNT', wexp, '(' .. now_ms, '+inf'),
  listed_holders, listed_waiters, math.max(0, tonumber(m.n_parked) or 0),
  math.max(0, tonumber(m.n_handed) or 0), sent_count, listed_sent, lapsed_count, resumes_ms,
  rate and fmt(rate.interval) .. '|' .. fmt(rate.burst) or '', m.rate_override or '',
  rate and room or 0, rate and fmt(now_ms + math.ceil(next_us / 1000)) or 0,
  math.max(0, (tonumber(m.rate_pause) or 0) > now_ms and tonumber(m.rate_pause) or 0),
  n_fair_keys, fair_grants, fair_read, listed_fair,
  tonumber(m.m_shadow_limit) or 0, tonumber(m.m_shadow_rate) or 0,
  tonumber(m.m_shadow_wait_ms) or 0, tonumber(m.m_shadow_peak) or 0, m.shadow or '',
}
