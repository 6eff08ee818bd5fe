-- dispatch.lua: hand over the parked waiters that are due (see common.lua).
--
-- For a caller that publishes but frees nothing: the worker heartbeat, which so
-- notices permits freed by a lease that ran out while nobody called, and
-- handed-over waiters whose publisher died before publishing.
--
-- KEYS: the eight of common.lua.
-- ARGV[1] idle ms
-- ARGV[2] wake channel
-- ARGV[3] dispatch         "<max block ms>|<deadline ms>"
--
-- Returns {holder, handover token, payload, ...}.

local idle_ms, channel, cfg = tonumber(ARGV[1]), ARGV[2], ARGV[3]
if redis.call('HLEN', meta) == 0 then return {} end
local waiting = redis.call('ZCARD', waiters)
local reclaimed = reclaim(waiting)
if reclaimed > 0 then wake(channel) end
local out = dispatch(cfg)
if reclaimed > 0 or #out > 0 then touch(idle_ms, waiting == 0) end
return out
