-- parked_index/read.lua: the index of semaphores with parked waiters, and the time
-- by the same server's clock (the one its scores were taken by, also on Redis
-- Cluster). Not prepended with the prelude (common_*.lua).
--
-- KEYS[1] index  ZSET  semaphore name -> ms of server time (see register.lua); read only
--
-- Returns {now ms, {name, score, name, score, ...}}.

local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return {now_ms, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}
