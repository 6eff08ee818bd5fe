-- park.lua: stay in line without asking: leave a payload to be handed over when due.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's ParkArgs, read as ARGV[ARG.<name>]:
-- ARG.holder       id of the waiter (the task id)
-- ARG.ticket       its ticket, or '' (keeps the one it has, or takes a new one)
-- ARG.payload      opaque text handed back to whoever publishes it when due
-- ARG.park_ms      how long the place holds without being handed over
-- ARG.info         free text stored with the waiter
-- ARG.idle_ms
-- ARG.dispatch     "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARG.due_ms       hand it over after this long even if its turn has not
--                  come (its wait budget runs out then), or 0
-- ARG.channel      for after_free(), when reclaiming made room
-- ARG.weight       "<permits>|<grants>", or '' to keep the one recorded
--                  (see "Weights" in common_weights.lua)
--
-- Returns {ticket, position, {holder, handover token, payload, ...}}: the
-- waiters now due, possibly this one (a permit freed since it was refused).
-- The caller declares no limit (see effective_limit()).

local holder, presented = ARGV[ARG.holder], tonumber(ARGV[ARG.ticket])
local payload, park_ms, info = ARGV[ARG.payload], tonumber(ARGV[ARG.park_ms]), ARGV[ARG.info]
local idle_ms, cfg, due_ms = tonumber(ARGV[ARG.idle_ms]), ARGV[ARG.dispatch], tonumber(ARGV[ARG.due_ms])
local channel = ARGV[ARG.channel]
local weight = ARGV[ARG.weight] ~= '' and ARGV[ARG.weight] or nil

local reclaimed = reclaim(nil)
local m = load_meta({'ticket'}, true)
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
if presented and (not ticket or presented < ticket) then ticket = presented end
if not ticket then
  local writes = {}
  ticket = new_ticket(m, weight or '', writes)
  write_meta(m, writes)
end
stand_in_line(m, holder, ticket, park_ms, info, weight, channel)
leave_payload(m, holder, payload, due_ms)
local position = redis.call('ZCOUNT', waiters, '-inf', '(' .. fmt(ticket)) + 1
local out
if reclaimed > 0 then
  out = after_free(m, '', channel, cfg)
else
  out = dispatch(m, '', cfg)
end
touch(idle_ms, false)
return {ticket, position, out}
