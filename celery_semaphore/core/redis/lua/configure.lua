-- configure.lua: set or clear a runtime setting of a live semaphore.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's ConfigureArgs, read as ARGV[ARG.<name>]:
-- ARG.field        'override' (the runtime limit), 'draining' ('1': admit nobody),
--                  'rate_override' (the runtime rate, "<interval µs>|<burst>"), or
--                  'rate_pause' (the rate grants nothing for this many ms from now:
--                  a pause that ends later than one already set replaces it; a
--                  semaphore without a rate is not paused)
-- ARG.value        the new value, or '' to clear the setting
-- ARG.idle_ms
-- ARG.channel
-- ARG.dispatch     '' or "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARG.rate         the caller's rate, or '' for none declared (see "Rates" in common_rates.lua)
--
-- Publishes 'k' (processes give kept permits back: kept, they would start tasks past
-- a lowered limit, a drain or a rate; see release.lua).
-- Returns {the previous value or '', handovers}. Then after_free() (the caller
-- declares no limit), so a raised limit or an ended drain admits waiters at once.
--
-- A setting made before any contender recorded its limit (``set-limit`` before
-- a semaphore's first use) does not expire: nothing would refresh it until the
-- first task comes, however long after. That first acquire or enqueue records
-- the limit and touches every key, so idle expiry applies from then on.

local field, value, idle_ms = ARGV[ARG.field], ARGV[ARG.value], tonumber(ARGV[ARG.idle_ms])
local channel, cfg = ARGV[ARG.channel], ARGV[ARG.dispatch]
if ARGV[ARG.rate] ~= '' then declared_rate = ARGV[ARG.rate] end
local SETTINGS = {override = true, draining = true, rate_override = true, rate_pause = true}
if not SETTINGS[field] then
  return redis.error_reply('ERR unknown semaphore setting ' .. field)
end
local m = load_meta({}, true)
local previous = m[field] or ''
if field == 'rate_pause' and value ~= '' then
  if not effective_rate(m) then return {previous, {}} end
  value = fmt(math.max(now_ms + tonumber(value), tonumber(m.rate_pause) or 0))
end
if value == '' then
  redis.call('HDEL', meta, field)
  m[field] = false
else
  set_meta(m, field, value)
end
reclaim(m)
redis.call('PUBLISH', channel, 'k')  -- kept permits go back: they would start tasks past it
local out = after_free(m, '', channel, cfg)
touch(idle_ms)
if not m.limit then redis.call('PERSIST', meta) end
return {previous, out}
