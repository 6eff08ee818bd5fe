-- dispatch.lua: hand over the parked waiters that are due (see dispatch() in
-- common_after_free.lua), after dropping the named parked waiters from the line.
--
-- For a caller that publishes but frees nothing: the worker heartbeat, which so
-- notices permits freed by a lease that ran out while nobody called, handed-over
-- waiters whose publisher died before publishing, and revoked parked tasks. What
-- follows a reclaim or a drop is after_free() (the caller declares no limit).
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's DispatchArgs, then any number of Dropped, read as ARGV[ARG.<name>]:
-- ARG.idle_ms
-- ARG.channel
-- ARG.dispatch     "<max block ms>|<deadline ms>|<rate lead ms>"
-- ARG.drop.holder  a holder to drop from the line if it is parked or handed over (a
--                  holder asking in person, or holding a permit, is left alone)
--
-- Returns {dropped count, {holder, handover token, payload, ...}}; changes nothing
-- if meta is gone (expired, or Redis lost it): writing would recreate it unexpiring.

local idle_ms, channel, cfg = tonumber(ARGV[ARG.idle_ms]), ARGV[ARG.channel], ARGV[ARG.dispatch]
local m = load_meta({}, true)
local found = false
for _, value in pairs(m) do found = found or value end
if not found then return {0, {}} end
local dropped = 0
for i = ARG.drop.first, EPOCH_ARG - 1, ARG.drop.size do
  local holder = ARGV[i + ARG.drop.holder]
  local state = state_in(redis.call('HGET', parked, holder))
  if state == 'p' or state == 'h' then
    leave_line({holder}, 'forget', m)
    dropped = dropped + 1
  end
end
bump('m_abandoned', dropped)
local waiting = redis.call('ZCARD', waiters)
local reclaimed = reclaim(m, waiting)
local out
if reclaimed > 0 or dropped > 0 then
  out = after_free(m, '', channel, cfg)
else
  out = dispatch(m, '', cfg)
end
if reclaimed > 0 or dropped > 0 or #out > 0 then touch(idle_ms, waiting == 0) end
return {dropped, out}
