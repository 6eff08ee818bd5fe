-- parked_index/forget.lua: take a semaphore off the index of semaphores with parked
-- waiters, unless a process listed it again since the caller read its score (then
-- it may have parked a waiter since the caller saw none: its score changed, and is
-- younger than the age). Not prepended with the prelude (common_*.lua).
--
-- KEYS[1] index  ZSET  semaphore name -> ms of server time (see register.lua)
-- ARGV: arguments.py's ForgetArgs, read as ARGV[ARG.<name>]:
-- ARG.name         the semaphore's name
-- ARG.score        its score as the caller read it, before it found no parked waiter
-- ARG.least_ms     the least age (ms) of a score that may go
--
-- Returns 1 if the name was removed, else 0.

local score = redis.call('ZSCORE', KEYS[1], ARGV[ARG.name])
if not score or tonumber(score) ~= tonumber(ARGV[ARG.score]) then return 0 end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
if now_ms - tonumber(score) < tonumber(ARGV[ARG.least_ms]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[ARG.name])
return 1
