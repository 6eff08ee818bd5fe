-- renew.lua: compare-and-extend the leases of any number of holders.
--
-- KEYS: the ten of common_keys.lua; the last ARGV: the epoch (common_keys.lua).
-- ARGV: arguments.py's RenewArgs, then any number of Held, read as ARGV[ARG.<name>]:
-- ARG.lease_ms     new lease, counted from now
-- ARG.idle_ms
-- ARG.channel
-- ARG.dispatch     '' or "<max block ms>|<deadline ms>|<rate lead ms>" (dispatch())
-- ARG.held.holder  each held permit (ARGV[i + ARG.held.holder], i from ARG.held.first)
-- ARG.held.token   fencing token ('' = any token of this holder)
-- ARG.held.permits the permits it holds ('': 1), written back with it after a data loss
--                  (see "Weights" in common_weights.lua; a live holder's own record says)
--
-- Returns {new lease expiry ms, {lost holder, ...}, handovers, restored}. A holder whose
-- lease already ran out is reclaimed first and so reported lost: a renew never
-- resurrects an evicted holder; what follows the reclaim is after_free() (the
-- caller declares no limit). m_lost counts the lost pairs that came with a
-- token (the caller held that permit); a holder id alone may never have held
-- one (a worker renews its requests by id; it counts real losses itself).
-- Reads meta only if something was reclaimed.
-- While admissions are paused after a data loss ("Data loss" in common_epoch.lua), a
-- missing holder is written back instead (its token, or 0 if given none), and counted
-- in ``restored``.

local lease_ms, idle_ms = tonumber(ARGV[ARG.lease_ms]), tonumber(ARGV[ARG.idle_ms])
local channel, cfg = ARGV[ARG.channel], ARGV[ARG.dispatch]

local reclaimed = reclaim(nil)
local expires = now_ms + lease_ms
local lost, lost_permits, restored = {}, 0, 0
for i = ARG.held.first, EPOCH_ARG - 1, ARG.held.size do
  local holder, token = ARGV[i + ARG.held.holder], ARGV[i + ARG.held.token]
  local k = tonumber(ARGV[i + ARG.held.permits])
  local live = redis.call('ZSCORE', holders, holder)
  local record = live and redis.call('HGET', hinfo, holder)
  local current = token_of(record)
  if live and (token == '' or current == token or current == '0') then
    occupy(holder, expires, held_weight(record), true)
  elseif not live and resumes_ms > 0 then
    occupy(holder, expires, k or 1)
    redis.call('HSET', hinfo, holder, holder_record(token == '' and '0' or token, fmt(now_ms), k or 1, ''))
    restored = restored + 1
  else
    lost[#lost + 1] = holder
    if token ~= '' then lost_permits = lost_permits + 1 end
  end
end
bump('m_renewed', (EPOCH_ARG - 5) / 3 - #lost - restored)
if restored > 0 then redis.call('HINCRBY', epoch_key, 'restored', restored) end
bump('m_lost', lost_permits)
local out = {}
if reclaimed > 0 then out = after_free(load_meta({}, true), '', channel, cfg) end
touch(idle_ms)
return {expires, lost, out, restored}
