-- renew.lua: compare-and-extend the leases of any number of holders.
--
-- KEYS: the eight of common.lua.
-- ARGV[1] lease ms    new lease, counted from now
-- ARGV[2] idle ms
-- ARGV[3] wake channel
-- ARGV[4..] pairs: holder, fencing token ('' = any token of this holder)
--
-- Returns {new lease expiry ms, lost holder, lost holder, ...}. A holder whose
-- lease already ran out is reclaimed first and so reported lost: a renew never
-- resurrects an evicted holder.

local lease_ms, idle_ms, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local reclaimed = reclaim()
local expires = now_ms + lease_ms
local result = {expires}
for i = 4, #ARGV, 2 do
  local holder, token = ARGV[i], ARGV[i + 1]
  local live = redis.call('ZSCORE', holders, holder)
  if live and (token == '' or token_of(redis.call('HGET', hinfo, holder)) == token) then
    redis.call('ZADD', holders, 'XX', expires, holder)
  else
    result[#result + 1] = holder
  end
end
bump('m_renewed', (#ARGV - 3) / 2 - (#result - 1))
bump('m_lost', #result - 1)
if reclaimed > 0 then wake(channel) end
touch(idle_ms)
return result
