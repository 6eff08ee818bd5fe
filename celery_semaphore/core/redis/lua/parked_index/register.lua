-- parked_index/register.lua: list a semaphore in its namespace's index of the
-- semaphores with parked waiters (where every worker's heartbeat looks for them).
-- A script, not a plain ZADD, for the server's clock. Not prepended with the prelude
-- (common_*.lua).
--
-- KEYS[1] index  ZSET  semaphore name -> when a process last listed it, ms of
--                      server time (<namespace>:parked-index, the only key touched)
-- ARGV: arguments.py's RegisterArgs, read as ARGV[ARG.<name>]:
-- ARG.name         the semaphore's name
--
-- Returns the score it has now. A later time replaces an earlier one, never
-- the reverse (a server clock that stepped back does not age a name).

local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[ARG.name]))
if not score or now_ms > score then
  redis.call('ZADD', KEYS[1], now_ms, ARGV[ARG.name])
  score = now_ms
end
return score
