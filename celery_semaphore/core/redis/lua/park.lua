-- park.lua: stay in line without asking: leave a payload to be handed over when due.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV[1] holder           id of the waiter (the task id)
-- ARGV[2] ticket           its ticket, or '' (keeps the one it has, or takes a new one)
-- ARGV[3] payload          opaque text handed back to whoever publishes it when due
-- ARGV[4] park lease ms    how long the place holds without being handed over
-- ARGV[5] info             free text stored with the waiter
-- ARGV[6] idle ms
-- ARGV[7] dispatch         "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARGV[8] due ms           hand it over after this long even if its turn has not
--                          come (its wait budget runs out then), or 0
-- ARGV[9] wake channel     for after_free(), when reclaiming made room
-- ARGV[10] weight          "<permits>|<grants>", or '' to keep the one recorded
--                          (see "Weights" in common_weights.lua)
--
-- Returns {ticket, position, {holder, handover token, payload, ...}}: the
-- waiters now due, possibly this one (a permit freed since it was refused).
-- The caller declares no limit (see effective_limit()).

local holder, presented, payload = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local park_ms, info, idle_ms, cfg = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7]
local due_ms, channel = tonumber(ARGV[8]), ARGV[9]
local weight = ARGV[10] ~= '' and ARGV[10] or nil

local reclaimed = reclaim(nil)
local m = load_meta({'ticket'}, true)
local ticket = tonumber(redis.call('ZSCORE', waiters, holder))
if presented and (not ticket or presented < ticket) then ticket = presented end
if not ticket then
  local writes = {}
  ticket = new_ticket(m, weight or '', writes)
  write_meta(m, writes)
end
stand_in_line(m, holder, ticket, park_ms, info, weight)
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
