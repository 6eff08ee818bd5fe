-- counts.lua: the figures of one semaphore a metrics scrape exports; changes nothing.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua; a reader: pause 0).
-- ARGV: arguments.py's CountsArgs, then any number of MetaField, read as ARGV[ARG.<name>]:
-- ARG.horizon_ms   entries of ``sent`` older than this are not counted
-- ARG.fields.name  a meta field to answer with as it is (metrics.py: family and the m_*
--                  counters)
--
-- Returns {now ms, recorded limit or '', effective limit, draining 0/1, live holders,
-- live waiters, parked, handed over, sent, the effective rate ("<interval µs>|<burst>"
-- or ''), until when a RateLimited pause lasts (ms; 0: none), fair keys with waiters in
-- line, the permits kept by worker processes between tasks, {the value of each field
-- asked, or '' if absent}}: each figure as status.lua reports it for a caller that
-- declares no limit and no rate (the CLI, the metrics).
--
-- Each figure is a meta field or one ZCOUNT (O(log n)), but for the kept permits: no
-- entry of the line is read one by one, so a call costs the same with a line of ten
-- waiters or of a million. The kept permits are counted among the live holders'
-- members (KEPT_PREFIX), read one by one: the holders are at most the limit's worth
-- (more only for a while after the limit was lowered).
-- status.lua's lists, and what only they tell (the sent tasks whose place lapsed: a
-- lookup in wexp per sent entry; which fair keys wait most: a scan of meta), are not
-- read.

local horizon_ms = tonumber(ARGV[ARG.horizon_ms])
local fields = {'limit', 'override', 'draining', 'n_parked', 'n_handed', 'rate',
  'rate_override', 'rate_pause', 'n_fair_keys'}
local asked = {}
for i = ARG.fields.first, EPOCH_ARG - 1, ARG.fields.size do
  local field = ARGV[i + ARG.fields.name]
  asked[#asked + 1] = field
  fields[#fields + 1] = field
end
local m = load_meta(fields)

local values = {}
for i = 1, #asked do values[i] = m[asked[i]] or '' end
local rate = effective_rate(m)
local pause = tonumber(m.rate_pause) or 0
local kept = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', holders, '(' .. now_ms, '+inf')) do
  if string.sub(member, 1, #KEPT_PREFIX) == KEPT_PREFIX then kept = kept + 1 end
end

return {
  now_ms, m.limit or '', effective_limit(m, ''), m.draining == '1' and 1 or 0,
  redis.call('ZCOUNT', holders, '(' .. now_ms, '+inf'),
  redis.call('ZCOUNT', wexp, '(' .. now_ms, '+inf'),
  math.max(0, tonumber(m.n_parked) or 0), math.max(0, tonumber(m.n_handed) or 0),
  redis.call('ZCOUNT', sent, now_ms - horizon_ms, '+inf'),
  rate and fmt(rate.interval) .. '|' .. fmt(rate.burst) or '',
  pause > now_ms and pause or 0,
  math.max(0, tonumber(m.n_fair_keys) or 0),
  kept,
  values,
}
